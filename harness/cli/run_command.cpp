#include <unistd.h>

#include <cstdio>
#include <memory>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include <fmt/format.h>

#include "canary_run.h"
#include "interrupt.h"
#include "commands.h"
#include "usage_check.h"
#include "registry.h"
#include "run_option_fields.h"
#include "thread_flag.h"

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
  std::map<std::string, std::string> texts;  // each TextFlag's text, by flag (a map: references stay)
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
  apply_engine_flags(f.engine_flags, o.engine_settings);
  for (const run::RunOptionField& field : run::run_option_fields()) {  // text turned into options, in order
    const auto* text = std::get_if<run::TextFlag>(&field.target);
    if (text != nullptr) text->apply(f.texts.at(std::string(field.flag)), o);
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

// One option of the table (harness/run/run_option_fields.h) as a flag of `harness run`;
// the engines' own flags where the table places them.
void add_run_option(CLI::App& run, RunFlags& f, const run::RunOptionField& field) {
  const std::string flag(field.flag), help(field.help);
  CLI::Option* option = nullptr;
  if (std::holds_alternative<std::monostate>(field.target)) {
    add_engine_flags(run, f.engine_flags);
    return;
  }
  if (const auto* text = std::get_if<run::TextFlag>(&field.target)) {
    std::string& slot = f.texts[flag];
    slot = std::string(text->default_text);
    option = run.add_option(flag, slot, help);
  } else if (const auto* toggle = std::get_if<bool& (*)(run::RunOptions&)>(&field.target)) {
    option = run.add_flag(flag, (*toggle)(f.options), help);
  } else {
    option = std::visit(
        [&](auto&& slot) -> CLI::Option* {
          if constexpr (std::is_invocable_v<decltype(slot), run::RunOptions&>) {
            return run.add_option(flag, slot(f.options), help);
          } else {
            return nullptr;  // monostate and TextFlag: taken above
          }
        },
        field.target);
  }
  if (field.check == run::FlagCheck::kThreads) option->check(thread_count_check());
  if (field.check == run::FlagCheck::kSeed) option->check(seed_check());
  if (field.show_default) option->capture_default_str();
  if (field.required) option->required();
}

void apply_engine_flags(const EngineFlagValues& values, EngineSettings& settings) {
  for (const auto& [name, value] : values) {
    if (value) settings.options[name] = *value;
  }
}

void add_run_command(CLI::App& app, CommandRegistry& commands) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* run = app.add_subcommand("run", "Run a canary on an engine and write an HDF5 receipt");
  for (const run::RunOptionField& field : run::run_option_fields()) add_run_option(*run, *flags, field);
  commands.add(run, [flags] { return run_action(*flags); });
}

}  // namespace harness::cli
