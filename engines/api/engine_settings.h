// Engine settings as the command line gives them, before an engine parses them: the
// --features string and the engine's own flags by name. Each engine validates its own
// settings (cpu-ref takes none) and rejects what it does not know with a line that
// names the flag.
#pragma once

#include <map>
#include <string>

namespace harness {

// Every engine flag the CLI offers, by name without dashes (accel's today).
inline constexpr const char* kEngineFlagNames[] = {"noise", "noise-seed", "fp8-recipe", "amax-history",
                                                   "amax-algo", "margin", "fp8-accumulate"};

struct EngineSettings {
  std::string features;                         // --features, e.g. "bf16,fp8=mlp_fc"
  std::map<std::string, std::string> options;   // flag without dashes -> value, e.g. "noise" -> "off"
};

}  // namespace harness
