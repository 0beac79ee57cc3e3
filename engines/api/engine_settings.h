// Engine settings as the command line gives them, before an engine parses them: the
// --features string and the engine's own flags by name. Each engine validates its own
// settings (cpu-ref takes none) and rejects what it does not know with a line that
// names the flag.
#pragma once

#include <map>
#include <string>

namespace harness {

struct EngineSettings {
  std::string features;                         // --features, e.g. "bf16,fp8=mlp_fc"
  std::map<std::string, std::string> options;   // flag without dashes -> value, e.g. "noise" -> "off"
};

}  // namespace harness
