// A Python canary's receipt (`python3 -m canary_harness run FILE.py:NAME`, a team's own
// model; docs/own-model.md): the harness cannot run that model itself, so its replays go to
// the Python package that wrote it (`python3 -m canary_harness replay`).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "child_process.h"

namespace harness::run {

// Whether the manifest's canary JSON says `"kind": "python"` (manifest_text's attributes).
bool is_python_canary(const std::map<std::string, std::string>& manifest);
// Whether `manifest` is a PyTorch lane's of a canary pack (`python3 -m canary_harness.lane`:
// engine torch, the pack it read named): the package replays it from that pack.
bool is_pack_lane(const std::map<std::string, std::string>& manifest);

// HARNESS_BIN naming this harness: what every child the harness starts runs with (a team's
// command lane too), so that the package, wherever it is loaded from, digests and writes
// its receipt through the libraries built with this harness (docs/python.md, "Install").
std::map<std::string, std::string> harness_environment();

// The environment every Python child of the harness runs with: harness_environment(), and
// this checkout's package first on PYTHONPATH.
std::map<std::string, std::string> python_package_environment();

// The command that runs `python3 -m canary_harness SUBCOMMAND RECEIPT FLAGS...` on `receipt`
// (a Python canary's): `replay` (verify it from a checkpoint) or `rerun` (its recipe again,
// into a new receipt). The interpreter the run recorded (run_options "python") when it is
// still there, else /usr/bin/python3, running this checkout's python/canary_harness.
struct PythonCommand {
  std::vector<std::string> argv;
  std::map<std::string, std::string> environment;
};
PythonCommand python_canary_command(const std::string& subcommand, const std::string& receipt,
                                    const std::map<std::string, std::string>& manifest,
                                    const std::vector<std::string>& flags);

// A Python child whose result is data (`replay`, `units`, `describe`): `argv` run with
// `--json-out PATH` added, PATH a file in a fresh temporary directory, and the JSON read
// from that file. The child's stdout is the canary's own (a model that prints its
// parameter count while it is built) and is never parsed: discarded by default, or where
// `stdout_mode` sends it; its stderr is captured for the error line by default. `result`
// is discarded (is_discarded()) where the child wrote no file or no JSON. Throws
// ChildProcessError when the child cannot start.
struct PythonJsonResult {
  ChildResult child;
  nlohmann::json result;
};
PythonJsonResult run_python_for_json(std::vector<std::string> argv, const std::map<std::string, std::string>& environment,
                                     ChildOutput stdout_mode = ChildOutput::kDiscard,
                                     ChildOutput stderr_mode = ChildOutput::kCapture);

}  // namespace harness::run
