// cpu-ref: the bitwise-deterministic reference engine. Eager fp32 execution on oneTBB with
// the deterministic kernels of kernels.h and gemm.h. Receipts from this engine are
// identical across thread counts, repeated runs, Debug/Release, GCC/Clang and
// -march=x86-64/native builds (docs/determinism.md says why each holds).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "api/engine.h"
#include "kernels/host_tensors.h"
#include "kernels/llama_kernels.h"

namespace harness {

// cpu-ref's one setting, a deliberate fault for drills (the op oracle's test of a
// fast-math exp, docs/oracle.md): --fast-exp BLOCK,... computes the softmax of those blocks'
// attention with kernels::fast_exp_inplace. Part of the lane name, never of the budget
// features: a fault is what the checks must find.
struct CpuRefConfig {
  std::set<int> fast_exp_blocks;
  std::string canonical_features() const;  // "" or "fast-exp=1,3"
};
std::vector<EngineFlag> cpu_ref_flags();
CpuRefConfig parse_cpu_ref_config(const EngineSettings& settings);  // throws std::invalid_argument naming the flag

class CpuRefEngine final : public Engine {
 public:
  CpuRefEngine() = default;
  explicit CpuRefEngine(CpuRefConfig config) : config_(std::move(config)) {}
  std::string_view name() const override { return "cpu-ref"; }
  std::string features() const override { return config_.canonical_features(); }
  std::vector<std::string> budget_features() const override { return {}; }  // the reference itself
  void check_table(const TensorTable& table) const override;  // --fast-exp's blocks are the model's
  void bind(const TensorTable& table) override { t_.bind(table); }

  void upload(TensorId id, std::span<const float> values) override { t_.upload(id, values); }
  void upload_tokens(TensorId id, std::span<const std::int32_t> tokens) override { t_.upload_tokens(id, tokens); }
  std::span<const float> read(TensorId id) override { return t_.view(id); }

  void step_begin(int) override {}
  void step_end() override {}

  void zero(TensorId id) override { t_.zero(id); }
  // Every compute op of the boundary (engines/api/engine_ops.inc), each defined in cpu_ref_engine.cpp.
#define HARNESS_ENGINE_OP(family, kind, member, parameters) void member parameters override;
#include "api/engine_ops.inc"
#undef HARNESS_ENGINE_OP
  bool implements(OpKind) const override { return true; }  // every op of the boundary
  void trace(const OpSite& site, TensorId tensor) override {
    if (trace_sink()) trace_sink()->on_trace(site, tensor, t_.view(tensor));
  }

 private:
  float* f32(TensorId id) { return t_.f32(id); }
  const std::int32_t* i32(TensorId id) const { return t_.i32(id); }
  const TensorDesc& desc(TensorId id) const { return t_.desc(id); }
  float scalar(TensorId id) { return *f32(id); }
  kernels::SoftmaxExp softmax_exp(const OpSite& site) const;  // --fast-exp's blocks: the fault's exp
  std::int64_t rows(TensorId id) const { return t_.rows(id); }

  CpuRefConfig config_;
  HostTensors t_;
  kernels::RopeTableCache rope_tables_;
};

}  // namespace harness
