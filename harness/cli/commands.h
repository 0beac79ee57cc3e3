// Subcommands of the `harness` CLI. Each add_*_command registers its flags on the
// CLI11 app and an action to run when it is the selected subcommand.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "api/engine_settings.h"
#include "bisect.h"
#include "replay.h"
#include "verdict.h"

namespace harness::cli {

inline constexpr int kExitPass = 0;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitBadInput = 2;

class CommandRegistry {
 public:
  void add(CLI::App* subcommand, std::function<int()> action) { actions_[subcommand] = std::move(action); }
  int run_selected(const CLI::App& app) const;

 private:
  std::map<const CLI::App*, std::function<int()>> actions_;
};

// Engine flags by name without dashes; unset flags stay empty (the engine's default).
using EngineFlagValues = std::map<std::string, std::optional<std::string>>;
// Every engine's flags (engines/registry.h), or only those of `only_engine`.
void add_engine_flags(CLI::App& command, EngineFlagValues& values, std::string_view only_engine = "");
// The engine flags given on the command line, into the settings an engine is made with.
void apply_engine_flags(const EngineFlagValues& values, EngineSettings& settings);

// The op trace of one step of a receipt without /trace: a replay with tracing on (the
// trace provider of `harness bisect`; `pack`, the canary pack a PyTorch lane's receipt was
// run from, "" for none); throws check::TraceUnavailable saying why not.
check::OpTrace replayed_trace(const check::ReceiptData& run, int step, const std::string& pack = "");
// The receipt's manifest where it is a Python canary's (replayed by its package); none where
// it is not, or cannot be read (what reads it next says why, naming the file).
std::optional<std::map<std::string, std::string>> python_receipt_manifest(const std::string& path);
// A receipt the Python package replays: a Python canary's (its recipe names its file), or a
// PyTorch lane's of a canary pack, replayed from the pack --pack gives (the receipt names it only).
struct PackageReceipt {
  std::map<std::string, std::string> manifest;
  std::vector<std::string> flags;  // what the package's replay takes besides the receipt: a lane's --pack PATH
};
// None for a harness engine's receipt or one that cannot be read (what reads it next says
// why). Throws run::UsageError for a lane's receipt without `pack`, and for `pack` given
// with any other receipt.
std::optional<PackageReceipt> package_receipt(const std::string& path, const std::string& pack);
// Whether `path` is a PyTorch lane's receipt of a canary pack (false where it cannot be read).
bool is_pack_lane_receipt(const std::string& path);
// The same from a manifest already read: the flags of the package's replay, none for a
// harness engine's receipt.
std::optional<std::vector<std::string>> package_replay_flags(const std::string& path,
                                                             const std::map<std::string, std::string>& manifest,
                                                             const std::string& pack);
// The --pack flag of the commands that replay a receipt (replay, precision).
void add_pack_flag(CLI::App& command, std::string& pack);
// A replay of step `step` of `receipt` alone (replay_command.cpp): what bisect's trace, its
// oracle and repro each ask for.
run::ReplayOptions one_step(const std::string& receipt, int step);
// A run's op at `step` judged by the float64 op oracle (a replay of the step): bisect's
// OracleProvider (harness/check/bisect.h).
check::OracleSide judged_op(const check::ReceiptData& run, int step, const check::DivergentOp& op,
                            const std::string& pack = "");
// Steps from..to of a Python canary's receipt replayed by its package with every aten op
// traced, one trace per step; throws check::TraceUnavailable saying why there are none (the
// replay cannot start, or does not reproduce the receipt bit for bit).
// `flags` go to the package's replay besides the steps (a PyTorch lane's --pack PATH).
std::vector<check::OpTrace> python_aten_traces(const std::string& receipt,
                                               const std::map<std::string, std::string>& manifest, int from, int to,
                                               const std::vector<std::string>& flags = {});

void add_run_command(CLI::App& app, CommandRegistry& commands);
void add_audit_command(CLI::App& app, CommandRegistry& commands);
void add_inspect_command(CLI::App& app, CommandRegistry& commands);
void add_check_command(CLI::App& app, CommandRegistry& commands);    // check, compare and bisect
void add_golden_command(CLI::App& app, CommandRegistry& commands);   // golden status|refresh|approve|reject
void add_nightly_command(CLI::App& app, CommandRegistry& commands);  // nightly and merge
void add_calibrate_command(CLI::App& app, CommandRegistry& commands);
void add_power_command(CLI::App& app, CommandRegistry& commands);      // detection power of a lane's check
void add_replay_command(CLI::App& app, CommandRegistry& commands);
void add_validate_command(CLI::App& app, CommandRegistry& commands);
void add_schema_command(CLI::App& app, CommandRegistry& commands);  // the receipt description, as JSON
void add_hosts_command(CLI::App& app, CommandRegistry& commands);   // the emulated hosts of calibrate --hosts
void add_export_command(CLI::App& app, CommandRegistry& commands);  // canary packs
void add_invariance_command(CLI::App& app, CommandRegistry& commands);  // batch invariance
void add_triage_command(CLI::App& app, CommandRegistry& commands);      // precision triage
void add_precision_command(CLI::App& app, CommandRegistry& commands);   // the op oracle on a recorded step
void add_repro_command(CLI::App& app, CommandRegistry& commands);       // the first divergent op as numpy files

}  // namespace harness::cli
