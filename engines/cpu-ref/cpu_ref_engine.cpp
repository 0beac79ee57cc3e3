#include "cpu_ref_engine.h"

#include <algorithm>
#include <charconv>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels/deterministic_reduce.h"
#include "kernels/kernels.h"
#include "kernels/moe_kernels.h"
#include "kernels/moe_ops.h"

namespace harness {
namespace {

// --fast-exp BLOCK,...: block indices in 0..1023.
void parse_fast_exp(const std::string& value, CpuRefConfig& config) {
  std::size_t at = 0;
  while (at <= value.size()) {
    const std::size_t end = std::min(value.find(',', at), value.size());
    const std::string item = value.substr(at, end - at);
    int block = -1;
    const auto [rest, error] = std::from_chars(item.data(), item.data() + item.size(), block);
    if (item.empty() || error != std::errc() || rest != item.data() + item.size() || block < 0 || block > 1023) {
      throw std::invalid_argument(
          fmt::format("--fast-exp: '{}' is not a block index in 0..1023 (give BLOCK,..., e.g. --fast-exp 1)", item));
    }
    config.fast_exp_blocks.insert(block);
    at = end + 1;
  }
}

constexpr FlagParser<CpuRefConfig> kCpuRefFlags[] = {
    {{"fast-exp", "cpu-ref fault: these blocks' attention softmax from a fast-math-like exp (about 1.5e-4 relative), "
                  "BLOCK,..."},
     parse_fast_exp},
};

}  // namespace

std::string CpuRefConfig::canonical_features() const {
  return fast_exp_blocks.empty() ? "" : fmt::format("fast-exp={}", fmt::join(fast_exp_blocks, ","));
}

std::vector<EngineFlag> cpu_ref_flags() { return flags_of(kCpuRefFlags); }

kernels::SoftmaxExp CpuRefEngine::softmax_exp(const OpSite& site) const {
  return config_.fast_exp_blocks.count(site.layer) != 0 ? kernels::SoftmaxExp::FastApproximation
                                                        : kernels::SoftmaxExp::Deterministic;
}

void CpuRefEngine::check_table(const TensorTable& table) const {
  if (config_.fast_exp_blocks.empty()) return;
  // The attention blocks: one saved probability tensor (B, NH, T, T) each, its heads on axis 1.
  int blocks = 0;
  for (TensorId id : table.of_kind(TensorKind::Activation)) {
    if (table[id].role.heads_dim == 1 && table[id].rank() == 4) ++blocks;
  }
  const int last = *config_.fast_exp_blocks.rbegin();
  if (last >= blocks) {
    throw std::invalid_argument(fmt::format("--fast-exp: block {} is not one of this canary's {} attention blocks (0-{})",
                                            last, blocks, blocks - 1));
  }
}

CpuRefConfig parse_cpu_ref_config(const EngineSettings& settings) {
  CpuRefConfig config;
  apply_flags(kCpuRefFlags, settings, config);
  return config;
}

void CpuRefEngine::encoder_forward(const OpSite&, TensorId out, TensorId inputs, TensorId wte, TensorId wpe) {
  const TensorDesc& o = desc(out);  // (B,T,C)
  kernels::encoder_forward(f32(out), i32(inputs), f32(wte), wpe == kNoTensor ? nullptr : f32(wpe), int(o.dim(0)),
                           int(o.dim(1)), int(o.dim(2)));
}

void CpuRefEngine::encoder_backward(const OpSite&, TensorId dwte, TensorId dwpe, TensorId dout, TensorId inputs) {
  const TensorDesc& o = desc(dout);
  kernels::encoder_backward(f32(dwte), dwpe == kNoTensor ? nullptr : f32(dwpe), f32(dout), i32(inputs), int(o.dim(0)),
                            int(o.dim(1)), int(o.dim(2)));
}

void CpuRefEngine::layernorm_forward(const OpSite&, TensorId out, TensorId mean, TensorId rstd, TensorId inp,
                                     TensorId weight, TensorId bias, float eps) {
  kernels::layernorm_forward(f32(out), f32(mean), f32(rstd), f32(inp), f32(weight), f32(bias), int(rows(inp)),
                             int(desc(inp).shape.back()), eps);
}

void CpuRefEngine::layernorm_backward(const OpSite&, TensorId dinp, TensorId dweight, TensorId dbias, TensorId dout,
                                      TensorId inp, TensorId weight, TensorId mean, TensorId rstd) {
  kernels::layernorm_backward(f32(dinp), f32(dweight), f32(dbias), f32(dout), f32(inp), f32(weight), f32(mean),
                              f32(rstd), int(rows(inp)), int(desc(inp).shape.back()));
}

void CpuRefEngine::linear_forward(const OpSite&, TensorId out, TensorId inp, TensorId weight, TensorId bias) {
  const TensorDesc& w = desc(weight);  // (OC,C)
  kernels::linear_forward(f32(out), f32(inp), f32(weight), bias == kNoTensor ? nullptr : f32(bias), int(rows(inp)),
                          int(w.dim(1)), int(w.dim(0)), t_.scratch());
}

void CpuRefEngine::linear_backward(const OpSite&, TensorId dinp, TensorId dweight, TensorId dbias, TensorId dout,
                                   TensorId inp, TensorId weight) {
  const TensorDesc& w = desc(weight);
  kernels::linear_backward(f32(dinp), f32(dweight), dbias == kNoTensor ? nullptr : f32(dbias), f32(dout), f32(inp),
                           f32(weight), int(rows(inp)), int(w.dim(1)), int(w.dim(0)), t_.scratch());
}

// ---- the llama ops -----------------------------------------------------------------------

void CpuRefEngine::rmsnorm_forward(const OpSite&, TensorId out, TensorId rstd, TensorId inp, TensorId weight, float eps) {
  kernels::rmsnorm_forward(f32(out), f32(rstd), f32(inp), f32(weight), int(rows(inp)), int(desc(inp).shape.back()), eps);
}

void CpuRefEngine::rmsnorm_backward(const OpSite&, TensorId dinp, TensorId dweight, TensorId dout, TensorId inp,
                                    TensorId weight, TensorId rstd) {
  kernels::rmsnorm_backward(f32(dinp), f32(dweight), f32(dout), f32(inp), f32(weight), f32(rstd), int(rows(inp)),
                            int(desc(inp).shape.back()));
}

void CpuRefEngine::rope_forward(const OpSite&, TensorId out, TensorId inp, int head_size, double theta) {
  const TensorDesc& x = desc(inp);  // (B,T,heads*head_size)
  const kernels::RopeTables& r = rope_tables_.get(int(x.dim(1)), head_size, theta);
  kernels::rope_forward(f32(out), f32(inp), r.cos.data(), r.sin.data(), int(x.dim(0)), int(x.dim(1)),
                        int(x.dim(2) / head_size), head_size);
}

void CpuRefEngine::rope_backward(const OpSite&, TensorId dinp, TensorId dout, int head_size, double theta) {
  const TensorDesc& x = desc(dout);
  const kernels::RopeTables& r = rope_tables_.get(int(x.dim(1)), head_size, theta);
  kernels::rope_backward(f32(dinp), f32(dout), r.cos.data(), r.sin.data(), int(x.dim(0)), int(x.dim(1)),
                         int(x.dim(2) / head_size), head_size);
}

void CpuRefEngine::swiglu_forward(const OpSite&, TensorId out, TensorId gate, TensorId up) {
  kernels::swiglu_forward(f32(out), f32(gate), f32(up), desc(out).numel());
}

void CpuRefEngine::swiglu_backward(const OpSite&, TensorId dgate, TensorId dup, TensorId dout, TensorId gate,
                                   TensorId up) {
  kernels::swiglu_backward(f32(dgate), f32(dup), f32(dout), f32(gate), f32(up), desc(dout).numel());
}

void CpuRefEngine::gqa_attention_forward(const OpSite& site, TensorId out, TensorId att, TensorId q, TensorId k,
                                         TensorId v) {
  const TensorDesc& a = desc(att);  // (B,NH,T,T)
  const int NH = int(a.dim(1)), hd = int(desc(q).dim(2)) / NH;
  kernels::gqa_attention_forward(f32(out), f32(att), f32(q), f32(k), f32(v), int(a.dim(0)), int(a.dim(2)), NH,
                                 int(desc(k).dim(2)) / hd, hd, softmax_exp(site));
}

void CpuRefEngine::gqa_attention_backward(const OpSite&, TensorId dq, TensorId dk, TensorId dv, TensorId dout,
                                          TensorId q, TensorId k, TensorId v, TensorId att) {
  const TensorDesc& a = desc(att);
  const int NH = int(a.dim(1)), hd = int(desc(q).dim(2)) / NH;
  kernels::gqa_attention_backward(f32(dq), f32(dk), f32(dv), f32(dout), f32(q), f32(k), f32(v), f32(att), int(a.dim(0)),
                                  int(a.dim(2)), NH, int(desc(k).dim(2)) / hd, hd);
}

void CpuRefEngine::attention_forward(const OpSite& site, TensorId out, TensorId att, TensorId qkv) {
  const TensorDesc& a = desc(att);  // (B,NH,T,T)
  const TensorDesc& o = desc(out);  // (B,T,C)
  kernels::attention_forward(f32(out), f32(att), f32(qkv), int(o.dim(0)), int(o.dim(1)), int(o.dim(2)), int(a.dim(1)),
                             softmax_exp(site));
}

void CpuRefEngine::attention_backward(const OpSite&, TensorId dqkv, TensorId dout, TensorId qkv, TensorId att) {
  const TensorDesc& a = desc(att);
  const TensorDesc& o = desc(dout);
  kernels::attention_backward(f32(dqkv), f32(dout), f32(qkv), f32(att), int(o.dim(0)), int(o.dim(1)), int(o.dim(2)),
                              int(a.dim(1)));
}

void CpuRefEngine::gelu_forward(const OpSite&, TensorId out, TensorId inp) {
  kernels::gelu_forward(f32(out), f32(inp), desc(inp).numel());
}

void CpuRefEngine::gelu_backward(const OpSite&, TensorId dinp, TensorId inp, TensorId dout) {
  kernels::gelu_backward(f32(dinp), f32(inp), f32(dout), desc(inp).numel());
}

void CpuRefEngine::gelu_erf_forward(const OpSite&, TensorId out, TensorId inp) {
  kernels::gelu_erf_forward(f32(out), f32(inp), desc(inp).numel());
}

void CpuRefEngine::gelu_erf_backward(const OpSite&, TensorId dinp, TensorId inp, TensorId dout) {
  kernels::gelu_erf_backward(f32(dinp), f32(inp), f32(dout), desc(inp).numel());
}

void CpuRefEngine::residual_forward(const OpSite&, TensorId out, TensorId a, TensorId b) {
  kernels::residual_forward(f32(out), f32(a), f32(b), desc(out).numel());
}

void CpuRefEngine::residual_backward(const OpSite&, TensorId da, TensorId db, TensorId dout) {
  kernels::add_inplace(f32(da), f32(dout), desc(dout).numel());
  kernels::add_inplace(f32(db), f32(dout), desc(dout).numel());
}

void CpuRefEngine::crossentropy_forward(const OpSite&, TensorId loss, TensorId probs, TensorId logits,
                                        TensorId targets) {
  *f32(loss) = kernels::crossentropy_forward(f32(probs), f32(logits), i32(targets), int(rows(logits)),
                                             int(desc(logits).shape.back()));
}

void CpuRefEngine::crossentropy_backward(const OpSite&, TensorId dlogits, TensorId probs, TensorId targets) {
  kernels::crossentropy_backward(f32(dlogits), f32(probs), i32(targets), int(rows(probs)), int(desc(probs).shape.back()));
}

void CpuRefEngine::global_norm(const OpSite&, TensorId norm, std::span<const TensorId> tensors) {
  // Partials of every tensor, in table order, then one fixed tree over all of them.
  std::vector<double> partials;
  for (TensorId id : tensors) {
    const std::size_t at = partials.size();
    partials.resize(at + static_cast<std::size_t>(kernels::sum_of_squares_partial_count(desc(id).numel())));
    kernels::sum_of_squares_partials(f32(id), desc(id).numel(), partials.data() + at);
  }
  kernels::combine_pairwise(partials, static_cast<std::int64_t>(partials.size()), 1);
  *f32(norm) = static_cast<float>(__builtin_sqrt(partials.empty() ? 0.0 : partials[0]));
}

void CpuRefEngine::clip_by_norm(const OpSite&, std::span<const TensorId> tensors, TensorId norm, float max_norm) {
  const float n = scalar(norm);
  if (!(n > max_norm)) return;
  const float factor = max_norm / (n + 1e-6f);
  for (TensorId id : tensors) kernels::scale_inplace(f32(id), factor, desc(id).numel());
}

void CpuRefEngine::adamw_update(const OpSite&, TensorId param, TensorId grad, TensorId m, TensorId v, TensorId lr,
                                TensorId bias_correction1, TensorId bias_correction2, const AdamWConfig& c) {
  const kernels::AdamWStep step{scalar(lr), c.beta1, c.beta2, c.eps, c.weight_decay, scalar(bias_correction1),
                                scalar(bias_correction2)};
  kernels::adamw_update(f32(param), f32(grad), f32(m), f32(v), desc(param).numel(), step);
}

void CpuRefEngine::nudge_ulps(const OpSite&, TensorId tensor, TensorId ulps) {
  const auto n = static_cast<std::int32_t>(scalar(ulps));
  if (n > 0) *f32(tensor) = kernels::next_up(*f32(tensor), n);
}

// ---- the mixture-of-experts ops (kernels/moe_ops.h) --------------------------------------

void CpuRefEngine::moe_route_forward(const OpSite&, TensorId weights, TensorId expert, TensorId slot, TensorId probs,
                                     TensorId routing, TensorId logits, int top_k, int capacity, float balance_coef) {
  kernels::moe_ops::route_forward(t_, weights, expert, slot, probs, routing, logits, top_k, capacity, balance_coef);
}

void CpuRefEngine::moe_route_backward(const OpSite&, TensorId dlogits, TensorId dweights, TensorId probs,
                                      TensorId weights, TensorId expert, float balance_coef) {
  kernels::moe_ops::route_backward(t_, dlogits, dweights, probs, weights, expert, balance_coef);
}

void CpuRefEngine::moe_dispatch_forward(const OpSite&, TensorId expert_in, TensorId inp, TensorId expert,
                                        TensorId slot) {
  kernels::moe_ops::dispatch_forward(t_, expert_in, inp, expert, slot);
}

void CpuRefEngine::moe_dispatch_backward(const OpSite&, TensorId dinp, TensorId dexpert_in, TensorId expert,
                                         TensorId slot) {
  kernels::moe_ops::dispatch_backward(t_, dinp, dexpert_in, expert, slot);
}

void CpuRefEngine::moe_combine_forward(const OpSite&, TensorId out, TensorId expert_out, TensorId weights,
                                       TensorId expert, TensorId slot) {
  kernels::moe_ops::combine_forward(t_, out, expert_out, weights, expert, slot);
}

void CpuRefEngine::moe_combine_backward(const OpSite&, TensorId dexpert_out, TensorId dweights, TensorId dout,
                                        TensorId expert_out, TensorId weights, TensorId expert, TensorId slot) {
  kernels::moe_ops::combine_backward(t_, dexpert_out, dweights, dout, expert_out, weights, expert, slot);
}

void CpuRefEngine::expert_linear_forward(const OpSite&, TensorId out, TensorId inp, TensorId weight) {
  const TensorDesc& w = desc(weight);  // (E,OC,C)
  kernels::expert_linear_forward(f32(out), f32(inp), f32(weight), int(w.dim(0)), int(desc(inp).dim(1)), int(w.dim(2)),
                                 int(w.dim(1)), t_.scratch());
}

void CpuRefEngine::expert_linear_backward(const OpSite&, TensorId dinp, TensorId dweight, TensorId dout, TensorId inp,
                                          TensorId weight) {
  const TensorDesc& w = desc(weight);
  kernels::expert_linear_backward(f32(dinp), f32(dweight), f32(dout), f32(inp), f32(weight), int(w.dim(0)),
                                  int(desc(inp).dim(1)), int(w.dim(2)), int(w.dim(1)), t_.scratch());
}

}  // namespace harness
