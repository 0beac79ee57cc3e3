#include "llama.h"

#include <stdexcept>

#include <fmt/format.h>

namespace harness::canary {
namespace {
using Shape = std::vector<std::int64_t>;
}

std::vector<OpKind> LlamaCanary::step_ops() const {
  return {OpKind::Zero,          OpKind::EncoderForward,      OpKind::EncoderBackward,      OpKind::RmsNormForward,
          OpKind::RmsNormBackward, OpKind::LinearForward,     OpKind::LinearBackward,       OpKind::RopeForward,
          OpKind::RopeBackward,  OpKind::GqaAttentionForward, OpKind::GqaAttentionBackward, OpKind::SwigluForward,
          OpKind::SwigluBackward, OpKind::ResidualForward,    OpKind::ResidualBackward,     OpKind::CrossEntropyForward,
          OpKind::CrossEntropyBackward, OpKind::GlobalNorm,   OpKind::ClipByNorm,           OpKind::AdamW};
}

LlamaCanary::LlamaCanary(const CanaryConfig& config, std::optional<FaultSpec> fault, bool trace_ops)
    : LlamaCanary(config, std::move(fault), trace_ops, kDescribeLater) {
  describe_tensors();
}

LlamaCanary::LlamaCanary(const CanaryConfig& config, std::optional<FaultSpec> fault, bool trace_ops, DescribeLater)
    : Canary(config, std::move(fault), trace_ops) {
  if (config.channels % config.heads != 0 || config.heads % config.kv_heads != 0 || head_size() % 2 != 0) {
    throw std::invalid_argument("llama needs heads | channels, kv_heads | heads and an even head size");
  }
}

// The op names of block l, each spelled here once: the sites its ops are called at and
// the prefix of its tensors' names.
LlamaCanary::LayerSites LlamaCanary::layer_sites(std::int64_t l) {
  const std::string p = fmt::format("blocks.{}.", l);
  return {.attn_norm = p + "attn_norm",
          .q = p + "attn.q",
          .k = p + "attn.k",
          .v = p + "attn.v",
          .rope_q = p + "attn.rope_q",
          .rope_k = p + "attn.rope_k",
          .attn = p + "attn",
          .o = p + "attn.o",
          .attn_residual = p + "attn.residual",
          .mlp_norm = p + "mlp_norm",
          .gate = p + "mlp.gate",
          .up = p + "mlp.up",
          .swiglu = p + "mlp.swiglu",
          .down = p + "mlp.down",
          .mlp_residual = p + "mlp.residual"};
}

// Parameters first, in the contract's canonical order (the receipt's /hashes/names order).
void LlamaCanary::describe_tensors() {
  const std::int64_t V = config_.vocab_size, T = config_.context_length, C = config_.channels;
  const std::int64_t B = config_.batch_size, NH = config_.heads, NKV = config_.kv_heads, L = config_.layers;
  const std::int64_t hd = head_size();
  // Init roles: every matrix and wte ~ N(0, init_std), attn.o and mlp.down scaled by
  // 1/sqrt(2L), norm weights 1 (no biases anywhere).
  const double std_dev = config_.init_std;
  wte_ = add_parameter("wte", {V, C}, ParameterInit::normal(std_dev));
  for (std::int64_t l = 0; l < L; ++l) {
    const LayerSites& s = sites_.emplace_back(layer_sites(l));
    const int layer = static_cast<int>(l);
    const ParameterInit matrix = ParameterInit::normal(std_dev, layer);
    const ParameterInit residual_matrix = ParameterInit::normal(residual_std_dev(), layer);
    constexpr LinearRole Column = LinearRole::ColumnParallel, Row = LinearRole::RowParallel;
    const int head = static_cast<int>(hd);  // q/k/v/o split between heads only
    LayerParams& lp = layer_params_.emplace_back();
    lp.attn_norm = add_parameter(s.attn_norm + ".weight", {C}, ParameterInit::ones(layer));
    lp.q = add_parameter(s.q + ".weight", {NH * hd, C}, matrix, linear(Column, Fp8Zone::Qkv, 1, head));
    lp.k = add_parameter(s.k + ".weight", {NKV * hd, C}, matrix, linear(Column, Fp8Zone::Qkv, 1, head));
    lp.v = add_parameter(s.v + ".weight", {NKV * hd, C}, matrix, linear(Column, Fp8Zone::Qkv, 1, head));
    lp.o = add_parameter(s.o + ".weight", {C, NH * hd}, residual_matrix, linear(Row, Fp8Zone::AttnProj, 1, head));
    lp.mlp_norm = add_parameter(s.mlp_norm + ".weight", {C}, ParameterInit::ones(layer));
    describe_mlp_parameters(layer);
  }
  norm_ = add_parameter(top_.final_norm + ".weight", {C}, ParameterInit::ones());
  lm_head_ = add_parameter(top_.lm_head + ".weight", {V, C}, ParameterInit::normal(std_dev));
  add_step_tensors();

  const auto act = [&](const std::string& name, Shape shape, TensorId* grad, TensorRole role = {}) {
    return add_activation(name, shape, grad, role);
  };
  const Shape btc{B, T, C}, bt{B, T}, q_shape{B, T, NH * hd}, kv_shape{B, T, NKV * hd};
  encoded_ = act(top_.embedding + ".out", btc, &d_encoded_);
  for (std::int64_t l = 0; l < L; ++l) {
    const LayerSites& s = sites_[static_cast<std::size_t>(l)];
    LayerActs &a = acts_.emplace_back(), &g = grads_.emplace_back();
    a.attn_norm = act(s.attn_norm + ".out", btc, &g.attn_norm);
    a.attn_rstd = act(s.attn_norm + ".rstd", bt, nullptr, statistic());
    a.q = act(s.q + ".out", q_shape, &g.q);
    a.k = act(s.k + ".out", kv_shape, &g.k);
    a.v = act(s.v + ".out", kv_shape, &g.v);
    a.q_rope = act(s.rope_q + ".out", q_shape, &g.q_rope);
    a.k_rope = act(s.rope_k + ".out", kv_shape, &g.k_rope);
    a.att = act(s.attn + ".att", {B, NH, T, T}, nullptr, attention_heads(1));
    a.atty = act(s.attn + ".out", q_shape, &g.atty);
    a.o = act(s.o + ".out", btc, &g.o);
    a.res_attn = act(s.attn_residual + ".out", btc, &g.res_attn);
    a.mlp_norm = act(s.mlp_norm + ".out", btc, &g.mlp_norm);
    a.mlp_rstd = act(s.mlp_norm + ".rstd", bt, nullptr, statistic());
    describe_mlp_activations(static_cast<int>(l));
    a.res_mlp = act(s.mlp_residual + ".out", btc, &g.res_mlp);
  }
  normed_ = act(top_.final_norm + ".out", btc, &d_normed_);
  norm_rstd_ = act(top_.final_norm + ".rstd", bt, nullptr, statistic());
  logits_ = act(top_.lm_head + ".out", {B, T, V}, &d_logits_);
  probs_ = act(top_.loss + ".probs", {B, T, V}, nullptr, statistic());
}

// ---- the MLP: SwiGLU (an architecture on llama's blocks may replace it) ----------------

void LlamaCanary::describe_mlp_parameters(int layer) {
  const std::int64_t C = config_.channels, H = config_.mlp_hidden;
  const LayerSites& s = sites_[static_cast<std::size_t>(layer)];
  const ParameterInit matrix = ParameterInit::normal(config_.init_std, layer);
  const ParameterInit residual_matrix = ParameterInit::normal(residual_std_dev(), layer);
  constexpr LinearRole Column = LinearRole::ColumnParallel, Row = LinearRole::RowParallel;
  LayerParams& lp = layer_params_[static_cast<std::size_t>(layer)];
  lp.gate = add_parameter(s.gate + ".weight", {H, C}, matrix, linear(Column, Fp8Zone::MlpFc));
  lp.up = add_parameter(s.up + ".weight", {H, C}, matrix, linear(Column, Fp8Zone::MlpFc));
  lp.down = add_parameter(s.down + ".weight", {C, H}, residual_matrix, linear(Row, Fp8Zone::MlpProj));
}

void LlamaCanary::describe_mlp_activations(int layer) {
  const std::int64_t B = config_.batch_size, T = config_.context_length, C = config_.channels, H = config_.mlp_hidden;
  const LayerSites& s = sites_[static_cast<std::size_t>(layer)];
  LayerActs &a = acts_[static_cast<std::size_t>(layer)], &g = grads_[static_cast<std::size_t>(layer)];
  a.gate = add_activation(s.gate + ".out", {B, T, H}, &g.gate);
  a.up = add_activation(s.up + ".out", {B, T, H}, &g.up);
  a.swiglu = add_activation(s.swiglu + ".out", {B, T, H}, &g.swiglu);
  a.down = add_activation(s.down + ".out", {B, T, C}, &g.down);
}

std::pair<TensorId, TensorId> LlamaCanary::mlp_branch(int layer) const {
  return {acts_[static_cast<std::size_t>(layer)].down, grads_[static_cast<std::size_t>(layer)].down};
}

void LlamaCanary::mlp_forward(Ops& e, int l, TensorId in) const {
  using enum OpKind;
  constexpr Phase F = Phase::Forward;
  const LayerParams& p = layer_params_[l];
  const LayerActs& a = acts_[l];
  const LayerSites& n = sites_[l];
  e.call<LinearForward>(site(n.gate, l, F), a.gate, in, p.gate, kNoTensor);  // (B,T,H)
  e.call<LinearForward>(site(n.up, l, F), a.up, in, p.up, kNoTensor);  // (B,T,H)
  e.call<SwigluForward>(site(n.swiglu, l, F), a.swiglu, a.gate, a.up);  // (B,T,H)
  e.call<LinearForward>(site(n.down, l, F), a.down, a.swiglu, p.down, kNoTensor);  // (B,T,C)
}

void LlamaCanary::mlp_backward(Ops& e, int l, TensorId in, TensorId d_in) const {
  using enum OpKind;
  constexpr Phase Bw = Phase::Backward;
  const LayerParams& p = layer_params_[l];
  const LayerActs& a = acts_[l];
  const LayerActs& g = grads_[l];
  const LayerSites& n = sites_[l];
  e.call<LinearBackward>(site(n.down, l, Bw), g.swiglu, grad(p.down), kNoTensor, g.down, a.swiglu, p.down);
  e.call<SwigluBackward>(site(n.swiglu, l, Bw), g.gate, g.up, g.swiglu, a.gate, a.up);
  e.call<LinearBackward>(site(n.up, l, Bw), d_in, grad(p.up), kNoTensor, g.up, in, p.up);
  e.call<LinearBackward>(site(n.gate, l, Bw), d_in, grad(p.gate), kNoTensor, g.gate, in, p.gate);
}

void LlamaCanary::forward(Ops& e) const {
  using enum OpKind;
  constexpr Phase F = Phase::Forward;
  const int hd = head_size();
  const double theta = config_.rope_theta;
  e.call<EncoderForward>(site(top_.embedding, -1, F), encoded_, inputs_, wte_,
                         kNoTensor);  // (B,T,C): no position embedding
  TensorId x = encoded_;
  for (int l = 0; l < config_.layers; ++l) {
    const LayerParams& p = layer_params_[l];
    const LayerActs& a = acts_[l];
    const LayerSites& n = sites_[l];
    e.call<RmsNormForward>(site(n.attn_norm, l, F), a.attn_norm, a.attn_rstd, x, p.attn_norm, norm_eps());
    e.call<LinearForward>(site(n.q, l, F), a.q, a.attn_norm, p.q, kNoTensor);  // (B,T,NH*hd)
    e.call<LinearForward>(site(n.k, l, F), a.k, a.attn_norm, p.k, kNoTensor);  // (B,T,NKV*hd)
    e.call<LinearForward>(site(n.v, l, F), a.v, a.attn_norm, p.v, kNoTensor);  // (B,T,NKV*hd)
    e.call<RopeForward>(site(n.rope_q, l, F), a.q_rope, a.q, hd, theta);
    e.call<RopeForward>(site(n.rope_k, l, F), a.k_rope, a.k, hd, theta);
    e.call<GqaAttentionForward>(site(n.attn, l, F), a.atty, a.att, a.q_rope, a.k_rope,
                                a.v);  // (B,T,NH*hd), att (B,NH,T,T)
    e.call<LinearForward>(site(n.o, l, F), a.o, a.atty, p.o, kNoTensor);  // (B,T,C)
    e.call<ResidualForward>(site(n.attn_residual, l, F), a.res_attn, x, a.o);
    e.call<RmsNormForward>(site(n.mlp_norm, l, F), a.mlp_norm, a.mlp_rstd, a.res_attn, p.mlp_norm, norm_eps());
    mlp_forward(e, l, a.mlp_norm);
    e.call<ResidualForward>(site(n.mlp_residual, l, F), a.res_mlp, a.res_attn, mlp_branch(l).first);
    x = a.res_mlp;
  }
  e.call<RmsNormForward>(site(top_.final_norm, -1, F), normed_, norm_rstd_, x, norm_, norm_eps());
  e.call<LinearForward>(site(top_.lm_head, -1, F), logits_, normed_, lm_head_, kNoTensor);  // (B,T,V), untied
  e.call<CrossEntropyForward>(site(top_.loss, -1, F), loss_, probs_, logits_, targets_);
}

// Backward: the forward calls undone in reverse order; every call adds into gradients.
void LlamaCanary::backward(Ops& e) const {
  using enum OpKind;
  constexpr Phase Bw = Phase::Backward;
  e.call<CrossEntropyBackward>(site(top_.loss, -1, Bw), d_logits_, probs_, targets_);
  e.call<LinearBackward>(site(top_.lm_head, -1, Bw), d_normed_, grad(lm_head_), kNoTensor, d_logits_, normed_,
                         lm_head_);
  const TensorId last = config_.layers > 0 ? acts_.back().res_mlp : encoded_;
  const TensorId d_last = config_.layers > 0 ? grads_.back().res_mlp : d_encoded_;
  e.call<RmsNormBackward>(site(top_.final_norm, -1, Bw), d_last, grad(norm_), d_normed_, last, norm_, norm_rstd_);
  for (int l = config_.layers - 1; l >= 0; --l) backward_layer(e, l);
  e.call<EncoderBackward>(site(top_.embedding, -1, Bw), grad(wte_), kNoTensor, d_encoded_, inputs_);
}

void LlamaCanary::backward_layer(Ops& e, int l) const {
  using enum OpKind;
  constexpr Phase Bw = Phase::Backward;
  const int hd = head_size();
  const double theta = config_.rope_theta;
  const LayerParams& p = layer_params_[l];
  const LayerActs& a = acts_[l];
  const LayerActs& g = grads_[l];
  const LayerSites& n = sites_[l];
  const TensorId x = l == 0 ? encoded_ : acts_[l - 1].res_mlp;
  const TensorId dx = l == 0 ? d_encoded_ : grads_[l - 1].res_mlp;
  // forward: res_mlp = res_attn + down
  e.call<ResidualBackward>(site(n.mlp_residual, l, Bw), g.res_attn, mlp_branch(l).second, g.res_mlp);
  mlp_backward(e, l, a.mlp_norm, g.mlp_norm);
  e.call<RmsNormBackward>(site(n.mlp_norm, l, Bw), g.res_attn, grad(p.mlp_norm), g.mlp_norm, a.res_attn, p.mlp_norm,
                          a.mlp_rstd);
  // forward: res_attn = x + o
  e.call<ResidualBackward>(site(n.attn_residual, l, Bw), dx, g.o, g.res_attn);
  e.call<LinearBackward>(site(n.o, l, Bw), g.atty, grad(p.o), kNoTensor, g.o, a.atty, p.o);
  e.call<GqaAttentionBackward>(site(n.attn, l, Bw), g.q_rope, g.k_rope, g.v, g.atty, a.q_rope, a.k_rope, a.v, a.att);
  e.call<RopeBackward>(site(n.rope_k, l, Bw), g.k, g.k_rope, hd, theta);
  e.call<RopeBackward>(site(n.rope_q, l, Bw), g.q, g.q_rope, hd, theta);
  e.call<LinearBackward>(site(n.v, l, Bw), g.attn_norm, grad(p.v), kNoTensor, g.v, a.attn_norm, p.v);
  e.call<LinearBackward>(site(n.k, l, Bw), g.attn_norm, grad(p.k), kNoTensor, g.k, a.attn_norm, p.k);
  e.call<LinearBackward>(site(n.q, l, Bw), g.attn_norm, grad(p.q), kNoTensor, g.q, a.attn_norm, p.q);
  e.call<RmsNormBackward>(site(n.attn_norm, l, Bw), dx, grad(p.attn_norm), g.attn_norm, x, p.attn_norm, a.attn_rstd);
}

const ArchitectureSpec& llama_architecture() {
  static const ArchitectureSpec spec{
      "llama",
      {.grouped_query_attention = true, .rope = true, .mlp_ratio = 0},  // the SwiGLU hidden size is the file's
      false,
      [](const CanaryConfig& config, std::optional<FaultSpec> fault, bool trace_ops) -> std::unique_ptr<Canary> {
        return std::make_unique<LlamaCanary>(config, std::move(fault), trace_ops);
      }};
  return spec;
}

}  // namespace harness::canary
