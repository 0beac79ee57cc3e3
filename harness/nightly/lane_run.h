// Running one lane of the matrix into a receipt that appears whole or not at all.
#pragma once

#include <functional>
#include <string>

#include "canary_run.h"
#include "matrix.h"

namespace harness::nightly {

// Runs `spec` with the matrix's canary, steps and seed into `out`, through `out`.partial
// renamed on success: a receipt at `out` is always complete. Overwrites `out`.
// Throws run::UsageError (bad settings) or what the run throws; nothing is left at `out`.
run::RunSummary run_lane(const Matrix& matrix, const LaneSpec& spec, const std::string& out,
                         const std::function<void(const run::StepProgress&)>& on_step = {}, int threads = 0);

}  // namespace harness::nightly
