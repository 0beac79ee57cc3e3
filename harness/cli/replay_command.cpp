// `harness replay RECEIPT --from K [--to M]`: replays a recorded run from the checkpoint at
// or before K and verifies every replayed step bit for bit. Exit 0 reproduced, 1 a step
// differs (the first named), 2 the receipt cannot be replayed or its checkpoint is not
// trusted. Also the trace provider of `harness bisect` for receipts without /trace.
#include <bit>
#include <limits>
#include <map>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bisect.h"
#include "child_process.h"
#include "python_canary.h"
#include "python_oracle.h"
#include "receipt/receipt_reader.h"
#include "canary_run.h"
#include "commands.h"
#include "replay.h"
#include "json_text.h"
#include "thread_flag.h"

namespace harness::cli {
namespace {

struct ReplayFlags {
  run::ReplayOptions options;
  std::optional<int> to;
  std::string pack;  // a PyTorch lane's receipt: the canary pack it was run from
  bool json = false;
};

nlohmann::json to_json(const run::ReplayResult& r) {
  nlohmann::json mismatch = nullptr;
  if (r.first_mismatch) {
    mismatch = {{"step", r.first_mismatch->step}, {"what", r.first_mismatch->what}, {"tensor", r.first_mismatch->tensor}};
  }
  return {{"version", 1},
          {"verdict", r.reproduced() ? "reproduced" : (r.record_altered ? "record_altered" : "diverged")},
          {"receipt", r.receipt},
          {"lane", r.lane},
          {"resumed_from", r.resumed_from},
          {"checkpoint", r.checkpoint.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.checkpoint)},
          {"from", r.from},
          {"to", r.to},
          {"steps_run", r.steps_run},
          {"seconds", r.seconds},
          {"first_mismatch", mismatch},
          {"mismatched_steps", r.mismatched_steps},
          {"notes", r.notes}};
}

std::string to_text(const run::ReplayResult& r) {
  std::string out = fmt::format("{:<12}{} ({})\n", "replay", r.lane, r.receipt);
  out += r.checkpoint.empty() ? fmt::format("{:<12}the initial state (no checkpoint at or before step {})\n", "resumed", r.from)
                              : fmt::format("{:<12}checkpoint of step {} ({}: content and tensor hashes verified)\n",
                                            "resumed", r.resumed_from, r.checkpoint);
  out += fmt::format("{:<12}steps {}-{} in {:.2f} s ({} steps)\n", "replayed", r.resumed_from, r.to, r.seconds, r.steps_run);
  for (const std::string& note : r.notes) out += fmt::format("{:<12}{}\n", "note", note);
  if (r.reproduced()) return out + fmt::format("{:<12}steps {}-{} bitwise equal to the receipt\n", "verified", r.resumed_from, r.to);
  const run::ReplayMismatch& m = *r.first_mismatch;
  out += fmt::format("{:<12}step {} differs from the receipt first in {}{}\n", "mismatch", m.step, m.what,
                     m.tensor.empty() ? "" : " " + m.tensor);
  if (r.record_altered) {
    out += fmt::format("{:<12}the replay agrees again at step {}: the receipt's record of step{} {} was altered; the "
                       "receipt is not trusted\n",
                       "diagnosis", r.to, r.mismatched_steps.size() > 1 ? "s" : "", fmt::join(r.mismatched_steps, ", "));
  }
  return out;
}


// A Python canary's receipt is replayed by the package that wrote it; its output is ours.
// With --json the result comes back in a file and is printed here: the canary's own prints
// go to stderr, never into the JSON.
int run_python_replay(const ReplayFlags& f, const PackageReceipt& replayed_by) {
  std::vector<std::string> flags = {"--from", std::to_string(f.options.from)};
  if (f.to) flags.insert(flags.end(), {"--to", std::to_string(*f.to)});
  flags.insert(flags.end(), replayed_by.flags.begin(), replayed_by.flags.end());
  const run::PythonCommand command = run::python_canary_command("replay", f.options.receipt, replayed_by.manifest, flags);
  if (!f.json) {
    return run::run_child(command.argv, command.environment, run::ChildOutput::kInherit, run::ChildOutput::kInherit)
        .exit_code();
  }
  const run::PythonJsonResult replayed =
      run::run_python_for_json(command.argv, command.environment, run::ChildOutput::kStderr, run::ChildOutput::kInherit);
  const int code = replayed.child.exit_code();
  if ((code == 0 || code == 1) && replayed.result.is_object()) {
    fmt::print("{}\n", run::json_text(replayed.result));
    return code;
  }
  if (code == 0 || code == 1) {
    throw run::UsageError(fmt::format("{}: its replay {} but wrote no result", f.options.receipt, replayed.child.how()));
  }
  return code;  // the replay's own error is on stderr
}

int run_replay(ReplayFlags& f) {
  if (const auto replayed_by = package_receipt(f.options.receipt, f.pack)) return run_python_replay(f, *replayed_by);
  f.options.to = f.to;
  const run::ReplayResult r = run::replay(f.options);
  fmt::print("{}", f.json ? run::json_text(to_json(r)) + "\n" : to_text(r));
  return r.reproduced() ? kExitPass : kExitCheckFailed;
}

// An aten trace of one step as `python3 -m canary_harness replay --json-out PATH` writes it.
check::OpTrace trace_of_json(const nlohmann::json& traced) {
  check::OpTrace trace;
  for (const nlohmann::json& c : traced.at("columns")) {
    trace.columns.push_back({c.at("op_index").get<int>(), c.at("op").get<std::string>(), c.at("layer").get<int>(),
                             c.at("phase").get<std::string>(), c.at("tensor").get<std::string>(),
                             c.at("kind").get<std::string>()});
    trace.sites.push_back(c.value("site", ""));
  }
  // Sketch values come as their float64 bit patterns (exact; JSON has no inf or NaN).
  const auto as_double = [](const nlohmann::json& bits) { return std::bit_cast<double>(bits.get<std::uint64_t>()); };
  trace.hashes = traced.at("hash").get<std::vector<std::uint64_t>>();
  for (const nlohmann::json& bits : traced.at("l2_bits")) trace.l2.push_back(as_double(bits));
  for (const nlohmann::json& row : traced.at("projection_bits")) {
    for (const nlohmann::json& bits : row) trace.projection.push_back(as_double(bits));
  }
  trace.level = check::kAtenLevel;
  if (trace.hashes.size() != trace.columns.size() || trace.l2.size() != trace.columns.size() ||
      trace.projection.size() != trace.columns.size() * receipt::kSketchWidth) {
    throw check::TraceUnavailable("the replay wrote a trace whose columns and digests differ in number");
  }
  return trace;
}


}  // namespace

// A replay of step `step` of `receipt` alone.
std::optional<std::map<std::string, std::string>> python_receipt_manifest(const std::string& path) {
  try {
    std::map<std::string, std::string> manifest = receipt::ReceiptReader(path).manifest_text();
    if (run::is_python_canary(manifest)) return manifest;
  } catch (const std::exception&) {  // unreadable: what reads it next says why, naming the file
  }
  return std::nullopt;
}

std::optional<std::vector<std::string>> package_replay_flags(const std::string& path,
                                                             const std::map<std::string, std::string>& manifest,
                                                             const std::string& pack) {
  if (run::is_pack_lane(manifest)) {
    if (pack.empty()) {
      throw run::UsageError(fmt::format("{}: a PyTorch lane's receipt of the canary pack {}: give that pack with --pack "
                                        "PATH (the nightly's canary-pack.h5, or `harness export`'s)",
                                        path, manifest.at("pack")));
    }
    return std::vector<std::string>{"--pack", pack};
  }
  if (!pack.empty()) {
    throw run::UsageError(fmt::format("--pack: {} is not a PyTorch lane's receipt of a canary pack; drop --pack", path));
  }
  if (run::is_python_canary(manifest)) return std::vector<std::string>{};
  return std::nullopt;
}

bool is_pack_lane_receipt(const std::string& path) {
  try {
    return run::is_pack_lane(receipt::ReceiptReader(path).manifest_text());
  } catch (const std::exception&) {  // unreadable: what reads it next says why, naming the file
    return false;
  }
}

std::optional<PackageReceipt> package_receipt(const std::string& path, const std::string& pack) {
  std::map<std::string, std::string> manifest;
  try {
    manifest = receipt::ReceiptReader(path).manifest_text();
  } catch (const std::exception&) {  // unreadable: what reads it next says why, naming the file
    if (pack.empty()) return std::nullopt;
    throw;
  }
  const auto flags = package_replay_flags(path, manifest, pack);
  if (!flags) return std::nullopt;
  return PackageReceipt{manifest, *flags};
}

void add_pack_flag(CLI::App& command, std::string& pack) {
  command.add_option("--pack", pack,
                     "For a PyTorch lane's receipt (python3 -m canary_harness.lane): the canary pack it was run from "
                     "(the nightly's canary-pack.h5)");
}

run::ReplayOptions one_step(const std::string& receipt, int step) {
  run::ReplayOptions options;
  options.receipt = receipt;
  options.from = step;
  options.to = step;
  return options;
}

std::vector<check::OpTrace> python_aten_traces(const std::string& receipt,
                                               const std::map<std::string, std::string>& manifest, int from, int to,
                                               const std::vector<std::string>& flags) {
  std::vector<std::string> replay_flags{"--from", std::to_string(from), "--to", std::to_string(to), "--trace", "aten"};
  replay_flags.insert(replay_flags.end(), flags.begin(), flags.end());
  const run::PythonCommand command = run::python_canary_command("replay", receipt, manifest, replay_flags);
  run::PythonJsonResult replayed;
  try {
    replayed = run::run_python_for_json(command.argv, command.environment);
  } catch (const std::exception& e) {  // it cannot start, or its result cannot be read
    throw check::TraceUnavailable(fmt::format("its replay cannot start: {}", e.what()));
  }
  const run::ChildResult& child = replayed.child;
  if (child.exit_code() == 2 || (!child.exited_zero() && child.exit_code() != 1)) {
    throw check::TraceUnavailable(fmt::format("it cannot be replayed: {}", run::last_line(child.stderr_tail)));
  }
  const nlohmann::json& result = replayed.result;
  if (result.is_object() && result.value("first_mismatch", nlohmann::json()).is_object()) {
    const nlohmann::json& m = result["first_mismatch"];
    throw check::TraceUnavailable(fmt::format("a replay with today's code does not reproduce step {} ({}); its trace "
                                              "is not trusted",
                                              m.value("step", from), m.value("what", "?")));
  }
  const std::size_t steps = static_cast<std::size_t>(to - from + 1);
  if (!result.is_object() || result.value("verdict", "") != "reproduced" || !result.contains("traces") ||
      result["traces"].size() != steps) {
    throw check::TraceUnavailable(fmt::format("its replay wrote no trace of steps {}-{}", from, to));
  }
  std::vector<check::OpTrace> traces;
  try {
    for (const nlohmann::json& traced : result["traces"]) traces.push_back(trace_of_json(traced));
  } catch (const nlohmann::json::exception& e) {
    throw check::TraceUnavailable(fmt::format("its replay wrote a trace that cannot be read ({})", e.what()));
  }
  return traces;
}

// The flags of the package's replay of `run` (a Python canary's, a PyTorch lane's from
// `pack`, which goes to a lane's receipt only: bisect may hold a lane against a golden of
// another engine); none for a harness engine's. A lane's without its pack: `Unavailable`.
template <typename Unavailable>
std::optional<std::vector<std::string>> replayed_by_package(const check::ReceiptData& run, const std::string& pack) {
  try {
    return package_replay_flags(run.path, run.manifest, run::is_pack_lane(run.manifest) ? pack : "");
  } catch (const run::UsageError& e) {  // its message names the receipt
    throw Unavailable(e.what());
  }
}

check::OpTrace replayed_trace(const check::ReceiptData& run, int step, const std::string& pack) {
  if (const auto flags = replayed_by_package<check::TraceUnavailable>(run, pack)) {
    try {  // a Python canary's or a PyTorch lane's step, replayed by the package with every aten op traced
      return python_aten_traces(run.path, run.manifest, step, step, *flags).front();
    } catch (const check::TraceUnavailable& e) {
      throw check::TraceUnavailable(fmt::format("{} has no op trace: {}", run.path, e.what()));
    }
  }
  run::ReplayOptions options = one_step(run.path, step);
  options.trace_ops = true;
  run::ReplayResult r;
  try {
    r = run::replay(options);
  } catch (const std::exception& e) {  // no recipe, racy noise, an untrusted checkpoint, a failed run
    throw check::TraceUnavailable(fmt::format("{} has no op trace and cannot be replayed: {}", run.path, e.what()));
  }
  if (!r.reproduced()) {
    throw check::TraceUnavailable(fmt::format("a replay of {} does not reproduce step {} ({}); its trace is not trusted",
                                              run.path, r.first_mismatch->step, r.first_mismatch->what));
  }
  const receipt::TraceStep& row = r.trace.back();
  check::OpTrace trace{r.trace_columns, row.hashes, {}, {}, {}};
  receipt::split_sketches(row.sketches, trace.l2, trace.projection);
  return trace;
}

// Step `step` of `run` under the oracle: a harness engine's replay, or a Python canary's
// captured ops (run::judge_python_step): at module outputs where bisect found the op among
// module outputs (`level` ops: the /trace of a PyTorch lane, torch_xla's too), else aten
// ops. Throws with why it cannot be judged.
run::OracleReport step_oracle(const check::ReceiptData& run, int step, const std::string& pack,
                              const std::string& level) {
  if (auto flags = replayed_by_package<std::runtime_error>(run, pack)) {
    flags->insert(flags->end(), {"--level", level == check::kOpsLevel ? "modules" : "aten"});
    try {
      return run::judge_python_step(run.path, run.manifest, step, std::nullopt, run::ChildOutput::kCapture, *flags)
          .report;
    } catch (const run::PythonCaptureError& e) {
      throw std::runtime_error(std::string(e.what()).empty() ? fmt::format("its capture exited {}", e.exit_code)
                                                              : std::string(e.what()));
    }
  }
  run::ReplayOptions options = one_step(run.path, step);
  options.oracle_step = step;
  const run::ReplayResult r = run::replay(options);
  if (!r.reproduced()) throw std::runtime_error(fmt::format("a replay does not reproduce step {}", r.first_mismatch->step));
  return *r.oracle;
}

check::OracleSide judged_op(const check::ReceiptData& run, int step, const check::DivergentOp& op,
                            const std::string& pack) {
  check::OracleSide side;
  run::OracleReport report;
  try {
    report = step_oracle(run, step, pack, op.level);
  } catch (const std::exception& e) {  // an engine that compiles its steps, no recipe, a racy run
    side.why_not = e.what();
    return side;
  }
  int seen = 0;  // an engine's judged results of the op's site, phase and tensor, in order
  for (const run::OpJudgement& j : report.judged) {
    if (j.site != op.name || j.phase != op.phase || j.tensor != op.tensor) continue;
    // A Python canary's result says its place among every traced output (judged or not).
    if ((j.occurrence >= 0 ? j.occurrence : seen++) != op.occurrence) continue;
    side.judged = true;
    side.within = j.within();
    side.ratio = j.worst_ratio;
    side.error_ulps = j.error_ulps;
    side.bound_ulps = j.bound_ulps;
    side.stored = j.stored;
    side.worst_index = j.worst_index;
    return side;
  }
  side.why_not = fmt::format("{}'s op has no bound yet (docs/oracle.md)", op.name);
  if (report.judged.empty() && !report.not_judged.empty()) {  // a bf16 lane at module outputs: autocast, say so
    std::string why;
    for (const auto& [call, count] : report.not_judged) why += (why.empty() ? "" : "; ") + call;
    side.why_not = fmt::format("nothing of step {} is judged ({})", step, why);
  }
  for (const run::OracleReport::Unbounded& call : report.not_bounded) {
    if (call.site == op.name && call.phase == op.phase) side.why_not = "not bounded: " + call.text();
  }
  return side;
}

void add_replay_command(CLI::App& app, CommandRegistry& commands) {
  auto f = std::make_shared<ReplayFlags>();
  CLI::App* replay = app.add_subcommand("replay", "Replay a recorded run from a checkpoint and verify it bit for bit");
  replay->add_option("receipt", f->options.receipt, "Receipt of the run (.h5); its checkpoints in <receipt>.ckpt/ (a Python canary's: in the receipt)")
      ->required();
  replay->add_option("--from", f->options.from, "First step to verify: resumes from the checkpoint at or before it")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()))
      ->capture_default_str();
  replay->add_option("--to", f->to, "Last step to verify (default: the last recorded)")->check(CLI::Range(0, std::numeric_limits<int>::max()));
  add_threads_flag(*replay, f->options.threads,
                   "Worker threads (0 = all cores; any count gives the same bits; a Python canary replays on its recorded count)");
  add_pack_flag(*replay, f->pack);
  replay->add_flag("--json", f->json, "Print the result as JSON (keys in docs/cli.md)");
  commands.add(replay, [f] { return run_replay(*f); });
}

}  // namespace harness::cli
