#include "calibrate.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "canary_run.h"
#include "child_process.h"
#include "file_io.h"
#include "lane_run.h"
#include "matrix.h"
#include "python_canary.h"
#include "run_option_fields.h"
#include "receipt/budget_features.h"
#include "stack_info.h"
#include "verdict.h"
#include "verdict_report.h"
#include "drift_bias.h"
#include "environment_drift.h"
#include "false_alarm.h"
#include "host_variants.h"
#include "margin.h"

namespace harness::nightly {
namespace {

namespace fs = std::filesystem;

inline constexpr double kFloorUlps = 4;    // and never allow less than this many fp32 ulps

// 3 significant digits, rounded up so that a proposal never shrinks in print.
double round_up(double x) {
  if (x <= 0) return 0;
  const double unit = std::pow(10.0, std::floor(std::log10(x)) - 2);
  return std::ceil(x / unit * (1 - 1e-12)) * unit;
}

std::string number(double x) { return fmt::format("{:.3g}", round_up(x)); }

std::string window_steps(const check::Window& w) {
  return w.last == std::numeric_limits<int>::max() ? fmt::format("{}-", w.first) : fmt::format("{}-{}", w.first, w.last);
}

std::string window_toml(const check::Window& w) {
  std::string text = fmt::format("{{ steps = \"{}\"", window_steps(w));
  if (w.from_decisions_part) text += fmt::format(", from = \"{}\"", check::kFromDecisionsPart);
  if (w.atol > 0 || (w.rtol == 0 && w.ulp == 0)) text += ", atol = " + number(w.atol);
  if (w.rtol > 0) text += ", rtol = " + number(w.rtol);
  if (w.ulp > 0) text += ", ulp = " + number(w.ulp);
  return text + " }";
}

// A TOML basic string ("..."), as every string of the budgets file is written.
std::string toml_string(const std::string& s) {
  std::ostringstream out;
  const toml::table holder{{"s", s}};
  out << toml::toml_formatter(*holder.get("s"), toml::toml_formatter::default_flags & ~toml::format_flags::allow_literal_strings);
  return out.str();
}

// The windows of one metric of the entry being calibrated: those from the decisions' part
// (a step they cover, once a run's decisions parted, is theirs to fit, on top of `base`),
// and `base`, the entry's other windows as proposed.
struct EntryWindows {
  std::vector<check::Window> from_part;
  std::vector<check::Window> base;

  bool part_covers(const check::Deviation& d) const {
    return std::any_of(from_part.begin(), from_part.end(),
                       [&](const check::Window& w) { return w.covers(d.step, d.since_decisions_part); });
  }
};

// The proposal for one window: the current window's shape (its atol : rtol : ulp)
// scaled so that every observed deviation times the margin its spread justifies, less what
// the other features (and, for a window from the decisions' part, the entry's other windows)
// allow, fits (check/margin.h: propose_scale); at least kFloorUlps ulps of the largest
// reference value. A window that no step of the repeats falls in (short runs, a window of
// later steps, decisions that never parted) keeps its current values: nothing was measured
// there, and a floor-sized proposal would fail every run that reaches those steps.
WindowProposal propose(const std::string& metric, const check::Window& current,
                       const std::vector<std::vector<check::Deviation>>& repeats, const check::ComposedBudget& others,
                       bool widen, const EntryWindows& entry) {
  WindowProposal p{metric, current, current};
  const bool shaped = current.atol > 0 || current.rtol > 0 || current.ulp > 0;
  double largest_reference = 0, resolution = 0;
  std::vector<std::vector<check::NeedSample>> samples;  // per repeat that reaches the window
  for (const std::vector<check::Deviation>& deviations : repeats) {
    std::vector<check::NeedSample> repeat;
    for (const check::Deviation& d : deviations) {
      if (d.metric != metric || !current.covers(d.step, d.since_decisions_part)) continue;
      if (!current.from_decisions_part && entry.part_covers(d)) continue;  // the part's windows fit it
      resolution = std::max(resolution, d.resolution);
      const double own = current.from_decisions_part
                             ? check::windows_allowance(entry.base, d.step, d.since_decisions_part, d.reference)
                             : 0.0;
      repeat.push_back({d.deviation, others.allowed(metric, d.step, d.reference, d.since_decisions_part) + own,
                        shaped ? current.allowance(d.reference) : 1.0});
      p.observed = std::max(p.observed, d.deviation);
      largest_reference = std::max(largest_reference, std::fabs(d.reference));
    }
    if (repeat.empty()) continue;
    p.samples += static_cast<int>(repeat.size());
    samples.push_back(std::move(repeat));
  }
  if (p.samples == 0) return p;  // proposed = current
  // A window from the decisions' part fits flips: discrete events, each with its own
  // consequence, whose sizes are no one log-normal population (check/margin.h).
  const check::ScaleProposal scale = check::propose_scale(
      samples, current.from_decisions_part ? check::MarginFrom::kLargestEvent : check::MarginFrom::kSpread);
  p.margin = scale.margin.factor;
  p.margin_samples = scale.margin.samples;
  p.needed_scale = scale.needed;
  p.proposed.atol = shaped ? scale.scale * current.atol : scale.scale;
  p.proposed.rtol = shaped ? scale.scale * current.rtol : 0;
  p.proposed.ulp = shaped ? scale.scale * current.ulp : 0;
  p.proposed.atol = std::max({p.proposed.atol, kFloorUlps * check::fp32_ulp(largest_reference), resolution});
  if (widen) {  // each term at least the current one: the hosts it was measured on stay covered
    p.proposed.atol = std::max(p.proposed.atol, current.atol);
    p.proposed.rtol = std::max(p.proposed.rtol, current.rtol);
    p.proposed.ulp = std::max(p.proposed.ulp, current.ulp);
  }
  return p;
}

// How the proposal was made, in the words the candidate and the report give it: the method,
// N and the statistic.
std::string method_text(const Calibration& c) {
  std::string rule = fmt::format("per window, the largest deviation from the reference over them times the margin their "
                                 "spread justifies (a log-normal tolerance bound covering {:.0f}% of runs at {:.0f}% "
                                 "confidence, at least {})",
                                 100 * check::kMarginCoverage, 100 * check::kMarginConfidence, check::kMinMargin);
  int flips = 0;  // the repeats whose decisions parted, as a window from the part saw them
  for (const WindowProposal& w : c.windows) {
    if (w.current.from_decisions_part) flips = std::max(flips, w.margin_samples);
  }
  if (flips > 0) {
    rule += fmt::format("; windows from the decisions' part: the largest flip times {} (flips are discrete events, no "
                        "one population: the largest of {} covers {:.0f}% of flips at {:.0f}% confidence)",
                        check::kMinMargin, flips, 100 * check::distribution_free_coverage(flips),
                        100 * check::kMarginConfidence);
  }
  if (c.held_out > 0) rule += fmt::format("; the last {} held out of the proposal and checked against it", c.held_out);
  if (c.envelope) {
    return fmt::format("perturbation: the unperturbed run and {} runs with every initial weight moved one ulp "
                       "(seeds {}..{}); {}",
                       c.envelope->seeds.size(), c.envelope->seeds.front(), c.envelope->seeds.back(), rule);
  }
  const std::string hosts = c.host_variants.empty() ? ""
                                                    : fmt::format(" on {} emulated host{} ({})", c.host_variants.size(),
                                                                  c.host_variants.size() == 1 ? "" : "s",
                                                                  fmt::join(c.host_variants, ", "));
  if (c.source == "runs") {
    return c.noise_seeds.empty() ? fmt::format("repeats: {} runs{}; {}", c.repeats, hosts, rule)
                                 : fmt::format("repeats: {} runs (noise seeds {}..{}){}; {}", c.repeats,
                                               c.noise_seeds.front(), c.noise_seeds.back(), hosts, rule);
  }
  if (c.paired) {
    return fmt::format("pairs: {} receipts, each against the reference run made beside it (the same weights, stack and "
                       "host){}; {}",
                       c.repeats, hosts, rule);
  }
  return fmt::format("receipts: {} made elsewhere{}; {}", c.repeats, hosts, rule);
}

// The envelope per metric and step, as JSON (beside the report): what tests and plots read.
nlohmann::json envelope_json(const Calibration& c) {
  const PerturbationEnvelope& e = *c.envelope;
  nlohmann::json j = {{"lane", c.lane},
                      {"reference", c.reference},
                      {"method", "perturbation"},
                      {"runs", e.seeds.size()},
                      {"seeds", e.seeds},
                      {"ulps", 1},
                      {"statistic", "max over the runs of |perturbed - unperturbed| per step (params_sketch: and over tensors)"},
                      {"spread", e.spread}};
  if (!e.drift.empty()) j["drift"] = e.drift;
  return j;
}

// The entry's held-out samples and how many fell outside it (what its false-alarm bound is
// made of): this calibration's; or, widened without any held out, the entry's own, which
// still hold since no window shrank; else none.
std::string held_out_toml(const check::FeatureBudget& f, const Calibration& c) {
  int held_out = c.held_out, outside = c.held_out_outside;
  if (held_out == 0 && c.widened) std::tie(held_out, outside) = std::pair(f.provenance.held_out, f.provenance.held_out_outside);
  if (held_out == 0) return "";
  return fmt::format("held_out = {}\nheld_out_outside = {}  # false alarms below {:.3g}% at {:.0f}% confidence\n", held_out,
                     outside, 100 * check::false_alarm_upper_bound(outside, held_out), 100 * check::kFalseAlarmConfidence);
}

// A TOML array of strings.
std::string toml_strings(const std::vector<std::string>& items) {
  std::vector<std::string> quoted;
  for (const std::string& item : items) quoted.push_back(toml_string(item));
  return fmt::format("[{}]", fmt::join(quoted, ", "));
}

// The emulated hosts and real CPUs the samples ran on; widened, with the entry's own (the
// hosts it was checked on before still hold: no window shrank).
std::string hosts_toml(const check::FeatureBudget& f, const Calibration& c) {
  const auto merged = [&](std::vector<std::string> before, const std::vector<std::string>& now) {
    if (!c.widened) before.clear();
    for (const std::string& item : now) {
      if (std::find(before.begin(), before.end(), item) == before.end()) before.push_back(item);
    }
    return before;
  };
  const std::vector<std::string> variants = merged(f.provenance.host_variants, c.host_variants);
  const std::vector<std::string> cpus = merged(f.provenance.host_cpus, c.host_cpus);
  std::string text;
  if (!variants.empty()) text += fmt::format("host_variants = {}\n", toml_strings(variants));
  if (!cpus.empty()) text += fmt::format("host_cpus = {}\n", toml_strings(cpus));
  return text;
}

}  // namespace

std::string power_record(const PowerReport& p) {
  if (p.ladders.empty()) return "";
  std::vector<std::string> items = {fmt::format("lane = {}", toml_string(p.lane))};
  if (p.against_golden) items.emplace_back("against = \"golden\"");
  items.push_back(fmt::format("step = {}", p.step));
  items.push_back(fmt::format("tensor = {}", toml_string(p.tensor)));
  for (const PowerLadder& l : p.ladders) {
    std::string key = l.kind;
    std::replace(key.begin(), key.end(), '-', '_');
    const PowerRung* caught = l.smallest_caught();
    items.push_back(caught ? fmt::format("{} = {}", key, caught->size)
                           : fmt::format("{} = {}", key, toml_string(fmt::format("none up to {}", l.sizes.back()))));
  }
  if (const std::optional<bool> loose = p.too_loose()) items.push_back(fmt::format("too_loose = {}", *loose));
  return fmt::format("power = {{ {} }}", fmt::join(items, ", "));
}

namespace {

// What the lane's check caught under the proposal (--power). Not kept from the entry when
// not measured again: wider windows catch less, so an old measure would overstate.
std::string power_toml(const Calibration& c) {
  const std::string record = c.power ? power_record(*c.power) : "";
  return record.empty() ? "" : record + "\n";
}

std::string section_toml(const check::FeatureBudget& f, const Calibration& c) {
  std::string text = fmt::format("[{}]\nform = \"tolerance\"\nrationale = {}\n", f.key(), toml_string(f.rationale));
  if (!f.across_platforms.empty()) text += fmt::format("across_platforms = {}\n", toml_string(f.across_platforms));
  if (!f.triage_twin.empty()) text += fmt::format("triage_twin = {}\n", toml_string(f.triage_twin));  // kept as declared
  text += fmt::format("calibrated = \"{}\"\nsamples = {}\nmethod = {}\n", run::utc_timestamp().substr(0, 10), c.samples,
                      toml_string(method_text(c)));
  std::vector<std::string> observed;
  for (const std::string& metric : c.metrics) {
    // Widened: the entry keeps the largest spread any of its calibrations saw.
    const auto before = f.provenance.observed.find(metric);
    const double seen = c.widened && before != f.provenance.observed.end() ? std::max(before->second, c.observed.at(metric))
                                                                           : c.observed.at(metric);
    observed.push_back(fmt::format("{} = {}", metric, number(seen)));
  }
  text += fmt::format("observed = {{ {} }}\n", fmt::join(observed, ", "));
  text += held_out_toml(f, c);
  text += hosts_toml(f, c);
  text += power_toml(c);
  for (const std::string& metric : c.metrics) {
    std::vector<std::string> windows;
    for (const WindowProposal& w : c.windows) {
      if (w.metric == metric) windows.push_back(window_toml(w.proposed));
    }
    text += fmt::format("{} = [ {} ]\n", metric, fmt::join(windows, ", "));
  }
  if (f.outlier_fraction > 0) text += fmt::format("outlier_fraction = {}\n", f.outlier_fraction);
  if (f.bias_fails) text += "bias = \"fail\"\n";
  return text + "\n";
}

// The budgets file's text with one entry's section replaced (its table: "bf16", "tiny.bf16"),
// or appended when the entry is new.
std::string splice_section(const std::string& text, const std::string& feature, const std::string& section, bool is_new) {
  if (is_new) return text + (text.empty() || text.ends_with("\n") ? "\n" : "\n\n") + section;
  const std::string header = "[" + feature + "]\n";
  std::size_t start = text.rfind("\n" + header);
  start = text.starts_with(header) ? 0 : start == std::string::npos ? start : start + 1;
  if (start == std::string::npos) throw check::BudgetError(fmt::format("no [{}] section to replace", feature));
  std::size_t end = text.find("\n[", start + header.size());
  end = end == std::string::npos ? text.size() : end + 1;
  return text.substr(0, start) + section + text.substr(end);
}

// The feature to calibrate: `wanted`, else the most specific the lane composes. An engine
// declares its features from the most general to the most specific (accel: noise, bf16,
// fp8, fp8-limited; Engine::budget_features), so that is the last of the run's declared
// features that the comparison composes.
std::string choose_feature(const std::string& wanted, const std::vector<std::string>& composed, const std::string& lane,
                           const std::vector<std::string>& declared) {
  if (!wanted.empty()) {
    if (std::find(composed.begin(), composed.end(), wanted) == composed.end()) {
      throw run::UsageError(fmt::format("--feature: {} is not a feature of {} against the reference (features: {})", wanted,
                                        lane, fmt::join(composed, ", ")));
    }
    return wanted;
  }
  for (auto f = declared.rbegin(); f != declared.rend(); ++f) {
    if (std::find(composed.begin(), composed.end(), *f) != composed.end()) return *f;
  }
  if (composed.size() == 1) return composed.front();  // a feature of another stack (torch-bf16, ...)
  if (composed.empty()) {
    throw run::UsageError(fmt::format("lane {} has no feature to calibrate: it is bitwise against the reference", lane));
  }
  throw run::UsageError(fmt::format("--feature: {} composes {}; name the one to calibrate", lane, fmt::join(composed, ", ")));
}

// The samples the proposal rests on, checked before anything runs: the `samples` the
// options give (`flag` names how: "--repeats 3") less those held out (--held-out), at least
// kMinCalibrationSamples of them unless --provisional; sets c.samples and c.held_out.
void take_samples(const CalibrateOptions& o, int samples, const std::string& flag, Calibration& c) {
  if (o.held_out < 0 || (o.held_out > 0 && o.held_out >= samples)) {
    throw run::UsageError(fmt::format("--held-out {}: {} gives {} sample{}; hold out fewer, so that some remain to "
                                      "propose from", o.held_out, flag, samples, samples == 1 ? "" : "s"));
  }
  c.held_out = o.held_out;
  c.samples = samples - o.held_out;
  if (o.provisional || c.samples >= check::kMinCalibrationSamples) return;
  const std::string besides = o.held_out > 0 ? fmt::format(" besides the {} held out", o.held_out) : "";
  throw run::UsageError(fmt::format("{}: an entry needs at least {} samples of the lane's deviation{} (docs/budgets.md, "
                                    "\"Samples\"); give {} or more, or --provisional to write an entry marked provisional",
                                    flag, check::kMinCalibrationSamples, besides, check::kMinCalibrationSamples));
}

// --held-out where nothing is proposed (the envelope of the reference, or of a receipt
// with no --reference): refused before anything runs.
void refuse_held_out_without_proposal(const CalibrateOptions& o) {
  if (o.held_out > 0) {
    throw run::UsageError("--held-out: an envelope proposes no entry, so nothing can be held out of it; give a lane "
                          "other than the reference (or --reference)");
  }
}

// The calibration runs' directory.
class TempDir : public run::TempDir {
 public:
  TempDir() : run::TempDir("calibrate", "the calibration runs") {}
};

// The candidate's paths: beside the budgets by default; never the budgets file itself.
void choose_outputs(const CalibrateOptions& o, Calibration& c) {
  c.candidate_path = o.out.empty() ? (fs::path(o.budgets_path).parent_path() / "budgets.candidate.toml").string() : o.out;
  if (fs::path(c.candidate_path).extension() != ".toml") {
    throw run::UsageError(fmt::format("--out: {} must end in .toml (the report goes beside it as .md)", c.candidate_path));
  }
  std::error_code ec;
  if (fs::equivalent(c.candidate_path, o.budgets_path, ec)) {
    throw run::UsageError(fmt::format("--out: {} is the budgets file; calibration only writes candidates", c.candidate_path));
  }
  c.report_path = fs::path(c.candidate_path).replace_extension(".md").string();
  const fs::path out_dir = fs::absolute(c.candidate_path).parent_path();
  if (!fs::is_directory(out_dir) || access(out_dir.c_str(), W_OK) != 0) {
    throw run::UsageError(fmt::format("--out: cannot write into {}; create it or choose another place", out_dir.string()));
  }
}

// The metrics the deviations measure: every per-step one, then the held-out evaluation's
// when the runs evaluated one (a metric proposed from no sample would budget nothing).
std::vector<std::string> measured_metrics(const std::vector<std::vector<check::Deviation>>& repeats) {
  std::vector<std::string> metrics(std::begin(check::kBudgetMetrics), std::end(check::kBudgetMetrics));
  for (const char* metric : check::kEvalMetrics) {
    const auto measures = [&](const check::Deviation& d) { return d.metric == metric; };
    const auto any = [&](const std::vector<check::Deviation>& r) { return std::any_of(r.begin(), r.end(), measures); };
    if (std::any_of(repeats.begin(), repeats.end(), any)) metrics.emplace_back(metric);
  }
  return metrics;
}

struct Runs {
  check::ReceiptData reference;  // path "" : none (--perturb of a receipt with no --reference)
  std::vector<check::ReceiptData> repeats;
  std::vector<std::string> labels;  // per repeat, how the outcome lines name it
  std::vector<std::vector<check::Deviation>> deviations;  // per repeat, from its reference
  // --reference per receipt: repeat i's own reference; empty: `reference` is every repeat's.
  std::vector<check::ReceiptData> paired_references;

  const check::ReceiptData& reference_of(std::size_t repeat) const {
    return paired_references.empty() ? reference : paired_references.at(repeat);
  }

  // The deviations of the first `count` repeats, each repeat's apart: what a proposal is made
  // from (each repeat one sample of the margin).
  std::vector<std::vector<check::Deviation>> per_repeat_of_first(std::size_t count) const {
    return {deviations.begin(), deviations.begin() + static_cast<std::ptrdiff_t>(std::min(count, deviations.size()))};
  }
};

// `spec` run into `out` on an emulated host: an external lane's command with the variant's
// environment, a lane of the harness's engines as `harness run` in a child process (the
// kernels are chosen once per process), no trace. Throws LaneCommandError when it fails.
void run_on_host(const Matrix& matrix, const LaneSpec& spec, const std::string& out, const HostVariant& host, int threads,
                 const std::string& pack) {
  if (spec.external()) {
    LaneSpec on_host = spec;
    for (const auto& [name, value] : host.environment) on_host.environment[name] = value;
    run_lane(matrix, on_host, out, {}, threads, pack);
    return;
  }
  run::RunOptions options = matrix.run_options(spec, out);
  options.threads = threads;
  options.trace = run::TraceLevel::kNone;
  std::vector<std::string> argv = run::run_command_argv(options);
  argv.insert(argv.begin(), fs::read_symlink("/proc/self/exe").string());
  argv.insert(argv.end(), {"--out", out, "--force"});
  const run::ChildResult r = run::run_child(argv, host.environment, run::ChildOutput::kDiscard, run::ChildOutput::kCapture);
  if (!r.exited_zero()) {
    throw LaneCommandError(fmt::format("lane {} on host {}: {} {}: {}", spec.id, host.name, run::command_line(argv), r.how(),
                                       run::last_line(r.stderr_tail)));
  }
}

// "repeat 2 (noise seed 1002) on aten-avx2 (kernels gemm=generic ...)": a repeat's label.
std::string repeat_label(int i, const std::optional<std::int64_t>& seed, const HostVariant* host,
                         const check::ReceiptData& r) {
  std::string label = fmt::format("repeat {}", i);
  if (seed) label += fmt::format(" (noise seed {})", *seed);
  if (!host) return label;
  label += " on " + host->name;
  const auto kernels = r.manifest.find("kernels");
  if (kernels != r.manifest.end()) label += " (kernels " + kernels->second + ")";
  return label;
}

// The reference once, the lane `repeats` times (seeded lanes: a new noise seed each), on each
// of `hosts` in turn (none: this host as it is).
Runs run_repeats(const CalibrateOptions& o, const Matrix& matrix, const LaneSpec& spec,
                 const std::vector<HostVariant>& hosts, Calibration& c,
                 const std::function<void(const std::string&)>& progress) {
  const std::string seed_flag = spec.reduction_seed_flag();
  const bool seeded = !seed_flag.empty();
  const TempDir work;
  if (progress) progress(fmt::format("reference {}", matrix.reference));
  run_lane(matrix, matrix.lane(matrix.reference), work.file("reference.h5"), {}, o.threads);
  // An external lane's repeats read one canary pack.
  const std::string pack = spec.uses_pack() ? export_matrix_pack(matrix, work.file("canary-pack.h5")) : "";
  Runs runs{check::load_receipt(work.file("reference.h5")), {}, {}, {}, {}};
  const std::size_t host_count = std::max<std::size_t>(1, hosts.size());
  for (std::size_t h = 0; h < host_count; ++h) {
    const HostVariant* host = hosts.empty() ? nullptr : &hosts[h];
    for (int i = 0; i < o.repeats; ++i) {
      LaneSpec repeat = spec;
      std::optional<std::int64_t> seed;
      if (seeded) {  // every run its own seed: each sample an independent draw, on some host
        seed = o.noise_seed_base + static_cast<std::int64_t>(h) * o.repeats + i;
        c.noise_seeds.push_back(*seed);
        repeat.settings.options[seed_flag] = std::to_string(*seed);
      }
      if (progress) {
        progress(fmt::format("repeat {}/{} of {}{}", i + 1, o.repeats, spec.id, host ? " on " + host->name : ""));
      }
      const std::string path = work.file(fmt::format("repeat-{}-{}.h5", h, i));
      if (host) {
        run_on_host(matrix, repeat, path, *host, o.threads, pack);
      } else {
        run_lane(matrix, repeat, path, {}, o.threads, pack);
      }
      runs.repeats.push_back(check::load_receipt(path));
      runs.labels.push_back(repeat_label(i, seed, host, runs.repeats.back()));
      runs.deviations.push_back(check::metric_deviations(runs.repeats.back(), runs.reference));
    }
  }
  for (const HostVariant& host : hosts) c.host_variants.push_back(host.name);
  return runs;
}

std::vector<check::Window> doubling_windows(int steps);

// Every window of the feature's entry, per metric (one open window when it has none), from
// `repeats`' deviations (those not held out, each repeat's apart). A new entry calibrated from perturbed runs gets
// windows that follow the envelope (doubling_windows); otherwise one open window.
void propose_windows(const std::vector<const check::FeatureBudget*>& parts, const check::FeatureBudget& current,
                     const Runs& runs, const std::vector<std::vector<check::Deviation>>& repeats, Calibration& c) {
  std::vector<const check::FeatureBudget*> other_parts;
  for (const check::FeatureBudget* part : parts) {
    if (part != &current) other_parts.push_back(part);
  }
  const check::ComposedBudget others(other_parts);
  for (const std::string& metric : c.metrics) {
    const auto it = current.metrics.find(metric);
    const bool none = it == current.metrics.end() || it->second.empty();
    const std::vector<check::Window> fresh =
        c.envelope ? doubling_windows(runs.repeats.front().steps()) : std::vector<check::Window>{check::Window{}};
    const std::vector<check::Window>& windows = none ? fresh : it->second;
    EntryWindows entry;
    std::copy_if(windows.begin(), windows.end(), std::back_inserter(entry.from_part),
                 [](const check::Window& w) { return w.from_decisions_part; });
    for (bool from_part : {false, true}) {  // the part's windows add to the others' proposals
      for (const check::Window& w : windows) {
        if (w.from_decisions_part != from_part) continue;
        c.windows.push_back(propose(metric, w, repeats, others, c.widened, entry));
        c.observed[metric] = std::max(c.observed[metric], c.windows.back().observed);
        if (!from_part) entry.base.push_back(c.windows.back().proposed);
      }
    }
  }
}

// The lane's repeats, run here: the matrix's reference once and the lane `repeats` times.
Runs perturbed_lane(const CalibrateOptions& o, const Matrix& matrix, const LaneSpec& spec, Calibration& c,
                    const std::function<void(const std::string&)>& progress);
Runs perturbed_receipt(const CalibrateOptions& o, Calibration& c, const std::function<void(const std::string&)>& progress);

Runs runs_of_lane(const CalibrateOptions& o, const check::Budgets& budgets, Calibration& c,
                  const std::function<void(const std::string&)>& progress) {
  if (!o.perturb && (o.repeats < 1 || o.repeats > 1000)) throw run::UsageError("--repeats: must be between 1 and 1000");
  const Matrix matrix = load_matrix(o.matrix_path);
  const auto chosen = select_lanes(matrix, o.lane, "--lane");
  if (o.lane.empty() || chosen.size() != 1) throw run::UsageError("--lane: name one lane of the matrix (its id or name)");
  const LaneSpec& spec = *chosen.front();
  if (o.power) require_regressions(spec, "--power");
  if (spec.id == matrix.reference && !o.perturb) {  // perturbed, the reference gives its envelope
    throw run::UsageError(fmt::format("--lane: {} is the reference lane itself", spec.id));
  }
  const bool declared = std::find(spec.budget_features.begin(), spec.budget_features.end(), o.feature) !=
                        spec.budget_features.end();
  if (!o.feature.empty() && !budgets.describes(o.feature) && !declared) {
    throw run::UsageError(fmt::format("--feature: {} is not a feature of {} nor one {} declares", o.feature,
                                      o.budgets_path, spec.id));
  }
  if (!o.hosts.empty() && o.perturb) {
    throw run::UsageError("--hosts: runs the lane's repeats on each host; give --repeats, not --perturb");
  }
  // Checked before any run: --hosts once, each variant a host the repeats run on.
  const std::vector<HostVariant> variants = o.hosts.empty() ? std::vector<HostVariant>{} : parse_host_variants(o.hosts);
  const int hosts = std::max(1, static_cast<int>(variants.size()));
  choose_outputs(o, c);
  const bool envelope_only = spec.id == matrix.reference;  // proposes no entry
  if (envelope_only) {
    refuse_held_out_without_proposal(o);
  } else if (o.perturb) {
    take_samples(o, o.perturb, fmt::format("--perturb {}", o.perturb), c);
  } else {
    const std::string on_hosts = o.hosts.empty() ? "" : fmt::format(" on {} host{}", hosts, hosts == 1 ? "" : "s");
    take_samples(o, o.repeats * hosts, fmt::format("--repeats {}{}", o.repeats, on_hosts), c);
  }
  c.lane = spec.lane;
  c.reference = spec.id == matrix.reference ? "" : matrix.lane(matrix.reference).lane;
  if (o.perturb) {
    c.source = "perturbations";
    return perturbed_lane(o, matrix, spec, c, progress);
  }
  c.repeats = o.repeats * hosts;
  c.source = "runs";
  return run_repeats(o, matrix, spec, variants, c, progress);
}

// Receipts written elsewhere as the repeats, each judged against the reference receipt:
// every one must be of one lane and compose the same features against it.
Runs runs_of_receipts(const CalibrateOptions& o, const check::Budgets& budgets, Calibration& c,
                      const std::function<void(const std::string&)>& progress) {
  if (!o.lane.empty()) throw run::UsageError("--lane: give either --lane (runs here) or --receipts (runs made elsewhere)");
  if (!o.hosts.empty()) throw run::UsageError("--hosts: runs a lane here on each host; receipts were made on their own");
  if (o.perturb) {
    choose_outputs(o, c);
    if (o.references.size() > 1) {
      throw run::UsageError("--reference: --perturb judges its runs against one reference; give one");
    }
    if (o.references.empty()) {
      refuse_held_out_without_proposal(o);  // an envelope
    } else {
      take_samples(o, o.perturb, fmt::format("--perturb {}", o.perturb), c);
    }
    Runs runs = perturbed_receipt(o, c, progress);
    c.lane = runs.repeats.front().lane;
    c.reference = runs.reference.lane;
    c.source = "perturbations";
    return runs;
  }
  if (o.references.empty()) throw run::UsageError("--receipts: name the receipt they are judged against with --reference");
  if (o.receipts.size() > 1000) throw run::UsageError("--receipts: at most 1000 receipts");
  const bool paired = o.references.size() > 1;
  if (paired && o.references.size() != o.receipts.size()) {
    throw run::UsageError(fmt::format("--reference: give one reference, or one per receipt in their order ({} receipts, "
                                      "{} references)",
                                      o.receipts.size(), o.references.size()));
  }
  choose_outputs(o, c);
  const int receipts = static_cast<int>(o.receipts.size());
  take_samples(o, receipts, fmt::format("--receipts ({} receipt{})", receipts, receipts == 1 ? "" : "s"), c);
  Runs runs{check::load_receipt(o.references.front()), {}, {}, {}, {}};
  std::set<std::string> features;
  for (std::size_t i = 0; i < o.receipts.size(); ++i) {
    const std::string& path = o.receipts[i];
    if (paired) runs.paired_references.push_back(i == 0 ? runs.reference : check::load_receipt(o.references[i]));
    const check::ReceiptData& reference = runs.reference_of(i);
    if (reference.lane != runs.reference.lane) {
      throw run::UsageError(fmt::format("--reference: {} is of lane {}, {} of lane {}: pairs of one lane against one "
                                        "reference lane at a time",
                                        o.references[i], reference.lane, o.references.front(), runs.reference.lane));
    }
    runs.repeats.push_back(check::load_receipt(path));
    runs.labels.push_back(paired ? fmt::format("{} (against {})", path, o.references[i]) : path);
    const check::ReceiptData& r = runs.repeats.back();
    if (r.lane != runs.repeats.front().lane) {
      throw run::UsageError(fmt::format("--receipts: {} is of lane {}, {} of lane {}: calibrate one lane at a time", path,
                                        r.lane, o.receipts.front(), runs.repeats.front().lane));
    }
    const std::set<std::string> these = check::budgeted_features(budgets, r, reference);
    if (runs.repeats.size() > 1 && these != features) {
      throw run::UsageError(fmt::format("--receipts: {} composes {} against {}, {} composes {}: one feature set at a time",
                                        path, fmt::join(these, "+"), o.references[paired ? i : 0], o.receipts.front(),
                                        fmt::join(features, "+")));
    }
    features = these;
    // Checks the canary and the step ranges first.
    runs.deviations.push_back(check::metric_deviations(r, reference));
  }
  c.lane = runs.repeats.front().lane;
  c.reference = runs.reference.lane;
  c.repeats = static_cast<int>(runs.repeats.size());
  c.paired = paired;
  c.source = paired ? fmt::format("{} pairs, each receipt against the reference made beside it", receipts)
                    : fmt::format("{} against {}", fmt::join(o.receipts, ", "), o.references.front());
  return runs;
}

// ---- perturbation calibration (--perturb N) -----------------------------------------------

std::string perturb_label(std::int64_t seed) { return fmt::format("perturb seed {}", seed); }

// `receipt`'s own recipe run again into `out`, with its initial weights perturbed under
// `seed` when given: in this process for the harness's engines, through `python3 -m canary_harness
// rerun` for a Python canary.
void rerun_perturbed(const check::ReceiptData& receipt, const std::string& out, std::optional<std::int64_t> seed) {
  std::vector<std::string> python_flags;
  if (seed) python_flags = {"--perturb-init", std::to_string(*seed)};
  const auto perturb = [seed](run::RunOptions& options) { options.perturb_init = seed; };
  rerun_recipe(receipt, out, "--perturb", perturb, python_flags);
}

// The largest deviation per metric and step (over tensors for params_sketch).
std::map<std::string, std::vector<double>> largest_per_step(const std::vector<check::Deviation>& deviations, int steps,
                                                            std::map<std::string, std::vector<double>> into = {}) {
  for (const char* metric : check::kBudgetMetrics) into[metric].resize(static_cast<std::size_t>(steps), 0.0);
  for (const check::Deviation& d : deviations) {
    if (!into.count(d.metric)) continue;  // the held-out evaluation's metrics: not per step
    double& slot = into.at(d.metric).at(static_cast<std::size_t>(d.step));
    slot = std::max(slot, d.deviation);
  }
  return into;
}

// The envelope of runs.repeats (the unperturbed run first, then one per seed) and the
// unperturbed run's drift from the reference.
PerturbationEnvelope envelope_of(const Runs& runs, const std::vector<std::int64_t>& seeds) {
  PerturbationEnvelope e;
  e.seeds = seeds;
  const check::ReceiptData& unperturbed = runs.repeats.front();
  for (std::size_t i = 1; i < runs.repeats.size(); ++i) {
    e.spread = largest_per_step(check::metric_deviations(runs.repeats[i], unperturbed), unperturbed.steps(), e.spread);
  }
  if (!runs.reference.path.empty()) {
    e.drift = largest_per_step(check::metric_deviations(unperturbed, runs.reference), unperturbed.steps());
  }
  return e;
}

// The unperturbed run and `count` perturbed ones (seeds base, base + 1, ...), made by `make`
// into the temporary directory.
Runs perturbed_runs(const CalibrateOptions& o, Runs runs, const check::ReceiptData& unperturbed, Calibration& c,
                    const std::function<void(const check::ReceiptData&, const std::string&, std::int64_t)>& make,
                    const std::function<void(const std::string&)>& progress) {
  const TempDir work;
  runs.repeats.push_back(unperturbed);
  runs.labels.push_back("unperturbed");
  std::vector<std::int64_t> seeds;
  for (int i = 0; i < o.perturb; ++i) {
    seeds.push_back(o.perturb_seed_base + i);
    if (progress) progress(fmt::format("perturbed run {}/{} (seed {})", i + 1, o.perturb, seeds.back()));
    const std::string path = work.file(fmt::format("perturbed-{}.h5", seeds.back()));
    make(unperturbed, path, seeds.back());
    runs.repeats.push_back(check::load_receipt(path));
    runs.labels.push_back(perturb_label(seeds.back()));
  }
  c.repeats = static_cast<int>(runs.repeats.size());
  c.envelope = envelope_of(runs, seeds);
  c.envelope_only = runs.reference.path.empty();
  for (std::size_t i = 0; i < runs.repeats.size() && !c.envelope_only; ++i) {
    runs.deviations.push_back(check::metric_deviations(runs.repeats[i], runs.reference));
  }
  return runs;
}

// --lane L --perturb N: the reference once (unless L is it), L once as it is and N times
// perturbed, each run here by the harness's engines.
Runs perturbed_lane(const CalibrateOptions& o, const Matrix& matrix, const LaneSpec& spec, Calibration& c,
                    const std::function<void(const std::string&)>& progress) {
  if (spec.external() && !spec.python_canary) {
    throw run::UsageError(fmt::format("--perturb: lane {} runs a command ({}) the harness cannot perturb; perturb a "
                                      "lane of the harness's engines or of a Python canary",
                                      spec.id, spec.engine));
  }
  const TempDir work;
  const auto run_here = [&](const LaneSpec& lane, const std::string& path, std::optional<std::int64_t> seed) {
    if (lane.python_canary) {  // `python3 -m canary_harness run ... --perturb-init SEED`
      LaneSpec perturbed = lane;
      if (seed) perturbed.command.insert(perturbed.command.end(), {"--perturb-init", std::to_string(*seed)});
      run_lane(matrix, perturbed, path, {}, o.threads);
      return check::load_receipt(path);
    }
    run::RunOptions options = matrix.run_options(lane, path);
    options.force = true;
    options.threads = o.threads;
    options.trace = run::TraceLevel::kNone;
    options.perturb_init = seed;
    run::run_canary(options);
    return check::load_receipt(path);
  };
  // Every run of a seeded-noise lane replays one noise seed: the spread is the perturbation's alone.
  LaneSpec lane = spec;
  if (const std::string flag = spec.reduction_seed_flag(); !flag.empty() && !lane.settings.options.count(flag)) {
    c.noise_seeds = {o.noise_seed_base};
    lane.settings.options[flag] = std::to_string(o.noise_seed_base);
  }
  Runs runs;
  if (spec.id != matrix.reference) {
    if (progress) progress(fmt::format("reference {}", matrix.reference));
    runs.reference = run_here(matrix.lane(matrix.reference), work.file("reference.h5"), std::nullopt);
  }
  if (progress) progress(fmt::format("{} unperturbed", spec.id));
  const check::ReceiptData unperturbed = run_here(lane, work.file("unperturbed.h5"), std::nullopt);
  return perturbed_runs(o, std::move(runs), unperturbed, c,
                        [&](const check::ReceiptData&, const std::string& path, std::int64_t seed) {
                          run_here(lane, path, seed);
                        },
                        progress);
}

// --receipts R --perturb N [--reference REF]: R as it is and its recipe N times perturbed.
Runs perturbed_receipt(const CalibrateOptions& o, Calibration& c, const std::function<void(const std::string&)>& progress) {
  if (o.receipts.size() != 1) {
    throw run::UsageError("--perturb: give one receipt with --receipts (its recipe is what runs again, perturbed)");
  }
  Runs runs;
  if (!o.references.empty()) runs.reference = check::load_receipt(o.references.front());
  const check::ReceiptData recorded = check::load_receipt(o.receipts.front());
  if (!recorded.complete) {
    throw run::UsageError(fmt::format("--receipts: {} is incomplete (complete = 0); perturb a finished run", recorded.path));
  }
  if (recorded.manifest.count("init_perturbation_seed")) {
    throw run::UsageError(fmt::format("--receipts: {} is itself a perturbed run (init_perturbation_seed {}); give the "
                                      "unperturbed one", recorded.path, recorded.manifest.at("init_perturbation_seed")));
  }
  // The recipe must still make the receipt, bit for bit: otherwise a change of code or host
  // since the run would pass for the perturbations' spread.
  const TempDir work;
  if (progress) progress(fmt::format("rerun of {} (must reproduce it)", recorded.path));
  rerun_perturbed(recorded, work.file("rerun.h5"), std::nullopt);
  require_reproduced(recorded, check::load_receipt(work.file("rerun.h5")), "--receipts", "perturb a fresh run");
  return perturbed_runs(o, std::move(runs), recorded, c, rerun_perturbed, progress);
}

// Windows that follow an envelope step by step for a new entry: 0, 1, 2-3, 4-7, ... (the
// last open), so that a proposal made from N perturbed runs grows with the steps as they do.
std::vector<check::Window> doubling_windows(int steps) {
  std::vector<check::Window> windows;
  for (int first = 0;; first = first == 0 ? 1 : 2 * first) {
    const int last = first == 0 ? 0 : 2 * first - 1;
    if (last >= steps - 1) {
      windows.push_back(check::Window{first, std::numeric_limits<int>::max()});
      return windows;
    }
    windows.push_back(check::Window{first, last});
  }
}

// ---- one-sided drift over the repeats ------------------------------------------------------

// The repeats' one-sided drift in the proposed windows. Perturbation calibration's repeats
// are its perturbed runs (the unperturbed one is not independent of them); the others' are
// all of them (other noise seeds, or receipts made elsewhere).
std::vector<check::DriftBias> one_sided_drift_of(const Runs& runs, const Calibration& c) {
  std::map<std::string, std::vector<check::Window>> windows;
  for (const WindowProposal& w : c.windows) windows[w.metric].push_back(w.proposed);
  const std::size_t first = c.envelope ? 1 : 0;
  std::vector<const check::ReceiptData*> repeats, references;
  for (std::size_t i = first; i < runs.repeats.size(); ++i) {
    repeats.push_back(&runs.repeats[i]);
    references.push_back(&runs.reference_of(i));
  }
  return check::one_sided_drift(repeats, references, windows, check::kBiasAlpha);
}

// ---- each repeat's outcome, in one line ---------------------------------------------------

// The outcome of one repeat under `budgets`: whether it passes, and why in one line.
std::pair<bool, std::string> outcome(const check::ReceiptData& r, const check::ReceiptData& reference,
                                     const check::Budgets& budgets) {
  try {
    const check::Verdict v = check::compare_receipts(r, reference, budgets, "compare");
    return {v.pass(), check::one_line(v)};
  } catch (const check::ContractError& e) {
    if (e.kind != "no_budget") throw;
    return {false, fmt::format("FAIL: {}", e.what())};  // a feature with no entry passes nothing
  }
}

// The candidate's text parsed as the budgets are: a proposal the parser refuses is a bug, and
// no file is written.
check::Budgets parse_candidate(const std::string& text) {
  const TempDir check_dir;
  run::write_file_atomically(check_dir.file("candidate.toml"), text);
  return check::load_budgets(check_dir.file("candidate.toml"));
}

// The lane's detection power (power.h) under the candidate `text`, from a copy of it: the
// candidate itself is written once, with the power in it.
PowerReport power_under(const std::string& text, const CalibrateOptions& o,
                        const std::function<void(const std::string&)>& progress) {
  const TempDir dir;
  run::write_file_atomically(dir.file("candidate.toml"), text);
  PowerOptions power;
  power.matrix_path = o.matrix_path;
  power.budgets_path = dir.file("candidate.toml");
  power.lane = o.lane;
  power.threads = o.threads;
  return measure_power(power, progress);
}

// Each repeat under the current budgets and under the proposal; the held-out ones (the last
// c.held_out) outside the proposal are counted: what the entry's false-alarm bound is made of.
void judge_repeats(const Runs& runs, const check::Budgets& budgets, const check::Budgets& proposed, Calibration& c) {
  for (std::size_t i = 0; i < runs.repeats.size(); ++i) {
    RepeatOutcome r;
    r.held_out = i >= runs.repeats.size() - static_cast<std::size_t>(c.held_out);
    r.label = runs.labels.at(i) + (r.held_out ? " (held out)" : "");
    std::tie(r.passes_now, r.now) = outcome(runs.repeats[i], runs.reference_of(i), budgets);
    std::tie(r.passes_proposed, r.proposed) = outcome(runs.repeats[i], runs.reference_of(i), proposed);
    c.passing_now += r.passes_now ? 1 : 0;
    c.passing_proposed += r.passes_proposed ? 1 : 0;
    c.held_out_outside += r.held_out && !r.passes_proposed ? 1 : 0;
    c.outcomes.push_back(std::move(r));
  }
}

}  // namespace

// --perturb's numbers, before anything runs.
void check_perturbation(const CalibrateOptions& o) {
  if (o.perturb == 0) return;
  if (o.perturb < 1 || o.perturb > 1000) throw run::UsageError("--perturb: must be between 1 and 1000");
  if (o.perturb_seed_base < 0 || o.perturb_seed_base > std::numeric_limits<std::int64_t>::max() - o.perturb) {
    throw run::UsageError("--perturb-seed-base: must be between 0 and 9223372036854775807 - N");
  }
}

namespace {

// The emulated host a receipt ran under, from the numerics env its stack line records ("": none).
std::string receipt_host_variant(const check::ReceiptData& r) {
  const auto toolchain = r.manifest.find("toolchain");
  if (toolchain == r.manifest.end()) return "";
  const std::string prefix = fmt::format("toolchain.{}.", run::kEnvironmentLabel);
  std::map<std::string, std::string> environment;
  for (const auto& [entry, value] : stack_entries("toolchain", toolchain->second)) {
    if (entry.starts_with(prefix)) environment.emplace(entry.substr(prefix.size()), value);
  }
  return host_variant_of(environment);
}

// The hosts the samples ran on: each receipt's CPU model (the real hosts) and, for receipts
// made elsewhere, the emulated host each of them and its reference recorded (runs made here
// under --hosts are named by their variants as given). Receipts that all name one host (or
// none) were not made across hosts: a knob they share is the machine's own environment
// (OPENBLAS_CORETYPE set for every process), and no variant is recorded.
void record_hosts(const CalibrateOptions& o, const Runs& runs, Calibration& c) {
  const auto add = [](std::vector<std::string>& list, const std::string& item) {
    if (std::find(list.begin(), list.end(), item) == list.end()) list.push_back(item);
  };
  std::vector<std::string> hosts;  // "" for a receipt that names none
  for (std::size_t i = 0; i < runs.repeats.size(); ++i) {
    const check::ReceiptData& r = runs.repeats[i];
    if (const auto cpu = r.manifest.find("cpu"); cpu != r.manifest.end()) add(c.host_cpus, cpu->second);
    if (o.receipts.empty()) continue;
    if (!runs.reference_of(i).path.empty()) add(hosts, receipt_host_variant(runs.reference_of(i)));
    add(hosts, receipt_host_variant(r));
  }
  if (hosts.size() < 2) return;
  for (const std::string& host : hosts) {
    if (!host.empty()) add(c.host_variants, host);
  }
}

}  // namespace

Calibration calibrate(const CalibrateOptions& o, const std::function<void(const std::string&)>& progress) {
  check_perturbation(o);
  if (o.power && o.lane.empty()) throw run::UsageError("--power: needs --lane (the lane whose check it measures)");
  const check::Budgets budgets = check::load_budgets(o.budgets_path);
  Calibration c;
  c.widened = o.widen;
  const Runs runs =
      o.receipts.empty() ? runs_of_lane(o, budgets, c, progress) : runs_of_receipts(o, budgets, c, progress);
  if (c.envelope) c.envelope_path = fs::path(c.candidate_path).replace_extension(".envelope.json").string();
  record_hosts(o, runs, c);
  if (c.envelope_only) {  // the reference's own spread: nothing separates it from a reference, nothing to propose
    run::write_file_atomically(c.envelope_path, envelope_json(c).dump(2) + "\n");
    run::write_file_atomically(c.report_path, calibration_report(c));
    return c;
  }
  // The declared features that separate the lane from the reference, each with its entry
  // (the canary's own over the default). A feature without one gets a new entry: no
  // windows yet (it allows nothing), so the proposal covers all it moves; the bitwise
  // rule takes no windows.
  const std::string canary = check::canary_name(runs.reference);
  std::map<std::string, check::FeatureBudget> new_entries;
  std::vector<const check::FeatureBudget*> parts;
  for (const std::string& name : check::budgeted_features(budgets, runs.repeats.front(), runs.reference)) {
    const check::FeatureBudget* entry = budgets.find(name, canary);
    if (!entry) {
      check::FeatureBudget& fresh = new_entries[name];
      // A canary that may not use the default entries gets its own ([tiny.bf16]).
      fresh.name = name;
      fresh.section = budgets.uses_default_entries(canary) ? name : canary + "." + name;
      fresh.rationale = fmt::format("NEW: proposed by harness calibrate from {}; say why {} moves the numbers", c.lane, name);
      entry = &fresh;
    }
    if (entry->bitwise) continue;
    parts.push_back(entry);
    c.composed.push_back(name);
  }
  const check::ReceiptData& lane_run = runs.repeats.front();
  const auto declared = lane_run.manifest.find("budget_features");
  c.feature = choose_feature(o.feature, c.composed, c.lane,
                             declared == lane_run.manifest.end()
                                 ? std::vector<std::string>{}
                                 : receipt::BudgetFeatures::parse(declared->second).names());
  const check::FeatureBudget& current =
      **std::find_if(parts.begin(), parts.end(), [&](const check::FeatureBudget* p) { return p->name == c.feature; });
  c.section = current.key();
  c.new_entry = new_entries.count(c.feature) > 0;
  // The last held_out repeats are held out of the proposal and only checked against it.
  const std::size_t proposing = runs.repeats.size() - static_cast<std::size_t>(c.held_out);
  const std::vector<std::vector<check::Deviation>> proposal = runs.per_repeat_of_first(proposing);
  c.metrics = measured_metrics(proposal);
  propose_windows(parts, current, runs, proposal, c);

  const std::string budgets_text = run::read_file(o.budgets_path);
  const auto candidate = [&] { return splice_section(budgets_text, c.section, section_toml(current, c), c.new_entry); };
  judge_repeats(runs, budgets, parse_candidate(candidate()), c);
  if (o.power) c.power = power_under(candidate(), o, progress);
  // The held-out samples' count and the power are known only now: the candidate is made
  // again with them.
  const std::string candidate_text = candidate();
  parse_candidate(candidate_text);
  c.bias = one_sided_drift_of(runs, c);
  c.bias_fails = current.bias_fails;
  run::write_file_atomically(c.candidate_path, candidate_text);
  if (c.envelope) run::write_file_atomically(c.envelope_path, envelope_json(c).dump(2) + "\n");
  run::write_file_atomically(c.report_path, calibration_report(c));
  return c;
}

namespace {

// Steps 0, 1, 2, 4, 8, ... and the last: where an envelope's growth shows.
std::vector<int> sample_steps(int steps) {
  std::vector<int> picked;
  for (int s = 0; s < steps; s = s == 0 ? 1 : 2 * s) picked.push_back(s);
  if (steps > 0 && picked.back() != steps - 1) picked.push_back(steps - 1);
  return picked;
}

std::string envelope_section(const Calibration& c) {
  const PerturbationEnvelope& e = *c.envelope;
  std::string text = fmt::format(
      "## Perturbation envelope\n\nMethod: perturbation, N = {} runs of {} with every initial weight moved one "
      "ulp (seeds {}..{}). Statistic: per step, the largest |perturbed - unperturbed| over the N runs (params_sketch: "
      "over the tensors too): the divergence a bitwise-irrelevant change is entitled to.{}\n\n",
      e.seeds.size(), c.lane, e.seeds.front(), e.seeds.back(),
      e.drift.empty() ? "" : fmt::format(" Drift: the unperturbed run against {}, per step, and its ratio to the envelope.",
                                         c.reference));
  const bool drift = !e.drift.empty();
  text += "| step |";
  for (const char* metric : check::kBudgetMetrics) {
    text += drift ? fmt::format(" {0} envelope | {0} drift | ratio |", metric) : fmt::format(" {} envelope |", metric);
  }
  text += "\n|---|";
  for (std::size_t i = 0; i < std::size(check::kBudgetMetrics); ++i) text += drift ? "---|---|---|" : "---|";
  text += "\n";
  const auto& any = e.spread.at(check::kBudgetMetrics[0]);
  for (int step : sample_steps(static_cast<int>(any.size()))) {
    text += fmt::format("| {} |", step);
    for (const char* metric : check::kBudgetMetrics) {
      const double spread = e.spread.at(metric).at(static_cast<std::size_t>(step));
      text += fmt::format(" {:.3g} |", spread);
      if (!drift) continue;
      const double moved = e.drift.at(metric).at(static_cast<std::size_t>(step));
      const std::string ratio = spread > 0 ? fmt::format("{:.3g}", moved / spread) : (moved > 0 ? "inf" : "-");
      text += fmt::format(" {:.3g} | {} |", moved, ratio);
    }
    text += "\n";
  }
  return text + fmt::format("\nEvery step: {}.\n", c.envelope_path);
}

}  // namespace

// One-sided drift, per metric and proposed window, and what the entry makes of it.
std::string bias_section(const Calibration& c) {
  if (c.bias.empty()) return "";
  std::string text = fmt::format(
      "\nOne-sided drift over the repeats (per metric and window, each repeat's mean signed residual; "
      "family-wise level {}; bias = \"{}\" in [{}]):\n\n",
      check::kBiasAlpha, c.bias_fails ? "fail" : "warn", c.section);
  for (const check::DriftBias& b : c.bias) text += fmt::format("- {}\n", check::drift_bias_line(b));
  return text;
}

std::string false_alarm_summary(const Calibration& c) {
  if (c.held_out == 0) return "";
  constexpr double kTighterRate = 0.05;  // the claim the summary says the cost of
  const double bound = check::false_alarm_upper_bound(c.held_out_outside, c.held_out);
  const std::string tighter =
      bound > kTighterRate ? fmt::format("; below {:.0f}% needs {} held out, none outside", 100 * kTighterRate,
                                         check::held_out_samples_needed(kTighterRate))
                           : "";
  return fmt::format("{} of {} held-out samples outside the proposal: false-alarm rate below {:.3g}% at {:.0f}% "
                     "confidence{}",
                     c.held_out_outside, c.held_out, 100 * bound, 100 * check::kFalseAlarmConfidence, tighter);
}

bool Calibration::biased() const {
  return std::any_of(bias.begin(), bias.end(), [](const check::DriftBias& b) { return b.biased; });
}

std::string calibration_report(const Calibration& c) {
  if (c.envelope_only) {
    return fmt::format("# Perturbation envelope of {}\n\n{} is the reference: nothing separates it from one, so "
                       "nothing is proposed.\n\n{}",
                       c.lane, c.lane, envelope_section(c));
  }
  const std::string repeats =
      c.source == "runs" ? fmt::format("{} repeats of {} against {}", c.repeats, c.lane, c.reference)
      : c.envelope       ? fmt::format("{} runs of {} (1 unperturbed, {} perturbed) against {}", c.repeats, c.lane,
                                       c.envelope->seeds.size(), c.reference)
                         : fmt::format("{} receipts of {} against {} ({})", c.repeats, c.lane, c.reference, c.source);
  std::string text = fmt::format(
      "# Calibration of [{}]{}\n\n{}{}.\nMethod: {}.\nComposed budget: {}; the other features keep their "
      "share and [{}] gets the rest, times each window's margin, at least {} fp32 ulps{}.\n\n",
      c.section, c.new_entry ? " (a new entry: write its rationale)" : "", repeats,
      c.noise_seeds.empty() ? "" : fmt::format(" (noise seeds {}..{})", c.noise_seeds.front(), c.noise_seeds.back()),
      method_text(c), fmt::join(c.composed, " + "), c.section, kFloorUlps,
      c.widened ? ", and no term below the current entry's (--widen)" : "");
  if (c.provisional()) {
    text += fmt::format("**Provisional**: {} samples, fewer than {} (docs/budgets.md, \"Samples\"); check and the nightly "
                        "say so until [{}] is recalibrated from {} or more.\n\n",
                        c.samples, check::kMinCalibrationSamples, c.section, check::kMinCalibrationSamples);
  }
  text += "| metric | steps | largest deviation | margin | current | proposed |\n|---|---|---|---|---|---|\n";
  for (const WindowProposal& w : c.windows) {
    const std::string largest = w.samples == 0 ? "none: no step of the repeats is in it, kept as it is"
                                               : fmt::format("{:.3g}", w.observed);
    const std::string anchor = w.current.from_decisions_part ? " from the decisions' part" : "";
    const std::string margin = w.samples == 0                  ? "-"
                               : w.current.from_decisions_part ? fmt::format("{:.3g} (the largest flip)", w.margin)
                                                               : fmt::format("{:.3g}", w.margin);
    text += fmt::format("| {} | {} | {} | {} | `{}` | `{}` |\n", w.metric, window_steps(w.current) + anchor, largest, margin,
                        window_toml(w.current), window_toml(w.proposed));
  }
  text += "\nEach repeat, under the current budgets (now) and the proposal:\n\n";
  for (const RepeatOutcome& r : c.outcomes) text += fmt::format("- {}: now {}; proposed {}\n", r.label, r.now, r.proposed);
  text += fmt::format("\nRepeats within the current budgets: {}/{}; within the proposal: {}/{}.\n", c.passing_now, c.repeats,
                      c.passing_proposed, c.repeats);
  if (c.held_out > 0) text += fmt::format("\nFalse alarms: {}.\n", false_alarm_summary(c));
  text += bias_section(c);
  text += fmt::format("Candidate: {}. Review it, then replace canaries/budgets.toml with it in a reviewed change.\n",
                      c.candidate_path);
  if (c.envelope) text += "\n" + envelope_section(c);
  if (c.power) {
    text += fmt::format("\n## Detection power under the proposal\n\n{}```\n{}```\n",
                        c.power->too_loose().value_or(false) ? "**Too loose**: the proposal misses a 1e-4 scale of a layer within its run.\n\n"
                                             : "",
                        power_text(*c.power));
  }
  return text;
}

}  // namespace harness::nightly
