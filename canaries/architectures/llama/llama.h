// The llama architecture (docs/design.md, "The `llama` architecture"): pre-norm decoder
// with RMSNorm, RoPE on q and k, grouped-query attention, a SwiGLU MLP, no biases and an
// untied head, written once against the Engine call boundary (canary.h has the step
// around it).
//
// Dimension key: B = batch, T = time, C = channels, V = vocab, L = layers, NH = heads,
// NKV = kv heads, hd = C/NH, H = MLP hidden size.
#pragma once

#include <optional>
#include <utility>
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
  TensorId token_logits() const override { return logits_; }

 protected:
  // For an architecture built on llama's blocks that replaces the MLP (moe/moe.h): its
  // constructor describes the tensors once its own members exist.
  enum DescribeLater { kDescribeLater };
  LlamaCanary(const CanaryConfig& config, std::optional<FaultSpec> fault, bool trace_ops, DescribeLater);
  void describe_tensors();

  // The MLP of block l, from its normed input to the branch the residual adds: its
  // parameters (described right after the block's mlp_norm.weight), its activations
  // (after mlp_norm's), that branch and its gradient, its forward and its backward (which
  // adds into d_in, the normed input's gradient).
  virtual void describe_mlp_parameters(int layer);
  virtual void describe_mlp_activations(int layer);
  virtual std::pair<TensorId, TensorId> mlp_branch(int layer) const;
  virtual void mlp_forward(Ops& e, int layer, TensorId in) const;
  virtual void mlp_backward(Ops& e, int layer, TensorId in, TensorId d_in) const;

  float norm_eps() const { return static_cast<float>(config_.layernorm_eps); }
  int head_size() const { return config_.channels / config_.heads; }
  // The init of the matrices that write into the residual stream: N(0, init_std / sqrt(2L)).
  double residual_std_dev() const { return config_.init_std / __builtin_sqrt(2.0 * config_.layers); }

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
  void forward(Ops& e) const override;
  void backward(Ops& e) const override;
  void backward_layer(Ops& e, int l) const;

  TensorId wte_, norm_, lm_head_;
  std::vector<LayerParams> layer_params_;
  std::vector<LayerActs> acts_, grads_;
  const TopSites top_;
  std::vector<LayerSites> sites_;
  TensorId encoded_, normed_, norm_rstd_, logits_, probs_;
  TensorId d_encoded_, d_normed_, d_logits_;
};

}  // namespace harness::canary
