// Fault injection for testing the harness itself: `step=K,op=NAME[,ulps=N]` moves the
// first element of op NAME's forward output up by N units in the last place at step K.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace harness::canary {

struct FaultSpec {
  int step = 0;
  std::string op;
  std::int32_t ulps = 1;

  std::string to_string() const;  // canonical "step=K,op=NAME,ulps=N" for the manifest
};

// Parses the --inject-fault value; throws std::invalid_argument naming the bad field.
// `known_ops` (the model's forward op names) validates op=.
FaultSpec parse_fault_spec(std::string_view text, const std::vector<std::string>& known_ops);

}  // namespace harness::canary
