// A canary model: the architecture-independent half of every canary (tensor table,
// initialisation from roles, the training step's shape: batch and per-step scalars,
// forward, backward, global-norm clipping and AdamW), written once against the Engine call
// boundary. An architecture (architectures/gpt2/gpt2.h) describes its tensors and writes its forward and
// backward; make_canary() picks it from the canary file's `architecture`.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
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

class Canary;

// Sees every op of a training step as the engine runs it: before, its operands as the op
// will read them; after, its results as the next op reads them (an injected fault's nudge
// included). The precision audit's op oracle is one (harness/run/op_oracle.h). Reading a
// tensor inside a step is for an engine that runs each op as it is called.
class OpObserver {
 public:
  virtual ~OpObserver() = default;
  // `attributes`: the call's floating-point arguments, in order (layernorm's eps), as doubles.
  virtual void before_op(OpKind op, const OpSite& site, std::span<const TensorId> operands,
                         std::span<const double> attributes) = 0;
  virtual void after_op(OpKind op, const OpSite& site, std::span<const TensorId> operands) = 0;
};

// What a model's forward and backward call ops through: `e.call<OpKind::LinearForward>(site,
// out, inp, weight, bias)` takes the Engine call's own arguments. Each call reaches the
// engine, then, read from the op's description, what the run asked for after it: the
// injected fault moves the first result of the forward op it names (so a trace sees what
// the next op reads), and `--trace ops` records the op's results (written operands that
// are not saved for later: OperandDescription::saved). Models carry no fault or trace
// code. Without an engine it only lists the forward ops' sites, in execution order: how
// Canary::forward_op_names() is derived from the model's own forward.
class Ops {
 public:
  template <OpKind K, typename... Args>
  void call(const OpSite& site, const Args&... args) {
    if (engine_ == nullptr) {
      if (site.phase == Phase::Forward) forward_sites_->emplace_back(site.name);
      return;
    }
    // The call's tensor arguments in order: its fixed operands come first (a variadic op's
    // span is not one), then an int attribute may follow, which the count leaves out.
    std::array<TensorId, (std::size_t{std::is_same_v<Args, TensorId>} + ... + 0)> tensors{};
    std::size_t next = 0;
    const auto collect = [&](const auto& argument) {
      if constexpr (std::is_same_v<std::decay_t<decltype(argument)>, TensorId>) tensors[next++] = argument;
    };
    (collect(args), ...);
    const auto operands = std::span<const TensorId>(tensors).first(std::min(tensors.size(), describe(K).operands.size()));
    OpObserver* const observer = held_out_ ? nullptr : observer_of_canary();
    if (observer != nullptr) {
      std::array<double, (std::size_t{std::is_floating_point_v<Args>} + ... + 0)> numbers{};
      std::size_t at = 0;
      const auto number = [&](const auto& argument) {
        if constexpr (std::is_floating_point_v<std::decay_t<decltype(argument)>>) numbers[at++] = argument;
      };
      (number(args), ...);
      observer->before_op(K, site, operands, numbers);
    }
    (engine_->*kEngineCall<K>)(site, args...);
    after(K, site, operands);
    if (observer != nullptr) observer->after_op(K, site, operands);
  }

 private:
  friend class Canary;
  Ops(Engine* engine, const Canary& canary, std::vector<std::string>* forward_sites, bool held_out = false)
      : engine_(engine), canary_(canary), forward_sites_(forward_sites), held_out_(held_out) {}
  void after(OpKind op, const OpSite& site, std::span<const TensorId> operands);
  OpObserver* observer_of_canary() const;

  Engine* engine_;
  const Canary& canary_;
  std::vector<std::string>* forward_sites_;
  // The held-out evaluation's forward: no fault, and only the token logits traced.
  bool held_out_ = false;
};

class Canary {
 public:
  virtual ~Canary() = default;

  const CanaryConfig& config() const { return config_; }
  const TensorTable& tensors() const { return table_; }
  // Parameters in canonical order: the order of hashes, dumps and the receipt's names.
  const std::vector<TensorId>& parameters() const { return table_.of_kind(TensorKind::Parameter); }
  std::vector<std::string> parameter_names() const;  // in parameters()' order
  // The engine ops its training step calls (held to a traced step by op_description_test):
  // an engine must implement each (Engine::implements) to run it.
  virtual std::vector<OpKind> step_ops() const = 0;
  // Names of the forward ops, in execution order (valid fault-injection targets): the
  // sites the model's forward calls its ops at, listed once by running it without an engine.
  const std::vector<std::string>& forward_op_names() const;
  // The (B, T, V) logits the forward's cross-entropy reads: each token's output
  // distribution, what `harness invariance` turns into log-probabilities per sequence.
  virtual TensorId token_logits() const = 0;
  // What the model records of each step beside the engine's state (read after the step,
  // e.g. moe's routing), described by its ArchitectureSpec::receipt_entries.
  virtual std::vector<StepState> step_state(Engine& /*engine*/) const { return {}; }

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
  // The held-out evaluation (docs/logit-kl.md): the forward alone on `batch`, with the
  // parameters of the start of `step`, injecting no fault; the token logits (and nothing
  // else) go to the engine's trace sink, whole. Returns the batch's mean loss. The engine's
  // own state (FP8 scaling) moves as in any forward: the caller saves and restores it.
  float evaluate_held_out(Engine& engine, int step, const Batch& batch) const;
  // Every op of the training steps that follow goes past `observer` too (nullptr: none).
  void set_op_observer(OpObserver* observer) { observer_ = observer; }

 protected:
  // trace_ops: trace every op's results after it (`--trace ops`; Ops::call).
  Canary(const CanaryConfig& config, std::optional<FaultSpec> fault, bool trace_ops);

  // The architecture's ops; forward ends with the loss in loss_, backward leaves every
  // parameter's gradient (the engine API's accumulation convention).
  virtual void forward(Ops& e) const = 0;
  virtual void backward(Ops& e) const = 0;

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
  // Every expert's weight of a linear role, stacked along a leading expert dimension.
  static TensorRole stacked_experts(LinearRole parallel) { return {.linear = parallel, .stacked_dims = 1}; }
  // Every expert's buffer of rows (E, capacity, ...), stacked like the experts' weights.
  static TensorRole expert_rows() { return {.stacked_dims = 1}; }
  static TensorRole statistic() { return {.fp32_statistic = true}; }
  static TensorRole fp32_weight() { return {.fp32_weight = true}; }
  static TensorRole attention_heads(int dim) { return {.heads_dim = dim}; }

  static OpSite site(std::string_view name, int layer, Phase phase) { return {name, layer, phase}; }
  TensorId grad(TensorId parameter) const { return table_.shadow(parameter, TensorKind::Gradient); }

  CanaryConfig config_;
  std::optional<FaultSpec> fault_;
  bool trace_ops_ = false;
  OpObserver* observer_ = nullptr;
  TensorTable table_;
  TensorId inputs_ = kNoTensor, targets_ = kNoTensor;
  TensorId loss_ = kNoTensor, grad_norm_ = kNoTensor, lr_ = kNoTensor;
  TensorId bias_correction1_ = kNoTensor, bias_correction2_ = kNoTensor, fault_ulps_ = kNoTensor;

 private:
  friend class Ops;
  // Uploads the batch and per-step scalars, zeroes gradients; returns the uploaded lr.
  float begin_step(Engine& e, int step, const Batch& batch) const;
  // Global norm and clipping over all gradients, then AdamW per parameter.
  void update(Ops& e) const;
  // The run's fault when it is of `kind`, else nullptr.
  const FaultSpec* fault_of(FaultKind kind) const;
  // A weight-scale fault's parameter scaled, at the start of its step.
  void scale_weight_at(Engine& e, int step) const;

  std::vector<ParameterInit> inits_;  // by position in parameters()
  mutable std::vector<std::string> forward_op_names_;  // listed on first use
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
