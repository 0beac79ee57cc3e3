// The nightly's restart gate (docs/nightly.md, "The restart gate"): a lane with
// `resume-at = K` is run again, stopped after step K, checkpointed, and taken on from the
// checkpoint in a new process; from step K+1 it must be bitwise the uninterrupted run.
// A Python canary's lane checkpoints with the canary's own save and load
// (`python3 -m canary_harness resume-check`, which names the likely omission); a harness
// engine's lane with the harness's checkpoints (`harness replay --from K+1` in a child).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "matrix.h"
#include "verdict.h"

namespace harness::nightly {

struct ResumeInputs {
  const Matrix& matrix;
  const LaneSpec& spec;           // resume_at >= 0 (load_matrix checked it fits the steps)
  const check::ReceiptData& run;  // the job's run of the lane
  std::string work_dir;           // where a harness lane's checkpointed run goes, under the job's directory
  int threads = 0;                // a harness lane's (a Python canary's lane pins its own)
};

// The check's record: {check: "resume", against (the job's run of the lane), status, summary,
// at, seconds, command (the gate's child, as run), first_difference}. status "pass" (bitwise equal from K+1), "fail" (first_difference:
// {step, what, tensor, omission}, what a resumed step did otherwise) or "error" (the gate
// could not run: the message names the command and its last stderr line).
nlohmann::json resume_check(const ResumeInputs& in);

}  // namespace harness::nightly
