// --threads, as every command that runs an engine takes it: 0 (all cores) up to
// run::kMaxThreads. One rule, so that no command accepts a count another refuses.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "canary_run.h"

namespace harness::cli {

inline CLI::Validator thread_count_check() { return CLI::Range(0, run::kMaxThreads); }

// Adds --threads to `cmd`, its default shown in --help; `help` says what the count is for.
inline CLI::Option* add_threads_flag(CLI::App& cmd, int& threads, const std::string& help) {
  return cmd.add_option("--threads", threads, help)->check(thread_count_check())->capture_default_str();
}

}  // namespace harness::cli
