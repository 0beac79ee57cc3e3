// Running one lane of the matrix into a receipt that appears whole or not at all.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "canary_run.h"
#include "child_process.h"
#include "matrix.h"
#include "verdict.h"

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

// `receipt`'s recipe (its manifest's run_options) as the options that run it here; throws
// run::UsageError naming `flag` when it has none the harness can run: another stack's, or
// a Python canary's (rerun_recipe runs those).
run::RunOptions recipe_options(const check::ReceiptData& receipt, std::string_view flag);

// `receipt`'s own recipe run again into `out` (overwritten), metrics only (no trace, no
// checkpoints): in this process for the harness's engines, with `adjust` applied to the
// recipe's options; through `python3 -m canary_harness rerun` for a Python canary, with
// `python_flags` added. Errors name `flag`: UsageError for no recipe, LaneCommandError for
// a Python rerun that fails.
void rerun_recipe(const check::ReceiptData& receipt, const std::string& out, std::string_view flag,
                  const std::function<void(run::RunOptions&)>& adjust, const std::vector<std::string>& python_flags);

// Where `again`, a rerun of `recorded`'s recipe, is first not it bit for bit: the earliest
// step where a metric or a tensor's hash differs, and what ("loss", "params hash"); none
// where every step is (a hash family missing on one side differs at step 0).
struct Unreproduced {
  int step = 0;
  std::string what;
};
std::optional<Unreproduced> first_unreproduced(const check::ReceiptData& recorded, const check::ReceiptData& again);

// Throws run::UsageError "PREFIX: its recipe no longer reproduces PATH (loss differs at step
// 3): the code, the host or the stack changed since the run; ADVICE" when `again`, a rerun of
// `recorded`'s recipe, differs from it in a metric or a hash.
void require_reproduced(const check::ReceiptData& recorded, const check::ReceiptData& again, std::string_view prefix,
                        std::string_view advice);

// Exports the matrix's canary pack (canary, seed, steps) to `path` (overwriting it), the
// pack every external lane of a job reads. Returns `path`.
std::string export_matrix_pack(const Matrix& matrix, const std::string& path);

// The argv of `command` for messages: items joined with spaces, quoted where they hold one.
using run::command_line;

}  // namespace harness::nightly
