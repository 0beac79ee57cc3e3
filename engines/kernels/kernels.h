// Deterministic fp32 kernels of the canary's ops (everything but the GEMM, in gemm.h).
// Free functions over raw pointers so that every engine can reuse them; the engines
// decide rounding policy and execution model around them.
//
// Rules that keep them bitwise portable (docs/determinism.md):
//  - each output element is written by one task, in a fixed loop order;
//  - reductions over tokens or elements use deterministic_reduce.h (fixed blocks, fixed tree);
//  - exp/log/tanh come from numerics/det_math.h, never from libm;
//  - no fused multiply-add outside the GEMM (the build sets -ffp-contract=off).
//
// Dimension key: B = batch, T = time, C = channels, V = vocab, NH = heads, N = rows.
#pragma once

#include <cstdint>

namespace harness::kernels {

// out (B,T,C) = wte[inp[b,t]] + wpe[t]; wpe (and then dwpe) may be nullptr: no position embedding
void encoder_forward(float* out, const std::int32_t* inp, const float* wte, const float* wpe, int B, int T, int C);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* inp, int B, int T, int C);

// out (N,C); mean, rstd (N)
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C, float eps);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);

// One row of the backward: dx += d/dx, dw += norm * dy, db += dy (C channels).
void layernorm_backward_row(float* dx, float* dw, float* db, const float* dy, const float* x, const float* weight,
                            float mean, float rstd, int C);

// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias. scratch >= C*OC floats.
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                    float* scratch);
// dinp += dout @ weight; dweight += dout^T @ inp; dbias += sum over rows. scratch >= N*OC.
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, float* scratch);

// q, k, v of head h of batch row b inside qkv (B,T,3C); row stride 3C.
struct HeadView {
  const float* q;
  const float* k;
  const float* v;
  int ld;
};
HeadView head_view(const float* qkv, int b, int h, int T, int C, int hs);

// Row t of the causal softmax backward in place: d = scale * a * (d - <a, d>) over
// t2 <= t (a: probabilities, d: their gradient), exact zeros beyond.
void causal_softmax_backward_row(float* d, const float* a, int t, int T, float scale);

// The exp a softmax uses: the deterministic polynomial (exp_inplace, within 3 ulps), or a
// deliberate fault for drills (cpu-ref's --fast-exp): a fast-math-like exp from the
// exponent's bits and a cubic for the fraction, about 1.5e-4 relative error, deterministic.
enum class SoftmaxExp : std::uint8_t { Deterministic, FastApproximation };
void fast_exp_inplace(float* x, std::int64_t n);

// Row t of attention scores in place: scale, softmax over t2 <= t, exact zeros beyond.
void causal_softmax_row(float* row, int t, int T, float scale, SoftmaxExp exp = SoftmaxExp::Deterministic);
// qkv (B,T,3C) -> out (B,T,C), att (B,NH,T,T) (masked entries 0)
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH,
                       SoftmaxExp exp = SoftmaxExp::Deterministic);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int NH);

// GELU, tanh approximation (GPT-2's): out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_forward(float* out, const float* inp, std::int64_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n);
// GELU, exact: out = x Phi(x) = 0.5 x erfc(-x / sqrt(2)), each element in double with
// det_erfc and rounded once; dinp += (Phi(x) + x phi(x)) dout, the product rounded once.
void gelu_erf_forward(float* out, const float* inp, std::int64_t n);
void gelu_erf_backward(float* dinp, const float* inp, const float* dout, std::int64_t n);

void residual_forward(float* out, const float* a, const float* b, std::int64_t n);
void add_inplace(float* dst, const float* src, std::int64_t n);  // dst += src

// probs (N,V) = softmax(logits); losses (N) = -log probs[target] per row
void crossentropy_rows(float* probs, float* losses, const float* logits, const std::int32_t* targets, int N, int V);
// crossentropy_rows, then the mean of the losses in a fixed order
float crossentropy_forward(float* probs, const float* logits, const std::int32_t* targets, int N, int V);
void crossentropy_backward(float* dlogits, const float* probs, const std::int32_t* targets, int N, int V);
// The same for N rows of a loss that is the mean over mean_rows (>= N) rows: a block of
// the batch on one device of a mesh.
void crossentropy_backward(float* dlogits, const float* probs, const std::int32_t* targets, int N, int V,
                           std::int64_t mean_rows);

// Sum of squares of one tensor as fixed-block partials in double: appends ceil(n/block)
// partials, so the caller can tree-combine the partials of many tensors in one fixed order.
void sum_of_squares_partials(const float* x, std::int64_t n, double* partials);
std::int64_t sum_of_squares_partial_count(std::int64_t n);
void scale_inplace(float* x, float factor, std::int64_t n);

struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2;
};
void adamw_update(float* param, const float* grad, float* m, float* v, std::int64_t n, const AdamWStep& s);

// x moved up (towards +inf) by `ulps` units in the last place.
float next_up(float x, std::int32_t ulps);

}  // namespace harness::kernels
