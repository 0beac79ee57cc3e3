#include "engine.h"

#include <stdexcept>

namespace harness {

std::string_view to_string(Phase phase) {
  switch (phase) {
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Optimizer: return "optimizer";
  }
  return "unknown";
}

// ---- the llama ops, for engines that do not run them yet ---------------------------------
// The run refuses a llama canary on such an engine before step 0 (llama_ops_missing), so
// reaching one of these is a bug in the caller, never a user's input.

std::string Engine::llama_ops_missing() const {
  return "engine " + std::string(name()) +
         " does not run the llama ops (RMSNorm, RoPE, SwiGLU, grouped-query attention) yet; run a llama canary on "
         "--engine cpu-ref";
}

namespace {
[[noreturn]] void no_llama_op(const Engine& engine, const char* op) {
  throw std::logic_error(std::string(op) + " called on engine " + std::string(engine.name()) +
                         ", which does not run the llama ops (llama_ops_missing)");
}
}  // namespace

void Engine::rmsnorm_forward(const OpSite&, TensorId, TensorId, TensorId, TensorId, float) {
  no_llama_op(*this, "rmsnorm_forward");
}
void Engine::rmsnorm_backward(const OpSite&, TensorId, TensorId, TensorId, TensorId, TensorId, TensorId) {
  no_llama_op(*this, "rmsnorm_backward");
}
void Engine::rope_forward(const OpSite&, TensorId, TensorId, int, double) { no_llama_op(*this, "rope_forward"); }
void Engine::rope_backward(const OpSite&, TensorId, TensorId, int, double) { no_llama_op(*this, "rope_backward"); }
void Engine::swiglu_forward(const OpSite&, TensorId, TensorId, TensorId) { no_llama_op(*this, "swiglu_forward"); }
void Engine::swiglu_backward(const OpSite&, TensorId, TensorId, TensorId, TensorId, TensorId) {
  no_llama_op(*this, "swiglu_backward");
}
void Engine::gqa_attention_forward(const OpSite&, TensorId, TensorId, TensorId, TensorId, TensorId) {
  no_llama_op(*this, "gqa_attention_forward");
}
void Engine::gqa_attention_backward(const OpSite&, TensorId, TensorId, TensorId, TensorId, TensorId, TensorId,
                                    TensorId, TensorId) {
  no_llama_op(*this, "gqa_attention_backward");
}

}  // namespace harness
