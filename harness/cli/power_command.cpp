// `harness power --lane L`: what the lane's check catches (docs/budgets.md, "Detection
// power"): a ladder of injected regressions per kind, the smallest each check fails, and
// at which step. Exit 0 when the check catches a 1e-4 scale of a layer within its run, 1
// when it is too loose (or the clean lane already fails its check), 2 on bad input.
#include <unistd.h>

#include <memory>
#include <string>

#include <fmt/format.h>

#include "canary_run.h"
#include "commands.h"
#include "defaults.h"
#include "calibrate.h"
#include "power.h"
#include "thread_flag.h"

namespace harness::cli {

void add_power_command(CLI::App& app, CommandRegistry& commands) {
  auto o = std::make_shared<nightly::PowerOptions>();
  auto json = std::make_shared<bool>(false);
  o->matrix_path = default_matrix();
  o->budgets_path = default_budgets();
  CLI::App* power = app.add_subcommand("power", "Measure what a lane's check catches: a ladder of injected regressions");
  power->add_option("--lane", o->lane, "Lane id or name in the matrix (of the harness's engines, or a PyTorch or JAX lane)")
      ->required();
  power->add_option("--step", o->step, "Step the weight and learning-rate regressions start at (default: a quarter of the run)")
      ->check(CLI::NonNegativeNumber);
  power->add_option("--tensor", o->tensor, "Parameter the weight regressions move (default: the first linear layer's weight)");
  power->add_option("--matrix", o->matrix_path, "Lane matrix (TOML)")->capture_default_str();
  power->add_option("--budgets", o->budgets_path, "Budgets the lane's check is judged by")->capture_default_str();
  add_threads_flag(*power, o->threads, "Worker threads per run (0 = all cores)");
  power->add_option("--kinds", o->kinds, "Ladders to climb (weight-scale, weight-ulps, lr-scale, eps-scale; default all)")
      ->delimiter(',');
  power->add_flag("--against-golden", o->against_golden,
                  "Check the lane against its golden (the nightly's golden check: bitwise on the golden's platform, "
                  "its across_platforms entry on another) instead of the reference lane");
  o->goldens_path = default_goldens();
  power->add_option("--goldens", o->goldens_path, "Goldens directory (--against-golden)")->capture_default_str();
  power->add_flag("--json", *json, "Print the ladders as JSON");
  commands.add(power, [o, json] {
    // Progress on a terminal only: in a log, an error stays the one line on stderr.
    const bool tty = isatty(STDERR_FILENO) != 0;
    const nightly::PowerReport r = nightly::measure_power(*o, [tty](const std::string& line) {
      if (tty) fmt::print(stderr, "run         {}\n", line);
    });
    const std::string record = nightly::power_record(r);  // what calibrate --power writes under the entry
    if (*json) {
      nlohmann::json j = nightly::power_json(r);
      j["record"] = record.empty() ? nlohmann::json(nullptr) : nlohmann::json(record);
      fmt::print("{}\n", j.dump(2));
    } else {
      fmt::print("{}{}", nightly::power_text(r), record.empty() ? "" : fmt::format("{:<12}{}\n", "record", record));
    }
    return r.clean_failure.empty() && !r.too_loose().value_or(false) ? kExitPass : kExitCheckFailed;
  });
}

}  // namespace harness::cli
