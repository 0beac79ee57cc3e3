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
    : Canary(config, std::move(fault), trace_ops) {
  if (config.channels % config.heads != 0 || config.heads % config.kv_heads != 0 || head_size() % 2 != 0) {
    throw std::invalid_argument("llama needs heads | channels, kv_heads | heads and an even head size");
  }
  describe_tensors();
}

// Parameters first, in the contract's canonical order (the receipt's /hashes/names order).
void LlamaCanary::describe_tensors() {
  const std::int64_t V = config_.vocab_size, T = config_.context_length, C = config_.channels;
  const std::int64_t B = config_.batch_size, NH = config_.heads, NKV = config_.kv_heads, L = config_.layers;
  const std::int64_t hd = head_size(), H = config_.mlp_hidden;
  // Init roles: every matrix and wte ~ N(0, init_std), attn.o and mlp.down scaled by
  // 1/sqrt(2L), norm weights 1 (no biases anywhere).
  const double std_dev = config_.init_std;
  const double residual_std_dev = config_.init_std / __builtin_sqrt(2.0 * config_.layers);
  wte_ = add_parameter("wte", {V, C}, ParameterInit::normal(std_dev));
  for (std::int64_t l = 0; l < L; ++l) {
    const std::string p = fmt::format("blocks.{}.", l);
    const int layer = static_cast<int>(l);
    const ParameterInit matrix = ParameterInit::normal(std_dev, layer);
    const ParameterInit residual_matrix = ParameterInit::normal(residual_std_dev, layer);
    constexpr LinearRole Column = LinearRole::ColumnParallel, Row = LinearRole::RowParallel;
    const int head = static_cast<int>(hd);  // q/k/v/o split between heads only
    LayerParams lp;
    lp.attn_norm = add_parameter(p + "attn_norm.weight", {C}, ParameterInit::ones(layer));
    lp.q = add_parameter(p + "attn.q.weight", {NH * hd, C}, matrix, linear(Column, Fp8Zone::Qkv, 1, head));
    lp.k = add_parameter(p + "attn.k.weight", {NKV * hd, C}, matrix, linear(Column, Fp8Zone::Qkv, 1, head));
    lp.v = add_parameter(p + "attn.v.weight", {NKV * hd, C}, matrix, linear(Column, Fp8Zone::Qkv, 1, head));
    lp.o = add_parameter(p + "attn.o.weight", {C, NH * hd}, residual_matrix, linear(Row, Fp8Zone::AttnProj, 1, head));
    lp.mlp_norm = add_parameter(p + "mlp_norm.weight", {C}, ParameterInit::ones(layer));
    lp.gate = add_parameter(p + "mlp.gate.weight", {H, C}, matrix, linear(Column, Fp8Zone::MlpFc));
    lp.up = add_parameter(p + "mlp.up.weight", {H, C}, matrix, linear(Column, Fp8Zone::MlpFc));
    lp.down = add_parameter(p + "mlp.down.weight", {C, H}, residual_matrix, linear(Row, Fp8Zone::MlpProj));
    layer_params_.push_back(lp);
  }
  norm_ = add_parameter("norm.weight", {C}, ParameterInit::ones());
  lm_head_ = add_parameter("lm_head.weight", {V, C}, ParameterInit::normal(std_dev));
  add_step_tensors();

  const auto act = [&](const std::string& name, Shape shape, TensorId* grad, TensorRole role = {}) {
    return add_activation(name, shape, grad, role);
  };
  const Shape btc{B, T, C}, bt{B, T}, q_shape{B, T, NH * hd}, kv_shape{B, T, NKV * hd}, bth{B, T, H};
  encoded_ = act("embedding.out", btc, &d_encoded_);
  forward_op_names_.push_back("embedding");
  for (std::int64_t l = 0; l < L; ++l) {
    const std::string p = fmt::format("blocks.{}.", l);
    LayerSites s{p + "attn_norm", p + "attn.q",   p + "attn.k",   p + "attn.v",  p + "attn.rope_q",
                 p + "attn.rope_k", p + "attn",   p + "attn.o",   p + "attn.residual", p + "mlp_norm",
                 p + "mlp.gate",  p + "mlp.up",   p + "mlp.swiglu", p + "mlp.down", p + "mlp.residual"};
    LayerActs a{}, g{};
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
    a.gate = act(s.gate + ".out", bth, &g.gate);
    a.up = act(s.up + ".out", bth, &g.up);
    a.swiglu = act(s.swiglu + ".out", bth, &g.swiglu);
    a.down = act(s.down + ".out", btc, &g.down);
    a.res_mlp = act(s.mlp_residual + ".out", btc, &g.res_mlp);
    for (const std::string* op : {&s.attn_norm, &s.q, &s.k, &s.v, &s.rope_q, &s.rope_k, &s.attn, &s.o,
                                  &s.attn_residual, &s.mlp_norm, &s.gate, &s.up, &s.swiglu, &s.down, &s.mlp_residual}) {
      forward_op_names_.push_back(*op);
    }
    acts_.push_back(a);
    grads_.push_back(g);
    sites_.push_back(std::move(s));
  }
  normed_ = act("norm.out", btc, &d_normed_);
  norm_rstd_ = act("norm.rstd", bt, nullptr, statistic());
  logits_ = act("lm_head.out", {B, T, V}, &d_logits_);
  probs_ = act("loss.probs", {B, T, V}, nullptr, statistic());
  for (const char* op : {"norm", "lm_head", "loss"}) forward_op_names_.push_back(op);
}

void LlamaCanary::forward(Engine& e) const {
  constexpr Phase F = Phase::Forward;
  const int hd = head_size();
  const double theta = config_.rope_theta;
  OpSite s = site("embedding", -1, F);
  e.encoder_forward(s, encoded_, inputs_, wte_, kNoTensor);  // (B,T,C): no position embedding
  after_forward_op(e, s, encoded_);
  TensorId x = encoded_;
  for (int l = 0; l < config_.layers; ++l) {
    const LayerParams& p = layer_params_[l];
    const LayerActs& a = acts_[l];
    const LayerSites& n = sites_[l];
    s = site(n.attn_norm, l, F);
    e.rmsnorm_forward(s, a.attn_norm, a.attn_rstd, x, p.attn_norm, norm_eps());
    after_forward_op(e, s, a.attn_norm);
    s = site(n.q, l, F);
    e.linear_forward(s, a.q, a.attn_norm, p.q, kNoTensor);  // (B,T,NH*hd)
    after_forward_op(e, s, a.q);
    s = site(n.k, l, F);
    e.linear_forward(s, a.k, a.attn_norm, p.k, kNoTensor);  // (B,T,NKV*hd)
    after_forward_op(e, s, a.k);
    s = site(n.v, l, F);
    e.linear_forward(s, a.v, a.attn_norm, p.v, kNoTensor);  // (B,T,NKV*hd)
    after_forward_op(e, s, a.v);
    s = site(n.rope_q, l, F);
    e.rope_forward(s, a.q_rope, a.q, hd, theta);
    after_forward_op(e, s, a.q_rope);
    s = site(n.rope_k, l, F);
    e.rope_forward(s, a.k_rope, a.k, hd, theta);
    after_forward_op(e, s, a.k_rope);
    s = site(n.attn, l, F);
    e.gqa_attention_forward(s, a.atty, a.att, a.q_rope, a.k_rope, a.v);  // (B,T,NH*hd), att (B,NH,T,T)
    after_forward_op(e, s, a.atty);
    s = site(n.o, l, F);
    e.linear_forward(s, a.o, a.atty, p.o, kNoTensor);  // (B,T,C)
    after_forward_op(e, s, a.o);
    s = site(n.attn_residual, l, F);
    e.residual_forward(s, a.res_attn, x, a.o);
    after_forward_op(e, s, a.res_attn);
    s = site(n.mlp_norm, l, F);
    e.rmsnorm_forward(s, a.mlp_norm, a.mlp_rstd, a.res_attn, p.mlp_norm, norm_eps());
    after_forward_op(e, s, a.mlp_norm);
    s = site(n.gate, l, F);
    e.linear_forward(s, a.gate, a.mlp_norm, p.gate, kNoTensor);  // (B,T,H)
    after_forward_op(e, s, a.gate);
    s = site(n.up, l, F);
    e.linear_forward(s, a.up, a.mlp_norm, p.up, kNoTensor);  // (B,T,H)
    after_forward_op(e, s, a.up);
    s = site(n.swiglu, l, F);
    e.swiglu_forward(s, a.swiglu, a.gate, a.up);  // (B,T,H)
    after_forward_op(e, s, a.swiglu);
    s = site(n.down, l, F);
    e.linear_forward(s, a.down, a.swiglu, p.down, kNoTensor);  // (B,T,C)
    after_forward_op(e, s, a.down);
    s = site(n.mlp_residual, l, F);
    e.residual_forward(s, a.res_mlp, a.res_attn, a.down);
    after_forward_op(e, s, a.res_mlp);
    x = a.res_mlp;
  }
  s = site("norm", -1, F);
  e.rmsnorm_forward(s, normed_, norm_rstd_, x, norm_, norm_eps());
  after_forward_op(e, s, normed_);
  s = site("lm_head", -1, F);
  e.linear_forward(s, logits_, normed_, lm_head_, kNoTensor);  // (B,T,V), untied
  after_forward_op(e, s, logits_);
  s = site("loss", -1, F);
  e.crossentropy_forward(s, loss_, probs_, logits_, targets_);
  after_forward_op(e, s, loss_);
}

// Backward: the forward calls undone in reverse order; every call adds into gradients.
void LlamaCanary::backward(Engine& e) const {
  constexpr Phase Bw = Phase::Backward;
  OpSite s = site("loss", -1, Bw);
  e.crossentropy_backward(s, d_logits_, probs_, targets_);
  traced(e, s, {d_logits_});
  s = site("lm_head", -1, Bw);
  e.linear_backward(s, d_normed_, grad(lm_head_), kNoTensor, d_logits_, normed_, lm_head_);
  traced(e, s, {d_normed_, grad(lm_head_)});
  const TensorId last = config_.layers > 0 ? acts_.back().res_mlp : encoded_;
  const TensorId d_last = config_.layers > 0 ? grads_.back().res_mlp : d_encoded_;
  s = site("norm", -1, Bw);
  e.rmsnorm_backward(s, d_last, grad(norm_), d_normed_, last, norm_, norm_rstd_);
  traced(e, s, {d_last, grad(norm_)});
  for (int l = config_.layers - 1; l >= 0; --l) backward_layer(e, l);
  s = site("embedding", -1, Bw);
  e.encoder_backward(s, grad(wte_), kNoTensor, d_encoded_, inputs_);
  traced(e, s, {grad(wte_)});
}

void LlamaCanary::backward_layer(Engine& e, int l) const {
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
  OpSite s = site(n.mlp_residual, l, Bw);
  e.residual_backward(s, g.res_attn, g.down, g.res_mlp);
  traced(e, s, {g.res_attn, g.down});
  s = site(n.down, l, Bw);
  e.linear_backward(s, g.swiglu, grad(p.down), kNoTensor, g.down, a.swiglu, p.down);
  traced(e, s, {g.swiglu, grad(p.down)});
  s = site(n.swiglu, l, Bw);
  e.swiglu_backward(s, g.gate, g.up, g.swiglu, a.gate, a.up);
  traced(e, s, {g.gate, g.up});
  s = site(n.up, l, Bw);
  e.linear_backward(s, g.mlp_norm, grad(p.up), kNoTensor, g.up, a.mlp_norm, p.up);
  traced(e, s, {g.mlp_norm, grad(p.up)});
  s = site(n.gate, l, Bw);
  e.linear_backward(s, g.mlp_norm, grad(p.gate), kNoTensor, g.gate, a.mlp_norm, p.gate);
  traced(e, s, {g.mlp_norm, grad(p.gate)});
  s = site(n.mlp_norm, l, Bw);
  e.rmsnorm_backward(s, g.res_attn, grad(p.mlp_norm), g.mlp_norm, a.res_attn, p.mlp_norm, a.mlp_rstd);
  traced(e, s, {g.res_attn, grad(p.mlp_norm)});
  // forward: res_attn = x + o
  s = site(n.attn_residual, l, Bw);
  e.residual_backward(s, dx, g.o, g.res_attn);
  traced(e, s, {dx, g.o});
  s = site(n.o, l, Bw);
  e.linear_backward(s, g.atty, grad(p.o), kNoTensor, g.o, a.atty, p.o);
  traced(e, s, {g.atty, grad(p.o)});
  s = site(n.attn, l, Bw);
  e.gqa_attention_backward(s, g.q_rope, g.k_rope, g.v, g.atty, a.q_rope, a.k_rope, a.v, a.att);
  traced(e, s, {g.q_rope, g.k_rope, g.v});
  s = site(n.rope_k, l, Bw);
  e.rope_backward(s, g.k, g.k_rope, hd, theta);
  traced(e, s, {g.k});
  s = site(n.rope_q, l, Bw);
  e.rope_backward(s, g.q, g.q_rope, hd, theta);
  traced(e, s, {g.q});
  s = site(n.v, l, Bw);
  e.linear_backward(s, g.attn_norm, grad(p.v), kNoTensor, g.v, a.attn_norm, p.v);
  traced(e, s, {g.attn_norm, grad(p.v)});
  s = site(n.k, l, Bw);
  e.linear_backward(s, g.attn_norm, grad(p.k), kNoTensor, g.k, a.attn_norm, p.k);
  traced(e, s, {g.attn_norm, grad(p.k)});
  s = site(n.q, l, Bw);
  e.linear_backward(s, g.attn_norm, grad(p.q), kNoTensor, g.q, a.attn_norm, p.q);
  traced(e, s, {g.attn_norm, grad(p.q)});
  s = site(n.attn_norm, l, Bw);
  e.rmsnorm_backward(s, dx, grad(p.attn_norm), g.attn_norm, x, p.attn_norm, a.attn_rstd);
  traced(e, s, {dx, grad(p.attn_norm)});
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
