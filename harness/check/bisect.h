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
  std::string name, phase, tensor, kind;
  std::string site;   // file:line of the code that ran it, where the trace knows it (aten traces)
  std::string other;  // where the two runs ran different ops here: what the other one ran
  int layer = -1;
  double distance = 0, allowed = 0;  // budgeted bisects: sketch distance and its budget
};

// A run's op trace of one step when its receipt has none of the level the other run's has:
// a replay with tracing on (level ops for a harness engine, aten for a Python canary).
// Throws TraceUnavailable saying why when there can be none (the lane is not replayable).
using TraceProvider = std::function<OpTrace(const ReceiptData& run, int step)>;
struct TraceUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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
// without one of the other's level is traced by `replay` (when given).
Bisection bisect(const ReceiptData& a, const ReceiptData& b, const Budgets& budgets, const TraceProvider& replay = {});

nlohmann::json to_json(const Bisection& bisection);
std::string to_text(const Bisection& bisection);  // a short story

}  // namespace harness::check
