// Per-feature determinism budgets (canaries/budgets.toml; docs/budgets.md is the reference).
//
// Every feature that moves a lane's numbers away from the reference lane has one entry
// ([bf16], or [tiny.bf16] for one canary): how far each metric may move, per step window,
// with its rationale and provenance. Two receipts are compared under the sum of the
// entries of the features they declare and that separate them (check::budget_between).
#pragma once

#include <limits>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace harness::check {

// A budgets file that cannot be used: the message names the file and the key.
struct BudgetError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The metrics a tolerance budget bounds, per step.
inline constexpr const char* kBudgetMetrics[] = {"loss", "grad_norm", "params_sketch"};
// The metrics of the held-out evaluation (/eval, check/logit_compare.h), per evaluation
// step: KL(reference || run), max |d log p(target)|, the fraction of tokens whose top-1
// differs. An entry may leave them out: a comparison whose tolerance entries do not all
// bound one reports it unjudged (ComposedBudget::bounds).
inline constexpr const char* kEvalMetrics[] = {"logit_kl", "logprob_delta", "top1_mismatch"};

// Steps first..last (inclusive) may move by atol + rtol * |reference| + ulp fp32 spacings
// of the reference value. A window `from_decisions_part` counts its steps from the first
// step at which the two runs' recorded decisions part (a MoE's routing: a token moved to
// another expert) and never applies to runs whose decisions do not part: it brings in what
// a moved decision does only once one moved, on top of the entry's other windows.
struct Window {
  int first = 0;
  int last = std::numeric_limits<int>::max();
  double atol = 0, rtol = 0, ulp = 0;
  bool from_decisions_part = false;

  // Whether the window covers `step`; `since_part` is step - the step the decisions parted
  // at, or kDecisionsNeverPart.
  bool covers(int step, int since_part) const;
  // How far it lets a value move from `reference`.
  double allowance(double reference) const;
};
inline constexpr int kDecisionsNeverPart = -1;
// `step` - `part` from the step the decisions parted at on, else kDecisionsNeverPart.
inline int steps_since_part(int step, std::optional<int> part) {
  return part && step >= *part ? step - *part : kDecisionsNeverPart;
}
// What `windows` allow at `step` (the decisions parted `since_part` steps before) from `reference`.
double windows_allowance(const std::vector<Window>& windows, int step, int since_part, double reference);
// The value of a window's `from` key that anchors it to the decisions' part.
inline constexpr const char* kFromDecisionsPart = "decisions-part";

// An entry calibrated from fewer independent samples of the lane's deviation from the
// reference (runs, receipts or perturbed runs) is provisional: its windows are a guess at
// the spread, not a measure of it (issue 47; docs/budgets.md, "Samples"). Calibrate and
// check share this one number.
inline constexpr int kMinCalibrationSamples = 8;

struct Provenance {
  std::string calibrated;                 // date, or "" for a rule (bitwise) entry
  int repeats = 0;                        // `repeats`, the key files written before `samples` have
  int samples = 0;                        // `samples`, else `repeats`: the independent runs measured
  std::map<std::string, double> observed;  // largest observed spread per metric
  std::string method;                      // how it was calibrated: runs, receipts or perturbation ("" : not said)
  // Samples held out of the proposal and checked against it (calibrate --held-out), and how
  // many of them the entry failed: what its false-alarm bound is made from (0: none held out).
  int held_out = 0;
  int held_out_outside = 0;
  // The emulated hosts its samples ran under (calibrate --hosts, docs/budgets.md "Hosts"), and
  // the real CPUs (receipts' `cpu`) they ran on: what the entry was checked across.
  std::vector<std::string> host_variants, host_cpus;
};

struct FeatureBudget {
  std::string name;
  bool bitwise = false;  // form = "bitwise": nothing may move
  std::map<std::string, std::vector<Window>> metrics;
  double outlier_fraction = 0;  // of the steps, per metric, allowed outside the budget
  std::string rationale;
  Provenance provenance;
  std::string section;  // its table in the file: "bf16", or "tiny.bf16" for one canary's ("": name)
  // A feature whose bits depend on the machine (a real stack's CPU kernels): the feature
  // that budgets two receipts of it from different platforms ("" when the bits are portable).
  std::string across_platforms = {};
  // bias = "fail": one-sided drift over a calibration's repeats fails it (calibrate exits 1);
  // by default it is a warning (check/drift_bias.h, docs/budgets.md "One-sided drift").
  bool bias_fails = false;
  // triage_twin = "bf16-only" ([fp8]): a lane that declares this feature and fails is
  // triaged by its twin, the same lane without the feature (BF16-first triage,
  // check/bf16_first.h); the words name the twin in the advice. "" where triage explains
  // nothing of the feature.
  std::string triage_twin = {};

  const std::string& key() const { return section.empty() ? name : section; }
  int samples() const { return provenance.samples; }
  // A tolerance entry from fewer than kMinCalibrationSamples samples; the rule never is.
  bool provisional() const { return !bitwise && samples() < kMinCalibrationSamples; }
  // The upper bound on how often it fails a bitwise-irrelevant change, at
  // kFalseAlarmConfidence, from its held-out samples (false_alarm.h); nullopt when none were
  // held out. The bitwise rule's is 0: a deterministic lane's bits move only when something did.
  std::optional<double> false_alarm_bound() const;
};

// Checks of a tpu-mesh lane's own counters (form: counts after the warm-up steps).
struct CompileStabilityBudget {
  int warmup_steps = 1;
  double max_uncached_compiles = 0;  // per step after the warm-up
  double max_host_syncs = 0;         // per step, every step
};

// Per-device peak bytes against the golden's, per category.
struct MemoryBudget {
  double rtol = 0;
};

struct Budgets {
  std::string path;
  std::map<std::string, FeatureBudget> features;                            // [name]: every canary
  std::map<std::string, std::map<std::string, FeatureBudget>> per_canary;   // canary -> [canary.name]
  CompileStabilityBudget compile_stability;
  // [NAME.compile-stability]: a canary whose loop compiles more than once before it is
  // stable (torch.optim's state made inside the first step: two graphs) declares its own.
  std::map<std::string, CompileStabilityBudget> per_canary_compile_stability;
  MemoryBudget memory;
  // [default-entries] canaries: the canaries that the default tolerance entries ([bf16])
  // were calibrated on, or that the file's authors chose to judge by them. Any other
  // canary needs its own entries ([NAME.bf16]): another model's calibration is never
  // reused silently. Bitwise entries hold for every canary.
  std::set<std::string> default_entry_canaries;

  const FeatureBudget& feature(const std::string& name) const;  // [name]; throws BudgetError if absent
  // Whether `canary` may be judged by the default tolerance entries ("": the file's own
  // checks, which concern every canary).
  bool uses_default_entries(const std::string& canary) const;
  // The entry that budgets feature `name` for canary `canary`: [canary.name] when the file
  // has one, else [name] when it is bitwise or the canary uses the default entries;
  // nullptr otherwise.
  const FeatureBudget* find(const std::string& name, const std::string& canary) const;
  // [canary.compile-stability] when the file has one, else [compile-stability].
  const CompileStabilityBudget& compile_stability_of(const std::string& canary) const;
  // Whether any entry ([name] or [C.name] for some canary C) budgets `name`.
  bool describes(const std::string& name) const;
};

// Parses and validates a budgets file. Throws BudgetError naming the file and the key.
// Every table but compile-stability, memory and data is a feature entry (it has `form`)
// or a canary's group of them ([tiny.bf16]); [reference] is required.
Budgets load_budgets(const std::string& path);

// The budget of several features at once: their allowances add up (docs/budgets.md,
// "Composition"). No parts, or only bitwise parts: bitwise.
class ComposedBudget {
 public:
  ComposedBudget() = default;
  explicit ComposedBudget(std::vector<const FeatureBudget*> parts, std::string reason = "")
      : parts_(std::move(parts)), reason_(std::move(reason)) {}

  bool bitwise() const;
  // The step at which the two runs' recorded decisions part (nullopt: they never do),
  // which windows `from_decisions_part` count from.
  void set_decisions_part(std::optional<int> step) { decisions_part_ = step; }
  // How far `metric` may move at `step` from a reference value `reference`.
  double allowed(const std::string& metric, int step, double reference) const;
  // The same for a run whose decisions parted `since_part` steps before `step`
  // (kDecisionsNeverPart: not, or not yet); calibration pools runs that part apart.
  double allowed(const std::string& metric, int step, double reference, int since_part) const;
  // Whether the budget judges `metric`: bitwise (nothing may move), or every tolerance part
  // has windows for it.
  bool bounds(const std::string& metric) const;
  double outlier_fraction() const;  // the largest of the parts'
  std::vector<std::string> names() const;  // the entries' tables ("bf16", "tiny.bf16"); "reference" when bitwise
  std::vector<const FeatureBudget*> provisional_parts() const;  // the parts that are provisional()
  const std::vector<const FeatureBudget*>& parts() const { return parts_; }
  const std::string& reason() const { return reason_; }  // why these parts (docs/budgets.md)

 private:
  std::vector<const FeatureBudget*> parts_;
  std::string reason_;
  std::optional<int> decisions_part_;
};

// The spacing of fp32 numbers at |x| (the value of one unit in the last place).
double fp32_ulp(double x);

}  // namespace harness::check
