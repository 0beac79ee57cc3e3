// Engine settings as the command line gives them, before an engine parses them: the
// --features string and the engine's own flags by name. Each engine validates its own
// settings (cpu-ref takes none) and rejects what it does not know with a line that
// names the flag.
#pragma once

#include <map>
#include <string>

namespace harness {

// The flags of each engine, by name without dashes. The CLI offers all of them; each
// engine accepts only its own.
inline constexpr const char* kAccelFlagNames[] = {"noise", "noise-seed", "fp8-recipe", "amax-history",
                                                  "amax-algo", "margin", "fp8-accumulate"};
// "leak-scalars" is a switch: present (any value) means on.
inline constexpr const char* kMeshFlagNames[] = {"mesh",         "shard-plan", "precision", "compile-cache",
                                                 "compile-mode", "grad-accum", "leak-scalars"};

struct EngineSettings {
  std::string features;                         // --features, e.g. "bf16,fp8=mlp_fc"
  std::map<std::string, std::string> options;   // flag without dashes -> value, e.g. "noise" -> "off"
};

}  // namespace harness
