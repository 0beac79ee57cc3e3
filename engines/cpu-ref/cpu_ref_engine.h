// cpu-ref: the bitwise-deterministic reference engine. Eager fp32 execution on oneTBB with
// the deterministic kernels of kernels.h and gemm.h. Receipts from this engine are
// identical across thread counts, repeated runs, Debug/Release, GCC/Clang and
// -march=x86-64/native builds (docs/determinism.md says why each holds).
#pragma once

#include <cstdint>

#include "api/engine.h"
#include "kernels/host_tensors.h"
#include "kernels/llama_kernels.h"

namespace harness {

class CpuRefEngine final : public Engine {
 public:
  std::string_view name() const override { return "cpu-ref"; }
  std::vector<std::string> budget_features() const override { return {}; }  // the reference itself
  void bind(const TensorTable& table) override { t_.bind(table); }

  void upload(TensorId id, std::span<const float> values) override { t_.upload(id, values); }
  void upload_tokens(TensorId id, std::span<const std::int32_t> tokens) override { t_.upload_tokens(id, tokens); }
  std::span<const float> read(TensorId id) override { return t_.view(id); }

  void step_begin(int) override {}
  void step_end() override {}

  void zero(TensorId id) override { t_.zero(id); }
  void encoder_forward(const OpSite&, TensorId out, TensorId inputs, TensorId wte, TensorId wpe) override;
  void encoder_backward(const OpSite&, TensorId dwte, TensorId dwpe, TensorId dout, TensorId inputs) override;
  void layernorm_forward(const OpSite&, TensorId out, TensorId mean, TensorId rstd, TensorId inp, TensorId weight,
                         TensorId bias, float eps) override;
  void layernorm_backward(const OpSite&, TensorId dinp, TensorId dweight, TensorId dbias, TensorId dout, TensorId inp,
                          TensorId weight, TensorId mean, TensorId rstd) override;
  void linear_forward(const OpSite&, TensorId out, TensorId inp, TensorId weight, TensorId bias) override;
  void linear_backward(const OpSite&, TensorId dinp, TensorId dweight, TensorId dbias, TensorId dout, TensorId inp,
                       TensorId weight) override;
  void attention_forward(const OpSite&, TensorId out, TensorId att, TensorId qkv) override;
  void attention_backward(const OpSite&, TensorId dqkv, TensorId dout, TensorId qkv, TensorId att) override;
  void rmsnorm_forward(const OpSite&, TensorId out, TensorId rstd, TensorId inp, TensorId weight, float eps) override;
  void rmsnorm_backward(const OpSite&, TensorId dinp, TensorId dweight, TensorId dout, TensorId inp, TensorId weight,
                        TensorId rstd) override;
  void rope_forward(const OpSite&, TensorId out, TensorId inp, int head_size, double theta) override;
  void rope_backward(const OpSite&, TensorId dinp, TensorId dout, int head_size, double theta) override;
  void swiglu_forward(const OpSite&, TensorId out, TensorId gate, TensorId up) override;
  void swiglu_backward(const OpSite&, TensorId dgate, TensorId dup, TensorId dout, TensorId gate, TensorId up) override;
  void gqa_attention_forward(const OpSite&, TensorId out, TensorId att, TensorId q, TensorId k, TensorId v) override;
  void gqa_attention_backward(const OpSite&, TensorId dq, TensorId dk, TensorId dv, TensorId dout, TensorId q,
                              TensorId k, TensorId v, TensorId att) override;
  void moe_route_forward(const OpSite&, TensorId weights, TensorId expert, TensorId slot, TensorId probs,
                         TensorId routing, TensorId logits, int top_k, int capacity, float balance_coef) override;
  void moe_route_backward(const OpSite&, TensorId dlogits, TensorId dweights, TensorId probs, TensorId weights,
                          TensorId expert, float balance_coef) override;
  void moe_dispatch_forward(const OpSite&, TensorId expert_in, TensorId inp, TensorId expert, TensorId slot) override;
  void moe_dispatch_backward(const OpSite&, TensorId dinp, TensorId dexpert_in, TensorId expert,
                             TensorId slot) override;
  void moe_combine_forward(const OpSite&, TensorId out, TensorId expert_out, TensorId weights, TensorId expert,
                           TensorId slot) override;
  void moe_combine_backward(const OpSite&, TensorId dexpert_out, TensorId dweights, TensorId dout, TensorId expert_out,
                            TensorId weights, TensorId expert, TensorId slot) override;
  void expert_linear_forward(const OpSite&, TensorId out, TensorId inp, TensorId weight) override;
  void expert_linear_backward(const OpSite&, TensorId dinp, TensorId dweight, TensorId dout, TensorId inp,
                              TensorId weight) override;
  bool implements(OpKind) const override { return true; }  // every op of the boundary
  void gelu_forward(const OpSite&, TensorId out, TensorId inp) override;
  void gelu_backward(const OpSite&, TensorId dinp, TensorId inp, TensorId dout) override;
  void gelu_erf_forward(const OpSite&, TensorId out, TensorId inp) override;
  void gelu_erf_backward(const OpSite&, TensorId dinp, TensorId inp, TensorId dout) override;
  void residual_forward(const OpSite&, TensorId out, TensorId a, TensorId b) override;
  void residual_backward(const OpSite&, TensorId da, TensorId db, TensorId dout) override;
  void crossentropy_forward(const OpSite&, TensorId loss, TensorId probs, TensorId logits, TensorId targets) override;
  void crossentropy_backward(const OpSite&, TensorId dlogits, TensorId probs, TensorId targets) override;
  void global_norm(const OpSite&, TensorId norm, std::span<const TensorId> tensors) override;
  void clip_by_norm(const OpSite&, std::span<const TensorId> tensors, TensorId norm, float max_norm) override;
  void adamw_update(const OpSite&, TensorId param, TensorId grad, TensorId m, TensorId v, TensorId lr,
                    TensorId bias_correction1, TensorId bias_correction2, const AdamWConfig& config) override;
  void nudge_ulps(const OpSite&, TensorId tensor, TensorId ulps) override;
  void trace(const OpSite& site, TensorId tensor) override {
    if (trace_sink()) trace_sink()->on_trace(site, tensor, t_.view(tensor));
  }

 private:
  float* f32(TensorId id) { return t_.f32(id); }
  const std::int32_t* i32(TensorId id) const { return t_.i32(id); }
  const TensorDesc& desc(TensorId id) const { return t_.desc(id); }
  float scalar(TensorId id) { return *f32(id); }
  std::int64_t rows(TensorId id) const { return t_.rows(id); }

  HostTensors t_;
  kernels::RopeTableCache rope_tables_;
};

}  // namespace harness
