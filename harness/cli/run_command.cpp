#include <unistd.h>

#include <cstdio>
#include <memory>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "canary_file.h"
#include "canary_run.h"
#include "interrupt.h"
#include "commands.h"
#include "usage_check.h"
#include "preset.h"
#include "registry.h"

namespace harness::cli {

int CommandRegistry::run_selected(const CLI::App& app) const {
  for (const CLI::App* sub : app.get_subcommands()) {
    const auto it = actions_.find(sub);
    if (it != actions_.end()) return it->second();
    if (!sub->get_subcommands().empty()) return run_selected(*sub);  // `golden status`, ...
  }
  return kExitBadInput;
}

namespace {

struct RunFlags {
  run::RunOptions options;
  std::string dump_tensors;
  std::optional<int> steps;
  std::string inject_fault;
  std::string trace = "none";
  EngineFlagValues engine_flags;
};

// Steps are numbered from 0 everywhere (receipts, summaries, bisect): the line names the
// step that just finished and counts how many are done.
void print_progress(const run::StepProgress& p) {
  const bool last = p.step + 1 == p.steps;
  if (isatty(STDERR_FILENO)) {
    const double eta = p.elapsed_seconds / (p.step + 1) * (p.steps - p.step - 1);
    fmt::print(stderr, "\rstep {:>4} ({} of {} done)  loss {:.4f}  eta {:.1f}s   {}", p.step, p.step + 1, p.steps, p.loss,
               eta, last ? "\n" : "");
  } else if ((p.step + 1) % 25 == 0 || last) {
    fmt::print(stderr, "step {} ({} of {} done) loss {:.4f}\n", p.step, p.step + 1, p.steps, p.loss);
  }
}

int run_action(RunFlags& f) {
  run::RunOptions o = f.options;
  o.steps = f.steps;
  o.trace = run::parse_trace_level(f.trace);
  if (!f.inject_fault.empty()) o.inject_fault = f.inject_fault;
  for (const auto& flag : f.engine_flags) {
    if (flag.second) o.engine_settings.options[flag.first] = *flag.second;
  }
  if (!f.dump_tensors.empty()) {
    int max_step = 0;
    try {
      max_step = o.steps.value_or(canary::load_canary(o.canary).steps);
    } catch (const std::invalid_argument& e) {
      throw run::UsageError(fmt::format("--canary: {}", e.what()));
    }
    o.dump_steps = run::parse_step_list(f.dump_tensors, max_step);
  }
  run::RunSummary s;
  try {
    s = run::run_canary(o, print_progress);
  } catch (const run::Interrupted& e) {
    fmt::print(stderr, "{}harness: {}\n", isatty(STDERR_FILENO) ? "\n" : "", e.what());
    return e.exit_code();
  }
  fmt::print("lane        {}\n", s.lane);
  fmt::print("steps       {} on {} thread{}\n", s.steps, s.threads, s.threads == 1 ? "" : "s");
  fmt::print("loss        {:.6f} (step 0) -> {:.6f} (step {})\n", s.first_loss, s.last_loss, s.steps - 1);
  fmt::print("speed       {:.2f} steps/s, {:.1f} ms/step (recording included)\n", s.steps / s.seconds,
             1000.0 * s.seconds / s.steps);
  fmt::print("receipt     {}\n", s.receipt_path);
  return kExitPass;
}

}  // namespace

// Each engine's flags as it describes them (engines/registry.h); each engine validates its
// own (cpu-ref takes none) and the registry names the one it rejects.
void add_engine_flags(CLI::App& command, EngineFlagValues& values, std::string_view only_engine) {
  for (const DescribedFlag& f : engine_flags()) {
    if (!only_engine.empty() && f.engine != only_engine) continue;
    const std::string name(f.flag.name), option = "--" + name, help(f.flag.help);
    if (f.flag.is_switch) {
      command.add_flag_callback(option, [&values, name] { values[name] = "1"; }, help);
    } else {
      command.add_option(option, values[name], help);
    }
  }
}

void add_run_command(CLI::App& app, CommandRegistry& commands) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* run = app.add_subcommand("run", "Run a canary on an engine and write an HDF5 receipt");
  run->add_option("--canary", flags->options.canary, "Canary: a shipped one's name (canaries/NAME.toml) or a canary file's path")->capture_default_str();
  run->add_option("--engine", flags->options.engine, "Engine (cpu-ref, accel, tpu-mesh)")->capture_default_str();
  run->add_option("--features", flags->options.engine_settings.features,
                  "accel features: bf16[,fp8=ZONES] with zones qkv, attn_proj, mlp_fc, mlp_proj, all");
  run->add_option("--steps", flags->steps, "Number of steps (default: the preset's)");
  run->add_option("--threads", flags->options.threads, "Worker threads (0 = all cores)")->check(CLI::Range(0, run::kMaxThreads))->capture_default_str();
  run->add_option("--seed", flags->options.seed, "Initialisation seed (default: the canary's [train] seed)")
      ->check(seed_check());
  run->add_option("--perturb-init", flags->options.perturb_init,
                  "SEED: move every initial weight one ulp, up or down as SEED draws (what calibrate --perturb runs)")
      ->check(seed_check());
  run->add_option("--out", flags->options.out, "Receipt path (.h5)")->required();
  run->add_flag("--force", flags->options.force, "Overwrite an existing receipt");
  run->add_option("--dump-tensors", flags->dump_tensors, "Steps whose parameters to dump, e.g. 0,50,100");
  run->add_flag("--record-batches", flags->options.record_batches, "Record every batch's tokens");
  run->add_option("--inject-fault", flags->inject_fault, "step=K,op=NAME[,ulps=N]: perturb an op's output");
  run->add_option("--trace", flags->trace,
                  "ops: record every op's output (hash and sketch) per step into /trace, for bisect")
      ->capture_default_str();
  run->add_option("--checkpoint-every", flags->options.checkpoint_every,
                  "K: save the full state at the start of steps K, 2K, ... into <out>.ckpt/, for harness replay");
  add_engine_flags(*run, flags->engine_flags);
  commands.add(run, [flags] { return run_action(*flags); });
}

}  // namespace harness::cli
