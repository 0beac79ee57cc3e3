// SIGINT and SIGTERM end a run between steps: the step under way finishes and is recorded,
// the receipt is closed with complete = 0, and the command says where it stopped and exits
// 128 + the signal (130 for Ctrl-C, 143 for SIGTERM). A second signal ends the process at
// once (the default action); the receipt, written in SWMR mode, still holds every step.
#pragma once

#include <stdexcept>
#include <string>

namespace harness::run {

// Thrown between steps once a signal arrived; `steps_done` steps are in the receipt.
struct Interrupted : std::runtime_error {
  Interrupted(int stop_signal, int steps_recorded, const std::string& message)
      : std::runtime_error(message), signal(stop_signal), steps_done(steps_recorded) {}
  int signal;
  int steps_done;
  int exit_code() const { return 128 + signal; }
};

// Installs the handlers for its lifetime (nested guards share them).
class InterruptGuard {
 public:
  InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
  ~InterruptGuard();
};

// The signal that asked the process to stop, or 0.
int pending_interrupt();

}  // namespace harness::run
