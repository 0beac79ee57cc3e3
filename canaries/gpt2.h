// The canary model: GPT-2 (pre-LayerNorm, tied LM head) written once against the Engine
// call boundary. Every engine runs this exact code; nothing below is engine-specific.
//
// Dimension key: B = batch, T = time, C = channels, V = vocab, L = layers, NH = heads.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "api/engine.h"
#include "api/tensor_table.h"
#include "byte_stream.h"
#include "fault.h"
#include "preset.h"

namespace harness::canary {

struct StepResult {
  int step = 0;
  float loss = 0;       // loss of batch `step` on params_step
  float grad_norm = 0;  // global L2 norm before clipping
  float lr = 0;         // learning rate the update used (fp32, as uploaded)
};

class Gpt2Canary {
 public:
  // trace_ops: call Engine::trace() after every op on its outputs (`--trace ops`).
  explicit Gpt2Canary(const CanaryConfig& config, std::optional<FaultSpec> fault = std::nullopt,
                      bool trace_ops = false);

  const CanaryConfig& config() const { return config_; }
  const TensorTable& tensors() const { return table_; }
  // Parameters in canonical order: the order of hashes, dumps and the receipt's names.
  const std::vector<TensorId>& parameters() const { return table_.of_kind(TensorKind::Parameter); }
  // Names of the forward ops, in execution order (valid fault-injection targets).
  const std::vector<std::string>& forward_op_names() const { return forward_op_names_; }

  // Initial parameter values (host side), drawn from the counter-based generator.
  std::vector<float> initial_values(TensorId parameter, std::uint64_t seed) const;
  void upload_initial_parameters(Engine& engine, std::uint64_t seed) const;

  // One training step: batch `step` -> loss on params_step -> params_{step+1}.
  StepResult train_step(Engine& engine, int step, const Batch& batch) const;
  // For gradient checks: the loss alone (forward), or the loss with every gradient
  // computed (forward + backward, no clipping, no update). Parameters do not change.
  float evaluate_loss(Engine& engine, int step, const Batch& batch) const;
  float compute_gradients(Engine& engine, int step, const Batch& batch) const;

 private:
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

  void describe_tensors();
  // Uploads the batch and per-step scalars, zeroes gradients; returns the uploaded lr.
  float begin_step(Engine& e, int step, const Batch& batch) const;
  void forward(Engine& e) const;
  void backward(Engine& e) const;
  void update(Engine& e) const;
  void after_forward_op(Engine& e, const OpSite& site, TensorId out) const;
  void traced(Engine& e, const OpSite& site, std::initializer_list<TensorId> outputs) const;
  static OpSite site(std::string_view name, int layer, Phase phase) { return {name, layer, phase}; }

  float ln_eps() const { return static_cast<float>(config_.layernorm_eps); }

  CanaryConfig config_;
  std::optional<FaultSpec> fault_;
  bool trace_ops_ = false;
  std::vector<int> parameter_layers_;  // by position in parameters()
  TensorTable table_;
  std::vector<std::string> forward_op_names_;

  TensorId wte_, wpe_, lnfw_, lnfb_;
  std::vector<LayerParams> layer_params_;
  std::vector<LayerActs> acts_, grads_;
  std::vector<LayerSites> sites_;
  TensorId inputs_, targets_, encoded_, lnf_, lnf_mean_, lnf_rstd_, logits_, probs_;
  TensorId d_encoded_, d_lnf_, d_logits_;
  TensorId loss_, grad_norm_, lr_, bias_correction1_, bias_correction2_, fault_ulps_ = kNoTensor;
};

}  // namespace harness::canary
