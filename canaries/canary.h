// A canary model: the architecture-independent half of every canary (tensor table,
// initialisation from roles, the training step's shape: batch and per-step scalars,
// forward, backward, global-norm clipping and AdamW), written once against the Engine call
// boundary. An architecture (architectures/gpt2/gpt2.h) describes its tensors and writes its forward and
// backward; make_canary() picks it from the canary file's `architecture`.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "api/engine.h"
#include "api/tensor_table.h"
#include "data_source.h"
#include "fault.h"
#include "preset.h"

namespace harness::canary {

struct StepResult {
  int step = 0;
  float loss = 0;       // loss of batch `step` on params_step
  float grad_norm = 0;  // global L2 norm before clipping
  float lr = 0;         // learning rate the update used (fp32, as uploaded)
};

// How a parameter starts: a role set where the parameter is described, never inferred
// from its name. Normal values are std_dev * N(0, 1) from the counter-based generator,
// keyed by (seed, the tensor's name, element index).
struct ParameterInit {
  enum class Kind : std::uint8_t { Normal, Zeros, Ones };
  Kind kind = Kind::Normal;
  double std_dev = 0.0;
  int layer = -1;  // the block it belongs to (-1 outside blocks): the AdamW op's site layer

  static ParameterInit normal(double std_dev, int layer = -1) { return {Kind::Normal, std_dev, layer}; }
  static ParameterInit zeros(int layer = -1) { return {Kind::Zeros, 0.0, layer}; }
  static ParameterInit ones(int layer = -1) { return {Kind::Ones, 0.0, layer}; }
};

class Canary {
 public:
  virtual ~Canary() = default;

  const CanaryConfig& config() const { return config_; }
  const TensorTable& tensors() const { return table_; }
  // Parameters in canonical order: the order of hashes, dumps and the receipt's names.
  const std::vector<TensorId>& parameters() const { return table_.of_kind(TensorKind::Parameter); }
  // The engine ops its training step calls (held to a traced step by op_description_test):
  // an engine must implement each (Engine::implements) to run it.
  virtual std::vector<OpKind> step_ops() const = 0;
  // Names of the forward ops, in execution order (valid fault-injection targets).
  const std::vector<std::string>& forward_op_names() const { return forward_op_names_; }

  // Initial parameter values (host side), from the parameter's ParameterInit.
  std::vector<float> initial_values(TensorId parameter, std::uint64_t seed) const;
  // `perturbation`: a seed moves every initial value one ulp (numerics/perturbation.h).
  void upload_initial_parameters(Engine& engine, std::uint64_t seed,
                                 std::optional<std::uint64_t> perturbation = std::nullopt) const;

  // One training step: batch `step` -> loss on params_step -> params_{step+1}.
  StepResult train_step(Engine& engine, int step, const Batch& batch) const;
  // For gradient checks: the loss alone (forward), or the loss with every gradient
  // computed (forward + backward, no clipping, no update). Parameters do not change.
  float evaluate_loss(Engine& engine, int step, const Batch& batch) const;
  float compute_gradients(Engine& engine, int step, const Batch& batch) const;

 protected:
  // trace_ops: call Engine::trace() after every op on its outputs (`--trace ops`).
  Canary(const CanaryConfig& config, std::optional<FaultSpec> fault, bool trace_ops);

  // The architecture's ops; forward ends with the loss in loss_, backward leaves every
  // parameter's gradient (the engine API's accumulation convention).
  virtual void forward(Engine& e) const = 0;
  virtual void backward(Engine& e) const = 0;

  // For describing tensors: a parameter with its init role (and its Gradient, AdamM and
  // AdamV shadows); then, after the parameters, the step's inputs and scalars.
  TensorId add_parameter(const std::string& name, std::vector<std::int64_t> shape, ParameterInit init,
                         TensorRole role = {});
  void add_step_tensors();
  // An activation, and its gradient when `grad` is given (they share the name and role).
  TensorId add_activation(const std::string& name, std::vector<std::int64_t> shape, TensorId* grad,
                          TensorRole role = {});
  // The roles the architectures share: a linear layer's weight (its bias, when
  // column-parallel, splits with it), a statistic kept in fp32, the attention matrix.
  static TensorRole linear(LinearRole parallel, Fp8Zone zone, int parallel_groups = 1, int parallel_unit = 1) {
    return {.linear = parallel, .fp8_zone = zone, .parallel_groups = parallel_groups, .parallel_unit = parallel_unit};
  }
  static TensorRole column_parallel_bias(int parallel_groups = 1) {
    return {.linear = LinearRole::ColumnParallel, .parallel_groups = parallel_groups};
  }
  static TensorRole statistic() { return {.fp32_statistic = true}; }
  static TensorRole attention_heads(int dim) { return {.heads_dim = dim}; }

  // After a forward op: the injected fault moves its output, then the trace sees it.
  void after_forward_op(Engine& e, const OpSite& site, TensorId out) const;
  void traced(Engine& e, const OpSite& site, std::initializer_list<TensorId> outputs) const;
  static OpSite site(std::string_view name, int layer, Phase phase) { return {name, layer, phase}; }
  TensorId grad(TensorId parameter) const { return table_.shadow(parameter, TensorKind::Gradient); }

  CanaryConfig config_;
  std::optional<FaultSpec> fault_;
  bool trace_ops_ = false;
  TensorTable table_;
  std::vector<std::string> forward_op_names_;
  TensorId inputs_ = kNoTensor, targets_ = kNoTensor;
  TensorId loss_ = kNoTensor, grad_norm_ = kNoTensor, lr_ = kNoTensor;
  TensorId bias_correction1_ = kNoTensor, bias_correction2_ = kNoTensor, fault_ulps_ = kNoTensor;

 private:
  // Uploads the batch and per-step scalars, zeroes gradients; returns the uploaded lr.
  float begin_step(Engine& e, int step, const Batch& batch) const;
  // Global norm and clipping over all gradients, then AdamW per parameter.
  void update(Engine& e) const;

  std::vector<ParameterInit> inits_;  // by position in parameters()
};

// Why `engine` cannot run `canary` ("" when it can): the first op of its step the engine
// does not implement. Checked before step 0 by everything that runs a canary.
std::string engine_cannot_run(const Engine& engine, const Canary& canary);

// The architectures this build has a model for (a canary file's `architecture`).
std::vector<std::string> architecture_names();
// The canary of `config.architecture` (one of architecture_names()). Throws
// std::invalid_argument naming the architecture when this build has none.
std::unique_ptr<Canary> make_canary(const CanaryConfig& config, std::optional<FaultSpec> fault = std::nullopt,
                                    bool trace_ops = false);

}  // namespace harness::canary
