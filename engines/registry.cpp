#include "registry.h"

#include <algorithm>
#include <iterator>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "accel/accel_engine.h"
#include "cpu-ref/cpu_ref_engine.h"
#include "tpu-mesh/tpu_mesh_engine.h"

namespace harness {
namespace {

// Features and options `engine` does not take: one line naming the flag and, when another
// engine takes it, that engine.
void reject_foreign_settings(std::string_view engine, const EngineSettings& settings) {
  if (engine == "cpu-ref" && !settings.features.empty()) {
    throw std::invalid_argument(
        fmt::format("--features: engine '{}' takes no features (got '{}'); bf16/fp8 run on --engine accel or "
                    "--engine tpu-mesh --precision bf16",
                    engine, settings.features));
  }
  for (const auto& [name, value] : settings.options) {
    const DescribedFlag* flag = find_engine_flag(name);
    if (flag != nullptr && flag->engine == engine) continue;
    const std::string owner = flag == nullptr ? "" : fmt::format("; it belongs to --engine {}", flag->engine);
    if (engine == "cpu-ref") {
      throw std::invalid_argument(fmt::format("--{}: engine '{}' has no such setting{}", name, engine, owner));
    }
    throw std::invalid_argument(fmt::format("--{}: not an option of engine {}{}", name, engine, owner));
  }
}

}  // namespace

std::vector<std::string> engine_names() { return {"cpu-ref", "accel", "tpu-mesh"}; }

std::vector<DescribedFlag> engine_flags() {
  std::vector<DescribedFlag> flags;
  for (const EngineFlag& f : accel::accel_flags()) flags.push_back({"accel", f});
  for (const EngineFlag& f : tpu::mesh_flags()) flags.push_back({"tpu-mesh", f});
  return flags;
}

const DescribedFlag* find_engine_flag(std::string_view name) {
  static const std::vector<DescribedFlag> flags = engine_flags();
  for (const DescribedFlag& f : flags) {
    if (f.flag.name == name) return &f;
  }
  return nullptr;
}

std::unique_ptr<Engine> make_engine(std::string_view name, const EngineSettings& settings) {
  const std::vector<std::string> names = engine_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    throw std::invalid_argument(fmt::format("--engine: unknown engine '{}' (available: {})", name,
                                            fmt::join(names, ", ")));
  }
  reject_foreign_settings(name, settings);
  if (name == "accel") return std::make_unique<accel::AccelEngine>(accel::parse_accel_config(settings));
  if (name == "tpu-mesh") return std::make_unique<tpu::TpuMeshEngine>(tpu::parse_mesh_config(settings));
  return std::make_unique<CpuRefEngine>();
}

}  // namespace harness
