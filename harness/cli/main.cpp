// `harness`: the command-line shell over the harness libraries. Exit status is the
// contract of docs/cli.md: 0 pass, 1 a check failed, 2 bad usage or bad input.
#include <csignal>
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "commands.h"
#include "harness_build_info.h"
#include "receipt/hdf5_file.h"
#include "receipt/receipt_schema.h"
#include "usage_check.h"

int main(int argc, char** argv) {
  harness::h5::skip_library_cleanup_at_exit();
  harness::h5::silence_library_errors();
  // Past a file size limit (ulimit -f) a write fails with EFBIG, which the writers report in
  // one line and clean up after, instead of the default SIGXFSZ killing the process mid-file.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"Deterministic replay and golden-regression harness for training numerics"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  app.set_version_flag("--version", fmt::format("harness {} (commit {}, {}; receipt schema {}.{})", HARNESS_VERSION,
                                                HARNESS_GIT_COMMIT, HARNESS_COMPILER, harness::receipt::kSchemaVersion,
                                                harness::receipt::kSchemaMinor));
  harness::cli::CommandRegistry commands;
  harness::cli::add_run_command(app, commands);
  harness::cli::add_inspect_command(app, commands);
  harness::cli::add_audit_command(app, commands);
  harness::cli::add_check_command(app, commands);
  harness::cli::add_golden_command(app, commands);
  harness::cli::add_nightly_command(app, commands);
  harness::cli::add_calibrate_command(app, commands);
  harness::cli::add_power_command(app, commands);
  harness::cli::add_replay_command(app, commands);
  harness::cli::add_validate_command(app, commands);
  harness::cli::add_schema_command(app, commands);
  harness::cli::add_hosts_command(app, commands);
  harness::cli::add_export_command(app, commands);
  harness::cli::add_invariance_command(app, commands);
  harness::cli::add_triage_command(app, commands);
  harness::cli::add_precision_command(app, commands);
  harness::cli::add_repro_command(app, commands);
  if (const auto problem = harness::cli::usage_problem(app, std::vector<std::string>(argv + 1, argv + argc))) {
    fmt::print(stderr, "harness: error: {}\n", *problem);
    return harness::cli::kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const std::string where = app.get_subcommands().empty() ? "harness" : "harness " + app.get_subcommands()[0]->get_name();
    fmt::print(stderr, "harness: error: {} (see `{} --help`)\n", e.what(), where);
    return harness::cli::kExitBadInput;
  }
  try {
    return commands.run_selected(app);
  } catch (const std::exception& e) {
    fmt::print(stderr, "harness: error: {}\n", e.what());
    return harness::cli::kExitBadInput;
  }
}
