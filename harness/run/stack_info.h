// The "stack line" of a receipt: what built and ran it (compiler, flags, library
// versions, host, CPU, kernels), so that two receipts that disagree can say why.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace harness::run {

struct StackInfo {
  std::string git_commit, toolchain, libraries, host, cpu, kernels;
};

// How a rerun sets a stack entry (nightly/environment_drift.h names entries
// "<manifest key>.<name>"): the environment variable the engines read, or a flag of
// `harness nightly`. Entries no rerun can set (a library, the compiler, the CPU) have none.
struct StackSetting {
  std::string_view entry;     // "kernels.gemm"
  std::string_view variable;  // "HARNESS_GEMM_KERNEL", or ""
  std::string_view flag;      // "--threads", or ""
};
std::span<const StackSetting> stack_settings();

// A stack line's part with this label lists environment variables as NAME=VALUE
// (python/canary_harness/receipts/stack.py's toolchain line): each is set by the variable it names.
inline constexpr std::string_view kEnvironmentLabel = "numerics env";

StackInfo collect_stack_info();
std::string utc_timestamp();  // ISO 8601, seconds, "Z"

}  // namespace harness::run
