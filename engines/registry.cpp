#include "registry.h"

#include <stdexcept>

#include <fmt/format.h>

#include "accel_engine.h"
#include "cpu_ref_engine.h"

namespace harness {
namespace {

void reject_settings(std::string_view engine, const EngineSettings& settings) {
  if (!settings.features.empty()) {
    throw std::invalid_argument(
        fmt::format("--features: engine '{}' takes no features (got '{}'); bf16/fp8 run on --engine accel", engine,
                    settings.features));
  }
  if (!settings.options.empty()) {
    throw std::invalid_argument(fmt::format("--{}: engine '{}' has no such setting; it belongs to --engine accel",
                                            settings.options.begin()->first, engine));
  }
}

}  // namespace

std::vector<std::string> engine_names() { return {"cpu-ref", "accel"}; }

std::unique_ptr<Engine> make_engine(std::string_view name, const EngineSettings& settings) {
  if (name == "cpu-ref") {
    reject_settings(name, settings);
    return std::make_unique<CpuRefEngine>();
  }
  if (name == "accel") return std::make_unique<accel::AccelEngine>(accel::parse_accel_config(settings));
  std::string known;
  for (const auto& n : engine_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("--engine: unknown engine '" + std::string(name) + "' (available: " + known + ")");
}

}  // namespace harness
