// `harness invariance`: one sequence's token probabilities alone and inside batches of
// 2..N (harness/run/invariance.h, docs/invariance.md). Exit 0 when bitwise for every batch
// size, 1 when a batch size breaks it, 2 for bad input.
#include <memory>

#include <fmt/format.h>

#include "commands.h"
#include "canary_run.h"
#include "invariance.h"
#include "json_text.h"
#include "usage_check.h"
#include "thread_flag.h"

namespace harness::cli {
namespace {

struct InvarianceFlags {
  run::InvarianceOptions options;
  EngineFlagValues engine_flags;
  bool json = false;
};

int invariance_action(InvarianceFlags& f) {
  run::InvarianceOptions o = f.options;
  apply_engine_flags(f.engine_flags, o.engine_settings);
  const run::InvarianceReport report = run::check_batch_invariance(o);
  if (f.json) {
    fmt::print("{}\n", run::json_text(run::to_json(report)));
  } else {
    fmt::print("{}", run::to_text(report));
  }
  return report.smallest_breaking() ? kExitCheckFailed : kExitPass;
}

}  // namespace

void add_invariance_command(CLI::App& app, CommandRegistry& commands) {
  auto flags = std::make_shared<InvarianceFlags>();
  CLI::App* cmd = app.add_subcommand(
      "invariance", "Batch invariance: one sequence's token probabilities alone and at a drawn row of batches 2..N");
  cmd->add_option("--canary", flags->options.canary, "Canary: a shipped one's name or a canary file's path")
      ->capture_default_str();
  cmd->add_option("--engine", flags->options.engine, "Engine (cpu-ref, accel, tpu-mesh)")->capture_default_str();
  cmd->add_option("--features", flags->options.engine_settings.features, "accel features: bf16[,fp8=ZONES]");
  cmd->add_option("--max-batch", flags->options.max_batch, "Largest batch size to place the sequence in (2..64)")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  cmd->add_option("--seed", flags->options.seed, "Initialisation seed (default: the canary's [train] seed)")
      ->check(seed_check());
  cmd->add_option("--position-seed", flags->options.position_seed, "Draws the sequence's row in each batch")
      ->capture_default_str();
  add_threads_flag(*cmd, flags->options.threads, "Worker threads (0 = all cores)");
  cmd->add_flag("--json", flags->json, "Print the report as JSON");
  add_engine_flags(*cmd, flags->engine_flags);
  commands.add(cmd, [flags] { return invariance_action(*flags); });
}

}  // namespace harness::cli
