#include "moe.h"

#include <stdexcept>

#include <fmt/format.h>

#include "kernels/moe_kernels.h"

namespace harness::canary {

std::vector<OpKind> MoeCanary::step_ops() const {
  std::vector<OpKind> ops = LlamaCanary::step_ops();
  for (OpKind op : {OpKind::MoeRouteForward, OpKind::MoeRouteBackward, OpKind::MoeDispatchForward,
                    OpKind::MoeDispatchBackward, OpKind::MoeCombineForward, OpKind::MoeCombineBackward,
                    OpKind::ExpertLinearForward, OpKind::ExpertLinearBackward}) {
    ops.push_back(op);
  }
  return ops;
}

MoeCanary::MoeCanary(const CanaryConfig& config, std::optional<FaultSpec> fault, bool trace_ops)
    : LlamaCanary(config, std::move(fault), trace_ops, kDescribeLater) {
  if (config.experts < 2 || config.experts_per_token < 1 || config.experts_per_token > config.experts) {
    throw std::invalid_argument("moe needs 2 or more experts and 1 to that many experts per token");
  }
  describe_tensors();
}

// The op names of block l's MLP, each spelled here once.
MoeCanary::ExpertSites MoeCanary::expert_sites(int l) {
  const std::string p = fmt::format("blocks.{}.moe.", l);
  return {.router = p + "router",
          .route = p + "route",
          .dispatch = p + "dispatch",
          .gate = p + "experts.gate",
          .up = p + "experts.up",
          .swiglu = p + "experts.swiglu",
          .down = p + "experts.down",
          .combine = p + "combine"};
}

// After the block's mlp_norm.weight: the router, then every expert's gate, up and down
// stacked by expert (llama's init roles: matrices N(0, init_std), down by depth). The
// router is read in fp32 under bf16 (its decisions would move with its rounding); the
// experts are in no FP8 zone yet.
void MoeCanary::describe_mlp_parameters(int layer) {
  const std::int64_t C = config_.channels, H = config_.mlp_hidden, E = config_.experts;
  const ExpertSites& s = expert_sites_.emplace_back(expert_sites(layer));
  const ParameterInit matrix = ParameterInit::normal(config_.init_std, layer);
  ExpertParams& p = expert_params_.emplace_back();
  p.router = add_parameter(s.router + ".weight", {E, C}, matrix, fp32_weight());  // the router's own zone
  // Each expert is llama's MLP: gate and up column-parallel, down row-parallel.
  p.gate = add_parameter(s.gate + ".weight", {E, H, C}, matrix, stacked_experts(LinearRole::ColumnParallel));
  p.up = add_parameter(s.up + ".weight", {E, H, C}, matrix, stacked_experts(LinearRole::ColumnParallel));
  p.down = add_parameter(s.down + ".weight", {E, C, H}, ParameterInit::normal(residual_std_dev(), layer),
                         stacked_experts(LinearRole::RowParallel));
}

// Router outputs stay fp32 (statistic: a rounded probability flips decisions); the
// decisions have no gradient.
void MoeCanary::describe_mlp_activations(int layer) {
  const std::int64_t B = config_.batch_size, T = config_.context_length, C = config_.channels;
  const std::int64_t H = config_.mlp_hidden, E = config_.experts, K = config_.experts_per_token;
  const std::int64_t cap = config_.expert_capacity();
  const ExpertSites& s = expert_sites_[static_cast<std::size_t>(layer)];
  ExpertActs &a = expert_acts_.emplace_back(), &g = expert_grads_.emplace_back();
  a.logits = add_activation(s.router + ".out", {B, T, E}, &g.logits, statistic());
  a.probs = add_activation(s.route + ".probs", {B, T, E}, nullptr, statistic());
  a.weights = add_activation(s.route + ".weights", {B, T, K}, &g.weights, statistic());
  a.expert = add_activation(s.route + ".expert", {B, T, K}, nullptr, statistic());
  a.slot = add_activation(s.route + ".slot", {B, T, K}, nullptr, statistic());
  a.expert_in = add_activation(s.dispatch + ".out", {E, cap, C}, &g.expert_in, expert_rows());
  a.gate = add_activation(s.gate + ".out", {E, cap, H}, &g.gate, expert_rows());
  a.up = add_activation(s.up + ".out", {E, cap, H}, &g.up, expert_rows());
  a.swiglu = add_activation(s.swiglu + ".out", {E, cap, H}, &g.swiglu, expert_rows());
  a.expert_out = add_activation(s.down + ".out", {E, cap, C}, &g.expert_out, expert_rows());
  a.out = add_activation(s.combine + ".out", {B, T, C}, &g.out);
  routing_.push_back(table_.add({s.route + ".record", {E + kernels::kRoutingRecordExtra}, DType::F32,
                                 TensorKind::Scalar}));
}

std::pair<TensorId, TensorId> MoeCanary::mlp_branch(int layer) const {
  return {expert_acts_[static_cast<std::size_t>(layer)].out, expert_grads_[static_cast<std::size_t>(layer)].out};
}

void MoeCanary::mlp_forward(Ops& e, int l, TensorId in) const {
  using enum OpKind;
  constexpr Phase F = Phase::Forward;
  const ExpertParams& p = expert_params_[l];
  const ExpertActs& a = expert_acts_[l];
  const ExpertSites& n = expert_sites_[l];
  const float coef = static_cast<float>(config_.balance_coef);
  e.call<LinearForward>(site(n.router, l, F), a.logits, in, p.router, kNoTensor);  // (B,T,E)
  e.call<MoeRouteForward>(site(n.route, l, F), a.weights, a.expert, a.slot, a.probs, routing_[l], a.logits,
                          config_.experts_per_token, config_.expert_capacity(), coef);  // (B,T,K)
  e.call<MoeDispatchForward>(site(n.dispatch, l, F), a.expert_in, in, a.expert, a.slot);  // (E,cap,C)
  e.call<ExpertLinearForward>(site(n.gate, l, F), a.gate, a.expert_in, p.gate);  // (E,cap,H)
  e.call<ExpertLinearForward>(site(n.up, l, F), a.up, a.expert_in, p.up);  // (E,cap,H)
  e.call<SwigluForward>(site(n.swiglu, l, F), a.swiglu, a.gate, a.up);  // (E,cap,H)
  e.call<ExpertLinearForward>(site(n.down, l, F), a.expert_out, a.swiglu, p.down);  // (E,cap,C)
  e.call<MoeCombineForward>(site(n.combine, l, F), a.out, a.expert_out, a.weights, a.expert, a.slot);  // (B,T,C)
}

void MoeCanary::mlp_backward(Ops& e, int l, TensorId in, TensorId d_in) const {
  using enum OpKind;
  constexpr Phase Bw = Phase::Backward;
  const ExpertParams& p = expert_params_[l];
  const ExpertActs& a = expert_acts_[l];
  const ExpertActs& g = expert_grads_[l];
  const ExpertSites& n = expert_sites_[l];
  e.call<MoeCombineBackward>(site(n.combine, l, Bw), g.expert_out, g.weights, g.out, a.expert_out, a.weights, a.expert,
                             a.slot);
  e.call<ExpertLinearBackward>(site(n.down, l, Bw), g.swiglu, grad(p.down), g.expert_out, a.swiglu, p.down);
  e.call<SwigluBackward>(site(n.swiglu, l, Bw), g.gate, g.up, g.swiglu, a.gate, a.up);
  e.call<ExpertLinearBackward>(site(n.up, l, Bw), g.expert_in, grad(p.up), g.up, a.expert_in, p.up);
  e.call<ExpertLinearBackward>(site(n.gate, l, Bw), g.expert_in, grad(p.gate), g.gate, a.expert_in, p.gate);
  e.call<MoeDispatchBackward>(site(n.dispatch, l, Bw), d_in, g.expert_in, a.expert, a.slot);
  e.call<MoeRouteBackward>(site(n.route, l, Bw), g.logits, g.weights, a.probs, a.weights, a.expert,
                           static_cast<float>(config_.balance_coef));
  e.call<LinearBackward>(site(n.router, l, Bw), d_in, grad(p.router), kNoTensor, g.logits, in, p.router);
}

// Each layer's routing record of the step, a column of /routing: the record's E counts and
// its dropped choices and balance loss as they are, its two hash halves as one integer.
std::vector<StepState> MoeCanary::step_state(Engine& engine) const {
  const std::size_t E = static_cast<std::size_t>(config_.experts);
  StepState s;
  s.group = "routing";
  for (const ExpertSites& n : expert_sites_) s.columns.push_back(n.route);
  for (std::size_t e = 0; e < E; ++e) s.fields.push_back({fmt::format("tokens_expert_{}", e), {}});
  for (const char* field : {"dropped", "balance_loss", "decisions_hash"}) s.fields.push_back({field, {}});
  for (TensorId record : routing_) {
    const std::span<const float> r = engine.read(record);
    for (std::size_t f = 0; f < E + 2; ++f) s.fields[f].second.push_back(r[f]);
    s.fields[E + 2].second.push_back(static_cast<double>(kernels::routing_hash(r[E + 2], r[E + 3])));
  }
  return {s};
}

// What step_state() adds to a receipt (docs/receipt-schema.md).
ReceiptEntries moe_receipt_entries() {
  const std::string writer = "the moe architecture";
  ReceiptEntries e;
  e.groups = {{"/routing", Presence::kOptional, 0, writer,
               "per step and MoE layer: tokens per expert, dropped choices, the balance loss, the decisions' hash"}};
  const auto per_layer = [&](std::string path, DecisionRecord decision, std::string meaning) {
    ReceiptDataset d{path, ReceiptDtype::kFloat64, {ReceiptDim::kSteps, ReceiptDim::kColumns}, false,
                     "/routing/names", Presence::kOptional, 0, writer, std::move(meaning)};
    d.decision = decision;
    return d;
  };
  e.datasets = {{"/routing/names", ReceiptDtype::kString, {ReceiptDim::kAny}, false, "", Presence::kRequired, 0, writer,
                 "each MoE layer's route op"},
                per_layer("/routing/*", DecisionRecord::kCount, "tokens_expert_E: the token rows expert E took"),
                per_layer("/routing/dropped", DecisionRecord::kCount, "the choices past their expert's capacity"),
                per_layer("/routing/balance_loss", DecisionRecord::kNone, "the layer's Switch balance loss"),
                per_layer("/routing/decisions_hash", DecisionRecord::kHash,
                          "the low 48 bits of the XXH3-64 of every choice's (expert, slot) as int32 pairs")};
  return e;
}

// E experts per block, K of them per token, each taking capacity_factor * B*T*K/E rows a
// step, the balance loss weighted by balance_coef (docs/canary-files.md).
constexpr ModelKey kMoeKeys[] = {
    {.name = "experts", .feature = "experts", .integer = &CanaryConfig::experts, .low = 2, .high = 1024,
     .required = true},
    {.name = "experts_per_token", .feature = "experts", .integer = &CanaryConfig::experts_per_token, .low = 1,
     .high_field = &CanaryConfig::experts, .required = true},
    {.name = "capacity_factor", .feature = "experts", .number = &CanaryConfig::capacity_factor, .low = 0.0,
     .high = 64.0, .open_low = true},
    {.name = "balance_coef", .feature = "experts", .number = &CanaryConfig::balance_coef, .low = 0.0, .high = 10.0},
};

const ArchitectureSpec& moe_architecture() {
  static const ArchitectureSpec spec{
      "moe",
      {.grouped_query_attention = true, .rope = true, .mlp_ratio = 0},
      false,
      [](const CanaryConfig& config, std::optional<FaultSpec> fault, bool trace_ops) -> std::unique_ptr<Canary> {
        return std::make_unique<MoeCanary>(config, std::move(fault), trace_ops);
      },
      moe_receipt_entries,
      kMoeKeys};
  return spec;
}

}  // namespace harness::canary
