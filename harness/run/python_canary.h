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

// The environment every Python child of the harness runs with: this checkout's package
// first on PYTHONPATH, and HARNESS_BIN naming this harness, so that the package digests
// through the library beside it (docs/python.md, "The native digest").
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

}  // namespace harness::run
