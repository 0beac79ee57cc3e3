// The "stack line" of a receipt: what built and ran it (compiler, flags, library
// versions, host, CPU, kernels), so that two receipts that disagree can say why.
#pragma once

#include <string>

namespace harness::run {

struct StackInfo {
  std::string git_commit, toolchain, libraries, host, cpu, kernels;
};

StackInfo collect_stack_info();
std::string utc_timestamp();  // ISO 8601, seconds, "Z"

}  // namespace harness::run
