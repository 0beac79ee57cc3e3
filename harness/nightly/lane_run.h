// Running one lane of the matrix into a receipt that appears whole or not at all.
#pragma once

#include <functional>
#include <string>

#include "canary_run.h"
#include "child_process.h"
#include "matrix.h"

namespace harness::nightly {

// Runs `spec` with the matrix's canary, steps and seed into `out`, through `out`.partial
// renamed on success: a receipt at `out` is always complete. Overwrites `out`.
// Throws run::UsageError (bad settings) or what the run throws; nothing is left at `out`.
//
// An external lane (LaneSpec::external: engine torch or a command) runs as a child process
// (argv, no shell; stdout discarded, stderr kept) on the canary pack `pack`; with no pack
// given, one is exported into a temporary directory for this run and removed after it. A non-zero exit
// throws LaneCommandError naming the lane, the command and its last stderr line. The receipt
// it writes is validated (check::load_receipt), must be complete, of the matrix's steps, of
// the lane's name and declare the lane's budget features. `threads` > 0 goes to a torch lane
// as --threads.
run::RunSummary run_lane(const Matrix& matrix, const LaneSpec& spec, const std::string& out,
                         const std::function<void(const run::StepProgress&)>& on_step = {}, int threads = 0,
                         const std::string& pack = "");

// An external lane that failed: its command exited non-zero, or wrote no usable receipt.
struct LaneCommandError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Exports the matrix's canary pack (canary, seed, steps) to `path` (overwriting it), the
// pack every external lane of a job reads. Returns `path`.
std::string export_matrix_pack(const Matrix& matrix, const std::string& path);

// The argv of `command` for messages: items joined with spaces, quoted where they hold one.
using run::command_line;

}  // namespace harness::nightly
