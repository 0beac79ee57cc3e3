// Engine settings as the command line gives them, before an engine parses them: the
// --features string and the engine's own flags by name. Each engine validates its own
// settings (cpu-ref takes none) and rejects what it does not know with a line that
// names the flag.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace harness {

// One engine flag: its name without dashes (the CLI's --NAME, the nightly matrix's lane
// key, the replay recipe's and the manifest's engine_options key) and its help. Each engine
// describes its flags once, with their parsers (accel_config.cpp, mesh_config.cpp); the
// registry lists every engine's (engines/registry.h).
struct EngineFlag {
  std::string_view name;
  std::string_view help;
  bool is_switch = false;  // present means on (the CLI takes no value; the matrix any)
  // The budget feature whose numbers the flag tunes ("fp8" for FP8 scaling), or none: the
  // nightly's triage finds an fp8 lane's bf16-only twin by dropping the fp8 flags.
  std::string_view feature = {};
  // The flag that sets the seed of a seeded reduction order (Engine::reduction_seed's flag):
  // what the report names beside a run's seed, without making the engine.
  bool seeds_reduction_order = false;
};

// One unit of an engine's reduced precision that triage can switch to a wider format on
// its own: a layer kind (its group across blocks) in one block.
struct PrecisionUnit {
  std::string group;  // "mlp_fc": the zone, what triage tries whole before single blocks
  int layer = 0;      // the block
  std::string value;  // its word in the switch flag's list: "mlp_fc@1"
};

// A reduced format and the engine flag that switches units of it to `wider`: the flag takes
// the units' values joined with ','. Each engine describes its own (Engine::precision_switches).
struct PrecisionSwitch {
  std::string format;  // "fp8"
  std::string flag;    // "fp8-off", without dashes
  std::string wider;   // what a switched unit computes in: "bf16"
  std::vector<PrecisionUnit> units;
};

struct EngineSettings {
  std::string features;                         // --features, e.g. "bf16,fp8=mlp_fc"
  std::map<std::string, std::string> options;   // flag without dashes -> value, e.g. "noise" -> "off"
};

// A flag with its parser into an engine's config: the one description of the flag.
template <class Config>
struct FlagParser {
  EngineFlag flag;
  void (*parse)(const std::string& value, Config& config);
};

// Applies the given options to `config` in the order of `parsers` (a flag may depend on
// one before it). The registry has checked that every option is one of `parsers`'.
template <class Config, std::size_t N>
void apply_flags(const FlagParser<Config> (&parsers)[N], const EngineSettings& settings, Config& config) {
  for (const FlagParser<Config>& p : parsers) {
    if (auto it = settings.options.find(std::string(p.flag.name)); it != settings.options.end()) {
      p.parse(it->second, config);
    }
  }
}

template <class Config, std::size_t N>
std::vector<EngineFlag> flags_of(const FlagParser<Config> (&parsers)[N]) {
  std::vector<EngineFlag> flags;
  for (const FlagParser<Config>& p : parsers) flags.push_back(p.flag);
  return flags;
}

}  // namespace harness
