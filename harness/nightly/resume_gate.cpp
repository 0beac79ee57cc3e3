#include "resume_gate.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "child_process.h"
#include "interrupt.h"
#include "lane_run.h"
#include "python_canary.h"

namespace harness::nightly {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// What a harness engine's lane that does not resume bitwise left out: its checkpoint is the
// harness's (harness/run/checkpoint.h), so the omission is the harness's.
constexpr const char* kHarnessOmission =
    "the harness's checkpoint misses state the run depends on (harness/run/checkpoint.h: parameters, moments, data "
    "position and the engine's EngineState)";

void set_error(json& check, const std::string& kind, const std::string& message) {
  check["status"] = "error";
  check["summary"] = "the restart gate could not be run";
  check["error"] = {{"kind", kind}, {"message", message}};
}

void set_equal(json& check, const ResumeInputs& in) {
  check["status"] = "pass";
  check["summary"] = fmt::format("stopped after step {}, restarted in a new process: steps {}-{} bitwise equal",
                                 in.spec.resume_at, in.spec.resume_at + 1, in.matrix.steps - 1);
}

// `difference` {step, what, tensor, omission}: the first thing a resumed step did otherwise.
void set_differs(json& check, const ResumeInputs& in, const json& difference) {
  check["status"] = "fail";
  check["first_difference"] = difference;
  const std::string tensor = difference.value("tensor", "");
  check["summary"] = fmt::format("stopped after step {}, restarted: step {} differs ({}{}): likely omission: {}",
                                 in.spec.resume_at, difference.at("step").get<int>(), difference.at("what").get<std::string>(),
                                 tensor.empty() ? "" : " " + tensor, difference.value("omission", ""));
}

// A Python canary's lane: `python -m canary_harness resume-check` under the lane's
// interpreter, threads, precision and compile switch (and the job's seed where the lane's
// run takes it), which saves with the canary's save and loads with its load in a process
// of its own.
void python_gate(json& check, const ResumeInputs& in) {
  const LaneSpec& spec = in.spec;
  const std::map<std::string, std::string>& options = spec.settings.options;
  std::vector<std::string> argv{spec.command.front(), "-m", "canary_harness", "resume-check", in.matrix.canary,
                                "--at", std::to_string(spec.resume_at), "--steps", std::to_string(in.matrix.steps),
                                "--threads", options.at("threads")};
  if (options.count("precision")) argv.insert(argv.end(), {"--precision", options.at("precision")});
  if (options.count("compile") && options.at("compile") == "true") argv.push_back("--compile");
  if (std::find(spec.command.begin(), spec.command.end(), "--seed") != spec.command.end()) {
    argv.insert(argv.end(), {"--seed", std::to_string(in.matrix.seed)});
  }
  check["command"] = run::command_line(argv);
  const run::PythonJsonResult gate = run::run_python_for_json(argv, spec.environment);
  const int code = gate.child.exit_code();
  const json& result = gate.result;
  if ((code != 0 && code != 1) || !result.is_object() || !result.contains("verdict")) {
    const std::string line = run::last_line(gate.child.stderr_tail);
    set_error(check, "resume_check", fmt::format("`{}` {}: {}", run::command_line(argv), gate.child.how(),
                                                 line.empty() ? "(nothing on stderr)" : line));
    return;
  }
  if (result["verdict"] == "equal") return set_equal(check, in);
  const json& d = result.at("first_difference");
  set_differs(check, in, {{"step", d.at("step")}, {"what", d.at("what")}, {"tensor", d.value("tensor", "")},
                          {"omission", d.value("omission", "")}});
}

// A harness engine's lane: its recipe again with a checkpoint at the start of step K+1
// (harness/run/checkpoint.h), which must change no bit of the run, then `harness replay
// --from K+1` of that receipt in a child: the checkpoint loaded in a new process, every step
// after it verified bitwise.
void harness_gate(json& check, const ResumeInputs& in) {
  const int from = in.spec.resume_at + 1;
  fs::create_directories(in.work_dir);
  const std::string out = (fs::path(in.work_dir) / fmt::format("{}.h5", in.spec.id)).string();
  rerun_recipe(in.run, out, "resume-at", [&](run::RunOptions& o) {
    o.checkpoint_every = from;
    o.threads = in.threads;
  }, {});
  const check::ReceiptData checkpointed = check::load_receipt(out);
  if (const std::optional<Unreproduced> differs = first_unreproduced(in.run, checkpointed)) {
    return set_differs(check, in, {{"step", differs->step}, {"what", "the lane's run again, checkpointing: " + differs->what},
                                   {"tensor", ""},
                                   {"omission", "none to restart: the lane does not repeat the job's run, or saving a "
                                                "checkpoint changed it"}});
  }
  const std::vector<std::string> argv{fs::read_symlink("/proc/self/exe").string(), "replay", out, "--from",
                                      std::to_string(from), "--json", "--threads", std::to_string(in.threads)};
  check["command"] = run::command_line(argv);
  const run::ChildResult replay = run::run_child(argv, {}, run::ChildOutput::kCapture, run::ChildOutput::kCapture);
  const json result = json::parse(replay.stdout_text, nullptr, /*allow_exceptions=*/false);
  const bool from_checkpoint = result.is_object() && result.value("resumed_from", -1) == from &&
                               result.value("checkpoint", json(nullptr)).is_string();
  if (replay.exited_zero() && from_checkpoint) return set_equal(check, in);
  if (replay.exited_zero()) {  // it verified the steps, but not from the checkpoint the gate saved
    return set_error(check, "replay", fmt::format("`{}` did not resume from the checkpoint of step {} (resumed from {})",
                                                  run::command_line(argv), from, result.value("resumed_from", json(nullptr)).dump()));
  }
  if (replay.exit_code() != 1 || !result.is_object() || !result.value("first_mismatch", json(nullptr)).is_object()) {
    const std::string line = run::last_line(replay.stderr_tail);
    return set_error(check, "replay", fmt::format("`{}` {}: {}", run::command_line(argv), replay.how(),
                                                  line.empty() ? "(nothing on stderr)" : line));
  }
  const json& m = result["first_mismatch"];
  set_differs(check, in, {{"step", m.at("step")}, {"what", m.at("what")}, {"tensor", m.value("tensor", "")},
                          {"omission", kHarnessOmission}});
}

}  // namespace

json resume_check(const ResumeInputs& in) {
  const auto start = std::chrono::steady_clock::now();
  json check = {{"check", "resume"}, {"against", in.run.path}, {"at", in.spec.resume_at}, {"first_difference", nullptr}};
  try {
    if (in.spec.python_canary) {
      python_gate(check, in);
    } else {
      harness_gate(check, in);
    }
  } catch (const run::Interrupted&) {
    throw;
  } catch (const std::exception& e) {
    set_error(check, "resume", fmt::format("lane {}: {}", in.spec.id, e.what()));
  }
  check["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return check;
}

}  // namespace harness::nightly
