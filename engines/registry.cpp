#include "registry.h"

#include <algorithm>
#include <iterator>
#include <stdexcept>

#include <fmt/format.h>

#include "accel_engine.h"
#include "cpu_ref_engine.h"
#include "tpu_mesh_engine.h"

namespace harness {
namespace {

void reject_settings(std::string_view engine, const EngineSettings& settings) {
  if (!settings.features.empty()) {
    throw std::invalid_argument(
        fmt::format("--features: engine '{}' takes no features (got '{}'); bf16/fp8 run on --engine accel or "
                    "--engine tpu-mesh --precision bf16",
                    engine,
                    settings.features));
  }
  if (!settings.options.empty()) {
    const std::string& flag = settings.options.begin()->first;
    const bool mesh_flag = std::find(std::begin(kMeshFlagNames), std::end(kMeshFlagNames), flag) != std::end(kMeshFlagNames);
    throw std::invalid_argument(fmt::format("--{}: engine '{}' has no such setting; it belongs to --engine {}", flag,
                                            engine, mesh_flag ? "tpu-mesh" : "accel"));
  }
}

}  // namespace

std::vector<std::string> engine_names() { return {"cpu-ref", "accel", "tpu-mesh"}; }

std::unique_ptr<Engine> make_engine(std::string_view name, const EngineSettings& settings) {
  if (name == "cpu-ref") {
    reject_settings(name, settings);
    return std::make_unique<CpuRefEngine>();
  }
  if (name == "accel") return std::make_unique<accel::AccelEngine>(accel::parse_accel_config(settings));
  if (name == "tpu-mesh") return std::make_unique<tpu::TpuMeshEngine>(tpu::parse_mesh_config(settings));
  std::string known;
  for (const auto& n : engine_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("--engine: unknown engine '" + std::string(name) + "' (available: " + known + ")");
}

}  // namespace harness
