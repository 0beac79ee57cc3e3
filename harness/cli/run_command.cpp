#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "canary_run.h"
#include "commands.h"
#include "preset.h"

namespace harness::cli {

int CommandRegistry::run_selected(const CLI::App& app) const {
  for (const CLI::App* sub : app.get_subcommands()) {
    const auto it = actions_.find(sub);
    if (it != actions_.end()) return it->second();
  }
  return kExitBadInput;
}

namespace {

struct RunFlags {
  run::RunOptions options;
  std::string dump_tensors;
  std::string features;
  std::optional<int> steps;
  std::string inject_fault;
};

void print_progress(const run::StepProgress& p) {
  const bool last = p.step + 1 == p.steps;
  if (isatty(STDERR_FILENO)) {
    const double eta = p.elapsed_seconds / (p.step + 1) * (p.steps - p.step - 1);
    fmt::print(stderr, "\rstep {:>4}/{}  loss {:.4f}  eta {:.1f}s   {}", p.step + 1, p.steps, p.loss, eta, last ? "\n" : "");
  } else if ((p.step + 1) % 25 == 0 || last) {
    fmt::print(stderr, "step {}/{} loss {:.4f}\n", p.step + 1, p.steps, p.loss);
  }
}

int run_action(RunFlags& f) {
  run::RunOptions o = f.options;
  o.steps = f.steps;
  if (!f.inject_fault.empty()) o.inject_fault = f.inject_fault;
  if (!f.features.empty()) {
    throw run::UsageError(fmt::format("--features: engine '{}' takes no features (got '{}')", o.engine, f.features));
  }
  if (!f.dump_tensors.empty()) {
    const int max_step = o.steps.value_or(canary::preset(o.canary).steps);
    o.dump_steps = run::parse_step_list(f.dump_tensors, max_step);
  }
  const run::RunSummary s = run::run_canary(o, print_progress);
  fmt::print("lane        {}\n", s.lane);
  fmt::print("steps       {} on {} thread{}\n", s.steps, s.threads, s.threads == 1 ? "" : "s");
  fmt::print("loss        {:.6f} (step 0) -> {:.6f} (step {})\n", s.first_loss, s.last_loss, s.steps - 1);
  fmt::print("speed       {:.2f} steps/s, {:.1f} ms/step (recording included)\n", s.steps / s.seconds,
             1000.0 * s.seconds / s.steps);
  fmt::print("receipt     {}\n", s.receipt_path);
  return kExitPass;
}

}  // namespace

void add_run_command(CLI::App& app, CommandRegistry& commands) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* run = app.add_subcommand("run", "Run a canary on an engine and write an HDF5 receipt");
  run->add_option("--canary", flags->options.canary, "Canary preset (tiny, micro)")->capture_default_str();
  run->add_option("--engine", flags->options.engine, "Engine (cpu-ref)")->capture_default_str();
  run->add_option("--features", flags->features, "Engine features (none for cpu-ref)");
  run->add_option("--steps", flags->steps, "Number of steps (default: the preset's)");
  run->add_option("--threads", flags->options.threads, "Worker threads (0 = all cores)")->capture_default_str();
  run->add_option("--seed", flags->options.seed, "Initialisation seed")->capture_default_str();
  run->add_option("--out", flags->options.out, "Receipt path (.h5)")->required();
  run->add_flag("--force", flags->options.force, "Overwrite an existing receipt");
  run->add_option("--dump-tensors", flags->dump_tensors, "Steps whose parameters to dump, e.g. 0,50,100");
  run->add_flag("--record-batches", flags->options.record_batches, "Record every batch's tokens");
  run->add_option("--inject-fault", flags->inject_fault, "step=K,op=NAME[,ulps=N]: perturb an op's output");
  commands.add(run, [flags] { return run_action(*flags); });
}

}  // namespace harness::cli
