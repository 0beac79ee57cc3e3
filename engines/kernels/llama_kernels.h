// Deterministic fp32 kernels of the llama architecture's ops (docs/design.md, "The
// `llama` architecture": RMSNorm, RoPE, SwiGLU, grouped-query attention), under the same
// rules as kernels.h: one task per output element or row, reductions in fixed blocks and
// fixed trees, the project's own exp/sin/cos (never libm), no contraction into FMAs.
// Backward kernels ADD into their gradient outputs (the engine API's convention).
//
// Dimension key: B = batch, T = time, C = channels, N = rows (B*T), NH = query heads,
// NKV = key/value heads (divides NH), hd = head size, H = MLP hidden size.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "kernels/kernels.h"

namespace harness::kernels {

// RMSNorm: out (N,C) = x * rstd * weight with rstd (N) = 1 / sqrt(mean(x^2) + eps).
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps);
// dinp += d/dx; dweight += sum over rows of x * rstd * dout (rows summed in fixed blocks).
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C);
// One row of it: dx (C) += d/dx, dw (C) += x * r * dy. (accel sums the rows in its own order.)
void rmsnorm_backward_row(float* dx, float* dw, const float* dy, const float* x, const float* weight, float r, int C);

// RoPE tables (T, hd/2): the pair (i, i + hd/2) of position t turns by the angle
// t * theta^(-2i/hd), evaluated in double with numerics/det_math.h and rounded once.
void rope_tables(float* cos_table, float* sin_table, int T, int hd, double theta);
// The tables of one (T, hd, theta), for engines to keep between steps.
struct RopeTables {
  int T = 0, head_size = 0;
  double theta = 0.0;
  std::vector<float> cos, sin;  // (T, hd/2) each
};
RopeTables make_rope_tables(int T, int hd, double theta);
// The tables of every (T, hd, theta) an engine used, made at the first use. A deque: a
// table stays where it is while later ones are added.
class RopeTableCache {
 public:
  const RopeTables& get(int T, int hd, double theta);

 private:
  std::deque<RopeTables> tables_;
};

// Rotate-half RoPE on x (B,T,heads*hd), every head: out_i = x_i cos - x_{i+hd/2} sin,
// out_{i+hd/2} = x_{i+hd/2} cos + x_i sin. out may not alias x.
void rope_forward(float* out, const float* inp, const float* cos_table, const float* sin_table, int B, int T, int heads,
                  int hd);
// dinp += the rotation's transpose applied to dout.
void rope_backward(float* dinp, const float* dout, const float* cos_table, const float* sin_table, int B, int T,
                   int heads, int hd);

// SwiGLU: out (n) = silu(gate) * up, silu(g) = g * sigmoid(g).
void swiglu_forward(float* out, const float* gate, const float* up, std::int64_t n);
// dgate += dout * up * silu'(gate); dup += dout * silu(gate).
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, std::int64_t n);

// Causal grouped-query attention: q (B,T,NH*hd), k and v (B,T,NKV*hd) -> out (B,T,NH*hd);
// query head h reads kv head h / (NH/NKV); scale 1/sqrt(hd); att (B,NH,T,T) saved
// (masked entries exactly 0).
void gqa_attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int B, int T, int NH,
                           int NKV, int hd, SoftmaxExp exp = SoftmaxExp::Deterministic);
// dq, dk, dv += the gradients. One task per (b, kv head): it owns that head's dk and dv
// and its query heads' dq, and adds the query heads of its group in order.
void gqa_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                            const float* v, const float* att, int B, int T, int NH, int NKV, int hd);

}  // namespace harness::kernels
