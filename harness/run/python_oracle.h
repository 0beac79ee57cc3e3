// The op oracle on a Python canary (docs/oracle.md, "Python canaries"): the package replays
// one step with its aten ops captured (`python3 -m canary_harness capture-ops`;
// python/canary_harness/tracing/op_capture.py says what each op's arithmetic is), and the
// harness judges each captured result here, with the bounds of
// engines/numerics/rounding_bounds.h and the judgement every oracle uses (judge_values).
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "child_process.h"
#include "numerics/rounding_bounds.h"
#include "op_oracle.h"

namespace harness::run {

// The precision a Python run declared (its recipe's `precision`: fp32, bf16); throws
// std::invalid_argument naming any other.
numerics::Precision declared_precision(const std::string& name);

// Judges every result of `description` (capture-ops' JSON: `results`, `not_judged`) whose
// values lie in the HDF5 file `values` (results/I/got, exact, magnitude). A result in a
// format narrower than `declared` (a bf16 result of an fp32 run) is judged as if stored in
// `declared`: its own rounding is then the error. Throws std::runtime_error naming the file
// for a description or file that does not hold what capture-ops writes.
OracleReport judge_captured_step(const nlohmann::json& description, const std::string& values,
                                 numerics::Precision declared);

// Step `step` of a Python canary's receipt judged: the package replays it with its aten ops
// captured (`capture-ops`, the canary's prints to stderr, the child's own stderr as
// `stderr_mode` says) and judge_captured_step judges them against the precision the run
// declared, or `against`.
struct PythonStepJudgement {
  OracleReport report;
  std::string lane;
  double seconds = 0;  // the replay's
};
// Why a step could not be judged: the child's exit code (1: the step does not replay; 2 or
// another: the child's own error, on stderr or, captured, in the message) and one line.
struct PythonCaptureError : std::runtime_error {
  PythonCaptureError(int code, const std::string& message) : std::runtime_error(message), exit_code(code) {}
  int exit_code;
};
// `flags` go to capture-ops besides the step (a PyTorch lane's --pack PATH).
PythonStepJudgement judge_python_step(const std::string& receipt, const std::map<std::string, std::string>& manifest,
                                      int step, std::optional<numerics::Precision> against,
                                      ChildOutput stderr_mode = ChildOutput::kInherit,
                                      const std::vector<std::string>& flags = {});

}  // namespace harness::run
