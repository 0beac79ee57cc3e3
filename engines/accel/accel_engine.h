// accel: the canary with the numerics of a GPU training stack. Eager execution like
// cpu-ref, with a numerics policy (bf16 autocast, FP8 zones with Transformer-Engine
// scaling, an optional limited FP8 accumulator) and reductions ordered by a noise source
// (seeded, racy or off). docs/engines/accel.md lists which tensor is stored in which
// format and which reductions are noisy.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "accel_config.h"
#include "accel_kernels.h"
#include "api/engine.h"
#include "kernels/host_tensors.h"
#include "kernels/llama_kernels.h"
#include "noise.h"
#include "numerics/fp8_scaling.h"

namespace harness::accel {

class AccelEngine final : public Engine {
 public:
  explicit AccelEngine(const AccelConfig& config);

  std::string_view name() const override { return "accel"; }
  std::string features() const override { return config_.canonical_features(); }
  std::vector<std::string> budget_features() const override { return config_.budget_features(); }
  std::vector<PrecisionSwitch> precision_switches(int layers) const override {
    return accel::precision_switches(config_, layers);
  }
  std::map<std::string, AttributeValue> manifest_attributes() const override;
  ReductionOrder reduction_order() const override;
  std::optional<ReductionSeed> reduction_seed() const override;
  std::vector<StepState> step_state() const override;
  EngineState save_state() const override;
  void restore_state(const EngineState& state) override;

  void bind(const TensorTable& table) override;
  void upload(TensorId id, std::span<const float> values) override;
  void upload_tokens(TensorId id, std::span<const std::int32_t> tokens) override { t_.upload_tokens(id, tokens); }
  std::span<const float> read(TensorId id) override { return t_.view(id); }

  void step_begin(int step) override;
  void step_end() override;

  void zero(TensorId id) override;
  // Every compute op of the boundary (engines/api/engine_ops.inc), each defined in
  // accel_engine.cpp. The MoE ops: the router's in fp32 (its outputs are statistics), the
  // dispatch, combine and experts' GEMMs stored and read in bf16 under bf16, with noisy
  // reductions; the experts are in no FP8 zone yet (check_table refuses a zone that covers
  // no weight).
#define HARNESS_ENGINE_OP(family, kind, member, parameters) void member parameters override;
#include "api/engine_ops.inc"
#undef HARNESS_ENGINE_OP
  bool implements(OpKind) const override { return true; }  // every op of every family
  // Under bf16: a linear's weight rounded to bf16 (unless its role or a switched-off unit
  // keeps it fp32; an FP8 unit's operands quantised with their declared scales), activations and
  // their gradients stored in bf16 (stores_bf16), a switched-off unit's linear output not.
  OpNumerics op_numerics(OpKind op, const OpSite& site, std::span<const TensorId> operands) override;
  // Every FP8 zone the configuration enables covers a weight of the canary.
  void check_table(const TensorTable& table) const override;
  void trace(const OpSite& site, TensorId tensor) override {
    if (trace_sink()) trace_sink()->on_trace(site, tensor, t_.view(tensor));
  }

 private:
  // A weight as this step's GEMMs read it: rounded to bf16 (unless its role keeps it fp32)
  // or quantised to the E4M3 grid (unscaled codes' values), as rows (OC,C) and transposed
  // (C,OC); a stack of experts' weights (E,OC,C) as E such blocks. Built once per step,
  // into the buffers of the step before (allocating and zero-filling them cost 1% of a step).
  struct PreparedWeight {
    std::vector<float> rows, transposed;
    float scale = 1.0f;  // FP8 scale; the GEMM multiplies its output by 1/scale
    bool current = false;  // built since the weight last changed (a step began, an upload)
  };
  // The scaling state of one FP8 zone instance (a linear layer of one block).
  struct ZoneScaling {
    std::string site;  // the layer's label in receipts and checkpoints
    numerics::Fp8ScalingState input, weight, grad_output;
    float input_scale = 1.0f;  // the scale the forward quantised the input with (reused for dW)
    float grad_output_scale = 1.0f;  // the scale the last backward quantised its output gradient with
    // The forward's fp8 input, kept for the weight gradient (as Transformer Engine keeps
    // it): the backward would compute the same values from the same input and scale. Which
    // input and step made it: the backward uses it only for that input in that step.
    std::vector<float> quantised_input;
    TensorId quantised_from = kNoTensor;
    int quantised_step = -1;
  };
  // A zone's three roles by name (const or not, as the zone).
  template <class Zone>
  static auto roles(Zone& z) {
    return std::array{std::pair{"input", &z.input}, std::pair{"weight", &z.weight},
                      std::pair{"grad_output", &z.grad_output}};
  }
  // What the last step recorded per zone instance and role: amax and the scale used.
  struct Fp8Record {
    std::vector<double> amax, scale;
  };

  // How one linear layer computes, from its unit (zone@block) and the unit switches.
  struct UnitNumerics {
    ZoneScaling* zone = nullptr;  // nullptr: not in FP8 (no enabled zone, --fp8-off or --bf16-off)
    numerics::Fp8Format format = numerics::Fp8Format::E4M3;  // its forward operands' (E5M2: --fp8-e5m2)
    bool saturate = false;     // --fp8-saturate: quantised with a scale kSaturatingOverscale too large
    bool fp32 = false;         // --bf16-off: fp32 weight and outputs under bf16
  };
  UnitNumerics unit_numerics(const OpSite& site, TensorId weight);
  // The weight as the unit's GEMMs read it (the expert GEMMs: no unit, bf16 under bf16).
  const PreparedWeight& prepared_weight(TensorId weight, const UnitNumerics& unit);
  const PreparedWeight& prepared_weight(TensorId weight) { return prepared_weight(weight, UnitNumerics()); }
  void values_changed(TensorId id);  // its prepared weight, if it is a weight, is built again
  // The tensor's values as a GEMM operand: copied into `buffer` and quantised to the
  // FP8 grid with `scale` (FP8 zones), or used in place (already bf16 when stored bf16).
  const float* fp8_operand(TensorId id, float scale, numerics::Fp8Format format, std::vector<float>& buffer);
  // The tensor quantised with this step's scale of `role`, which records the tensor's amax:
  // one pass over the tensor under delayed scaling, amax then quantisation otherwise.
  struct ScaledOperand {
    const float* values;  // in the buffer
    float scale;
  };
  // `saturate` (--fp8-saturate): the scale is kSaturatingOverscale times too large.
  ScaledOperand scaled_fp8_operand(TensorId id, numerics::Fp8ScalingState& role, numerics::Fp8Format format,
                                   bool saturate, std::vector<float>& buffer);
  // Rounds a freshly written tensor to its storage format (bf16 for activations under bf16).
  void store(TensorId id);
  bool stores_bf16(TensorId id) const;  // what store() rounds
  // A linear's GEMM under its unit's numerics: its weight rounded to bf16 (prepared_weight),
  // and its result `id` rounded to bf16 as the GEMM stores it (none in a unit switched to fp32).
  bool weight_in_bf16(TensorId weight, const UnitNumerics& unit) const;
  // The FP8 operands of a unit's linear (op_numerics), with the scales its last call used.
  std::vector<std::optional<OpNumerics::Scaled>> fp8_operands(OpKind op, std::span<const TensorId> operands,
                                                              const UnitNumerics& unit) const;
  bool result_in_bf16(TensorId id, const UnitNumerics& unit) const { return stores_bf16(id) && !unit.fp32; }
  // The attention kernels run P @ V in bf16 under bf16: they round the probabilities they
  // save (att, a statistic that stores_bf16 keeps fp32) to bf16 themselves.
  bool probabilities_in_bf16() const { return config_.bf16; }
  ReduceContext reduce_context() { return {noise_, workspace_}; }
  // The K chunk of an (M,N) = (M,K) @ (K,N) GEMM: fixed, or by the row count (--split-k).
  int split_k_chunk(int M, int N, int K) const {
    return config_.split_k == SplitK::Rows ? row_split_k_chunk(M, N, K) : kSplitKChunk;
  }
  // The heads of q, k, v (gpt2: one fused qkv) as the attention kernels read them.
  AttentionHeads gqa_heads(TensorId att, TensorId q, TensorId k, TensorId v);
  float* f32(TensorId id) { return t_.f32(id); }
  float scalar(TensorId id) { return *t_.f32(id); }

  AccelConfig config_;
  NoiseSource noise_;
  HostTensors t_;
  kernels::RopeTableCache rope_tables_;
  std::unordered_map<TensorId, PreparedWeight> prepared_;  // not current after step_begin and upload
  std::vector<ZoneScaling> zones_;                         // in table order of their weights
  std::unordered_map<TensorId, std::size_t> zone_index_;   // weight -> its zone in zones_
  Fp8Record last_step_fp8_;
  std::vector<float> workspace_, operand_a_, operand_b_;
  int step_ = -1;  // the step step_begin began
};

}  // namespace harness::accel
