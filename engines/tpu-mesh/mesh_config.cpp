#include "mesh_config.h"

#include <algorithm>
#include <charconv>
#include <iterator>
#include <optional>
#include <stdexcept>

#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace harness::tpu {
namespace {

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument(message); }

constexpr int kMaxAxisSize = 64;

// A whole decimal number in 1..max, or nothing.
std::optional<int> parse_count(const std::string& text, int max) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < 1 || value > max) {
    return std::nullopt;
  }
  return value;
}

int parse_axis_size(const std::string& text, const std::string& whole) {
  const std::optional<int> size = parse_count(text, kMaxAxisSize);
  if (!size) {
    fail(fmt::format("--mesh: '{}' is not DxM with D and M in 1..{} (data x model devices, e.g. 2x2)", whole,
                     kMaxAxisSize));
  }
  return *size;
}

int parse_grad_accum(const std::string& text) {
  const std::optional<int> count = parse_count(text, kMaxGradAccum);
  if (!count) fail(fmt::format("--grad-accum: '{}' is not a count of micro-batches in 1..{}", text, kMaxGradAccum));
  return *count;
}

}  // namespace

std::string Mesh::to_string() const { return fmt::format("{}x{}", data, model); }

std::string to_string(ShardPlan plan) {
  switch (plan) {
    case ShardPlan::DataParallel: return "dp";
    case ShardPlan::TensorParallel: return "tp";
    case ShardPlan::Zero3: return "zero3";
    case ShardPlan::ExpertParallel: return "ep";
  }
  return "?";
}

std::string to_string(Precision precision) { return precision == Precision::Bf16 ? "bf16" : "fp32"; }
std::string to_string(CompileMode mode) { return mode == CompileMode::Microstep ? "microstep" : "step"; }

Mesh parse_mesh(const std::string& text) {
  const std::size_t x = text.find('x');
  if (x == std::string::npos) parse_axis_size("", text);  // reports the expected form
  Mesh mesh;
  mesh.data = parse_axis_size(text.substr(0, x), text);
  mesh.model = parse_axis_size(text.substr(x + 1), text);
  return mesh;
}

std::string MeshConfig::engine_label() const { return fmt::format("tpu-mesh@{}", mesh.to_string()); }

std::vector<std::string> MeshConfig::budget_features() const {
  return {precision == Precision::Bf16 ? "mesh-bf16" : "mesh-fp32"};
}

std::string MeshConfig::canonical_features() const {
  std::vector<std::string> parts{to_string(plan)};
  if (precision != Precision::Fp32) parts.push_back(to_string(precision));
  if (compile_mode != CompileMode::Step) parts.push_back(to_string(compile_mode));
  if (grad_accum != 1) parts.push_back(fmt::format("accum{}", grad_accum));
  if (leak_scalars) parts.emplace_back("leak-scalars");
  return fmt::format("{}", fmt::join(parts, "+"));
}

std::string MeshConfig::fingerprint_flags() const {
  return fmt::format("compile-mode={};grad-accum={};leak-scalars={};mesh={};precision={};shard-plan={}",
                     to_string(compile_mode), grad_accum, leak_scalars ? 1 : 0, mesh.to_string(), to_string(precision),
                     to_string(plan));
}

namespace {

void parse_mesh_flag(const std::string& v, MeshConfig& c) { c.mesh = parse_mesh(v); }

void parse_shard_plan(const std::string& v, MeshConfig& c) {
  if (v == "dp") c.plan = ShardPlan::DataParallel;
  else if (v == "tp") c.plan = ShardPlan::TensorParallel;
  else if (v == "zero3") c.plan = ShardPlan::Zero3;
  else if (v == "ep") c.plan = ShardPlan::ExpertParallel;
  else fail(fmt::format("--shard-plan: unknown plan '{}' (dp, tp, zero3, ep)", v));
}

void parse_precision(const std::string& v, MeshConfig& c) {
  if (v == "fp32") c.precision = Precision::Fp32;
  else if (v == "bf16") c.precision = Precision::Bf16;
  else fail(fmt::format("--precision: unknown precision '{}' (fp32, bf16)", v));
}

void parse_compile_cache(const std::string& v, MeshConfig& c) {
  if (v.empty()) fail("--compile-cache: give a directory (it is created if missing)");
  c.compile_cache_dir = v;
}

void parse_compile_mode(const std::string& v, MeshConfig& c) {
  if (v == "step") c.compile_mode = CompileMode::Step;
  else if (v == "microstep") c.compile_mode = CompileMode::Microstep;
  else fail(fmt::format("--compile-mode: unknown mode '{}' (step, microstep)", v));
}

void parse_grad_accum_flag(const std::string& v, MeshConfig& c) { c.grad_accum = parse_grad_accum(v); }

void parse_leak_scalars(const std::string&, MeshConfig& c) { c.leak_scalars = true; }

// tpu-mesh's flags, described once.
constexpr FlagParser<MeshConfig> kMeshFlags[] = {
    {{"mesh", "tpu-mesh devices as DxM over the axes data x model (default 1x1)"}, parse_mesh_flag},
    {{"shard-plan", "tpu-mesh sharding: dp (default), tp, zero3 or ep (experts over data)"}, parse_shard_plan},
    {{"precision", "tpu-mesh precision: fp32 (default) or bf16"}, parse_precision},
    {{"compile-cache", "tpu-mesh persistent compile cache directory (created if missing)"}, parse_compile_cache},
    {{"compile-mode", "tpu-mesh programs: step (default: one per step) or microstep (forward+backward per "
                      "micro-batch, optimizer apart)"},
     parse_compile_mode},
    {{"grad-accum", "tpu-mesh micro-batches per step, 1..64 (default 1); must divide each data shard's batch"},
     parse_grad_accum_flag},
    {{"leak-scalars", "tpu-mesh: bake the learning rate into the graph (the recompile-every-step trap, on purpose)",
      true},
     parse_leak_scalars},
};

}  // namespace

std::vector<EngineFlag> mesh_flags() { return flags_of(kMeshFlags); }

MeshConfig parse_mesh_config(const EngineSettings& settings) {
  if (!settings.features.empty()) {
    fail(fmt::format("--features: engine tpu-mesh takes no features (got '{}'); use --precision bf16 for bf16",
                     settings.features));
  }
  MeshConfig c;
  apply_flags(kMeshFlags, settings, c);
  return c;
}

}  // namespace harness::tpu
