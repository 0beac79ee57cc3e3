// Deterministic fp32 kernels of a mixture-of-experts layer (docs/design.md, "The `moe`
// architecture"): the top-k router with a fixed expert capacity, the dispatch of token
// rows into per-expert buffers, the weighted combine of the experts' outputs, and the
// Switch Transformer load-balancing term. Under kernels.h's rules: fixed orders, no libm,
// no contraction into FMAs; backward kernels ADD into their gradient outputs.
//
// Routing is where MoE determinism breaks: a routing decision is a discrete function of
// the router logits, so a 1-ulp change that flips a near tie moves a whole token to
// another expert. Every decision here is a fixed function of its inputs: the top-k takes
// the larger probability and, on a tie, the lower expert; capacity is filled in a fixed
// priority (every token's first choice before any token's second, tokens in row order).
//
// Decisions are stored as floats (an expert index, a row in its buffer; exact below 2^24),
// so every engine holds them like any other tensor.
//
// Dimension key: N = token rows (B*T), C = channels, E = experts, K = experts per token,
// cap = each expert's capacity (rows of its buffer).
#pragma once

#include <cstdint>

namespace harness::kernels {

// A choice whose expert was full: its slot value.
inline constexpr float kDroppedSlot = -1.0f;

// The router's forward, per token row n:
//   probs (N,E) = softmax(logits);
//   expert (N,K): the K most probable experts, most probable first (ties: the lower index);
//   weights (N,K) = their probabilities renormalised to sum to 1;
//   slot (N,K): the choice's row in its expert's buffer, or kDroppedSlot once `cap` rows of
//   that expert are taken (rank-major priority, as above).
// tokens_per_expert (E) counts the placed choices; the rest (N*K minus their sum) dropped.
void moe_route_forward(float* probs, float* weights, float* expert, float* slot, float* tokens_per_expert,
                       const float* logits, int N, int E, int K, int cap);

// The Switch Transformer load-balancing loss, coef * E * sum_e f_e * P_e, where f_e is the
// share of the N*K choices that picked expert e (before capacity) and P_e its mean router
// probability. 1 when routing is uniform, E when every choice picks one expert.
float moe_balance_loss(const float* probs, const float* expert, int N, int E, int K, float coef);

// dlogits (N,E) += the router's gradient: through the renormalised top-K weights (dweights,
// the combine's gradient) and through the balance loss (its f_e a count, held constant, as
// in Switch), both back through the softmax.
void moe_route_backward(float* dlogits, const float* dweights, const float* probs, const float* weights,
                        const float* expert, int N, int E, int K, float balance_coef);

// expert_in (E,cap,C): each placed choice's token row at its slot, zeros in empty slots.
void moe_dispatch_forward(float* expert_in, const float* inp, const float* expert, const float* slot, int N, int C,
                          int E, int K, int cap);
// dinp (N,C) += the gradient of each placed choice's slot, choices in rank order.
void moe_dispatch_backward(float* dinp, const float* dexpert_in, const float* expert, const float* slot, int N, int C,
                           int K, int cap);

// out (N,C) = sum over placed choices, in rank order, of weight * expert_out[expert][slot].
void moe_combine_forward(float* out, const float* expert_out, const float* weights, const float* expert,
                         const float* slot, int N, int C, int K, int cap);
// dexpert_out += weight * dout at each placed slot; dweights (N,K) += <dout, expert_out[slot]>.
void moe_combine_backward(float* dexpert_out, float* dweights, const float* dout, const float* expert_out,
                          const float* weights, const float* expert, const float* slot, int N, int C, int K, int cap);

// The layer's routing record of a step (E + kRoutingRecordExtra floats): the tokens per
// expert (E), the dropped choices, the balance loss, and the low 48 bits of the XXH3-64 of
// every choice's (expert, slot) as little-endian int32 pairs in choice order (slot -1:
// dropped), as two 24-bit halves (exact in fp32). The record is
// what a receipt keeps of routing: two runs that route alike have equal hashes.
inline constexpr int kRoutingRecordExtra = 4;
void moe_routing_record(float* record, const float* expert, const float* slot, float balance_loss, int N, int E,
                        int K);
// The router's forward with the layer's routing record (its balance loss included), as
// every engine runs it.
void moe_route_with_record(float* probs, float* weights, float* expert, float* slot, float* record, const float* logits,
                           int N, int E, int K, int cap, float balance_coef);
// The hash's two halves as one integer (inline: the model reads records without linking
// the kernels).
inline std::uint64_t routing_hash(float high, float low) {
  return (static_cast<std::uint64_t>(high) << 24) | static_cast<std::uint64_t>(low);
}

// Every expert's own linear layer: out (E,cap,OC) = inp (E,cap,C) @ weight (E,OC,C)^T, each
// expert by kernels.h's deterministic GEMM; scratch as linear_forward's.
void expert_linear_forward(float* out, const float* inp, const float* weight, int E, int cap, int C, int OC,
                           float* scratch);
void expert_linear_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                            int E, int cap, int C, int OC, float* scratch);

}  // namespace harness::kernels
