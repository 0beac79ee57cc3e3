#include "gpt2.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace harness::canary {
namespace {
using Shape = std::vector<std::int64_t>;
}

std::vector<OpKind> Gpt2Canary::step_ops() const {
  const bool erf = exact_gelu();
  return {OpKind::Zero,           OpKind::EncoderForward,    OpKind::EncoderBackward,      OpKind::LayerNormForward,
          OpKind::LayerNormBackward, OpKind::LinearForward,  OpKind::LinearBackward,       OpKind::AttentionForward,
          OpKind::AttentionBackward, erf ? OpKind::GeluErfForward : OpKind::GeluForward,
          erf ? OpKind::GeluErfBackward : OpKind::GeluBackward, OpKind::ResidualForward,
          OpKind::ResidualBackward,  OpKind::CrossEntropyForward, OpKind::CrossEntropyBackward, OpKind::GlobalNorm,
          OpKind::ClipByNorm,     OpKind::AdamW};
}

bool Gpt2Canary::exact_gelu() const { return config_.gelu == kGeluChoices[1]; }

Gpt2Canary::Gpt2Canary(const CanaryConfig& config, std::optional<FaultSpec> fault, bool trace_ops)
    : Canary(config, std::move(fault), trace_ops) {
  if (config.channels % config.heads != 0) throw std::invalid_argument("channels must divide by heads");
  describe_tensors();
}

// The op names of block l, each spelled here once: the sites its ops are called at and
// the prefix of its tensors' names.
Gpt2Canary::LayerSites Gpt2Canary::layer_sites(std::int64_t l) {
  const std::string p = fmt::format("blocks.{}.", l);
  return {.ln1 = p + "ln1",
          .qkv = p + "attn.qkv",
          .attn = p + "attn",
          .attproj = p + "attn.proj",
          .attres = p + "attn.residual",
          .ln2 = p + "ln2",
          .fc = p + "mlp.fc",
          .gelu = p + "mlp.gelu",
          .fcproj = p + "mlp.proj",
          .mlpres = p + "mlp.residual"};
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
    const LayerSites& s = sites_.emplace_back(layer_sites(l));
    const int layer = static_cast<int>(l);
    const ParameterInit ones = ParameterInit::ones(layer), zeros = ParameterInit::zeros(layer);
    const ParameterInit matrix = ParameterInit::normal(std_dev, layer);
    const ParameterInit residual_matrix = ParameterInit::normal(residual_std_dev, layer);
    constexpr LinearRole Column = LinearRole::ColumnParallel, Row = LinearRole::RowParallel;
    LayerParams lp;
    lp.ln1w = add_parameter(s.ln1 + ".weight", {C}, ones);
    lp.ln1b = add_parameter(s.ln1 + ".bias", {C}, zeros);
    lp.qkvw = add_parameter(s.qkv + ".weight", {3 * C, C}, matrix, linear(Column, Fp8Zone::Qkv, 3));
    lp.qkvb = add_parameter(s.qkv + ".bias", {3 * C}, zeros, column_parallel_bias(3));
    lp.attprojw = add_parameter(s.attproj + ".weight", {C, C}, residual_matrix, linear(Row, Fp8Zone::AttnProj));
    lp.attprojb = add_parameter(s.attproj + ".bias", {C}, zeros);
    lp.ln2w = add_parameter(s.ln2 + ".weight", {C}, ones);
    lp.ln2b = add_parameter(s.ln2 + ".bias", {C}, zeros);
    lp.fcw = add_parameter(s.fc + ".weight", {4 * C, C}, matrix, linear(Column, Fp8Zone::MlpFc));
    lp.fcb = add_parameter(s.fc + ".bias", {4 * C}, zeros, column_parallel_bias());
    lp.fcprojw = add_parameter(s.fcproj + ".weight", {C, 4 * C}, residual_matrix, linear(Row, Fp8Zone::MlpProj));
    lp.fcprojb = add_parameter(s.fcproj + ".bias", {C}, zeros);
    layer_params_.push_back(lp);
  }
  lnfw_ = add_parameter(top_.final_norm + ".weight", {C}, ParameterInit::ones());
  lnfb_ = add_parameter(top_.final_norm + ".bias", {C}, ParameterInit::zeros());
  add_step_tensors();

  // Activations and their gradients share names; the kind tells them apart.
  auto act = [&](const std::string& name, Shape shape, TensorId* grad, TensorRole role = {}) {
    return add_activation(name, shape, grad, role);
  };
  const Shape btc{B, T, C}, bt{B, T};
  encoded_ = act(top_.embedding + ".out", btc, &d_encoded_);
  for (std::int64_t l = 0; l < L; ++l) {
    const LayerSites& s = sites_[static_cast<std::size_t>(l)];
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
    acts_.push_back(a);
    grads_.push_back(g);
  }
  lnf_ = act(top_.final_norm + ".out", btc, &d_lnf_);
  lnf_mean_ = act(top_.final_norm + ".mean", bt, nullptr, statistic());
  lnf_rstd_ = act(top_.final_norm + ".rstd", bt, nullptr, statistic());
  logits_ = act(top_.lm_head + ".out", {B, T, V}, &d_logits_);
  probs_ = act(top_.loss + ".probs", {B, T, V}, nullptr, statistic());
}

void Gpt2Canary::forward(Ops& e) const {
  using enum OpKind;
  constexpr Phase F = Phase::Forward;
  e.call<EncoderForward>(site(top_.embedding, -1, F), encoded_, inputs_, wte_, wpe_);  // (B,T,C)
  TensorId residual = encoded_;
  for (int l = 0; l < config_.layers; ++l) {
    const LayerParams& p = layer_params_[l];
    const LayerActs& a = acts_[l];
    const LayerSites& n = sites_[l];
    e.call<LayerNormForward>(site(n.ln1, l, F), a.ln1, a.ln1_mean, a.ln1_rstd, residual, p.ln1w, p.ln1b,
                             ln_eps());  // (B,T,C)
    e.call<LinearForward>(site(n.qkv, l, F), a.qkv, a.ln1, p.qkvw, p.qkvb);  // (B,T,3C)
    e.call<AttentionForward>(site(n.attn, l, F), a.atty, a.att, a.qkv);  // (B,T,C), att (B,NH,T,T)
    e.call<LinearForward>(site(n.attproj, l, F), a.attproj, a.atty, p.attprojw, p.attprojb);  // (B,T,C)
    e.call<ResidualForward>(site(n.attres, l, F), a.res2, residual, a.attproj);  // (B,T,C)
    e.call<LayerNormForward>(site(n.ln2, l, F), a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2w, p.ln2b,
                             ln_eps());  // (B,T,C)
    e.call<LinearForward>(site(n.fc, l, F), a.fch, a.ln2, p.fcw, p.fcb);  // (B,T,4C)
    if (exact_gelu()) {
      e.call<GeluErfForward>(site(n.gelu, l, F), a.fch_gelu, a.fch);  // (B,T,4C)
    } else {
      e.call<GeluForward>(site(n.gelu, l, F), a.fch_gelu, a.fch);  // (B,T,4C)
    }
    e.call<LinearForward>(site(n.fcproj, l, F), a.fcproj, a.fch_gelu, p.fcprojw, p.fcprojb);  // (B,T,C)
    e.call<ResidualForward>(site(n.mlpres, l, F), a.res3, a.res2, a.fcproj);  // (B,T,C)
    residual = a.res3;
  }
  e.call<LayerNormForward>(site(top_.final_norm, -1, F), lnf_, lnf_mean_, lnf_rstd_, residual, lnfw_, lnfb_,
                           ln_eps());  // (B,T,C)
  e.call<LinearForward>(site(top_.lm_head, -1, F), logits_, lnf_, wte_, kNoTensor);  // (B,T,V), tied to wte
  e.call<CrossEntropyForward>(site(top_.loss, -1, F), loss_, probs_, logits_, targets_);  // 0-D
}

// Backward: the forward calls undone in reverse order; every call adds into gradients.
// (With op tracing each call's results are traced after it, in its operands' order: the
// input gradient first, then the parameter gradients.)
void Gpt2Canary::backward(Ops& e) const {
  using enum OpKind;
  constexpr Phase Bw = Phase::Backward;
  e.call<CrossEntropyBackward>(site(top_.loss, -1, Bw), d_logits_, probs_, targets_);
  e.call<LinearBackward>(site(top_.lm_head, -1, Bw), d_lnf_, grad(wte_), kNoTensor, d_logits_, lnf_, wte_);
  const TensorId last_residual = config_.layers > 0 ? acts_.back().res3 : encoded_;
  const TensorId d_last_residual = config_.layers > 0 ? grads_.back().res3 : d_encoded_;
  e.call<LayerNormBackward>(site(top_.final_norm, -1, Bw), d_last_residual, grad(lnfw_), grad(lnfb_), d_lnf_,
                            last_residual, lnfw_, lnf_mean_, lnf_rstd_);
  for (int l = config_.layers - 1; l >= 0; --l) {
    const LayerParams& p = layer_params_[l];
    const LayerActs& a = acts_[l];
    const LayerActs& g = grads_[l];
    const LayerSites& n = sites_[l];
    const TensorId residual = l == 0 ? encoded_ : acts_[l - 1].res3;
    const TensorId d_residual = l == 0 ? d_encoded_ : grads_[l - 1].res3;
    // forward: res3 = res2 + fcproj
    e.call<ResidualBackward>(site(n.mlpres, l, Bw), g.res2, g.fcproj, g.res3);
    // forward: fcproj = fch_gelu @ fcprojw^T + fcprojb
    e.call<LinearBackward>(site(n.fcproj, l, Bw), g.fch_gelu, grad(p.fcprojw), grad(p.fcprojb), g.fcproj, a.fch_gelu,
                           p.fcprojw);
    // forward: fch_gelu = gelu(fch)
    if (exact_gelu()) {
      e.call<GeluErfBackward>(site(n.gelu, l, Bw), g.fch, a.fch, g.fch_gelu);
    } else {
      e.call<GeluBackward>(site(n.gelu, l, Bw), g.fch, a.fch, g.fch_gelu);
    }
    // forward: fch = ln2 @ fcw^T + fcb
    e.call<LinearBackward>(site(n.fc, l, Bw), g.ln2, grad(p.fcw), grad(p.fcb), g.fch, a.ln2, p.fcw);
    // forward: ln2 = layernorm(res2)
    e.call<LayerNormBackward>(site(n.ln2, l, Bw), g.res2, grad(p.ln2w), grad(p.ln2b), g.ln2, a.res2, p.ln2w, a.ln2_mean,
                              a.ln2_rstd);
    // forward: res2 = residual + attproj
    e.call<ResidualBackward>(site(n.attres, l, Bw), d_residual, g.attproj, g.res2);
    // forward: attproj = atty @ attprojw^T + attprojb
    e.call<LinearBackward>(site(n.attproj, l, Bw), g.atty, grad(p.attprojw), grad(p.attprojb), g.attproj, a.atty,
                           p.attprojw);
    // forward: atty = attention(qkv)
    e.call<AttentionBackward>(site(n.attn, l, Bw), g.qkv, g.atty, a.qkv, a.att);
    // forward: qkv = ln1 @ qkvw^T + qkvb
    e.call<LinearBackward>(site(n.qkv, l, Bw), g.ln1, grad(p.qkvw), grad(p.qkvb), g.qkv, a.ln1, p.qkvw);
    // forward: ln1 = layernorm(residual)
    e.call<LayerNormBackward>(site(n.ln1, l, Bw), d_residual, grad(p.ln1w), grad(p.ln1b), g.ln1, residual, p.ln1w,
                              a.ln1_mean, a.ln1_rstd);
  }
  // forward: encoded = wte[inputs] + wpe
  e.call<EncoderBackward>(site(top_.embedding, -1, Bw), grad(wte_), grad(wpe_), d_encoded_, inputs_);
}

// The MLP's GELU: GPT-2's tanh approximation (the default), or the exact one with erf.
constexpr ModelKey kGpt2Keys[] = {
    {.name = "gelu", .feature = "GELU choice", .choice = &CanaryConfig::gelu, .choices = kGeluChoices},
};

const ArchitectureSpec& gpt2_architecture() {
  static const ArchitectureSpec spec{
      "gpt2",
      {.grouped_query_attention = false, .rope = false, .mlp_ratio = 4},  // learned positions, a 4x GELU MLP
      true,
      [](const CanaryConfig& config, std::optional<FaultSpec> fault, bool trace_ops) -> std::unique_ptr<Canary> {
        return std::make_unique<Gpt2Canary>(config, std::move(fault), trace_ops);
      },
      nullptr,
      kGpt2Keys};
  return spec;
}

}  // namespace harness::canary
