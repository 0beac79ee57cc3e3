// `harness export --canary NAME --steps N [--seed S] --out PACK.h5 [--force]`: a canary
// pack (harness/run/canary_pack.h), from which any training stack trains on exactly the
// harness's initial weights and batches.
#include <memory>

#include <fmt/format.h>

#include "canary_pack.h"
#include "commands.h"
#include "usage_check.h"

namespace harness::cli {
namespace {

int export_action(const run::PackOptions& options) {
  const run::PackSummary s = run::export_pack(options);
  fmt::print("canary      {}\n", s.canary);
  fmt::print("steps       {} batches of {} x {} tokens\n", s.steps, s.batch_size, s.row_length);
  fmt::print("init        {} tensors, {} parameters (seed {})\n", s.tensors, s.parameters, s.seed);
  fmt::print("pack        {}\n", s.path);
  return kExitPass;
}

}  // namespace

void add_export_command(CLI::App& app, CommandRegistry& commands) {
  auto options = std::make_shared<run::PackOptions>();
  CLI::App* command = app.add_subcommand(
      "export", "Write a canary pack (initial parameters, every batch, the canary JSON) for another training stack");
  command->add_option("--canary", options->canary, "Canary: a shipped one's name (canaries/NAME.toml) or a canary file's path")->capture_default_str();
  command->add_option("--steps", options->steps, "Number of batches, and the schedule length (default: the canary's)");
  command->add_option("--seed", options->seed, "Initialisation seed (default: the canary's [train] seed)")
      ->check(seed_check());
  command->add_option("--out", options->out, "Pack path (.h5)")->required();
  command->add_flag("--force", options->force, "Overwrite an existing pack");
  commands.add(command, [options] { return export_action(*options); });
}

}  // namespace harness::cli
