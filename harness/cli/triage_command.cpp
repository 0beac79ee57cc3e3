// `harness triage A B`: the units of a precision lane's reduced precision that take it out
// of its budget against B (harness/nightly/triage.h, docs/triage.md). Exit 0 when the
// smallest set is found (or A passes: nothing to triage), 1 when no set of units brings A
// back, 2 for bad input.
#include <unistd.h>

#include <memory>

#include <fmt/format.h>

#include "canary_run.h"
#include "commands.h"
#include "defaults.h"
#include "json_text.h"
#include "triage.h"
#include "thread_flag.h"

namespace harness::cli {

void add_triage_command(CLI::App& app, CommandRegistry& commands) {
  auto o = std::make_shared<nightly::TriageOptions>();
  auto json = std::make_shared<bool>(false);
  o->budgets_path = default_budgets();
  CLI::App* cmd = app.add_subcommand(
      "triage", "Find the FP8/BF16 units (zone and block) whose precision takes a lane out of its budget");
  cmd->add_option("a", o->lane_receipt, "Receipt of the failing precision lane (.h5): its recipe runs again")
      ->required();
  cmd->add_option("b", o->reference, "Receipt of its reference (.h5, a golden too)")->required();
  cmd->add_option("--budgets", o->budgets_path, "Budgets file (TOML)")->capture_default_str();
  add_threads_flag(*cmd, o->threads,
                   "Worker threads per rerun of a harness engine's lane (0 = all cores; a Python canary's rerun keeps "
                   "its recipe's)");
  cmd->add_flag("--json", *json, "Print the triage as JSON (keys in docs/triage.md)");
  commands.add(cmd, [o, json] {
    // Progress on a terminal only: in a log, an error stays the one line on stderr.
    const bool tty = isatty(STDERR_FILENO) != 0;
    const nightly::Triage t = nightly::triage(*o, [tty](const std::string& line) {
      if (tty) fmt::print(stderr, "run         {}\n", line);
    });
    fmt::print("{}", *json ? run::json_text(nightly::to_json(t)) + "\n" : nightly::triage_report(t));
    return t.already_passes || t.found() ? kExitPass : kExitCheckFailed;
  });
}

}  // namespace harness::cli
