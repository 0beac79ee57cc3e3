// Comparing two receipts: the contracts first (same schema, canary, step range and data),
// then every metric under a composed budget, with the details a person needs to act on a
// failure. docs/budgets.md and docs/cli.md ("check", "compare") describe the verdict.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "budgets.h"
#include "logit_compare.h"
#include "receipt/receipt_writer.h"

namespace harness::check {

// Two receipts that cannot be compared: another canary, an incomplete run, a different
// step range, different data. `kind` names it for --json ("different_data", ...).
struct ContractError : std::runtime_error {
  ContractError(std::string error_kind, const std::string& message)
      : std::runtime_error(message), kind(std::move(error_kind)) {}
  std::string kind;
};

// Op traces (/trace, `--trace ops`): the traced outputs, then per step one row of hashes
// and sketches. A replay that traces one step gives a trace of one row; so does a golden's
// stored aten trace of one step (/aten_trace).
inline constexpr const char* kOpsLevel = "ops";    // module outputs (/trace, a harness engine's replay)
inline constexpr const char* kAtenLevel = "aten";  // aten op outputs (a Python canary's replay, /aten_trace)
struct OpTrace {
  std::vector<receipt::TraceColumn> columns;
  std::vector<std::uint64_t> hashes;  // (rows, columns)
  std::vector<double> l2, projection;  // (rows, columns), (rows, columns, sketch width)
  std::vector<std::string> sites;      // per column, the code's file:line where known (aten traces); else empty
  std::string level = kOpsLevel;       // only traces of one level compare

  int rows() const { return columns.empty() ? 0 : static_cast<int>(hashes.size() / columns.size()); }
};

// What a comparison reads of one receipt.
struct ReceiptData {
  std::string path, lane, engine;
  std::map<std::string, std::string> manifest;  // every attribute, as text
  bool complete = false;
  std::vector<double> loss, grad_norm;
  std::vector<std::uint64_t> batch_hashes;
  std::vector<std::string> tensors;                               // canonical order
  std::map<std::string, std::vector<std::uint64_t>> hashes;       // family -> (steps, tensors)
  std::vector<double> params_sketch;                              // (steps, tensors, width)
  // The per-step counters a verdict gates, by dataset path (/compile/UncachedCompile,
  // /memory/total, ...): which gate the description gives each, and its (steps) or
  // (steps, columns) values. The verdict finds them by gate, never by name.
  struct GatedCounter {
    CounterGate gate = CounterGate::kNone;
    std::vector<double> values;
  };
  std::map<std::string, GatedCounter> counters;
  // The datasets that record discrete decisions (DecisionRecord: moe's routing), by path:
  // the record, the deciding ops (the columns) and the (steps, columns) values. bisect
  // finds them by record, never by name.
  struct DecisionSeries {
    DecisionRecord record = DecisionRecord::kNone;
    std::vector<std::string> columns;
    std::vector<double> values;
  };
  std::map<std::string, DecisionSeries> decisions;
  std::optional<OpTrace> trace;                                   // /trace, when the run traced ops
  bool aten_trace = false;  // /aten_trace: a golden's aten traces of every step (read a step at a time by bisect)
  std::optional<EvalRecord> eval;                                 // /eval, when the run evaluated a held-out batch

  int steps() const { return static_cast<int>(loss.size()); }
};
ReceiptData load_receipt(const std::string& path);  // throws receipt::ReceiptError

// The features the receipt declares (/manifest budget_features, '+'-joined): what moves its
// lane away from the bitwise reference, by the names of the budgets file's entries
// ("noise", "bf16", "mesh-fp32", "torch-cpu", ...); empty for a lane that rounds like
// cpu-ref. Never inferred: a receipt that declares nothing (written before schema 1.2)
// throws ContractError "no_budget_features" naming the file (a golden: how to re-record it).
std::set<std::string> budget_features(const ReceiptData& receipt, bool golden = false);
// The canary a receipt ran, as budgets key it ([tiny.bf16]): the canary JSON's `name`,
// else its `preset`, else the lane's prefix before '/'.
std::string canary_name(const ReceiptData& receipt);
// Whether two runs make the same roundings: both deterministic, or seeded with one seed.
bool replays_of_each_other(const ReceiptData& a, const ReceiptData& b);
// The composition rule on the declared names (docs/budgets.md): the features that separate
// the two lanes; all features of both when the runs are not replays of each other (or are
// two configurations of one engine). `reason`, when given, says which case it was.
std::set<std::string> features_between(const ReceiptData& a, const ReceiptData& b, std::string* reason = nullptr,
                                       bool b_is_golden = false);
// features_between(a, b), plus the cross-platform feature (`across_platforms` of its
// entry) of every machine-dependent feature both declare when the receipts come from
// different platforms (cpu, toolchain, libraries or kernels differ): the names a
// comparison of the two is budgeted by. `reason`, when given, says why.
std::set<std::string> budgeted_features(const Budgets& budgets, const ReceiptData& a, const ReceiptData& b,
                                        std::string* reason = nullptr, bool b_is_golden = false);
// The budget of budgeted_features(a, b). Each feature's entry is
// the canary's own ([tiny.bf16]) over the default ([bf16]); a feature with neither throws
// ContractError "no_budget" (never a silent bitwise comparison). `b_is_golden`: b is a
// golden, for the re-recording advice when it declares no features. Its windows
// `from_decisions_part` count from decisions_part(a, b).
ComposedBudget budget_between(const Budgets& budgets, const ReceiptData& a, const ReceiptData& b,
                              bool b_is_golden = false);

// Where two runs' recorded decisions first part: the first step, then the first column, at
// which a decision hash both record (DecisionRecord::kHash, same columns) differs.
struct DecisionsPart {
  int step = 0;
  std::string column;        // the op that decided otherwise ("blocks.1.moe.route")
  std::string hash_dataset;  // "/routing/decisions_hash"
};
std::optional<DecisionsPart> decisions_part(const ReceiptData& a, const ReceiptData& b);
// The decision hash datasets both record with the same columns: what decisions_part compares.
std::vector<std::string> compared_decision_records(const ReceiptData& a, const ReceiptData& b);

struct MetricVerdict {
  std::string metric;
  bool pass = true;
  int first_failing_step = -1;  // -1: none
  int worst_step = -1;
  double max_deviation = 0;   // at the worst step
  double allowed = 0;         // the budget at the worst step
  double headroom_pct = 100;  // of the budget left at the worst step that counts (100: untouched)
  int failing_steps = 0;
  int allowed_outliers = 0;
  std::string worst_tensor;   // params_sketch, hashes, memory: which tensor or device
  // false: no entry of the budget bounds this metric (an /eval metric, kEvalMetrics), so it
  // is reported and never fails.
  bool judged = true;
  // Per step, the deviation and allowance where the step came closest to (or went past)
  // its budget: the envelope the reports draw, as the verdict judged it (0, 0 where a step
  // is not judged, e.g. a compile in the warm-up).
  std::vector<double> step_deviation, step_allowed;
};

struct TensorMove {
  std::string family, tensor;
  int step = -1;
  double distance = 0;  // relative sketch distance (most moved)
};

// The value a stack difference gives the side that lacks the manifest key.
inline constexpr const char* kAbsent = "(absent)";

// One manifest line that differs. A setting only one side has (an engine's own, such as
// accel's noise_mode against cpu-ref) is one-sided: expected when the engines differ.
struct StackDifference {
  std::string key, a, b;
  bool one_sided = false;
};

struct Verdict {
  std::string kind;  // "golden" or "compare"
  std::string a_path, b_path, a_lane, b_lane;
  std::vector<std::string> budget;  // the composed features ("reference" when bitwise)
  bool bitwise = false;
  std::string budget_reason;        // why these features
  // Each composed tolerance entry's samples, and those from fewer than kMinCalibrationSamples
  // (provisional, in the budget's order): docs/budgets.md, "Samples".
  std::map<std::string, int> budget_samples;
  std::vector<std::string> provisional;
  // Each composed tolerance entry's false-alarm bound, for those calibrated with held-out
  // samples (docs/budgets.md, "False alarms").
  std::map<std::string, double> budget_false_alarm;
  // This check's: the sum of its entries' bounds, capped at 1 (any of them may be the one that
  // fails); 0 when bitwise; nullopt when an entry has no held-out samples.
  std::optional<double> false_alarm_bound() const;
  std::optional<DecisionsPart> decisions_part;  // where the runs' decisions part (windows from it apply)
  int steps = 0;
  std::vector<MetricVerdict> metrics;
  std::optional<TensorMove> first_moved, most_moved;
  std::vector<StackDifference> stack;
  std::string triage;  // BF16-first triage of an fp8 failure, when evaluated
  // Why the runs' held-out logits were not compared, when one of them has /eval but they
  // cannot be ("" when they were, or when neither evaluated).
  std::string logits_not_compared;

  bool pass() const;
  const MetricVerdict* first_failure() const;
};

// `run` against `reference` (a golden, or another lane): contracts, then the metrics.
// Throws ContractError when the two cannot be compared.
Verdict compare_receipts(const ReceiptData& run, const ReceiptData& reference, const Budgets& budgets,
                         const std::string& kind);

// How far one metric moved at one step (and tensor, for params_sketch): |run - reference|
// and the reference magnitude a budget's rtol and ulp scale with. Calibration reads these.
struct Deviation {
  std::string metric;
  int step = 0;
  double deviation = 0, reference = 0;
  std::string tensor;  // params_sketch: the tensor; "" for the scalar metrics
  int since_decisions_part = kDecisionsNeverPart;  // steps since the runs' decisions parted
  // The metric's smallest nonzero value, where it moves in steps (top1_mismatch: one of the
  // recorded tokens); 0 for a continuous one. A proposed budget never goes below it.
  double resolution = 0;
};
// Every budgeted metric (kBudgetMetrics) at every step, then the held-out evaluation's
// (kEvalMetrics) at every step both runs evaluated; the contracts must hold.
std::vector<Deviation> metric_deviations(const ReceiptData& run, const ReceiptData& reference);

// Two value sketches (docs/receipt-schema.md, "Sketches"): how far apart, and the size
// of the reference's, which a budget's rtol scales with.
struct SketchDistance {
  double distance = 0;        // |run - reference|
  double reference_norm = 0;  // |reference|
};
SketchDistance sketch_distance(std::span<const double> run, std::span<const double> reference);

// The first hash that differs: the earliest step, then the families in receipt order
// (params, grads, adam_m, adam_v), then the tensors in canonical order. nullopt: none.
std::optional<TensorMove> first_moved(const ReceiptData& run, const ReceiptData& reference);

// The data contract and comparability alone (the first thing every comparison does).
void check_contracts(const ReceiptData& a, const ReceiptData& b);

}  // namespace harness::check
