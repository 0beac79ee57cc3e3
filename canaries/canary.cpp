#include "canary.h"

#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "architecture.h"
#include "numerics/perturbation.h"
#include "numerics/philox.h"

namespace harness::canary {

Canary::Canary(const CanaryConfig& config, std::optional<FaultSpec> fault, bool trace_ops)
    : config_(config), fault_(std::move(fault)), trace_ops_(trace_ops) {}

TensorId Canary::add_parameter(const std::string& name, std::vector<std::int64_t> shape, ParameterInit init,
                               TensorRole role) {
  inits_.push_back(init);
  return table_.add_parameter(name, std::move(shape), role);
}

// In the table's order after the parameters: inputs, targets, the per-step scalars, the
// fault's ulps. (The order is part of every engine's arena layout: keep it.)
void Canary::add_step_tensors() {
  const std::int64_t B = config_.batch_size, T = config_.context_length;
  inputs_ = table_.add({"inputs", {B, T}, DType::I32, TensorKind::Input});
  targets_ = table_.add({"targets", {B, T}, DType::I32, TensorKind::Input});
  const auto scalar = [&](const char* name, TensorRole role = {}) {
    return table_.add({name, {}, DType::F32, TensorKind::Scalar, kNoTensor, role});
  };
  lr_ = scalar("lr", {.learning_rate = true});
  bias_correction1_ = scalar("bias_correction1");
  bias_correction2_ = scalar("bias_correction2");
  loss_ = scalar("loss");
  grad_norm_ = scalar("grad_norm");
  if (fault_of(FaultKind::kNudge)) fault_ulps_ = scalar("fault_ulps");
}

TensorId Canary::add_activation(const std::string& name, std::vector<std::int64_t> shape, TensorId* grad,
                                TensorRole role) {
  const TensorId id = table_.add({name, shape, DType::F32, TensorKind::Activation, kNoTensor, role});
  if (grad) *grad = table_.add({name, std::move(shape), DType::F32, TensorKind::ActivationGrad, id, role});
  return id;
}

// ---- initialisation ---------------------------------------------------------------------

std::vector<float> Canary::initial_values(TensorId parameter, std::uint64_t seed) const {
  const TensorDesc& desc = table_[parameter];
  const auto n = static_cast<std::size_t>(desc.numel());
  const auto position = static_cast<std::size_t>(std::find(parameters().begin(), parameters().end(), parameter) -
                                                  parameters().begin());
  if (position >= inits_.size()) throw std::invalid_argument("initial_values: '" + desc.name + "' is not a parameter");
  const ParameterInit& init = inits_[position];
  switch (init.kind) {
    case ParameterInit::Kind::Zeros: return std::vector<float>(n, 0.0f);
    case ParameterInit::Kind::Ones: return std::vector<float>(n, 1.0f);
    case ParameterInit::Kind::Normal: break;
  }
  std::vector<float> values(n);
  const std::uint64_t stream = numerics::stream_id(desc.name.c_str());
  for (std::size_t i = 0; i < n; ++i) {
    values[i] = static_cast<float>(init.std_dev * numerics::normal_at(seed, stream, i));
  }
  return values;
}

void Canary::upload_initial_parameters(Engine& engine, std::uint64_t seed, std::optional<std::uint64_t> perturbation) const {
  for (TensorId p : parameters()) {
    std::vector<float> values = initial_values(p, seed);
    if (perturbation) numerics::perturb_one_ulp(values, *perturbation, table_[p].name);
    if (const FaultSpec* f = fault_of(FaultKind::kWeightUlps); f && f->tensor == table_[p].name) {
      for (std::int32_t i = 0; i < f->ulps; ++i) values.front() = numerics::one_ulp_step(values.front(), /*up=*/true);
    }
    engine.upload(p, values);
    const std::vector<float> zeros(static_cast<std::size_t>(table_[p].numel()), 0.0f);
    engine.upload(table_.shadow(p, TensorKind::AdamM), zeros);
    engine.upload(table_.shadow(p, TensorKind::AdamV), zeros);
  }
}

// ---- one step ---------------------------------------------------------------------------

float Canary::begin_step(Engine& e, int step, const Batch& batch) const {
  e.step_begin(step);
  e.upload_tokens(inputs_, batch.inputs);
  e.upload_tokens(targets_, batch.targets);
  // Per-step scalars are uploaded into 0-D tensors, never baked into an op.
  double beta1_t = 1.0, beta2_t = 1.0;  // beta^t with t = step + 1, by repeated products
  for (int i = 0; i <= step; ++i) {
    beta1_t *= config_.beta1;
    beta2_t *= config_.beta2;
  }
  const FaultSpec* lr_fault = fault_of(FaultKind::kLrScale);
  const double lr_scale = lr_fault && step >= lr_fault->step ? 1.0 + lr_fault->by : 1.0;
  const float scalars[3] = {static_cast<float>(learning_rate(config_, step) * lr_scale),
                            static_cast<float>(1.0 - beta1_t), static_cast<float>(1.0 - beta2_t)};
  e.upload(lr_, {&scalars[0], 1});
  e.upload(bias_correction1_, {&scalars[1], 1});
  e.upload(bias_correction2_, {&scalars[2], 1});
  if (const FaultSpec* nudge = fault_of(FaultKind::kNudge)) {
    const float ulps = step == nudge->step ? static_cast<float>(nudge->ulps) : 0.0f;
    e.upload(fault_ulps_, {&ulps, 1});
  }
  for (TensorId g : table_.of_kind(TensorKind::Gradient)) e.zero(g);
  for (TensorId g : table_.of_kind(TensorKind::ActivationGrad)) e.zero(g);
  return scalars[0];
}

StepResult Canary::train_step(Engine& e, int step, const Batch& batch) const {
  scale_weight_at(e, step);
  const float lr = begin_step(e, step, batch);
  Ops ops(&e, *this, nullptr);
  forward(ops);
  backward(ops);
  update(ops);
  e.step_end();
  StepResult result;
  result.step = step;
  result.lr = lr;
  result.loss = e.read(loss_)[0];
  result.grad_norm = e.read(grad_norm_)[0];
  return result;
}

std::vector<std::string> Canary::parameter_names() const {
  std::vector<std::string> names;
  for (TensorId p : parameters()) names.push_back(table_[p].name);
  return names;
}

const FaultSpec* Canary::fault_of(FaultKind kind) const {
  return fault_ && fault_->kind == kind ? &*fault_ : nullptr;
}

// A weight-scale fault, before its step begins (a read is a synchronisation point): the
// parameter's values times (1 + by), each product rounded once to fp32 from its exact double.
void Canary::scale_weight_at(Engine& e, int step) const {
  const FaultSpec* f = fault_of(FaultKind::kWeightScale);
  if (!f || step != f->step) return;
  const auto p = std::find_if(parameters().begin(), parameters().end(),
                              [&](TensorId id) { return table_[id].name == f->tensor; });
  if (p == parameters().end()) throw std::invalid_argument("--inject-fault: unknown parameter '" + f->tensor + "'");
  const std::span<const float> current = e.read(*p);
  std::vector<float> scaled(current.begin(), current.end());
  for (float& v : scaled) v = static_cast<float>(static_cast<double>(v) * (1.0 + f->by));
  e.upload(*p, scaled);
}

float Canary::evaluate_loss(Engine& e, int step, const Batch& batch) const {
  begin_step(e, step, batch);
  Ops ops(&e, *this, nullptr);
  forward(ops);
  e.step_end();
  return e.read(loss_)[0];
}

float Canary::evaluate_held_out(Engine& e, int step, const Batch& batch) const {
  begin_step(e, step, batch);
  Ops ops(&e, *this, nullptr, /*held_out=*/true);
  forward(ops);
  e.step_end();
  return e.read(loss_)[0];
}

float Canary::compute_gradients(Engine& e, int step, const Batch& batch) const {
  begin_step(e, step, batch);
  Ops ops(&e, *this, nullptr);
  forward(ops);
  backward(ops);
  e.step_end();
  return e.read(loss_)[0];
}

const std::vector<std::string>& Canary::forward_op_names() const {
  if (forward_op_names_.empty()) {
    Ops listing(nullptr, *this, &forward_op_names_);
    forward(listing);
  }
  return forward_op_names_;
}

OpObserver* Ops::observer_of_canary() const { return canary_.observer_; }

// The fault moves the forward op's first result, so a trace sees what the next op reads.
void Ops::after(OpKind op, const OpSite& s, std::span<const TensorId> operands) {
  const OpDescription& d = describe(op);
  bool first_result = true;
  for (std::size_t i = 0; i < operands.size(); ++i) {
    if (!d.result(i) || operands[i] == kNoTensor) continue;
    const std::optional<FaultSpec>& fault = canary_.fault_;
    if (first_result && !held_out_ && s.phase == Phase::Forward && fault && fault->kind == FaultKind::kNudge &&
        fault->op == s.name) {
      engine_->nudge_ulps(s, operands[i], canary_.fault_ulps_);
    }
    first_result = false;
    const bool traced = held_out_ ? operands[i] == canary_.token_logits() : canary_.trace_ops_;
    if (traced) engine_->trace(s, operands[i]);
  }
}

// The optimizer: the global norm and clipping over all gradients, then AdamW per
// parameter, whose op is named after the parameter (site "blocks.2.attn.proj.weight").
void Canary::update(Ops& e) const {
  const OpSite s = site("optimizer", -1, Phase::Optimizer);
  const auto& gradients = table_.of_kind(TensorKind::Gradient);
  e.call<OpKind::GlobalNorm>(s, grad_norm_, std::span<const TensorId>(gradients));
  e.call<OpKind::ClipByNorm>(s, std::span<const TensorId>(gradients), grad_norm_,
                             static_cast<float>(config_.max_grad_norm));
  for (std::size_t i = 0; i < parameters().size(); ++i) {
    const TensorId p = parameters()[i];
    AdamWConfig adam;
    adam.beta1 = static_cast<float>(config_.beta1);
    adam.beta2 = static_cast<float>(config_.beta2);
    const FaultSpec* eps_fault = fault_of(FaultKind::kEpsScale);
    adam.eps = static_cast<float>(config_.adam_eps * (eps_fault ? eps_fault->by : 1.0));
    // Decay only matrices: embeddings, weight matrices and stacks of them (moe's experts),
    // not biases, not norm weights.
    adam.weight_decay = table_[p].rank() >= 2 ? static_cast<float>(config_.weight_decay) : 0.0f;
    const OpSite adamw = site(table_[p].name, inits_[i].layer, Phase::Optimizer);
    e.call<OpKind::AdamW>(adamw, p, grad(p), table_.shadow(p, TensorKind::AdamM), table_.shadow(p, TensorKind::AdamV),
                          lr_, bias_correction1_, bias_correction2_, adam);
  }
}

std::string engine_cannot_run(const Engine& engine, const Canary& canary) {
  for (const OpKind op : canary.step_ops()) {
    if (!engine.implements(op)) {
      return fmt::format("op {} is not implemented by engine {}; run canary {} on an engine that implements it "
                         "(cpu-ref implements every op)",
                         describe(op).name, engine.name(), canary.config().name);
    }
  }
  return "";
}

namespace {
// Sizes within a canary file's ranges can still ask for terabytes (context 65536 is 2^32
// attention scores a row and head). Every engine holds the table's arenas and a scratch
// buffer the size of its largest tensor (HostTensors::bind), so their sum is what a run
// needs at least: refused here, naming the sizes, rather than std::bad_alloc (or the
// kernel's OOM kill) from whichever allocation comes first. A lower bound: a canary
// near the machine's memory can still run out.
void check_fits_in_memory(const CanaryConfig& config, const TensorTable& table) {
  double bytes = 0, largest = 0;
  for (int kind = 0; kind <= static_cast<int>(TensorKind::Input); ++kind) {
    bytes += 4.0 * static_cast<double>(table.arena_numel(static_cast<TensorKind>(kind)));
  }
  for (const TensorDesc& d : table.all()) largest = std::max(largest, 4.0 * static_cast<double>(d.numel()));
  bytes += largest;
  const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  if (memory > 0 && bytes > memory) {
    throw std::invalid_argument(fmt::format(
        "canary '{}' needs at least {:.1f} GB for its tensors (model.context {}, model.channels {}, model.layers {}, "
        "train.batch {}), more than this machine's {:.1f} GB of memory; make those smaller",
        config.name, bytes / 1e9, config.context_length, config.channels, config.layers, config.batch_size,
        memory / 1e9));
  }
}
}  // namespace

namespace {
// Every architecture's own description (architectures/NAME/): the rules read these, never a name.
const ArchitectureSpec* const kArchitectures[] = {&gpt2_architecture(), &llama_architecture(),
                                                      &moe_architecture()};
}  // namespace

std::span<const ArchitectureSpec* const> architectures() { return kArchitectures; }

const ArchitectureSpec* find_architecture(std::string_view name) {
  for (const ArchitectureSpec* spec : kArchitectures) {
    if (spec->name == name) return spec;
  }
  return nullptr;
}

const ArchitectureSpec& legacy_identity_architecture() {
  for (const ArchitectureSpec* spec : kArchitectures) {
    if (spec->legacy_identity) return *spec;
  }
  throw std::logic_error("no architecture has the legacy canary identity");  // tests/unit/canary_file_test.cpp
}

ReceiptEntries architecture_receipt_entries() {
  ReceiptEntries entries;
  for (const ArchitectureSpec* spec : kArchitectures) {
    if (spec->receipt_entries != nullptr) entries.append(spec->receipt_entries());
  }
  return entries;
}

std::vector<std::string> architecture_names() {
  std::vector<std::string> names;
  for (const ArchitectureSpec* spec : kArchitectures) names.emplace_back(spec->name);
  return names;
}

std::unique_ptr<Canary> make_canary(const CanaryConfig& config, std::optional<FaultSpec> fault, bool trace_ops) {
  const ArchitectureSpec* spec = find_architecture(config.architecture);
  if (spec == nullptr) {
    throw std::invalid_argument(fmt::format("canary architecture '{}' has no model in this build (known: {})",
                                            config.architecture, fmt::join(architecture_names(), ", ")));
  }
  std::unique_ptr<Canary> model = spec->make(config, std::move(fault), trace_ops);
  check_fits_in_memory(config, model->tensors());
  return model;
}

}  // namespace harness::canary
