// Negative controls: checks a nightly runs beside its lanes that must fail, so that a green
// nightly also proves it could have been red (docs/nightly.md, "Negative controls"):
//  - fault: the reference lane again with a 1-ulp fault at a recorded step (the matrix's
//    `control-fault`) must fail its golden check at that step, and bisect must name the
//    faulted op;
//  - noise: every lane whose engine sums in a seeded order must differ bitwise from the
//    reference lane (an order that came out as the reference's would make its budget blind);
//  - replay: the first such lane's receipt, its recorded noise seed replaced by another,
//    must not replay (a replay that reproduced it would vouch for any order).
// A control that passes is "blind": the nightly then cannot see what it claims to, and the
// job is an infrastructure error (exit 2), whatever its lanes say.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "budgets.h"
#include "matrix.h"
#include "verdict.h"

namespace harness::nightly {

struct ControlInputs {
  const Matrix& matrix;
  const check::Budgets& budgets;
  const check::ReceiptData& reference;  // the job's run of the reference lane
  // Every other lane the job ran, with its receipt.
  std::vector<std::pair<const LaneSpec*, const check::ReceiptData*>> lanes;
  std::string work_dir;  // where the control runs' receipts go
  int threads = 0;
  // Whether this job runs the fault control: the shard that holds the reference lane does
  // (every shard runs the others, on its own lanes).
  bool fault = true;
};

// One record per control: {control, status, summary, seconds}; status "seen" (it failed, as
// it must), "blind" (it passed), "skipped" (nothing to control here; summary says why) or
// "error" (it could not run).
nlohmann::json run_controls(const ControlInputs& in);

// A control that is blind or could not run: the nightly cannot vouch for its verdict.
bool control_fails_the_job(const nlohmann::json& control);
bool controls_fail_the_job(const nlohmann::json& controls);

// The controls of a job's shards as one list, one record per control: a blind one, else one
// that could not run, else the seen ones together (their summaries joined), else skipped.
nlohmann::json merge_controls(const std::vector<nlohmann::json>& shard_controls);

}  // namespace harness::nightly
