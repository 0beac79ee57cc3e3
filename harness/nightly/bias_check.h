// The nightly's one-sided drift check (docs/nightly.md, "One-sided drift"): a lane with
// `bias-repeats = N` runs N times, under its noise seed S (the job's run) and S+1 .. S+N-1,
// and the N runs are tested against the reference lane's run for drift in one direction
// (check/drift_bias.h: the sign test and Student's t over the repeats, per window of the
// lane's budget). A magnitude budget cannot see a lane that errs the same way on every
// seed; these tests can, where one run cannot (its steps share one trajectory).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "budgets.h"
#include "matrix.h"
#include "verdict.h"

namespace harness::nightly {

struct BiasInputs {
  const Matrix& matrix;
  const LaneSpec& spec;                 // bias_repeats > 0, its seed flag set (load_matrix checked)
  const check::ReceiptData& run;        // the job's run of the lane: the first repeat
  const check::ReceiptData& reference;  // the job's run of the reference lane
  const check::Budgets& budgets;
  std::string out_dir;  // the job's: the record's receipt paths are relative to it
  std::string work_dir;  // where the other repeats' receipts go, under out_dir
  int threads = 0;
};

// The check's record: {check: "bias", against, status, summary, text, seconds, seeds,
// receipts (relative to out_dir, the job's run first), windows[], bias_fails}. status "pass"
// (no window biased), "warn" (one is, and no entry of the lane's budget says bias = "fail"),
// "fail" (one is, and an entry does) or "error" (a repeat could not run, or the budget is
// missing). A warning passes the lane and the job.
nlohmann::json bias_check(const BiasInputs& in);

}  // namespace harness::nightly
