// The llama architecture (docs/design.md, "The `llama` architecture"): pre-norm decoder
// with RMSNorm, RoPE on q and k, grouped-query attention, a SwiGLU MLP, no biases and an
// untied head, written once against the Engine call boundary (canary.h has the step
// around it).
//
// Dimension key: B = batch, T = time, C = channels, V = vocab, L = layers, NH = heads,
// NKV = kv heads, hd = C/NH, H = MLP hidden size.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "api/engine.h"
#include "api/tensor_table.h"
#include "architecture.h"
#include "canary.h"

namespace harness::canary {

class LlamaCanary : public Canary {
 public:
  explicit LlamaCanary(const CanaryConfig& config, std::optional<FaultSpec> fault = std::nullopt,
                       bool trace_ops = false);
  std::vector<OpKind> step_ops() const override;

 private:
  struct LayerParams {
    TensorId attn_norm, q, k, v, o, mlp_norm, gate, up, down;
  };
  struct LayerActs {  // one struct for activations and one (same names) for their grads
    TensorId attn_norm, attn_rstd, q, k, v, q_rope, k_rope, att, atty, o, res_attn, mlp_norm, mlp_rstd, gate, up,
        swiglu, down, res_mlp;
  };
  struct LayerSites {
    std::string attn_norm, q, k, v, rope_q, rope_k, attn, o, attn_residual, mlp_norm, gate, up, swiglu, down,
        mlp_residual;
  };

  // The ops outside the blocks, named once.
  struct TopSites {
    std::string embedding = "embedding", final_norm = "norm", lm_head = "lm_head", loss = "loss";
  };

  static LayerSites layer_sites(std::int64_t layer);
  void describe_tensors();
  void forward(Ops& e) const override;
  void backward(Ops& e) const override;
  void backward_layer(Ops& e, int l) const;

  float norm_eps() const { return static_cast<float>(config_.layernorm_eps); }
  int head_size() const { return config_.channels / config_.heads; }

  TensorId wte_, norm_, lm_head_;
  std::vector<LayerParams> layer_params_;
  std::vector<LayerActs> acts_, grads_;
  const TopSites top_;
  std::vector<LayerSites> sites_;
  TensorId encoded_, normed_, norm_rstd_, logits_, probs_;
  TensorId d_encoded_, d_normed_, d_logits_;
};

}  // namespace harness::canary
