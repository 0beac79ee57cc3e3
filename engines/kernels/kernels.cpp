#include "kernels/kernels.h"

#include <bit>
#include <cstring>
#include <vector>

#include <tbb/parallel_for.h>

#include "kernels/deterministic_reduce.h"
#include "kernels/gemm.h"
#include "kernels/vector_lanes.h"
#include "numerics/det_math.h"

namespace harness::kernels {

using numerics::det_logf;

// ---- encoder -------------------------------------------------------------------------

void encoder_forward(float* out, const std::int32_t* inp, const float* wte, const float* wpe, int B, int T, int C) {
  tbb::parallel_for(0, B * T, [&](int bt) {
    const int t = bt % T;
    const float* wte_row = wte + static_cast<long>(inp[bt]) * C;
    float* out_row = out + static_cast<long>(bt) * C;
    if (wpe == nullptr) {  // no position embedding (llama): a copy, so -0.0 stays -0.0
      for (int c = 0; c < C; ++c) out_row[c] = wte_row[c];
      return;
    }
    const float* wpe_row = wpe + static_cast<long>(t) * C;
    for (int c = 0; c < C; ++c) out_row[c] = wte_row[c] + wpe_row[c];
  });
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* inp, int B, int T, int C) {
  // dwte is a scatter-add (a token may repeat): parallel over channel blocks, each block
  // visits the tokens in (b, t) order, so every element sums its terms in a fixed order.
  constexpr int kChannelBlock = 16;
  tbb::parallel_for(0, (C + kChannelBlock - 1) / kChannelBlock, [&](int cb) {
    const int c0 = cb * kChannelBlock, c1 = c0 + kChannelBlock < C ? c0 + kChannelBlock : C;
    for (int bt = 0; bt < B * T; ++bt) {
      // forward: out[bt][c] = wte[inp[bt]][c] + wpe[t][c]
      float* dwte_row = dwte + static_cast<long>(inp[bt]) * C;
      const float* dout_row = dout + static_cast<long>(bt) * C;
      for (int c = c0; c < c1; ++c) dwte_row[c] += dout_row[c];
    }
  });
  if (dwpe == nullptr) return;  // no position embedding
  tbb::parallel_for(0, T, [&](int t) {
    float* dwpe_row = dwpe + static_cast<long>(t) * C;
    for (int b = 0; b < B; ++b) {
      const float* dout_row = dout + (static_cast<long>(b) * T + t) * C;
      for (int c = 0; c < C; ++c) dwpe_row[c] += dout_row[c];
    }
  });
}

// ---- layernorm -----------------------------------------------------------------------

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C, float eps) {
  tbb::parallel_for(0, N, [&](int i) {
    const float* x = inp + static_cast<long>(i) * C;
    float sum = 0.0f;
    for (int c = 0; c < C; ++c) sum += x[c];
    const float m = sum / static_cast<float>(C);
    float var = 0.0f;  // biased variance, as PyTorch's LayerNorm
    for (int c = 0; c < C; ++c) {
      const float d = x[c] - m;
      var += d * d;
    }
    var /= static_cast<float>(C);
    const float s = 1.0f / __builtin_sqrtf(var + eps);
    float* y = out + static_cast<long>(i) * C;
    for (int c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[i] = m;
    rstd[i] = s;
  });
}

void layernorm_backward_row(float* dx, float* dw, float* db, const float* dy, const float* x, const float* weight,
                            float mean, float rstd, int C) {
  float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
  for (int c = 0; c < C; ++c) {
    const float norm = (x[c] - mean) * rstd;
    const float dnorm = weight[c] * dy[c];
    dnorm_mean += dnorm;
    dnorm_norm_mean += dnorm * norm;
  }
  dnorm_mean /= static_cast<float>(C);
  dnorm_norm_mean /= static_cast<float>(C);
  for (int c = 0; c < C; ++c) {
    const float norm = (x[c] - mean) * rstd;
    const float dnorm = weight[c] * dy[c];
    // forward: y = norm * weight + bias
    dw[c] += norm * dy[c];
    db[c] += dy[c];
    dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  // Row i's dinp is written by one task; dweight/dbias sum over rows in fixed blocks.
  const std::vector<float> sums = blocked_row_sum(N, kTokenBlock, 2 * C, [&](std::int64_t r0, std::int64_t r1,
                                                                              float* partial) {
    for (std::int64_t i = r0; i < r1; ++i) {
      layernorm_backward_row(dinp + i * C, partial, partial + C, dout + i * C, inp + i * C, weight, mean[i], rstd[i], C);
    }
  });
  add_inplace(dweight, sums.data(), C);
  add_inplace(dbias, sums.data() + C, C);
}

// ---- linear --------------------------------------------------------------------------

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                    float* scratch) {
  // Pack weight (OC,C) as (C,OC) so the GEMM vectorises over output columns.
  transpose(weight, OC, C, scratch);
  gemm(N, OC, C, inp, C, scratch, OC, out, OC, bias ? GemmEpilogue::AddBias : GemmEpilogue::Store, bias);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, float* scratch) {
  // forward: out[n][o] = sum_c inp[n][c] * weight[o][c] + bias[o]
  // dinp (N,C) += dout (N,OC) @ weight (OC,C)
  gemm(N, C, OC, dout, OC, weight, C, dinp, C, GemmEpilogue::Accumulate);
  // dweight (OC,C) += dout^T (OC,N) @ inp (N,C): each element sums over all N tokens in order
  transpose(dout, N, OC, scratch);
  gemm(OC, C, N, scratch, N, inp, C, dweight, C, GemmEpilogue::Accumulate);
  if (dbias) {
    const std::vector<float> sums = blocked_row_sum(N, kTokenBlock, OC, [&](std::int64_t r0, std::int64_t r1,
                                                                            float* partial) {
      for (std::int64_t i = r0; i < r1; ++i) {
        const float* dy = dout + i * OC;
        for (int o = 0; o < OC; ++o) partial[o] += dy[o];
      }
    });
    add_inplace(dbias, sums.data(), OC);
  }
}

namespace {
constexpr std::int64_t kElementwiseGrain = 4096;

// e^x in place over [0, n), on the widest vectors this CPU has (kernels/vector_lanes.h).
void exp_inplace(float* x, std::int64_t n) { lane_kernels().exp_inplace(x, n); }

}  // namespace

// ---- attention -----------------------------------------------------------------------
//
// One task per (b, h); its four products run through the serial deterministic GEMM.
// Scores are computed for all (t, t2) and the causal mask applied after: masked
// probabilities are exactly 0, so the products over t2 add exact zeros.

namespace {

struct AttentionScratch {  // per thread: T x T and hs x T buffers
  std::vector<float> a, b;
  void size_for(int T, int hs) {
    a.resize(static_cast<std::size_t>(T) * T);
    b.resize(static_cast<std::size_t>(T) * (T > hs ? T : hs));
  }
};
thread_local AttentionScratch attention_scratch;

}  // namespace

void fast_exp_inplace(float* x, std::int64_t n) {
  // 2^(x log2 e) as 2^i 2^f, i = floor, f in [0, 1): 2^f from a cubic fit (not minimax: the
  // fault wants a plausible 1.5e-4, not the best cubic), 2^i into the exponent's bits.
  for (std::int64_t j = 0; j < n; ++j) {
    const float y = x[j] * 1.44269504f;
    if (!(y > -126.0f && y < 128.0f)) {  // below the normals: 0, as a fast exp flushes; past fp32: inf; NaN stays
      x[j] = y != y ? y : y > 0 ? __builtin_inff() : 0.0f;
      continue;
    }
    const float i = static_cast<float>(static_cast<int>(y) - (y < 0 && static_cast<float>(static_cast<int>(y)) != y));
    const float f = y - i;
    const float two_f = 1.0f + f * (0.6960656f + f * (0.2244676f + f * 0.0794446f));
    const std::uint32_t exponent_bits = static_cast<std::uint32_t>(static_cast<int>(i) + 127) << 23;
    x[j] = two_f * std::bit_cast<float>(exponent_bits);
  }
}

void causal_softmax_row(float* row, int t, int T, float scale, SoftmaxExp exp) {
  float max_score = -3.402823466e38f;
  for (int t2 = 0; t2 <= t; ++t2) {
    row[t2] *= scale;
    if (row[t2] > max_score) max_score = row[t2];
  }
  for (int t2 = 0; t2 <= t; ++t2) row[t2] -= max_score;
  if (exp == SoftmaxExp::FastApproximation) {
    fast_exp_inplace(row, t + 1);
  } else {
    exp_inplace(row, t + 1);
  }
  float sum = 0.0f;
  for (int t2 = 0; t2 <= t; ++t2) sum += row[t2];
  const float inv_sum = 1.0f / sum;
  for (int t2 = 0; t2 <= t; ++t2) row[t2] *= inv_sum;
  for (int t2 = t + 1; t2 < T; ++t2) row[t2] = 0.0f;
}


HeadView head_view(const float* qkv, int b, int h, int T, int C, int hs) {
  const float* base = qkv + static_cast<long>(b) * T * 3 * C + h * hs;
  return {base, base + C, base + 2 * C, 3 * C};
}

void causal_softmax_backward_row(float* d, const float* a, int t, int T, float scale) {
  float dot = 0.0f;
  for (int t2 = 0; t2 <= t; ++t2) dot += a[t2] * d[t2];
  for (int t2 = 0; t2 <= t; ++t2) d[t2] = a[t2] * (d[t2] - dot) * scale;
  for (int t2 = t + 1; t2 < T; ++t2) d[t2] = 0.0f;
}

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH, SoftmaxExp exp) {
  const int hs = C / NH;
  const float scale = 1.0f / __builtin_sqrtf(static_cast<float>(hs));
  tbb::parallel_for(0, B * NH, [&](int bh) {
    const int b = bh / NH, h = bh % NH;
    const HeadView x = head_view(qkv, b, h, T, C, hs);
    AttentionScratch& s = attention_scratch;
    s.size_for(T, hs);
    float* att_bh = att + static_cast<long>(bh) * T * T;
    // preatt (T,T) = q (T,hs) @ k^T (hs,T)
    transpose_serial(x.k, T, hs, x.ld, s.b.data(), T);
    gemm_serial(T, T, hs, x.q, x.ld, s.b.data(), T, att_bh, T, GemmEpilogue::Store);
    for (int t = 0; t < T; ++t) causal_softmax_row(att_bh + static_cast<long>(t) * T, t, T, scale, exp);
    // out (T,hs) = att (T,T) @ v (T,hs)
    gemm_serial(T, hs, T, att_bh, T, x.v, x.ld, out + static_cast<long>(b) * T * C + h * hs, C, GemmEpilogue::Store);
  });
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int NH) {
  const int hs = C / NH;
  const float scale = 1.0f / __builtin_sqrtf(static_cast<float>(hs));
  // Each (b, h) owns the columns h*hs..h*hs+hs-1 of q, k and v in dqkv: tasks never overlap.
  tbb::parallel_for(0, B * NH, [&](int bh) {
    const int b = bh / NH, h = bh % NH;
    const HeadView x = head_view(qkv, b, h, T, C, hs);
    float* dq = dqkv + static_cast<long>(b) * T * 3 * C + h * hs;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* dy = dout + static_cast<long>(b) * T * C + h * hs;
    const float* att_bh = att + static_cast<long>(bh) * T * T;
    AttentionScratch& s = attention_scratch;
    s.size_for(T, hs);
    float* datt = s.a.data();
    float* transposed = s.b.data();
    // forward: out = att @ v  =>  datt (T,T) = dout (T,hs) @ v^T (hs,T); dv += att^T @ dout
    transpose_serial(x.v, T, hs, x.ld, transposed, T);
    gemm_serial(T, T, hs, dy, C, transposed, T, datt, T, GemmEpilogue::Store);
    transpose_serial(att_bh, T, T, T, transposed, T);
    gemm_serial(T, hs, T, transposed, T, dy, C, dv, 3 * C, GemmEpilogue::Accumulate);
    // forward: att = softmax(scale * preatt)  =>  dpreatt = scale * att * (datt - <att, datt>)
    for (int t = 0; t < T; ++t) {
      causal_softmax_backward_row(datt + static_cast<long>(t) * T, att_bh + static_cast<long>(t) * T, t, T, scale);
    }
    // forward: preatt = q @ k^T  =>  dq += dpreatt @ k; dk += dpreatt^T @ q
    gemm_serial(T, hs, T, datt, T, x.k, x.ld, dq, 3 * C, GemmEpilogue::Accumulate);
    transpose_serial(datt, T, T, T, transposed, T);
    gemm_serial(T, hs, T, transposed, T, x.q, x.ld, dk, 3 * C, GemmEpilogue::Accumulate);
  });
}

// ---- gelu (tanh approximation) -----------------------------------------------------
//
// Vector lanes of the widest width this CPU has (kernels/vector_lanes.h: 4, 8 or 16) and
// the same code on scalars for the tail: per lane, the same fp32 operations in the same
// order, so every element gets the same bits whatever the width.

void gelu_forward(float* out, const float* inp, std::int64_t n) {
  const LaneKernels& lanes = lane_kernels();
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, kElementwiseGrain),
                    [&](const auto& r) { lanes.gelu_forward(out, inp, r.begin(), r.end()); });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) {
  const LaneKernels& lanes = lane_kernels();
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, kElementwiseGrain),
                    [&](const auto& r) { lanes.gelu_backward(dinp, inp, dout, r.begin(), r.end()); });
}

// ---- gelu (exact, with erf) ----------------------------------------------------------
//
// Scalar double per element (erfc has no vector form here): every element's bits depend
// on its input alone, so the thread count and the blocking cannot move them.

namespace {
constexpr double kSqrtHalf = 0.70710678118654752440;     // 1/sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1/sqrt(2 pi)
}  // namespace

void gelu_erf_forward(float* out, const float* inp, std::int64_t n) {
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, kElementwiseGrain), [&](const auto& r) {
    for (std::int64_t i = r.begin(); i < r.end(); ++i) {
      const double x = inp[i];
      out[i] = static_cast<float>(0.5 * x * numerics::det_erfc(-x * kSqrtHalf));
    }
  });
}

void gelu_erf_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) {
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, kElementwiseGrain), [&](const auto& r) {
    for (std::int64_t i = r.begin(); i < r.end(); ++i) {
      const double x = inp[i];
      const double cdf = 0.5 * numerics::det_erfc(-x * kSqrtHalf);
      const double pdf = kInvSqrt2Pi * numerics::det_exp(-0.5 * x * x);
      dinp[i] += static_cast<float>((cdf + x * pdf) * static_cast<double>(dout[i]));
    }
  });
}

// ---- elementwise -----------------------------------------------------------------------

void residual_forward(float* out, const float* a, const float* b, std::int64_t n) {
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, kElementwiseGrain), [&](const auto& r) {
    for (std::int64_t i = r.begin(); i < r.end(); ++i) out[i] = a[i] + b[i];
  });
}

void add_inplace(float* dst, const float* src, std::int64_t n) {
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, kElementwiseGrain), [&](const auto& r) {
    for (std::int64_t i = r.begin(); i < r.end(); ++i) dst[i] += src[i];
  });
}

void scale_inplace(float* x, float factor, std::int64_t n) {
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, kElementwiseGrain), [&](const auto& r) {
    for (std::int64_t i = r.begin(); i < r.end(); ++i) x[i] *= factor;
  });
}

// ---- loss ------------------------------------------------------------------------------

void crossentropy_rows(float* probs, float* losses, const float* logits, const std::int32_t* targets, int N, int V) {
  tbb::parallel_for(0, N, [&](int i) {
    const float* z = logits + static_cast<long>(i) * V;
    float* p = probs + static_cast<long>(i) * V;
    float max_logit = -3.402823466e38f;
    for (int v = 0; v < V; ++v) max_logit = z[v] > max_logit ? z[v] : max_logit;
    for (int v = 0; v < V; ++v) p[v] = z[v] - max_logit;
    exp_inplace(p, V);
    float sum = 0.0f;
    for (int v = 0; v < V; ++v) sum += p[v];
    const float inv_sum = 1.0f / sum;
    for (int v = 0; v < V; ++v) p[v] *= inv_sum;
    // -log softmax[target] = (max - z[target]) + log(sum): no log of an underflowed prob
    losses[i] = (max_logit - z[targets[i]]) + det_logf(sum);
  });
}

float crossentropy_forward(float* probs, const float* logits, const std::int32_t* targets, int N, int V) {
  std::vector<float> losses(static_cast<std::size_t>(N));
  crossentropy_rows(probs, losses.data(), logits, targets, N, V);
  const float total = blocked_sum<float>(N, kTokenBlock, [&](std::int64_t i) { return losses[static_cast<std::size_t>(i)]; });
  return total / static_cast<float>(N);
}

void crossentropy_backward(float* dlogits, const float* probs, const std::int32_t* targets, int N, int V) {
  crossentropy_backward(dlogits, probs, targets, N, V, N);
}

void crossentropy_backward(float* dlogits, const float* probs, const std::int32_t* targets, int N, int V,
                           std::int64_t mean_rows) {
  const float dloss = 1.0f / static_cast<float>(mean_rows);  // d mean / d per-token loss
  tbb::parallel_for(0, N, [&](int i) {
    const float* p = probs + static_cast<long>(i) * V;
    float* dz = dlogits + static_cast<long>(i) * V;
    for (int v = 0; v < V; ++v) {
      const float indicator = v == targets[i] ? 1.0f : 0.0f;
      dz[v] += (p[v] - indicator) * dloss;
    }
  });
}

// ---- optimizer -------------------------------------------------------------------------

std::int64_t sum_of_squares_partial_count(std::int64_t n) { return (n + kElementBlock - 1) / kElementBlock; }

void sum_of_squares_partials(const float* x, std::int64_t n, double* partials) {
  tbb::parallel_for(std::int64_t{0}, sum_of_squares_partial_count(n), [&](std::int64_t b) {
    const std::int64_t end = (b + 1) * kElementBlock < n ? (b + 1) * kElementBlock : n;
    double s = 0.0;
    for (std::int64_t i = b * kElementBlock; i < end; ++i) s += static_cast<double>(x[i]) * x[i];
    partials[b] = s;
  });
}

void adamw_update(float* param, const float* grad, float* m, float* v, std::int64_t n, const AdamWStep& s) {
  const float decay = 1.0f - s.lr * s.weight_decay;
  const float one_minus_beta1 = 1.0f - s.beta1, one_minus_beta2 = 1.0f - s.beta2;
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, kElementwiseGrain), [&](const auto& r) {
    for (std::int64_t i = r.begin(); i < r.end(); ++i) {
      const float g = grad[i];
      const float p = param[i] * decay;  // decoupled weight decay first, as torch.optim.AdamW
      m[i] = s.beta1 * m[i] + one_minus_beta1 * g;
      v[i] = s.beta2 * v[i] + one_minus_beta2 * g * g;
      const float m_hat = m[i] / s.bias_correction1;
      const float v_hat = v[i] / s.bias_correction2;
      param[i] = p - s.lr * m_hat / (__builtin_sqrtf(v_hat) + s.eps);
    }
  });
}

float next_up(float x, std::int32_t ulps) {
  for (std::int32_t i = 0; i < ulps; ++i) {
    if (x != x || x == __builtin_inff()) return x;
    const auto bits = std::bit_cast<std::uint32_t>(x);
    if (x == 0.0f) {
      x = std::bit_cast<float>(std::uint32_t{1});  // smallest positive subnormal
    } else {
      x = std::bit_cast<float>(x > 0 ? bits + 1 : bits - 1);
    }
  }
  return x;
}

}  // namespace harness::kernels
