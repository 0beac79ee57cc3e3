// The gpt2 architecture: GPT-2 (pre-LayerNorm, tied LM head) written once against the
// Engine call boundary (canary.h has the step around it). Every engine runs this exact
// code; nothing below is engine-specific.
//
// Dimension key: B = batch, T = time, C = channels, V = vocab, L = layers, NH = heads.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/engine.h"
#include "api/tensor_table.h"
#include "architecture.h"
#include "canary.h"

namespace harness::canary {

// A gpt2 canary file's `model.gelu`: the first is the default (docs/canary-files.md).
inline constexpr std::string_view kGeluChoices[] = {"tanh", "erf"};

class Gpt2Canary : public Canary {
 public:
  // trace_ops: trace every op's results after it (`--trace ops`; Ops::call).
  explicit Gpt2Canary(const CanaryConfig& config, std::optional<FaultSpec> fault = std::nullopt,
                      bool trace_ops = false);
  std::vector<OpKind> step_ops() const override;
  TensorId token_logits() const override { return logits_; }

 private:
  bool exact_gelu() const;  // model.gelu = "erf": the MLP calls gelu_erf_*, else gelu_*

  struct LayerParams {
    TensorId ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
  };
  struct LayerActs {  // one struct for activations and one (same names) for their grads
    TensorId ln1, ln1_mean, ln1_rstd, qkv, atty, att, attproj, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu,
        fcproj, res3;
  };
  struct LayerSites {
    std::string ln1, qkv, attn, attproj, attres, ln2, fc, gelu, fcproj, mlpres;
  };

  // The ops outside the blocks, named once.
  struct TopSites {
    std::string embedding = "embedding", final_norm = "lnf", lm_head = "lm_head", loss = "loss";
  };

  static LayerSites layer_sites(std::int64_t layer);
  void describe_tensors();
  void forward(Ops& e) const override;
  void backward(Ops& e) const override;

  float ln_eps() const { return static_cast<float>(config_.layernorm_eps); }

  TensorId wte_, wpe_, lnfw_, lnfb_;
  std::vector<LayerParams> layer_params_;
  std::vector<LayerActs> acts_, grads_;
  const TopSites top_;
  std::vector<LayerSites> sites_;
  TensorId encoded_, lnf_, lnf_mean_, lnf_rstd_, logits_, probs_;
  TensorId d_encoded_, d_lnf_, d_logits_;
};

}  // namespace harness::canary
