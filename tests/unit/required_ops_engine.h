// A test engine that runs no op but says which it implements (tests of engine_cannot_run).
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "api/engine.h"

namespace harness::testing {

// An engine that implements the boundary's required (core) ops, and of the families whose
// ops have a default (llama, MoE) only those it is given: engine_cannot_run is all a test
// asks of it, so its ops do nothing.
class RequiredOpsOnly final : public Engine {
 public:
  explicit RequiredOpsOnly(std::set<OpFamily> also = {}) : also_(std::move(also)) {}
  std::string_view name() const override { return "required-only"; }
  bool implements(OpKind op) const override {
    return describe(op).family == OpFamily::Core || also_.count(describe(op).family) > 0;
  }
  std::vector<std::string> budget_features() const override { return {}; }
  void bind(const TensorTable&) override {}
  void upload(TensorId, std::span<const float>) override {}
  void upload_tokens(TensorId, std::span<const std::int32_t>) override {}
  std::span<const float> read(TensorId) override { return {}; }
  void step_begin(int) override {}
  void step_end() override {}
  void zero(TensorId) override {}
  void encoder_forward(const OpSite&, TensorId, TensorId, TensorId, TensorId) override {}
  void encoder_backward(const OpSite&, TensorId, TensorId, TensorId, TensorId) override {}
  void layernorm_forward(const OpSite&, TensorId, TensorId, TensorId, TensorId, TensorId, TensorId, float) override {}
  void layernorm_backward(const OpSite&, TensorId, TensorId, TensorId, TensorId, TensorId, TensorId, TensorId,
                          TensorId) override {}
  void linear_forward(const OpSite&, TensorId, TensorId, TensorId, TensorId) override {}
  void linear_backward(const OpSite&, TensorId, TensorId, TensorId, TensorId, TensorId, TensorId) override {}
  void attention_forward(const OpSite&, TensorId, TensorId, TensorId) override {}
  void attention_backward(const OpSite&, TensorId, TensorId, TensorId, TensorId) override {}
  void gelu_forward(const OpSite&, TensorId, TensorId) override {}
  void gelu_backward(const OpSite&, TensorId, TensorId, TensorId) override {}
  void gelu_erf_forward(const OpSite&, TensorId, TensorId) override {}
  void gelu_erf_backward(const OpSite&, TensorId, TensorId, TensorId) override {}
  void residual_forward(const OpSite&, TensorId, TensorId, TensorId) override {}
  void residual_backward(const OpSite&, TensorId, TensorId, TensorId) override {}
  void crossentropy_forward(const OpSite&, TensorId, TensorId, TensorId, TensorId) override {}
  void crossentropy_backward(const OpSite&, TensorId, TensorId, TensorId) override {}
  void global_norm(const OpSite&, TensorId, std::span<const TensorId>) override {}
  void clip_by_norm(const OpSite&, std::span<const TensorId>, TensorId, float) override {}
  void adamw_update(const OpSite&, TensorId, TensorId, TensorId, TensorId, TensorId, TensorId, TensorId,
                    const AdamWConfig&) override {}
  void nudge_ulps(const OpSite&, TensorId, TensorId) override {}
  void trace(const OpSite&, TensorId) override {}
 private:
  std::set<OpFamily> also_;
};

}  // namespace harness::testing
