// The float64 op oracle (docs/oracle.md): each op of one training step, recomputed in
// float64 from the operands the run gave it (read just before the engine ran it), and each
// of its results judged against the rounding bound of the precision the engine declares
// for it (Engine::op_numerics; engines/numerics/rounding_bounds.h). A bound is for one op
// on its own inputs: what earlier ops did to those inputs is theirs, so an op over its
// bound is that op's own error, wherever the run went before it.
//
// Judged ops: linear_forward and linear_backward (dot products of length K, gamma_{K+1}
// with the bias or the accumulated value), residual_forward and residual_backward (one
// rounding), gelu_erf_forward (1.5 ulp: its test's one grid step from the rounded value), layernorm_forward (its mean,
// its rstd given its mean, its output given both), attention_forward (its probabilities from
// q and k, its output given its own probabilities), crossentropy_forward (its probabilities;
// its loss, a mean over target tokens the oracle does not read, is listed as not judged). The others are listed as not judged,
// never counted as within.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "api/engine.h"
#include "canary.h"

namespace harness::run {

// One result of one op, judged element by element.
struct OpJudgement {
  std::string site;       // the op's site: blocks.1.mlp.fc
  std::string op;         // its engine call: linear_forward
  std::string phase;      // forward, backward, optimizer
  std::string result;     // the result operand: out, dinp, dweight, ...
  std::string tensor;     // the tensor it is, by the table's name (what an op trace names)
  std::string stored;     // the precision the result is stored in: fp32, bf16
  std::string operands;   // the precision the products' operands were rounded to
  std::string source;     // file:line of the team's code that ran it (a Python canary's); "" for an engine's
  std::string below;      // why it is judged in a precision other than its own (a bf16 result of an fp32 run)
  int occurrence = -1;    // a Python canary's: its place among the step's traced outputs of its site, phase and op
  std::int64_t elements = 0;
  std::int64_t over = 0;       // elements whose error exceeds their bound (a non-finite result's too)
  std::int64_t unbounded = 0;  // elements with no bound: non-finite operands, or past the stored format's range
  double worst_ratio = 0;     // the largest error / bound (0 where every element is exact)
  std::int64_t worst_index = 0;
  double value = 0, exact = 0;            // the run's value and the oracle's at that element
  double error_ulps = 0, bound_ulps = 0;  // there, in ulps of the stored precision
  bool within() const { return over == 0; }
};

// What one step's oracle saw: every judged result, in execution order; the ops it does not
// judge (by engine call, with their count) and the calls the engine computes in a way the
// bounds do not model yet (site and op, with why).
struct OracleReport {
  // A call the engine computes in a way the bounds do not model yet.
  struct Unbounded {
    std::string site, phase, op, why;
    std::string text() const { return site + " " + op + ": " + why; }  // "SITE OP: why", as --json lists it
  };
  std::vector<OpJudgement> judged;
  std::map<std::string, int> not_judged;
  std::vector<Unbounded> not_bounded;
  std::int64_t ops_over() const;
};

// One op call as the oracle saw it, kept for a standalone repro (`harness repro`): each
// operand it read, as it was before the op, and each result after it, with its shape.
struct CapturedOp {
  struct Tensor {
    std::string operand;  // the description's name: inp, weight, out, ...
    std::string tensor;   // the table's name: blocks.0.attn.proj.out
    std::vector<std::int64_t> shape;
    std::vector<float> values;
  };
  OpKind op = OpKind::LinearForward;
  std::string site, phase;
  std::string operands_precision;           // what its products' operands were rounded to
  std::vector<double> attributes;           // its floating-point arguments (layernorm's eps)
  std::vector<Tensor> inputs, results;      // results: every operand it wrote, `stored` below per result
  std::vector<std::string> stored;          // each result's stored precision
};

// Observes a step's ops on `engine` (an engine that runs each op as it is called) and
// judges them; `table` describes the tensors.
class OpOracle final : public canary::OpObserver {
 public:
  // Throws std::invalid_argument for an engine that compiles its steps (Engine::step_compilation:
  // its ops run when the step ends, so no op's operands can be read as it ran). `against`:
  // judge every op as if computed and stored in that precision, whatever the engine
  // declares (is this lane fp32 at all?); by default each op by its engine's declaration.
  OpOracle(Engine& engine, const TensorTable& table, std::optional<numerics::Precision> against = std::nullopt);

  void before_op(OpKind op, const OpSite& site, std::span<const TensorId> operands,
                 std::span<const double> attributes) override;
  void after_op(OpKind op, const OpSite& site, std::span<const TensorId> operands) override;

  const OracleReport& report() const { return report_; }
  // Keep the judged op at `site` in `phase` (its first call) for captured().
  void capture(std::string site, Phase phase) { capture_site_ = std::move(site), capture_phase_ = phase; }
  const std::optional<CapturedOp>& captured() const { return captured_; }

 private:
  // The op being run: its kind, site and operands, each operand's values as read before it
  // ran (empty where the oracle does not read it), and how the engine computes it.
  struct Call {
    OpKind op = OpKind::LinearForward;
    std::string site;
    Phase phase = Phase::Forward;
    std::vector<TensorId> operands;
    std::vector<double> attributes;  // its floating-point arguments (layernorm's eps)
    std::vector<std::vector<float>> before;
    Engine::OpNumerics numerics;
    std::span<const float> operand(std::string_view name) const;
  };
  void judge_linear_forward(const Call& call);
  void judge_linear_backward(const Call& call);
  void judge_elementwise(const Call& call);
  void judge_layernorm_forward(const Call& call);
  void judge_attention_forward(const Call& call);
  void judge_crossentropy_forward(const Call& call);
  void judge_layernorm_backward(const Call& call);
  void add(const Call& call, std::size_t result, std::span<const float> got, const std::vector<double>& exact,
           const std::vector<double>& compute_bound);

  Engine& engine_;
  const TensorTable& table_;
  void keep(const Call& call);

  std::optional<numerics::Precision> against_;
  OracleReport report_;
  Call call_;
  std::string capture_site_;
  Phase capture_phase_ = Phase::Forward;
  std::optional<CapturedOp> captured_;
};

// Judges one result element by element into `j` (its stored precision, counts, worst
// element): got[i] against exact[i] within compute_bound[i], plus one rounding to `stored`
// where that is narrower than fp32 (docs/oracle.md). What every oracle's judgement goes
// through: the harness's engines' (OpOracle) and a Python canary's captured ops'.
void judge_values(OpJudgement& j, std::span<const double> got, std::span<const double> exact,
                  std::span<const double> compute_bound, numerics::Precision stored);

// Whether the oracle judges op `op` (docs/oracle.md lists them).
bool oracle_judges(OpKind op);

}  // namespace harness::run
