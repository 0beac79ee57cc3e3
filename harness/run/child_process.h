// Running another program as a child process (no shell): the nightly's external lanes and
// the replay of a Python canary's receipt (python_canary.h).
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace harness::run {

// What happens to the child's stdout and stderr.
enum class ChildOutput {
  kDiscard,  // stdout to /dev/null
  kCapture,  // read back whole (stdout) or its last 64 KiB (stderr)
  kInherit,  // ours
  kStderr,   // stdout only: where the child's stderr goes (a child's prints kept off our stdout)
};

struct ChildResult {
  int status = 0;              // as waitpid reports it
  std::string stdout_text;     // kCapture only
  std::string stderr_tail;     // kCapture only: the last 64 KiB or more

  bool exited_zero() const;
  int exit_code() const;       // the exit status, or 128 + the signal that killed it
  std::string how() const;     // "exited with status N" or "was killed by signal S"
};

// A child that could not be started or waited for.
struct ChildProcessError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs argv (PATH lookup for a bare name) with `environment` set over ours (a PYTHONPATH
// given goes before the caller's own). Throws ChildProcessError when it cannot start.
ChildResult run_child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& environment,
                      ChildOutput stdout_mode, ChildOutput stderr_mode);

// The last non-empty line of a child's stderr.
std::string last_line(const std::string& text);

// The argv for messages: items joined with spaces, quoted where they hold one.
std::string command_line(const std::vector<std::string>& argv);

}  // namespace harness::run
