// A Python canary's receipt (`python3 -m canary_harness run FILE.py:NAME`, a team's own
// model; docs/own-model.md): the harness cannot run that model itself, so its replays go to
// the Python package that wrote it (`python3 -m canary_harness replay`).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "child_process.h"

namespace harness::run {

// Whether the manifest's canary JSON says `"kind": "python"` (manifest_text's attributes).
bool is_python_canary(const std::map<std::string, std::string>& manifest);

// The command that replays `receipt` (a Python canary's) with `flags` after it: the
// interpreter the run recorded (run_options "python") when it is still there, else
// /usr/bin/python3, running this checkout's python/canary_harness.
struct PythonCommand {
  std::vector<std::string> argv;
  std::map<std::string, std::string> environment;
};
PythonCommand python_replay_command(const std::string& receipt, const std::map<std::string, std::string>& manifest,
                                    const std::vector<std::string>& flags);

}  // namespace harness::run
