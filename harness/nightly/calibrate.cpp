#include "calibrate.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <variant>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "canary_run.h"
#include "file_io.h"
#include "lane_run.h"
#include "matrix.h"
#include "registry.h"
#include "stack_info.h"
#include "verdict.h"

namespace harness::nightly {
namespace {

namespace fs = std::filesystem;

inline constexpr double kMargin = 1.5;     // proposals cover the largest need times this
inline constexpr double kFloorUlps = 4;    // and never allow less than this many fp32 ulps
// The feature a multi-feature lane calibrates by default: the most specific it has.
inline constexpr const char* kFeaturePriority[] = {"fp8-limited", "fp8", "mesh-bf16", "bf16", "mesh-fp32", "noise"};

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

// The proposal for one window: the current window's shape (its atol : rtol : ulp)
// scaled so that every observed deviation, less what the other features allow, fits
// with the margin; at least kFloorUlps ulps of the largest reference value. A window that
// no step of the repeats falls in (short runs, a window of later steps) keeps its current
// values: nothing was measured there, and a floor-sized proposal would fail every run
// that reaches those steps.
WindowProposal propose(const std::string& metric, const check::Window& current, const std::vector<check::Deviation>& deviations,
                       const check::ComposedBudget& others, bool widen) {
  WindowProposal p{metric, current, current, 0, 0, 0};
  double largest_reference = 0, largest_excess = 0;
  for (const check::Deviation& d : deviations) {
    if (d.metric != metric || d.step < current.first || d.step > current.last) continue;
    ++p.samples;
    const double excess = std::max(0.0, d.deviation - others.allowed(metric, d.step, d.reference));
    const double unit = current.atol + current.rtol * std::fabs(d.reference) + current.ulp * check::fp32_ulp(d.reference);
    p.observed = std::max(p.observed, d.deviation);
    largest_reference = std::max(largest_reference, std::fabs(d.reference));
    largest_excess = std::max(largest_excess, excess);
    if (unit > 0) p.needed_scale = std::max(p.needed_scale, excess / unit);
  }
  if (p.samples == 0) return p;  // proposed = current
  const bool shaped = current.atol > 0 || current.rtol > 0 || current.ulp > 0;
  p.proposed.atol = shaped ? kMargin * p.needed_scale * current.atol : kMargin * largest_excess;
  p.proposed.rtol = shaped ? kMargin * p.needed_scale * current.rtol : 0;
  p.proposed.ulp = shaped ? kMargin * p.needed_scale * current.ulp : 0;
  p.proposed.atol = std::max(p.proposed.atol, kFloorUlps * check::fp32_ulp(largest_reference));
  if (widen) {  // each term at least the current one: the hosts it was measured on stay covered
    p.proposed.atol = std::max(p.proposed.atol, current.atol);
    p.proposed.rtol = std::max(p.proposed.rtol, current.rtol);
    p.proposed.ulp = std::max(p.proposed.ulp, current.ulp);
  }
  return p;
}

std::string section_toml(const check::FeatureBudget& f, const Calibration& c) {
  std::string text = fmt::format("[{}]\nform = \"tolerance\"\nrationale = {}\n", f.key(), toml_string(f.rationale));
  if (!f.across_platforms.empty()) text += fmt::format("across_platforms = {}\n", toml_string(f.across_platforms));
  text += fmt::format("calibrated = \"{}\"\nrepeats = {}\n", run::utc_timestamp().substr(0, 10), c.repeats);
  std::vector<std::string> observed;
  for (const char* metric : check::kBudgetMetrics) {
    // Widened: the entry keeps the largest spread any of its calibrations saw.
    const auto before = f.provenance.observed.find(metric);
    const double seen = c.widened && before != f.provenance.observed.end() ? std::max(before->second, c.observed.at(metric))
                                                                           : c.observed.at(metric);
    observed.push_back(fmt::format("{} = {}", metric, number(seen)));
  }
  text += fmt::format("observed = {{ {} }}\n", fmt::join(observed, ", "));
  for (const char* metric : check::kBudgetMetrics) {
    std::vector<std::string> windows;
    for (const WindowProposal& w : c.windows) {
      if (w.metric == metric) windows.push_back(window_toml(w.proposed));
    }
    text += fmt::format("{} = [ {} ]\n", metric, fmt::join(windows, ", "));
  }
  if (f.outlier_fraction > 0) text += fmt::format("outlier_fraction = {}\n", f.outlier_fraction);
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

std::string choose_feature(const std::string& wanted, const std::vector<std::string>& composed, const std::string& lane) {
  if (!wanted.empty()) {
    if (std::find(composed.begin(), composed.end(), wanted) == composed.end()) {
      throw run::UsageError(fmt::format("--feature: {} is not a feature of {} against the reference (features: {})", wanted,
                                        lane, fmt::join(composed, ", ")));
    }
    return wanted;
  }
  for (const char* f : kFeaturePriority) {
    if (std::find(composed.begin(), composed.end(), f) != composed.end()) return f;
  }
  if (composed.size() == 1) return composed.front();  // a feature of another stack (torch-bf16, ...)
  if (composed.empty()) {
    throw run::UsageError(fmt::format("lane {} has no feature to calibrate: it is bitwise against the reference", lane));
  }
  throw run::UsageError(fmt::format("--feature: {} composes {}; name the one to calibrate", lane, fmt::join(composed, ", ")));
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "harness-calibrate-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw run::FileError("cannot create a temporary directory for the calibration runs");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
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

struct Runs {
  check::ReceiptData reference;
  std::vector<check::ReceiptData> repeats;
  std::vector<check::Deviation> deviations;
};

// Whether the lane's engine declares seeded noise (its manifest setting noise_mode): each
// run then draws a reduction order, and a noise-seed replays one.
bool declares_seeded_noise(const LaneSpec& spec) {
  if (spec.external()) return false;  // torch and command lanes: no harness engine, no noise seed
  const auto attributes = make_engine(spec.engine, spec.settings)->manifest_attributes();
  const auto mode = attributes.find("noise_mode");
  return mode != attributes.end() && std::holds_alternative<std::string>(mode->second) &&
         std::get<std::string>(mode->second) == "seeded";
}

// The reference once, the lane `repeats` times (seeded lanes: a new noise seed each).
Runs run_repeats(const CalibrateOptions& o, const Matrix& matrix, const LaneSpec& spec, Calibration& c,
                 const std::function<void(const std::string&)>& progress) {
  const bool seeded = declares_seeded_noise(spec);
  const TempDir work;
  if (progress) progress(fmt::format("reference {}", matrix.reference));
  run_lane(matrix, matrix.lane(matrix.reference), work.file("reference.h5"), {}, o.threads);
  // An external lane's repeats read one canary pack.
  const std::string pack = spec.external() ? export_matrix_pack(matrix, work.file("canary-pack.h5")) : "";
  Runs runs{check::load_receipt(work.file("reference.h5")), {}, {}};
  for (int i = 0; i < o.repeats; ++i) {
    LaneSpec repeat = spec;
    if (seeded) {
      c.noise_seeds.push_back(o.noise_seed_base + i);
      repeat.settings.options["noise-seed"] = std::to_string(c.noise_seeds.back());
    }
    if (progress) progress(fmt::format("repeat {}/{} of {}", i + 1, o.repeats, spec.id));
    const std::string path = work.file(fmt::format("repeat-{}.h5", i));
    run_lane(matrix, repeat, path, {}, o.threads, pack);
    runs.repeats.push_back(check::load_receipt(path));
    const auto d = check::metric_deviations(runs.repeats.back(), runs.reference);
    runs.deviations.insert(runs.deviations.end(), d.begin(), d.end());
  }
  return runs;
}

// Every window of the feature's entry, per metric (one open window when it has none).
void propose_windows(const std::vector<const check::FeatureBudget*>& parts, const check::FeatureBudget& current,
                     const Runs& runs, Calibration& c) {
  std::vector<const check::FeatureBudget*> other_parts;
  for (const check::FeatureBudget* part : parts) {
    if (part != &current) other_parts.push_back(part);
  }
  const check::ComposedBudget others(other_parts);
  for (const char* metric : check::kBudgetMetrics) {
    const auto it = current.metrics.find(metric);
    const bool none = it == current.metrics.end() || it->second.empty();
    for (const check::Window& w : none ? std::vector<check::Window>{check::Window{}} : it->second) {
      c.windows.push_back(propose(metric, w, runs.deviations, others, c.widened));
      c.observed[metric] = std::max(c.observed[metric], c.windows.back().observed);
    }
  }
}

// The lane's repeats, run here: the matrix's reference once and the lane `repeats` times.
Runs runs_of_lane(const CalibrateOptions& o, const check::Budgets& budgets, Calibration& c,
                  const std::function<void(const std::string&)>& progress) {
  if (o.repeats < 1 || o.repeats > 1000) throw run::UsageError("--repeats: must be between 1 and 1000");
  const Matrix matrix = load_matrix(o.matrix_path);
  const auto chosen = select_lanes(matrix, o.lane, "--lane");
  if (o.lane.empty() || chosen.size() != 1) throw run::UsageError("--lane: name one lane of the matrix (its id or name)");
  const LaneSpec& spec = *chosen.front();
  if (spec.id == matrix.reference) throw run::UsageError(fmt::format("--lane: {} is the reference lane itself", spec.id));
  const bool declared = std::find(spec.budget_features.begin(), spec.budget_features.end(), o.feature) !=
                        spec.budget_features.end();
  if (!o.feature.empty() && !budgets.describes(o.feature) && !declared) {
    throw run::UsageError(fmt::format("--feature: {} is not a feature of {} nor one {} declares", o.feature,
                                      o.budgets_path, spec.id));
  }
  choose_outputs(o, c);
  c.lane = spec.lane;
  c.reference = matrix.lane(matrix.reference).lane;
  c.repeats = o.repeats;
  c.source = "runs";
  return run_repeats(o, matrix, spec, c, progress);
}

// Receipts written elsewhere as the repeats, each judged against the reference receipt:
// every one must be of one lane and compose the same features against it.
Runs runs_of_receipts(const CalibrateOptions& o, const check::Budgets& budgets, Calibration& c) {
  if (!o.lane.empty()) throw run::UsageError("--lane: give either --lane (runs here) or --receipts (runs made elsewhere)");
  if (o.reference.empty()) throw run::UsageError("--receipts: name the receipt they are judged against with --reference");
  if (o.receipts.size() > 1000) throw run::UsageError("--receipts: at most 1000 receipts");
  choose_outputs(o, c);
  Runs runs{check::load_receipt(o.reference), {}, {}};
  std::set<std::string> features;
  for (const std::string& path : o.receipts) {
    runs.repeats.push_back(check::load_receipt(path));
    const check::ReceiptData& r = runs.repeats.back();
    if (r.lane != runs.repeats.front().lane) {
      throw run::UsageError(fmt::format("--receipts: {} is of lane {}, {} of lane {}: calibrate one lane at a time", path,
                                        r.lane, o.receipts.front(), runs.repeats.front().lane));
    }
    const std::set<std::string> these = check::budgeted_features(budgets, r, runs.reference);
    if (runs.repeats.size() > 1 && these != features) {
      throw run::UsageError(fmt::format("--receipts: {} composes {} against {}, {} composes {}: one feature set at a time",
                                        path, fmt::join(these, "+"), o.reference, o.receipts.front(),
                                        fmt::join(features, "+")));
    }
    features = these;
    const auto d = check::metric_deviations(r, runs.reference);  // checks the canary and the step ranges first
    runs.deviations.insert(runs.deviations.end(), d.begin(), d.end());
  }
  c.lane = runs.repeats.front().lane;
  c.reference = runs.reference.lane;
  c.repeats = static_cast<int>(runs.repeats.size());
  c.source = fmt::format("{} against {}", fmt::join(o.receipts, ", "), o.reference);
  return runs;
}

}  // namespace

Calibration calibrate(const CalibrateOptions& o, const std::function<void(const std::string&)>& progress) {
  const check::Budgets budgets = check::load_budgets(o.budgets_path);
  Calibration c;
  c.widened = o.widen;
  const Runs runs = o.receipts.empty() ? runs_of_lane(o, budgets, c, progress) : runs_of_receipts(o, budgets, c);
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
  c.feature = choose_feature(o.feature, c.composed, c.lane);
  const check::FeatureBudget& current =
      **std::find_if(parts.begin(), parts.end(), [&](const check::FeatureBudget* p) { return p->name == c.feature; });
  c.section = current.key();
  c.new_entry = new_entries.count(c.feature) > 0;
  propose_windows(parts, current, runs, c);

  // Validated before it is written: a proposal the parser refuses is a bug, and no file.
  const std::string candidate_text =
      splice_section(run::read_file(o.budgets_path), c.section, section_toml(current, c), c.new_entry);
  const TempDir check_dir;
  run::write_file_atomically(check_dir.file("candidate.toml"), candidate_text);
  const check::Budgets proposed = check::load_budgets(check_dir.file("candidate.toml"));
  // A feature with no entry (before, or another one still without) passes nothing.
  const auto passes = [&](const check::ReceiptData& r, const check::Budgets& b) {
    try {
      return check::compare_receipts(r, runs.reference, b, "compare").pass();
    } catch (const check::ContractError& e) {
      if (e.kind != "no_budget") throw;
      return false;
    }
  };
  for (const check::ReceiptData& r : runs.repeats) {
    c.passing_now += passes(r, budgets) ? 1 : 0;
    c.passing_proposed += passes(r, proposed) ? 1 : 0;
  }
  run::write_file_atomically(c.candidate_path, candidate_text);
  run::write_file_atomically(c.report_path, calibration_report(c));
  return c;
}

std::string calibration_report(const Calibration& c) {
  const std::string repeats =
      c.source == "runs" ? fmt::format("{} repeats of {} against {}", c.repeats, c.lane, c.reference)
                         : fmt::format("{} receipts of {} against {} ({})", c.repeats, c.lane, c.reference, c.source);
  std::string text = fmt::format(
      "# Calibration of [{}]{}\n\n{}{}.\nComposed budget: {}; the other features keep their "
      "share and [{}] gets the rest, times {}, at least {} fp32 ulps{}.\n\n",
      c.section, c.new_entry ? " (a new entry: write its rationale)" : "", repeats,
      c.noise_seeds.empty() ? "" : fmt::format(" (noise seeds {}..{})", c.noise_seeds.front(), c.noise_seeds.back()),
      fmt::join(c.composed, " + "), c.section, kMargin, kFloorUlps,
      c.widened ? ", and no term below the current entry's (--widen)" : "");
  text += "| metric | steps | largest deviation | current | proposed |\n|---|---|---|---|---|\n";
  for (const WindowProposal& w : c.windows) {
    const std::string largest = w.samples == 0 ? "none: no step of the repeats is in it, kept as it is"
                                               : fmt::format("{:.3g}", w.observed);
    text += fmt::format("| {} | {} | {} | `{}` | `{}` |\n", w.metric, window_steps(w.current), largest,
                        window_toml(w.current), window_toml(w.proposed));
  }
  text += fmt::format("\nRepeats within the current budgets: {}/{}; within the proposal: {}/{}.\n", c.passing_now, c.repeats,
                      c.passing_proposed, c.repeats);
  text += fmt::format("Candidate: {}. Review it, then replace canaries/budgets.toml with it in a reviewed change.\n",
                      c.candidate_path);
  return text;
}

}  // namespace harness::nightly
