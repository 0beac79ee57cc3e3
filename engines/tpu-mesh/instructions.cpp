#include "instructions.h"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <vector>

#include <tbb/parallel_for.h>

#include "kernels/kernels.h"
#include "kernels/llama_kernels.h"
#include "kernels/moe_kernels.h"
#include "numerics/formats.h"
#include "sharding.h"

namespace harness::tpu {
namespace {

using K = InstrKind;
using C = const KernelCall&;

void add_bias(float* out, const float* bias, std::int64_t rows, std::int64_t channels) {
  tbb::parallel_for(std::int64_t{0}, rows, [&](std::int64_t r) {
    float* row = out + r * channels;
    for (std::int64_t o = 0; o < channels; ++o) row[o] += bias[o];
  });
}

void clip(C c) {
  const float norm = *c.P(0), max_norm = c.attrs[0];
  if (!(norm > max_norm)) return;
  const float factor = max_norm / (norm + 1e-6f);
  for (std::size_t i = 1; i < c.buffers.size(); ++i) kernels::scale_inplace(c.P(i), factor, c.n[i - 1]);
}

void adamw(C c) {
  const kernels::AdamWStep step{*c.P(4), c.attrs[0], c.attrs[1], c.attrs[2], c.attrs[3], *c.P(5), *c.P(6)};
  kernels::adamw_update(c.P(0), c.P(1), c.P(2), c.P(3), c.n[0], step);
}

// Only the device holding the tensor's element 0 moves it (a fault of one element).
void nudge(C c) {
  const auto ulps = static_cast<std::int32_t>(*c.P(1));
  if (ulps > 0 && holds_first_element(c.exe.spec_of(c.in, 0), c.mesh(), c.device)) {
    *c.P(0) = kernels::next_up(*c.P(0), ulps);
  }
}

void cast_bf16(C c) {
  std::copy(c.P(1), c.P(1) + c.n[0], c.P(0));
  numerics::round_to_bf16_inplace(c.P(0), c.n[0]);
}

template <bool Forward>
void rope(C c) {
  const int B = c.dim(0), T = c.dim(1), heads = c.dim(2), hd = c.dim(3);
  const kernels::RopeTables& r = c.rope_tables(T, hd, attrs_double(c.attrs[0], c.attrs[1]));
  if constexpr (Forward) {
    kernels::rope_forward(c.P(0), c.P(1), r.cos.data(), r.sin.data(), B, T, heads, hd);
  } else {
    kernels::rope_backward(c.P(0), c.P(1), r.cos.data(), r.sin.data(), B, T, heads, hd);
  }
}

void take_block(C c) {
  const std::vector<std::int64_t> global(c.n.begin(), c.n.end());
  copy_block_from_global(global, c.exe.spec_of(c.in, 0), c.mesh(), c.device, c.P(1), c.P(0));
}

// Indexed by InstrKind. Schemas: {buffers, dims, attrs, specs, nullable, elementwise}.
constexpr std::array<InstrDescription, static_cast<std::size_t>(InstrKind::kLastKind) + 1> kInstructions{{
    {K::Fill, {1, 1, 1, 0, -1, true}, [](C c) { std::fill(c.P(0), c.P(0) + c.n[0], c.attrs[0]); }},
    {K::EncoderForward, {4, 3, 0, 0, 3, false},  // wpe may be absent (llama)
     [](C c) { kernels::encoder_forward(c.P(0), c.I(1), c.P(2), c.P(3), c.dim(0), c.dim(1), c.dim(2)); }},
    {K::EncoderBackward, {4, 3, 0, 0, 1, false},  // dwpe may be absent
     [](C c) { kernels::encoder_backward(c.P(0), c.P(1), c.P(2), c.I(3), c.dim(0), c.dim(1), c.dim(2)); }},
    {K::LayerNormForward, {6, 2, 1, 0, -1, false},
     [](C c) {
       kernels::layernorm_forward(c.P(0), c.P(1), c.P(2), c.P(3), c.P(4), c.P(5), c.dim(0), c.dim(1), c.attrs[0]);
     }},
    {K::LayerNormBackward, {8, 2, 0, 0, -1, false},
     [](C c) {
       kernels::layernorm_backward(c.P(0), c.P(1), c.P(2), c.P(3), c.P(4), c.P(5), c.P(6), c.P(7), c.dim(0), c.dim(1));
     }},
    {K::Linear, {4, 3, 0, 0, 3, false},  // bias may be absent
     [](C c) { kernels::linear_forward(c.P(0), c.P(1), c.P(2), c.P(3), c.dim(0), c.dim(1), c.dim(2), c.scratch); }},
    {K::LinearBackward, {6, 3, 0, 0, 2, false},  // dbias may be absent
     [](C c) {
       kernels::linear_backward(c.P(0), c.P(1), c.P(2), c.P(3), c.P(4), c.P(5), c.dim(0), c.dim(1), c.dim(2), c.scratch);
     }},
    {K::AttentionForward, {3, 4, 0, 0, -1, false},
     [](C c) { kernels::attention_forward(c.P(0), c.P(1), c.P(2), c.dim(0), c.dim(1), c.dim(2), c.dim(3)); }},
    {K::AttentionBackward, {4, 4, 0, 0, -1, false},
     [](C c) { kernels::attention_backward(c.P(0), c.P(1), c.P(2), c.P(3), c.dim(0), c.dim(1), c.dim(2), c.dim(3)); }},
    {K::GeluForward, {2, 1, 0, 0, -1, true}, [](C c) { kernels::gelu_forward(c.P(0), c.P(1), c.n[0]); }},
    {K::GeluBackward, {3, 1, 0, 0, -1, true}, [](C c) { kernels::gelu_backward(c.P(0), c.P(1), c.P(2), c.n[0]); }},
    {K::Add, {3, 1, 0, 0, -1, true}, [](C c) { kernels::residual_forward(c.P(0), c.P(1), c.P(2), c.n[0]); }},
    {K::AddInPlace, {2, 1, 0, 0, -1, true}, [](C c) { kernels::add_inplace(c.P(0), c.P(1), c.n[0]); }},
    {K::BiasAdd, {2, 2, 0, 0, -1, false}, [](C c) { add_bias(c.P(0), c.P(1), c.n[0], c.n[1]); }},
    {K::CrossEntropyRows, {4, 2, 0, 0, -1, false},
     [](C c) { kernels::crossentropy_rows(c.P(0), c.P(1), c.P(2), c.I(3), c.dim(0), c.dim(1)); }},
    {K::CrossEntropyBackward, {3, 3, 0, 0, -1, false},
     [](C c) { kernels::crossentropy_backward(c.P(0), c.P(1), c.I(2), c.dim(0), c.dim(1), c.n[2]); }},
    {K::Clip, {kPerTensor, kPerTensor, 1, 0, -1, false}, clip},
    {K::AdamW, {7, 1, 4, 0, -1, false}, adamw},
    {K::Nudge, {2, 0, 0, 1, -1, false}, nudge},
    {K::RoundBf16, {1, 1, 0, 0, -1, true}, [](C c) { numerics::round_to_bf16_inplace(c.P(0), c.n[0]); }},
    {K::CastBf16, {2, 1, 0, 0, -1, true}, cast_bf16},
    {K::AllReduce, {1, 1, 0, 0, -1, true}},
    {K::AllGather, {2, kPerTensor, 0, 1, -1, false}},      // dims: the global shape
    {K::ReduceScatter, {2, kPerTensor, 0, 1, -1, false}},  // dims: the global shape
    {K::LossMean, {2, 3, 1, 0, -1, false}},
    {K::GlobalNorm, {kPerTensor, kPerTensor, 0, kPerTensor, -1, false}},
    {K::Trace, {1, kPerTensor, 2, 1, -1, false}},  // dims: the global shape
    {K::RmsNormForward, {4, 2, 1, 0, -1, false},
     [](C c) { kernels::rmsnorm_forward(c.P(0), c.P(1), c.P(2), c.P(3), c.dim(0), c.dim(1), c.attrs[0]); }},
    {K::RmsNormBackward, {6, 2, 0, 0, -1, false},
     [](C c) { kernels::rmsnorm_backward(c.P(0), c.P(1), c.P(2), c.P(3), c.P(4), c.P(5), c.dim(0), c.dim(1)); }},
    {K::RopeForward, {2, 4, 2, 0, -1, false}, rope<true>},
    {K::RopeBackward, {2, 4, 2, 0, -1, false}, rope<false>},
    {K::SwigluForward, {3, 1, 0, 0, -1, true}, [](C c) { kernels::swiglu_forward(c.P(0), c.P(1), c.P(2), c.n[0]); }},
    {K::SwigluBackward, {5, 1, 0, 0, -1, true},
     [](C c) { kernels::swiglu_backward(c.P(0), c.P(1), c.P(2), c.P(3), c.P(4), c.n[0]); }},
    {K::GqaAttentionForward, {5, 5, 0, 0, -1, false},
     [](C c) {
       kernels::gqa_attention_forward(c.P(0), c.P(1), c.P(2), c.P(3), c.P(4), c.dim(0), c.dim(1), c.dim(2), c.dim(3),
                                      c.dim(4));
     }},
    {K::GqaAttentionBackward, {8, 5, 0, 0, -1, false},
     [](C c) {
       kernels::gqa_attention_backward(c.P(0), c.P(1), c.P(2), c.P(3), c.P(4), c.P(5), c.P(6), c.P(7), c.dim(0),
                                       c.dim(1), c.dim(2), c.dim(3), c.dim(4));
     }},
    {K::MoeRouteForward, {6, 4, 1, 0, -1, false},
     [](C c) {
       kernels::moe_route_with_record(c.P(3), c.P(0), c.P(1), c.P(2), c.P(4), c.P(5), c.dim(0), c.dim(1), c.dim(2),
                                      c.dim(3), c.attrs[0]);
     }},
    {K::MoeRouteBackward, {5, 3, 1, 0, -1, false},
     [](C c) {
       kernels::moe_route_backward(c.P(0), c.P(1), c.P(2), c.P(3), c.P(4), c.dim(0), c.dim(1), c.dim(2), c.attrs[0]);
     }},
    {K::MoeDispatchForward, {4, 5, 0, 0, -1, false},
     [](C c) {
       kernels::moe_dispatch_forward(c.P(0), c.P(1), c.P(2), c.P(3), c.dim(0), c.dim(1), c.dim(2), c.dim(3), c.dim(4));
     }},
    {K::MoeDispatchBackward, {4, 4, 0, 0, -1, false},
     [](C c) {
       kernels::moe_dispatch_backward(c.P(0), c.P(1), c.P(2), c.P(3), c.dim(0), c.dim(1), c.dim(2), c.dim(3));
     }},
    {K::MoeCombineForward, {5, 4, 0, 0, -1, false},
     [](C c) {
       kernels::moe_combine_forward(c.P(0), c.P(1), c.P(2), c.P(3), c.P(4), c.dim(0), c.dim(1), c.dim(2), c.dim(3));
     }},
    {K::MoeCombineBackward, {7, 4, 0, 0, -1, false},
     [](C c) {
       kernels::moe_combine_backward(c.P(0), c.P(1), c.P(2), c.P(3), c.P(4), c.P(5), c.P(6), c.dim(0), c.dim(1),
                                     c.dim(2), c.dim(3));
     }},
    {K::ExpertLinear, {3, 4, 0, 0, -1, false},
     [](C c) {
       kernels::expert_linear_forward(c.P(0), c.P(1), c.P(2), c.dim(0), c.dim(1), c.dim(2), c.dim(3), c.scratch);
     }},
    {K::ExpertLinearBackward, {5, 4, 0, 0, -1, false},
     [](C c) {
       kernels::expert_linear_backward(c.P(0), c.P(1), c.P(2), c.P(3), c.P(4), c.dim(0), c.dim(1), c.dim(2), c.dim(3),
                                       c.scratch);
     }},
    {K::TakeBlock, {2, kPerTensor, 0, 1, -1, false}, take_block},  // dims: the global shape
    {K::ExpertExchange, {4, 5, 1, 0, -1, false}},
    {K::GeluErfForward, {2, 1, 0, 0, -1, true}, [](C c) { kernels::gelu_erf_forward(c.P(0), c.P(1), c.n[0]); }},
    {K::GeluErfBackward, {3, 1, 0, 0, -1, true},
     [](C c) { kernels::gelu_erf_backward(c.P(0), c.P(1), c.P(2), c.n[0]); }},
}};

constexpr bool indexed_by_kind() {
  for (std::size_t i = 0; i < kInstructions.size(); ++i) {
    if (static_cast<std::size_t>(kInstructions[i].kind) != i) return false;
  }
  return true;
}
static_assert(indexed_by_kind(), "kInstructions must list the kinds in InstrKind order");

}  // namespace

bool known_instruction(std::int32_t kind) { return kind >= 0 && static_cast<std::size_t>(kind) < kInstructions.size(); }

const InstrDescription& instruction(InstrKind kind) {
  if (!known_instruction(static_cast<std::int32_t>(kind))) throw std::logic_error("tpu-mesh: an unknown instruction kind");
  return kInstructions[static_cast<std::size_t>(kind)];
}

}  // namespace harness::tpu
