// Bisecting two runs of one canary: where they part. The data contract first (different
// batches: nothing to bisect), then the first step where they differ and the first tensor
// that differs in it: bitwise for runs that make the same roundings, and where a metric
// leaves the composed budget for runs that do not (docs/bisect.md).
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "budgets.h"
#include "verdict.h"

namespace harness::check {

inline constexpr int kBisectJsonVersion = 2;

// The first traced op output that differs (bitwise) or leaves the budget, in the step's
// execution order.
struct DivergentOp {
  int index = 0;  // op_index: the op's place among the step's traced ops
  int occurrence = 0;  // how many traced ops of the step before it have its name, phase and tensor
  std::string name, phase, tensor, kind;
  std::string site;   // file:line of the code that ran it, where the trace knows it (aten traces)
  std::string other;  // where the two runs ran different ops here: what the other one ran
  int layer = -1;
  double distance = 0, allowed = 0;  // budgeted bisects: sketch distance and its budget
  std::string level = kOpsLevel;     // the traces it was found in: module outputs (ops) or aten ops
};

// A run's op trace of one step when its receipt has none of the level the other run's has:
// a replay with tracing on (level ops for a harness engine, aten for a Python canary).
// Throws TraceUnavailable saying why when there can be none (the lane is not replayable).
using TraceProvider = std::function<OpTrace(const ReceiptData& run, int step)>;
struct TraceUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One side's first divergent op against the float64 op oracle on that side's own operands
// (harness/run/op_oracle.h, docs/oracle.md): its error and bound, or why it is not judged.
struct OracleSide {
  bool judged = false;
  std::string why_not;  // when not judged
  bool within = false;
  double ratio = 0, error_ulps = 0, bound_ulps = 0;  // error / bound; both in ulps of `stored`
  std::string stored;
  std::int64_t worst_index = 0;  // the element of the largest error / bound
};
// Who is right at the first divergent op: each side judged, and the verdict in words.
struct OracleVerdict {
  OracleSide a, b;
  std::string verdict;
};
// A run's op `op` at step `step`, judged (a replay of that step under the oracle).
using OracleProvider = std::function<OracleSide(const ReceiptData& run, int step, const DivergentOp& op)>;
// "both within their bounds: rounding", "B exceeds its bound by 40x: B's op is wrong", ...
std::string oracle_verdict(const OracleSide& a, const OracleSide& b);

// Where two runs first decided otherwise (DecisionRecord datasets, moe's routing): the step
// and the deciding op (a column) whose decision hashes differ first, and what the counts
// beside that hash say moved: at least half their summed differences, each choice that
// moved leaving one bucket and joining another.
struct DecisionFlip {
  int step = -1;
  std::string op, hash_dataset;
  double moved_at_least = 0;
  struct Count {
    std::string dataset;
    double a = 0, b = 0;
  };
  std::vector<Count> counts;  // the counts that differ at that step and op
};

struct Bisection {
  std::string a_path, b_path, a_lane, b_lane;
  int steps = 0;
  bool bitwise = false;              // same roundings: the first bit that differs
  std::vector<std::string> budget;   // otherwise: the composed budget a step must leave
  int first_divergent_step = -1;     // -1: the runs are equivalent
  int equal_steps = 0;               // steps 0 .. equal_steps-1 are equal (or within budget)
  std::optional<TensorMove> first_divergent_tensor;
  std::string first_divergent_metric;  // loss, grad_norm, hashes or params_sketch
  double deviation = 0, allowed = 0;   // at the first divergent step (budgeted bisects)
  std::optional<DivergentOp> first_divergent_op;
  std::optional<OracleVerdict> oracle;  // at the first divergent op, where an OracleProvider was given
  std::string op_source;  // where the traces came from: "receipts", "replay of A", "the aten trace B holds ...", ...
  std::string no_op;      // diverged without an op: why
  // Both runs record decisions: where they first decided otherwise (none: every recorded
  // decision is equal), and which hash datasets were compared.
  std::optional<DecisionFlip> first_decision_flip;
  std::vector<std::string> decision_records;

  bool diverged() const { return first_divergent_step >= 0; }
};

// Throws ContractError when the two cannot be compared (different data first). At the
// divergent step, traces the receipts hold (/trace, a golden's /aten_trace) are read; a side
// without one of the other's level is traced by `replay` (when given). With `oracle`, each
// side's first divergent op is judged by the float64 op oracle.
Bisection bisect(const ReceiptData& a, const ReceiptData& b, const Budgets& budgets, const TraceProvider& replay = {},
                 const OracleProvider& oracle = {});

nlohmann::json to_json(const Bisection& bisection);
std::string to_text(const Bisection& bisection);  // a short story

}  // namespace harness::check
