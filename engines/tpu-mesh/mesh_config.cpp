#include "mesh_config.h"

#include <algorithm>
#include <charconv>
#include <iterator>
#include <stdexcept>

#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace harness::tpu {
namespace {

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument(message); }

constexpr int kMaxAxisSize = 64;

int parse_axis_size(const std::string& text, const std::string& whole) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < 1 || value > kMaxAxisSize) {
    fail(fmt::format("--mesh: '{}' is not DxM with D and M in 1..{} (data x model devices, e.g. 2x2)", whole,
                     kMaxAxisSize));
  }
  return value;
}

}  // namespace

std::string Mesh::to_string() const { return fmt::format("{}x{}", data, model); }

std::string to_string(ShardPlan plan) {
  switch (plan) {
    case ShardPlan::DataParallel: return "dp";
    case ShardPlan::TensorParallel: return "tp";
    case ShardPlan::Zero3: return "zero3";
  }
  return "?";
}

std::string to_string(Precision precision) { return precision == Precision::Bf16 ? "bf16" : "fp32"; }

Mesh parse_mesh(const std::string& text) {
  const std::size_t x = text.find('x');
  if (x == std::string::npos) parse_axis_size("", text);  // reports the expected form
  Mesh mesh;
  mesh.data = parse_axis_size(text.substr(0, x), text);
  mesh.model = parse_axis_size(text.substr(x + 1), text);
  return mesh;
}

std::string MeshConfig::engine_label() const { return fmt::format("tpu-mesh@{}", mesh.to_string()); }

std::string MeshConfig::canonical_features() const {
  std::vector<std::string> parts{to_string(plan)};
  if (precision != Precision::Fp32) parts.push_back(to_string(precision));
  if (leak_scalars) parts.emplace_back("leak-scalars");
  return fmt::format("{}", fmt::join(parts, "+"));
}

std::string MeshConfig::fingerprint_flags() const {
  return fmt::format("leak-scalars={};mesh={};precision={};shard-plan={}", leak_scalars ? 1 : 0, mesh.to_string(),
                     to_string(precision), to_string(plan));
}

MeshConfig parse_mesh_config(const EngineSettings& settings) {
  if (!settings.features.empty()) {
    fail(fmt::format("--features: engine tpu-mesh takes no features (got '{}'); use --precision bf16 for bf16",
                     settings.features));
  }
  for (const auto& option : settings.options) {
    const bool known = std::find(std::begin(kMeshFlagNames), std::end(kMeshFlagNames), option.first) !=
                       std::end(kMeshFlagNames);
    if (!known) fail(fmt::format("--{}: not an option of engine tpu-mesh", option.first));
  }
  const auto& o = settings.options;
  MeshConfig c;
  if (auto it = o.find("mesh"); it != o.end()) c.mesh = parse_mesh(it->second);
  if (auto it = o.find("shard-plan"); it != o.end()) {
    if (it->second == "dp") c.plan = ShardPlan::DataParallel;
    else if (it->second == "tp") c.plan = ShardPlan::TensorParallel;
    else if (it->second == "zero3") c.plan = ShardPlan::Zero3;
    else fail(fmt::format("--shard-plan: unknown plan '{}' (dp, tp, zero3)", it->second));
  }
  if (auto it = o.find("precision"); it != o.end()) {
    if (it->second == "fp32") c.precision = Precision::Fp32;
    else if (it->second == "bf16") c.precision = Precision::Bf16;
    else fail(fmt::format("--precision: unknown precision '{}' (fp32, bf16)", it->second));
  }
  if (auto it = o.find("compile-cache"); it != o.end()) {
    if (it->second.empty()) fail("--compile-cache: give a directory (it is created if missing)");
    c.compile_cache_dir = it->second;
  }
  // One compile mode exists: the whole step as one program. Micro-step programs need a
  // canary that splits its batch (docs/engines/tpu-mesh.md, "Left out").
  if (auto it = o.find("compile-mode"); it != o.end() && it->second != "step") {
    fail(it->second == "microstep"
             ? "--compile-mode: microstep is not built yet; only step (one program per step) runs today"
             : fmt::format("--compile-mode: unknown mode '{}' (step)", it->second));
  }
  if (auto it = o.find("grad-accum"); it != o.end() && it->second != "1") {
    fail(fmt::format("--grad-accum: '{}': gradient accumulation over micro-batches is not built yet; only 1 runs today",
                     it->second));
  }
  c.leak_scalars = o.count("leak-scalars") != 0;
  return c;
}

}  // namespace harness::tpu
