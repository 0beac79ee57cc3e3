#include "verdict.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "false_alarm.h"
#include "receipt/aten_trace.h"
#include "receipt/budget_features.h"
#include "receipt/hdf5_file.h"
#include "receipt/receipt_reader.h"
#include "receipt/receipt_schema.h"
#include "receipt/receipt_validator.h"
#include "run/full_receipt_schema.h"

namespace harness::check {
namespace {

namespace paths = receipt::paths;

// Every dataset of the receipt the description gives a gate (validated: float64 already).
std::map<std::string, ReceiptData::GatedCounter> read_gated_counters(const receipt::ReceiptReader& r) {
  std::map<std::string, ReceiptData::GatedCounter> out;
  for (const h5::DatasetInfo& d : h5::list_datasets(r.file())) {
    const ReceiptDataset* described = run::full_receipt_schema().dataset(d.path);
    if (described && described->gate != CounterGate::kNone) out[d.path] = {described->gate, h5::read_f64(r.file(), d.path)};
  }
  return out;
}

// Every dataset of the receipt the description gives a decision record, with its columns.
std::map<std::string, ReceiptData::DecisionSeries> read_decisions(const receipt::ReceiptReader& r) {
  std::map<std::string, ReceiptData::DecisionSeries> out;
  for (const h5::DatasetInfo& d : h5::list_datasets(r.file())) {
    const ReceiptDataset* described = run::full_receipt_schema().dataset(d.path);
    if (!described || described->decision == DecisionRecord::kNone || described->columns.empty()) continue;
    out[d.path] = {described->decision, h5::read_strings(r.file(), described->columns), h5::read_f64(r.file(), d.path)};
  }
  return out;
}

// The value of the manifest attribute the description gives `role`, when the receipt has one.
std::optional<std::string> attribute_with_role(const ReceiptData& r, AttributeRole role) {
  for (const ReceiptAttribute& a : run::full_receipt_schema().entries().attributes) {
    if (a.role != role || !a.path.starts_with("/manifest/")) continue;
    const auto it = r.manifest.find(a.path.substr(a.path.rfind('/') + 1));
    if (it != r.manifest.end()) return it->second;
  }
  return std::nullopt;
}

// The name of a counter for reports: its dataset's last segment (/memory/total -> total).
std::string counter_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// One metric's per-step deviations and allowances, and the verdict they give.
class SeriesJudge {
 public:
  SeriesJudge(std::string metric, int steps, double outlier_fraction)
      : ratios_(static_cast<std::size_t>(steps), 0.0), judged_(static_cast<std::size_t>(steps), false) {
    v_.metric = std::move(metric);
    v_.step_deviation.assign(static_cast<std::size_t>(steps), 0.0);
    v_.step_allowed.assign(static_cast<std::size_t>(steps), 0.0);
    v_.allowed_outliers = static_cast<int>(std::floor(outlier_fraction * steps));
  }

  // A deviation at `step` against what the budget allows there (0: must be exact).
  void add(int step, double deviation, double allowed, const std::string& where = "") {
    double ratio = deviation == 0 ? 0 : allowed > 0 ? deviation / allowed : std::numeric_limits<double>::infinity();
    if (std::isnan(ratio) || std::isnan(deviation)) ratio = std::numeric_limits<double>::infinity();  // NaN never passes
    const auto at = static_cast<std::size_t>(step);
    if (!judged_[at] || ratio > ratios_[at]) {  // the step's worst place so far
      v_.step_deviation[at] = deviation;
      v_.step_allowed[at] = allowed;
    }
    judged_[at] = true;
    ratios_[at] = std::max(ratios_[at], ratio);
    if (v_.worst_step < 0 || ratio > worst_ratio_) {
      worst_ratio_ = ratio;
      v_.worst_step = step;
      v_.max_deviation = deviation;
      v_.allowed = allowed;
      v_.worst_tensor = where;
    }
  }

  MetricVerdict finish() {
    int unexcusable = 0;  // a NaN, or a move where the budget is exact: never an outlier
    for (std::size_t s = 0; s < ratios_.size(); ++s) {
      if (ratios_[s] > 1) {
        if (v_.first_failing_step < 0) v_.first_failing_step = static_cast<int>(s);
        ++v_.failing_steps;
        unexcusable += std::isinf(ratios_[s]) ? 1 : 0;
      }
    }
    v_.pass = unexcusable == 0 && v_.failing_steps <= v_.allowed_outliers;
    // Headroom at the worst step that counts: the allowed outliers are set aside.
    std::vector<double> sorted = ratios_;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    const auto counted = static_cast<std::size_t>(v_.allowed_outliers);
    const double ratio = counted < sorted.size() ? sorted[counted] : 0;
    // -infinity when a NaN or an exact budget broke (JSON: null): no outlier excuses those.
    v_.headroom_pct = unexcusable > 0 ? -std::numeric_limits<double>::infinity() : (1 - ratio) * 100;
    if (v_.worst_step < 0) v_.worst_step = 0;
    return v_;
  }

 private:
  MetricVerdict v_;
  std::vector<double> ratios_;
  std::vector<bool> judged_;
  double worst_ratio_ = 0;
};

// A held-out logit metric no entry of the budget bounds: its largest value and that step,
// reported and judged against nothing.
MetricVerdict reported_only(const char* metric, const EvalComparison& c) {
  MetricVerdict m;
  m.metric = metric;
  m.judged = false;
  for (std::size_t i = 0; i < c.steps.size(); ++i) {
    if (m.worst_step < 0 || c.distances[i].value(metric) > m.max_deviation) {
      m.worst_step = c.steps[i];
      m.max_deviation = c.distances[i].value(metric);
    }
  }
  return m;
}

// The held-out logits (docs/logit-kl.md) at the steps both runs evaluated: under a bitwise
// budget every logit bit for bit (a KL of exactly 0); otherwise each metric the budget's
// entries bound, and the others reported unjudged.
void judge_logits(const ReceiptData& run, const ReceiptData& ref, const ComposedBudget& budget, Verdict& v) {
  const EvalComparison c = compare_evals(run.eval, ref.eval);
  if (run.eval || ref.eval) v.logits_not_compared = c.not_compared;
  if (c.steps.empty()) return;
  const int length = std::max(run.steps(), c.steps.back() + 1);
  for (const char* metric : kEvalMetrics) {
    if (!v.bitwise && !budget.bounds(metric)) {
      v.metrics.push_back(reported_only(metric, c));
      continue;
    }
    SeriesJudge judge(metric, length, 0.0);
    for (std::size_t i = 0; i < c.steps.size(); ++i) {
      const LogitDistance& d = c.distances[i];
      const double value = d.value(metric);
      if (v.bitwise) {
        // Any differing bit fails, even where the metric rounds to 0 (a top-1 that held).
        judge.add(c.steps[i], d.identical ? 0.0 : std::max(value, std::numeric_limits<double>::denorm_min()), 0.0);
      } else {
        judge.add(c.steps[i], value, budget.allowed(metric, c.steps[i], 0.0));
      }
    }
    v.metrics.push_back(judge.finish());
  }
}

MetricVerdict judge_scalar(const std::string& metric, const std::vector<double>& run, const std::vector<double>& ref,
                           const ComposedBudget& budget, bool bitwise) {
  SeriesJudge judge(metric, static_cast<int>(run.size()), bitwise ? 0 : budget.outlier_fraction());
  for (std::size_t s = 0; s < run.size(); ++s) {
    const int step = static_cast<int>(s);
    if (bitwise || !std::isfinite(run[s]) || !std::isfinite(ref[s])) {
      judge.add(step, same_bits(run[s], ref[s]) ? 0 : std::fabs(run[s] - ref[s]), 0);
    } else {
      judge.add(step, std::fabs(run[s] - ref[s]), budget.allowed(metric, step, ref[s]));
    }
  }
  return judge.finish();
}

SketchDistance sketch_distance(const ReceiptData& run, const ReceiptData& ref, int step, std::size_t tensor) {
  const std::size_t w = receipt::kSketchWidth;
  const std::size_t at = (static_cast<std::size_t>(step) * run.tensors.size() + tensor) * w;
  return check::sketch_distance(std::span(run.params_sketch).subspan(at, w), std::span(ref.params_sketch).subspan(at, w));
}

// Per tensor: the Euclidean distance of the parameter sketches against rtol * |reference
// sketch| + atol; a step is as bad as its worst tensor.
MetricVerdict judge_sketches(const ReceiptData& run, const ReceiptData& ref, const ComposedBudget& budget) {
  SeriesJudge judge("params_sketch", run.steps(), budget.outlier_fraction());
  for (int s = 0; s < run.steps(); ++s) {
    for (std::size_t t = 0; t < run.tensors.size(); ++t) {
      const SketchDistance d = sketch_distance(run, ref, s, t);
      judge.add(s, d.distance, budget.allowed("params_sketch", s, d.reference_norm), run.tensors[t]);
    }
  }
  return judge.finish();
}

// Bitwise lanes: every hash of every family must match.
MetricVerdict judge_hashes(const ReceiptData& run, const ReceiptData& ref) {
  SeriesJudge judge("hashes", run.steps(), 0);
  const std::size_t k = run.tensors.size();
  for (int s = 0; s < run.steps(); ++s) {
    int differing = 0;
    std::string first;
    for (const char* family : receipt::kHashFamilies) {
      const auto& a = run.hashes.at(family);
      const auto& b = ref.hashes.at(family);
      for (std::size_t t = 0; t < k; ++t) {
        if (a[static_cast<std::size_t>(s) * k + t] == b[static_cast<std::size_t>(s) * k + t]) continue;
        if (first.empty()) first = fmt::format("{} {}", family, run.tensors[t]);
        ++differing;
      }
    }
    judge.add(s, differing, 0, first);
  }
  return judge.finish();
}

std::optional<TensorMove> most_moved(const ReceiptData& run, const ReceiptData& ref) {
  std::optional<TensorMove> best;
  for (int s = 0; s < run.steps(); ++s) {
    for (std::size_t t = 0; t < run.tensors.size(); ++t) {
      const SketchDistance d = sketch_distance(run, ref, s, t);
      const double relative = d.reference_norm > 0 ? d.distance / d.reference_norm : d.distance;
      if (relative > 0 && (!best || relative > best->distance)) best = TensorMove{"params", run.tensors[t], s, relative};
    }
  }
  return best;
}

// A compiled lane's own counters (tpu-mesh, torch_xla, JAX): no compile after the canary's
// warm-up, no host sync at all.
void judge_compile_stability(const ReceiptData& run, const CompileStabilityBudget& budget,
                             std::vector<MetricVerdict>& out) {
  SeriesJudge compiles("compile_stability.uncached_compiles", run.steps(), 0);
  SeriesJudge syncs("compile_stability.host_syncs", run.steps(), 0);
  bool gated = false;
  for (const auto& [path, counter] : run.counters) {
    const bool after_warmup = counter.gate == CounterGate::kCompilesAfterWarmup;
    if (!after_warmup && counter.gate != CounterGate::kHostSyncs) continue;
    gated = true;
    SeriesJudge& judge = after_warmup ? compiles : syncs;
    const double allowed = after_warmup ? budget.max_uncached_compiles : budget.max_host_syncs;
    for (int s = after_warmup ? budget.warmup_steps : 0; s < run.steps(); ++s) {
      const double v = counter.values[static_cast<std::size_t>(s)];
      judge.add(s, v > allowed ? v : 0, allowed);
    }
  }
  if (!gated) return;
  // A held-out evaluation compiles its forward-only program once; every later one reuses it.
  if (run.eval) {
    for (std::size_t i = 1; i < run.eval->compiles.size(); ++i) {
      // The last evaluation, after the last step, counts at the last step.
      const int step = std::min(static_cast<int>(run.eval->steps[i]), run.steps() - 1);
      const double v = run.eval->compiles[i];
      compiles.add(step, v > budget.max_uncached_compiles ? v : 0, budget.max_uncached_compiles);
    }
  }
  out.push_back(compiles.finish());
  out.push_back(syncs.finish());
}

// Per-device peak bytes by category against the golden's.
void judge_memory(const ReceiptData& run, const ReceiptData& golden, const MemoryBudget& budget,
                  std::vector<MetricVerdict>& out) {
  for (const auto& [path, golden_counter] : golden.counters) {
    if (golden_counter.gate != CounterGate::kPeakBytes) continue;
    const std::vector<double>& golden_peaks = golden_counter.values;
    const auto it = run.counters.find(path);
    if (it == run.counters.end() || it->second.values.size() != golden_peaks.size()) {
      throw ContractError("memory", fmt::format("{} records {} for another mesh (or not at all) than its golden; "
                                                "compare runs of one mesh",
                                                run.path, path));
    }
    const std::vector<double>& peaks = it->second.values;
    SeriesJudge judge("memory." + counter_name(path), run.steps(), 0);
    const std::size_t devices = peaks.size() / static_cast<std::size_t>(std::max(1, run.steps()));
    for (int s = 0; s < run.steps(); ++s) {
      for (std::size_t d = 0; d < devices; ++d) {
        const std::size_t at = static_cast<std::size_t>(s) * devices + d;
        judge.add(s, std::fabs(peaks[at] - golden_peaks[at]), budget.rtol * golden_peaks[at], fmt::format("device{}", d));
      }
    }
    out.push_back(judge.finish());
  }
}

std::vector<StackDifference> stack_diff(const ReceiptData& a, const ReceiptData& b) {
  std::set<std::string> keys;
  for (const auto& [k, v] : a.manifest) keys.insert(k);
  for (const auto& [k, v] : b.manifest) keys.insert(k);
  std::vector<StackDifference> out;
  for (const std::string& k : keys) {
    // created_utc always differs; run_options repeats the keys that say what differs
    if (k == "created_utc" || k == "run_options") continue;
    const auto ia = a.manifest.find(k), ib = b.manifest.find(k);
    const std::string va = ia == a.manifest.end() ? kAbsent : ia->second;
    const std::string vb = ib == b.manifest.end() ? kAbsent : ib->second;
    if (va != vb) out.push_back({k, va, vb, ia == a.manifest.end() || ib == b.manifest.end()});
  }
  return out;
}

bool is_noisy(const ReceiptData& r) {
  const std::optional<std::string> order = attribute_with_role(r, AttributeRole::kReductionOrder);
  return order == kSeededOrder || order == kRacyOrder;
}

// Every series as long as the steps (times tensors, sketch width, devices): a receipt
// whose datasets disagree is refused, never read past its end.
void check_shapes(const ReceiptData& d) {
  const std::size_t n = d.loss.size(), k = d.tensors.size();
  auto expect = [&](std::size_t got, std::size_t want, const std::string& what) {
    if (got != want) {
      throw receipt::ReceiptError(fmt::format("{}: {} holds {} values where {} steps need {}; the receipt is damaged",
                                              d.path, what, got, n, want));
    }
  };
  expect(d.grad_norm.size(), n, paths::kGradNorm);
  expect(d.batch_hashes.size(), n, paths::kBatchHash);
  for (const auto& [family, hashes] : d.hashes) expect(hashes.size(), n * k, paths::hashes(family));
  expect(d.params_sketch.size(), n * k * receipt::kSketchWidth, paths::sketch_projection("params"));
  for (const auto& [path, counter] : d.counters) {
    if (n == 0 || counter.values.size() % n != 0) expect(counter.values.size(), n, path);
  }
  for (const auto& [path, series] : d.decisions) expect(series.values.size(), n * series.columns.size(), path);
  if (d.trace) {
    const std::size_t r = d.trace->columns.size();
    expect(d.trace->hashes.size(), n * r, paths::kTraceHash);
    expect(d.trace->l2.size(), n * r, paths::kTraceL2);
    expect(d.trace->projection.size(), n * r * receipt::kSketchWidth, paths::kTraceProjection);
  }
}

std::optional<OpTrace> read_trace(const receipt::ReceiptReader& r) {
  if (!h5::exists(r.file(), paths::kTrace)) return std::nullopt;
  const hid_t f = r.file();
  const std::vector<std::int64_t> op_index = h5::read_i64(f, paths::kTraceOpIndex);
  const std::vector<std::int64_t> layer = h5::read_i64(f, paths::kTraceLayer);
  const std::vector<std::string> op = h5::read_strings(f, paths::kTraceOp);
  const std::vector<std::string> phase = h5::read_strings(f, paths::kTracePhase);
  const std::vector<std::string> tensor = h5::read_strings(f, paths::kTraceTensor);
  const std::vector<std::string> kind = h5::read_strings(f, paths::kTraceKind);
  for (std::size_t size : {layer.size(), op.size(), phase.size(), tensor.size(), kind.size()}) {
    if (size != op_index.size()) {
      throw receipt::ReceiptError(fmt::format("{}: /trace columns disagree in length; the receipt is damaged", r.path()));
    }
  }
  OpTrace t;
  for (std::size_t c = 0; c < op_index.size(); ++c) {
    t.columns.push_back({static_cast<int>(op_index[c]), op[c], static_cast<int>(layer[c]), phase[c], tensor[c], kind[c]});
  }
  t.hashes = h5::read_u64(f, paths::kTraceHash);
  t.l2 = h5::read_f64(f, paths::kTraceL2);
  t.projection = h5::read_f64(f, paths::kTraceProjection);
  return t;
}

}  // namespace

ReceiptData load_receipt(const std::string& path) {
  // Whoever wrote it, a receipt is judged only once it validates: one gate, the same for
  // our engines and for any other stack, and every byte checksummed before it counts.
  receipt::require_valid_receipt(path, run::full_receipt_schema());
  const receipt::ReceiptReader r(path);
  ReceiptData d;
  d.path = path;
  d.manifest = r.manifest_text();
  d.lane = r.manifest_string("lane");
  d.engine = r.manifest_string("engine");
  d.complete = r.complete();
  d.loss = r.f64(paths::kLoss);
  d.grad_norm = r.f64(paths::kGradNorm);
  d.batch_hashes = r.batch_hashes();
  d.tensors = r.tensor_names();
  for (const char* family : receipt::kHashFamilies) d.hashes[family] = r.hashes(family);
  d.params_sketch = h5::read_f64(r.file(), paths::sketch_projection("params"));
  d.counters = read_gated_counters(r);
  d.decisions = read_decisions(r);
  d.trace = read_trace(r);
  d.aten_trace = receipt::has_aten_traces(r);
  d.eval = read_eval(r);
  check_shapes(d);
  return d;
}

SketchDistance sketch_distance(std::span<const double> run, std::span<const double> reference) {
  double d2 = 0, r2 = 0;
  for (std::size_t i = 0; i < run.size(); ++i) {
    const double a = run[i], b = reference[i];
    d2 += (a - b) * (a - b);
    r2 += b * b;
  }
  return {std::sqrt(d2), std::sqrt(r2)};
}

std::set<std::string> budget_features(const ReceiptData& r, bool golden) {
  const auto it = r.manifest.find("budget_features");
  if (it == r.manifest.end()) {
    throw ContractError(
        "no_budget_features",
        golden ? fmt::format("{}: the golden of lane {} declares no budget_features (recorded before receipts declared "
                             "them); re-record it: `harness golden refresh --lanes {} --reason TEXT`, then approve it",
                             r.path, r.lane, r.lane)
               : fmt::format("{}: the receipt declares no budget_features in /manifest (docs/budgets.md); re-record it "
                             "with a writer that declares them",
                             r.path));
  }
  try {
    return receipt::BudgetFeatures::parse(it->second).as_set();
  } catch (const std::invalid_argument& e) {  // validate_receipt refuses these first
    throw ContractError("receipt", fmt::format("{}: /manifest/budget_features {}", r.path, e.what()));
  }
}

std::string canary_name(const ReceiptData& r) {
  const auto it = r.manifest.find("canary");
  const nlohmann::json j = nlohmann::json::parse(it == r.manifest.end() ? "{}" : it->second, nullptr, false);
  for (const char* key : {"name", "preset"}) {
    if (j.is_object() && j.contains(key) && j[key].is_string()) return j[key].get<std::string>();
  }
  return r.lane.substr(0, r.lane.find('/'));
}

bool replays_of_each_other(const ReceiptData& a, const ReceiptData& b) {
  if (!is_noisy(a) && !is_noisy(b)) return true;
  const auto sa = attribute_with_role(a, AttributeRole::kReductionSeed);
  return sa && sa == attribute_with_role(b, AttributeRole::kReductionSeed);
}

std::set<std::string> features_between(const ReceiptData& a, const ReceiptData& b, std::string* reason,
                                       bool b_is_golden) {
  const std::set<std::string> fa = budget_features(a), fb = budget_features(b, b_is_golden);
  const bool replays = replays_of_each_other(a, b);
  std::set<std::string> chosen;
  std::string why = "the features that separate the two lanes";
  if (replays) {
    std::set_symmetric_difference(fa.begin(), fa.end(), fb.begin(), fb.end(), std::inserter(chosen, chosen.end()));
  }
  // Independent roundings, or two configurations of one engine (another mesh, plan or FP8
  // recipe sums in another order): every feature of both lanes.
  if (!replays || (chosen.empty() && a.lane != b.lane)) {
    std::set_union(fa.begin(), fa.end(), fb.begin(), fb.end(), std::inserter(chosen, chosen.end()));
    why = replays ? "all features of both lanes: two configurations of one engine"
                  : "all features of both lanes: the runs do not make the same roundings (noise)";
  }
  if (reason) *reason = why;
  return chosen;
}

namespace {

// The first manifest attribute that says two receipts' numbers came from different
// machines or software ("" when none does): the CPU, the toolchain, the library versions
// and the kernel settings (threads, deterministic algorithms) the writer recorded.
std::string platform_difference(const ReceiptData& a, const ReceiptData& b) {
  const auto value = [](const ReceiptData& r, const char* key) {
    const auto it = r.manifest.find(key);
    return it == r.manifest.end() ? std::string() : it->second;
  };
  for (const char* key : {"cpu", "toolchain", "libraries", "kernels"}) {
    if (value(a, key) != value(b, key)) return fmt::format("{} '{}' vs '{}'", key, value(a, key), value(b, key));
  }
  return "";
}

}  // namespace

std::set<std::string> budgeted_features(const Budgets& budgets, const ReceiptData& a, const ReceiptData& b,
                                        std::string* reason, bool b_is_golden) {
  std::string why;
  std::set<std::string> chosen = features_between(a, b, &why, b_is_golden);
  // Both sides ran one canary definition (check_contracts), so `a`'s name keys the entries.
  const std::string canary = canary_name(a);
  // A feature whose bits depend on the machine, declared by both receipts, brings its
  // cross-platform budget when they come from different platforms (a golden recorded on
  // another CPU). One side alone is held by the feature's own entry, which covers every host.
  if (const std::string difference = platform_difference(a, b); !difference.empty()) {
    const std::set<std::string> fa = budget_features(a), fb = budget_features(b, b_is_golden);
    std::vector<std::string> both;
    std::set_intersection(fa.begin(), fa.end(), fb.begin(), fb.end(), std::back_inserter(both));
    for (const std::string& name : both) {
      const FeatureBudget* entry = budgets.find(name, canary);
      if (!entry || entry->across_platforms.empty()) continue;
      why = fmt::format("{}{} for {} across platforms ({})", chosen.empty() ? "" : why + "; ", entry->across_platforms,
                        name, difference);
      chosen.insert(entry->across_platforms);
    }
  }
  if (reason) *reason = why;
  return chosen;
}

ComposedBudget budget_between(const Budgets& budgets, const ReceiptData& a, const ReceiptData& b, bool b_is_golden) {
  std::string reason;
  const std::set<std::string> chosen = budgeted_features(budgets, a, b, &reason, b_is_golden);
  const std::string canary = canary_name(a);
  std::vector<const FeatureBudget*> parts;
  std::vector<std::string> missing;  // [canary.name] entries the canary needs and lacks
  for (const std::string& name : chosen) {
    const FeatureBudget* entry = budgets.find(name, canary);
    if (!entry && !budgets.features.count(name)) {
      throw ContractError("no_budget", fmt::format("no budget for feature '{}' in {}: calibrate one", name, budgets.path));
    }
    if (!entry) missing.push_back(fmt::format("[{}.{}]", canary, name));
    parts.push_back(entry);
  }
  if (!missing.empty()) {
    throw ContractError("no_budget",
                        fmt::format("no budget for canary '{}' in {}: {} missing; the default entries are for {} "
                                    "([default-entries]); calibrate the canary's own (harness calibrate) or list it there",
                                    canary, budgets.path, fmt::join(missing, ", "),
                                    budgets.default_entry_canaries.empty()
                                        ? std::string("no canary")
                                        : fmt::format("{}", fmt::join(budgets.default_entry_canaries, ", "))));
  }
  ComposedBudget budget(std::move(parts), std::move(reason));
  if (const auto part = decisions_part(a, b)) budget.set_decisions_part(part->step);
  return budget;
}

namespace {

// The canary definitions' keys that differ; `steps` is the step range's own error.
std::vector<std::string> canary_differences(const ReceiptData& a, const ReceiptData& b) {
  const auto definition = [](const ReceiptData& r) {
    const auto it = r.manifest.find("canary");
    nlohmann::json j = nlohmann::json::parse(it == r.manifest.end() ? "{}" : it->second, nullptr, false);
    if (!j.is_object()) throw ContractError("receipt", fmt::format("{}: manifest attribute canary is not a JSON object", r.path));
    j.erase("steps");
    return j;
  };
  const nlohmann::json da = definition(a), db = definition(b);
  std::vector<std::string> keys;
  for (const auto& [key, value] : da.items()) {
    if (!db.contains(key) || db[key] != value) keys.push_back(key);
  }
  for (const auto& [key, value] : db.items()) {
    if (!da.contains(key)) keys.push_back(key);
  }
  return keys;
}

}  // namespace

void check_contracts(const ReceiptData& a, const ReceiptData& b) {
  if (const auto keys = canary_differences(a, b); !keys.empty()) {
    throw ContractError("another_canary",
                        fmt::format("{} ({}) and {} ({}) ran different canaries (they differ in {}); compare receipts "
                                    "of one canary definition",
                                    a.path, a.lane, b.path, b.lane, fmt::join(keys, ", ")));
  }
  const auto seed = [](const ReceiptData& r) { return r.manifest.count("seed") ? r.manifest.at("seed") : ""; };
  if (seed(a) != seed(b)) {
    throw ContractError("another_seed", fmt::format("{} and {} start from different initial parameters (--seed {} vs {}); "
                                                    "compare runs of one seed",
                                                    a.path, b.path, seed(a), seed(b)));
  }
  for (const ReceiptData* r : {&a, &b}) {
    if (!r->complete) {
      throw ContractError("incomplete", fmt::format("{}: the run stopped after {} steps (complete = 0); rerun it",
                                                    r->path, r->steps()));
    }
  }
  if (a.steps() != b.steps()) {
    throw ContractError("step_range", fmt::format("{} has {} steps and {} has {}; compare receipts of the same --steps",
                                                  a.path, a.steps(), b.path, b.steps()));
  }
  if (a.tensors != b.tensors) {
    throw ContractError("tensors", fmt::format("{} and {} record different tensors", a.path, b.path));
  }
  for (int s = 0; s < a.steps(); ++s) {
    const auto i = static_cast<std::size_t>(s);
    if (a.batch_hashes[i] != b.batch_hashes[i]) {
      throw ContractError("different_data",
                          fmt::format("different data: the batch of step {} differs ({:016x} in {}, {:016x} in {}); "
                                      "the runs did not see the same tokens, so their numerics cannot be compared",
                                      s, a.batch_hashes[i], a.path, b.batch_hashes[i], b.path));
    }
  }
}

std::vector<std::string> compared_decision_records(const ReceiptData& a, const ReceiptData& b) {
  std::vector<std::string> paths;
  for (const auto& [path, series] : a.decisions) {
    const auto other = b.decisions.find(path);
    if (series.record == DecisionRecord::kHash && other != b.decisions.end() && other->second.columns == series.columns)
      paths.push_back(path);
  }
  return paths;
}

std::optional<DecisionsPart> decisions_part(const ReceiptData& a, const ReceiptData& b) {
  std::optional<DecisionsPart> first;
  for (const std::string& path : compared_decision_records(a, b)) {
    const ReceiptData::DecisionSeries& series = a.decisions.at(path);
    const auto other = b.decisions.find(path);
    const std::size_t width = series.columns.size();
    for (int s = 0; s < std::min(a.steps(), b.steps()) && (!first || s < first->step); ++s) {
      for (std::size_t c = 0; c < width; ++c) {
        const std::size_t at = static_cast<std::size_t>(s) * width + c;
        if (same_bits(series.values[at], other->second.values[at])) continue;
        first = DecisionsPart{s, series.columns[c], path};
        break;
      }
    }
  }
  return first;
}

std::vector<Deviation> metric_deviations(const ReceiptData& run, const ReceiptData& ref) {
  check_contracts(run, ref);
  const std::optional<DecisionsPart> part = decisions_part(run, ref);
  const std::optional<int> part_step = part ? std::optional<int>(part->step) : std::nullopt;
  std::vector<Deviation> out;
  for (int s = 0; s < run.steps(); ++s) {
    const auto i = static_cast<std::size_t>(s);
    const int since = steps_since_part(s, part_step);
    out.push_back({"loss", s, std::fabs(run.loss[i] - ref.loss[i]), ref.loss[i], "", since});
    out.push_back({"grad_norm", s, std::fabs(run.grad_norm[i] - ref.grad_norm[i]), ref.grad_norm[i], "", since});
    for (std::size_t t = 0; t < run.tensors.size(); ++t) {
      const SketchDistance d = sketch_distance(run, ref, s, t);
      out.push_back({"params_sketch", s, d.distance, d.reference_norm, run.tensors[t], since});
    }
  }
  // The held-out logits: each distance is itself the deviation, from a reference of 0.
  const EvalComparison evals = compare_evals(run.eval, ref.eval);
  for (std::size_t i = 0; i < evals.steps.size(); ++i) {
    const int step = evals.steps[i];
    const int since = steps_since_part(step, part_step);
    for (const char* metric : kEvalMetrics) {
      const double resolution = LogitDistance::resolution(metric, ref.eval->targets.size());
      out.push_back({metric, step, evals.distances[i].value(metric), 0.0, "", since, resolution});
    }
  }
  return out;
}

std::optional<TensorMove> first_moved(const ReceiptData& run, const ReceiptData& ref) {
  const std::size_t k = run.tensors.size();
  for (int s = 0; s < run.steps(); ++s) {
    for (const char* family : receipt::kHashFamilies) {
      for (std::size_t t = 0; t < k; ++t) {
        const std::size_t at = static_cast<std::size_t>(s) * k + t;
        if (run.hashes.at(family)[at] != ref.hashes.at(family)[at]) return TensorMove{family, run.tensors[t], s, 0};
      }
    }
  }
  return std::nullopt;
}

bool Verdict::pass() const {
  return std::all_of(metrics.begin(), metrics.end(), [](const MetricVerdict& m) { return m.pass; });
}

std::optional<double> Verdict::false_alarm_bound() const {
  if (bitwise) return 0.0;
  std::vector<double> bounds;
  for (const auto& [key, samples] : budget_samples) {
    const auto bound = budget_false_alarm.find(key);
    if (bound == budget_false_alarm.end()) return std::nullopt;
    bounds.push_back(bound->second);
  }
  return any_false_alarm_bound(bounds);
}

const MetricVerdict* Verdict::first_failure() const {
  const MetricVerdict* first = nullptr;
  for (const MetricVerdict& m : metrics) {
    if (!m.pass && (!first || m.first_failing_step < first->first_failing_step)) first = &m;
  }
  return first;
}

Verdict compare_receipts(const ReceiptData& run, const ReceiptData& ref, const Budgets& budgets,
                         const std::string& kind) {
  check_contracts(run, ref);
  Verdict v;
  v.kind = kind;
  v.a_path = run.path;
  v.b_path = ref.path;
  v.a_lane = run.lane;
  v.b_lane = ref.lane;
  v.steps = run.steps();
  const ComposedBudget budget = budget_between(budgets, run, ref, kind == "golden");
  v.bitwise = budget.bitwise();
  v.budget = budget.names();
  v.budget_reason = budget.reason();
  for (const FeatureBudget* f : budget.parts()) {
    if (!f->bitwise) v.budget_samples[f->key()] = f->samples();
  }
  for (const FeatureBudget* f : budget.provisional_parts()) v.provisional.push_back(f->key());
  for (const FeatureBudget* f : budget.parts()) {
    if (const auto bound = f->false_alarm_bound(); bound && !f->bitwise) v.budget_false_alarm[f->key()] = *bound;
  }
  v.decisions_part = decisions_part(run, ref);
  v.metrics.push_back(judge_scalar("loss", run.loss, ref.loss, budget, v.bitwise));
  v.metrics.push_back(judge_scalar("grad_norm", run.grad_norm, ref.grad_norm, budget, v.bitwise));
  v.metrics.push_back(v.bitwise ? judge_hashes(run, ref) : judge_sketches(run, ref, budget));
  judge_logits(run, ref, budget, v);
  judge_compile_stability(run, budgets.compile_stability_of(canary_name(run)), v.metrics);
  if (kind == "golden") judge_memory(run, ref, budgets.memory, v.metrics);
  v.first_moved = first_moved(run, ref);
  v.most_moved = most_moved(run, ref);
  v.stack = stack_diff(run, ref);
  return v;
}

}  // namespace harness::check
