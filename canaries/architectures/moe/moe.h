// The moe architecture (docs/design.md, "The `moe` architecture"): llama's blocks (RMSNorm,
// RoPE, grouped-query attention, no biases, an untied head) whose MLP is a mixture of
// SwiGLU experts. A linear router scores the E experts of each token; the top K take it,
// weighted by their renormalised probabilities, each expert taking at most `capacity`
// token rows a step (static shapes: the choices past it are dropped and counted); the
// experts run on their buffers of rows and the combine adds their outputs back to the
// tokens. The router also carries the Switch Transformer balance loss, whose gradient
// trains it; the receipt's loss is the language-model loss, and each layer's routing
// record (tokens per expert, dropped choices, the balance loss, a hash of the decisions)
// goes to the receipt's /routing group every step.
//
// Dimension key: as llama's, and E = experts, K = experts per token, cap = capacity,
// H = each expert's hidden size (model.mlp_hidden).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "architecture.h"
#include "llama/llama.h"

namespace harness::canary {

class MoeCanary : public LlamaCanary {
 public:
  explicit MoeCanary(const CanaryConfig& config, std::optional<FaultSpec> fault = std::nullopt,
                     bool trace_ops = false);
  std::vector<OpKind> step_ops() const override;
  std::vector<StepState> step_state(Engine& engine) const override;

 private:
  struct ExpertSites {
    std::string router, route, dispatch, gate, up, swiglu, down, combine;
  };
  struct ExpertParams {
    TensorId router, gate, up, down;  // router (E,C); gate and up (E,H,C); down (E,C,H)
  };
  struct ExpertActs {  // activations, and (same names, where one exists) their gradients
    TensorId logits, probs, weights, expert, slot, expert_in, gate, up, swiglu, expert_out, out;
  };

  static ExpertSites expert_sites(int layer);
  void describe_mlp_parameters(int layer) override;
  void describe_mlp_activations(int layer) override;
  std::pair<TensorId, TensorId> mlp_branch(int layer) const override;
  void mlp_forward(Ops& e, int layer, TensorId in) const override;
  void mlp_backward(Ops& e, int layer, TensorId in, TensorId d_in) const override;

  std::vector<ExpertSites> expert_sites_;
  std::vector<ExpertParams> expert_params_;
  std::vector<ExpertActs> expert_acts_, expert_grads_;
  std::vector<TensorId> routing_;  // per layer: its routing record (E+4), read after each step
};

}  // namespace harness::canary
