#include "gpt2.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace harness::canary {
namespace {
using Shape = std::vector<std::int64_t>;
}

std::vector<OpKind> Gpt2Canary::step_ops() const {
  return {OpKind::Zero,           OpKind::EncoderForward,    OpKind::EncoderBackward,      OpKind::LayerNormForward,
          OpKind::LayerNormBackward, OpKind::LinearForward,  OpKind::LinearBackward,       OpKind::AttentionForward,
          OpKind::AttentionBackward, OpKind::GeluForward,    OpKind::GeluBackward,         OpKind::ResidualForward,
          OpKind::ResidualBackward,  OpKind::CrossEntropyForward, OpKind::CrossEntropyBackward, OpKind::GlobalNorm,
          OpKind::ClipByNorm,     OpKind::AdamW};
}

Gpt2Canary::Gpt2Canary(const CanaryConfig& config, std::optional<FaultSpec> fault, bool trace_ops)
    : Canary(config, std::move(fault), trace_ops) {
  if (config.channels % config.heads != 0) throw std::invalid_argument("channels must divide by heads");
  describe_tensors();
}

// The one description of every tensor. Parameters first, in docs/design.md's canonical order:
// that order is the receipt's /hashes/names order.
void Gpt2Canary::describe_tensors() {
  const std::int64_t V = config_.vocab_size, T = config_.context_length, C = config_.channels;
  const std::int64_t B = config_.batch_size, NH = config_.heads, L = config_.layers;

  // Init roles (docs/canary.md): weight matrices and embeddings ~ N(0, init_std), the
  // residual projections scaled by 1/sqrt(2L) (GPT-2's depth scaling), biases 0, norms 1.
  const double std_dev = config_.init_std;
  const double residual_std_dev = config_.init_std / __builtin_sqrt(2.0 * config_.layers);
  wte_ = add_parameter("wte", {V, C}, ParameterInit::normal(std_dev));
  wpe_ = add_parameter("wpe", {T, C}, ParameterInit::normal(std_dev));
  for (std::int64_t l = 0; l < L; ++l) {
    const std::string p = fmt::format("blocks.{}.", l);
    const int layer = static_cast<int>(l);
    const ParameterInit ones = ParameterInit::ones(layer), zeros = ParameterInit::zeros(layer);
    const ParameterInit matrix = ParameterInit::normal(std_dev, layer);
    const ParameterInit residual_matrix = ParameterInit::normal(residual_std_dev, layer);
    constexpr LinearRole Column = LinearRole::ColumnParallel, Row = LinearRole::RowParallel;
    LayerParams lp;
    lp.ln1w = add_parameter(p + "ln1.weight", {C}, ones);
    lp.ln1b = add_parameter(p + "ln1.bias", {C}, zeros);
    lp.qkvw = add_parameter(p + "attn.qkv.weight", {3 * C, C}, matrix, linear(Column, Fp8Zone::Qkv, 3));
    lp.qkvb = add_parameter(p + "attn.qkv.bias", {3 * C}, zeros, column_parallel_bias(3));
    lp.attprojw = add_parameter(p + "attn.proj.weight", {C, C}, residual_matrix, linear(Row, Fp8Zone::AttnProj));
    lp.attprojb = add_parameter(p + "attn.proj.bias", {C}, zeros);
    lp.ln2w = add_parameter(p + "ln2.weight", {C}, ones);
    lp.ln2b = add_parameter(p + "ln2.bias", {C}, zeros);
    lp.fcw = add_parameter(p + "mlp.fc.weight", {4 * C, C}, matrix, linear(Column, Fp8Zone::MlpFc));
    lp.fcb = add_parameter(p + "mlp.fc.bias", {4 * C}, zeros, column_parallel_bias());
    lp.fcprojw = add_parameter(p + "mlp.proj.weight", {C, 4 * C}, residual_matrix, linear(Row, Fp8Zone::MlpProj));
    lp.fcprojb = add_parameter(p + "mlp.proj.bias", {C}, zeros);
    layer_params_.push_back(lp);
  }
  lnfw_ = add_parameter("lnf.weight", {C}, ParameterInit::ones());
  lnfb_ = add_parameter("lnf.bias", {C}, ParameterInit::zeros());
  add_step_tensors();

  // Activations and their gradients share names; the kind tells them apart.
  auto act = [&](const std::string& name, Shape shape, TensorId* grad, TensorRole role = {}) {
    return add_activation(name, shape, grad, role);
  };
  const Shape btc{B, T, C}, bt{B, T};
  encoded_ = act("embedding.out", btc, &d_encoded_);
  forward_op_names_.push_back("embedding");
  for (std::int64_t l = 0; l < L; ++l) {
    const std::string p = fmt::format("blocks.{}.", l);
    LayerSites s{p + "ln1", p + "attn.qkv", p + "attn", p + "attn.proj", p + "attn.residual",
                 p + "ln2", p + "mlp.fc", p + "mlp.gelu", p + "mlp.proj", p + "mlp.residual"};
    LayerActs a{}, g{};
    a.ln1 = act(s.ln1 + ".out", btc, &g.ln1);
    a.ln1_mean = act(s.ln1 + ".mean", bt, nullptr, statistic());
    a.ln1_rstd = act(s.ln1 + ".rstd", bt, nullptr, statistic());
    a.qkv = act(s.qkv + ".out", {B, T, 3 * C}, &g.qkv);
    a.att = act(s.attn + ".att", {B, NH, T, T}, nullptr, attention_heads(1));
    a.atty = act(s.attn + ".out", btc, &g.atty);
    a.attproj = act(s.attproj + ".out", btc, &g.attproj);
    a.res2 = act(s.attres + ".out", btc, &g.res2);
    a.ln2 = act(s.ln2 + ".out", btc, &g.ln2);
    a.ln2_mean = act(s.ln2 + ".mean", bt, nullptr, statistic());
    a.ln2_rstd = act(s.ln2 + ".rstd", bt, nullptr, statistic());
    a.fch = act(s.fc + ".out", {B, T, 4 * C}, &g.fch);
    a.fch_gelu = act(s.gelu + ".out", {B, T, 4 * C}, &g.fch_gelu);
    a.fcproj = act(s.fcproj + ".out", btc, &g.fcproj);
    a.res3 = act(s.mlpres + ".out", btc, &g.res3);
    for (const std::string* op : {&s.ln1, &s.qkv, &s.attn, &s.attproj, &s.attres, &s.ln2, &s.fc, &s.gelu, &s.fcproj,
                                  &s.mlpres}) {
      forward_op_names_.push_back(*op);
    }
    acts_.push_back(a);
    grads_.push_back(g);
    sites_.push_back(std::move(s));
  }
  lnf_ = act("lnf.out", btc, &d_lnf_);
  lnf_mean_ = act("lnf.mean", bt, nullptr, statistic());
  lnf_rstd_ = act("lnf.rstd", bt, nullptr, statistic());
  logits_ = act("lm_head.out", {B, T, V}, &d_logits_);
  probs_ = act("loss.probs", {B, T, V}, nullptr, statistic());
  for (const char* op : {"lnf", "lm_head", "loss"}) forward_op_names_.push_back(op);
}

void Gpt2Canary::forward(Engine& e) const {
  constexpr Phase F = Phase::Forward;
  OpSite s = site("embedding", -1, F);
  e.encoder_forward(s, encoded_, inputs_, wte_, wpe_);  // (B,T,C)
  after_forward_op(e, s, encoded_);
  TensorId residual = encoded_;
  for (int l = 0; l < config_.layers; ++l) {
    const LayerParams& p = layer_params_[l];
    const LayerActs& a = acts_[l];
    const LayerSites& n = sites_[l];
    s = site(n.ln1, l, F);
    e.layernorm_forward(s, a.ln1, a.ln1_mean, a.ln1_rstd, residual, p.ln1w, p.ln1b, ln_eps());  // (B,T,C)
    after_forward_op(e, s, a.ln1);
    s = site(n.qkv, l, F);
    e.linear_forward(s, a.qkv, a.ln1, p.qkvw, p.qkvb);  // (B,T,3C)
    after_forward_op(e, s, a.qkv);
    s = site(n.attn, l, F);
    e.attention_forward(s, a.atty, a.att, a.qkv);  // (B,T,C), att (B,NH,T,T)
    after_forward_op(e, s, a.atty);
    s = site(n.attproj, l, F);
    e.linear_forward(s, a.attproj, a.atty, p.attprojw, p.attprojb);  // (B,T,C)
    after_forward_op(e, s, a.attproj);
    s = site(n.attres, l, F);
    e.residual_forward(s, a.res2, residual, a.attproj);  // (B,T,C)
    after_forward_op(e, s, a.res2);
    s = site(n.ln2, l, F);
    e.layernorm_forward(s, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2w, p.ln2b, ln_eps());  // (B,T,C)
    after_forward_op(e, s, a.ln2);
    s = site(n.fc, l, F);
    e.linear_forward(s, a.fch, a.ln2, p.fcw, p.fcb);  // (B,T,4C)
    after_forward_op(e, s, a.fch);
    s = site(n.gelu, l, F);
    e.gelu_forward(s, a.fch_gelu, a.fch);  // (B,T,4C)
    after_forward_op(e, s, a.fch_gelu);
    s = site(n.fcproj, l, F);
    e.linear_forward(s, a.fcproj, a.fch_gelu, p.fcprojw, p.fcprojb);  // (B,T,C)
    after_forward_op(e, s, a.fcproj);
    s = site(n.mlpres, l, F);
    e.residual_forward(s, a.res3, a.res2, a.fcproj);  // (B,T,C)
    after_forward_op(e, s, a.res3);
    residual = a.res3;
  }
  s = site("lnf", -1, F);
  e.layernorm_forward(s, lnf_, lnf_mean_, lnf_rstd_, residual, lnfw_, lnfb_, ln_eps());  // (B,T,C)
  after_forward_op(e, s, lnf_);
  s = site("lm_head", -1, F);
  e.linear_forward(s, logits_, lnf_, wte_, kNoTensor);  // (B,T,V), tied to wte
  after_forward_op(e, s, logits_);
  s = site("loss", -1, F);
  e.crossentropy_forward(s, loss_, probs_, logits_, targets_);  // 0-D
  after_forward_op(e, s, loss_);
}

// Backward: the forward calls undone in reverse order; every call adds into gradients.
// With op tracing each call's outputs are traced after it: the input gradient first,
// then the parameter gradients.
void Gpt2Canary::backward(Engine& e) const {
  constexpr Phase Bw = Phase::Backward;
  OpSite s = site("loss", -1, Bw);
  e.crossentropy_backward(s, d_logits_, probs_, targets_);
  traced(e, s, {d_logits_});
  s = site("lm_head", -1, Bw);
  e.linear_backward(s, d_lnf_, grad(wte_), kNoTensor, d_logits_, lnf_, wte_);
  traced(e, s, {d_lnf_, grad(wte_)});
  const TensorId last_residual = config_.layers > 0 ? acts_.back().res3 : encoded_;
  const TensorId d_last_residual = config_.layers > 0 ? grads_.back().res3 : d_encoded_;
  s = site("lnf", -1, Bw);
  e.layernorm_backward(s, d_last_residual, grad(lnfw_), grad(lnfb_), d_lnf_, last_residual, lnfw_, lnf_mean_, lnf_rstd_);
  traced(e, s, {d_last_residual, grad(lnfw_), grad(lnfb_)});
  for (int l = config_.layers - 1; l >= 0; --l) {
    const LayerParams& p = layer_params_[l];
    const LayerActs& a = acts_[l];
    const LayerActs& g = grads_[l];
    const LayerSites& n = sites_[l];
    const TensorId residual = l == 0 ? encoded_ : acts_[l - 1].res3;
    const TensorId d_residual = l == 0 ? d_encoded_ : grads_[l - 1].res3;
    // forward: res3 = res2 + fcproj
    s = site(n.mlpres, l, Bw);
    e.residual_backward(s, g.res2, g.fcproj, g.res3);
    traced(e, s, {g.res2, g.fcproj});
    // forward: fcproj = fch_gelu @ fcprojw^T + fcprojb
    s = site(n.fcproj, l, Bw);
    e.linear_backward(s, g.fch_gelu, grad(p.fcprojw), grad(p.fcprojb), g.fcproj, a.fch_gelu, p.fcprojw);
    traced(e, s, {g.fch_gelu, grad(p.fcprojw), grad(p.fcprojb)});
    // forward: fch_gelu = gelu(fch)
    s = site(n.gelu, l, Bw);
    e.gelu_backward(s, g.fch, a.fch, g.fch_gelu);
    traced(e, s, {g.fch});
    // forward: fch = ln2 @ fcw^T + fcb
    s = site(n.fc, l, Bw);
    e.linear_backward(s, g.ln2, grad(p.fcw), grad(p.fcb), g.fch, a.ln2, p.fcw);
    traced(e, s, {g.ln2, grad(p.fcw), grad(p.fcb)});
    // forward: ln2 = layernorm(res2)
    s = site(n.ln2, l, Bw);
    e.layernorm_backward(s, g.res2, grad(p.ln2w), grad(p.ln2b), g.ln2, a.res2, p.ln2w, a.ln2_mean, a.ln2_rstd);
    traced(e, s, {g.res2, grad(p.ln2w), grad(p.ln2b)});
    // forward: res2 = residual + attproj
    s = site(n.attres, l, Bw);
    e.residual_backward(s, d_residual, g.attproj, g.res2);
    traced(e, s, {d_residual, g.attproj});
    // forward: attproj = atty @ attprojw^T + attprojb
    s = site(n.attproj, l, Bw);
    e.linear_backward(s, g.atty, grad(p.attprojw), grad(p.attprojb), g.attproj, a.atty, p.attprojw);
    traced(e, s, {g.atty, grad(p.attprojw), grad(p.attprojb)});
    // forward: atty = attention(qkv)
    s = site(n.attn, l, Bw);
    e.attention_backward(s, g.qkv, g.atty, a.qkv, a.att);
    traced(e, s, {g.qkv});
    // forward: qkv = ln1 @ qkvw^T + qkvb
    s = site(n.qkv, l, Bw);
    e.linear_backward(s, g.ln1, grad(p.qkvw), grad(p.qkvb), g.qkv, a.ln1, p.qkvw);
    traced(e, s, {g.ln1, grad(p.qkvw), grad(p.qkvb)});
    // forward: ln1 = layernorm(residual)
    s = site(n.ln1, l, Bw);
    e.layernorm_backward(s, d_residual, grad(p.ln1w), grad(p.ln1b), g.ln1, residual, p.ln1w, a.ln1_mean, a.ln1_rstd);
    traced(e, s, {d_residual, grad(p.ln1w), grad(p.ln1b)});
  }
  // forward: encoded = wte[inputs] + wpe
  s = site("embedding", -1, Bw);
  e.encoder_backward(s, grad(wte_), grad(wpe_), d_encoded_, inputs_);
  traced(e, s, {grad(wte_), grad(wpe_)});
}

const ArchitectureSpec& gpt2_architecture() {
  static const ArchitectureSpec spec{
      "gpt2",
      {.grouped_query_attention = false, .rope = false, .mlp_ratio = 4},  // learned positions, a 4x GELU MLP
      true,
      [](const CanaryConfig& config, std::optional<FaultSpec> fault, bool trace_ops) -> std::unique_ptr<Canary> {
        return std::make_unique<Gpt2Canary>(config, std::move(fault), trace_ops);
      }};
  return spec;
}

}  // namespace harness::canary
