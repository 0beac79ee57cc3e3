#include "interrupt.h"

#include <atomic>
#include <csignal>

namespace harness::run {
namespace {

std::atomic<int> g_signal{0};
std::atomic<int> g_guards{0};
struct sigaction g_previous_int {}, g_previous_term {};

extern "C" void on_stop_signal(int signal) {
  int expected = 0;
  g_signal.compare_exchange_strong(expected, signal);
  // The next one of these signals takes the default action: ends the process at once.
  std::signal(signal, SIG_DFL);
}

}  // namespace

InterruptGuard::InterruptGuard() {
  if (g_guards.fetch_add(1) > 0) return;
  g_signal = 0;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &g_previous_int);
  sigaction(SIGTERM, &action, &g_previous_term);
}

InterruptGuard::~InterruptGuard() {
  if (g_guards.fetch_sub(1) > 1) return;
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGTERM, &g_previous_term, nullptr);
}

int pending_interrupt() { return g_signal.load(); }

}  // namespace harness::run
