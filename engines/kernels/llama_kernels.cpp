#include "kernels/llama_kernels.h"

#include <vector>

#include <tbb/parallel_for.h>

#include "kernels/deterministic_reduce.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/vector_lanes.h"
#include "numerics/det_math.h"

namespace harness::kernels {

// ---- RMSNorm -----------------------------------------------------------------------------

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, float eps) {
  tbb::parallel_for(0, N, [&](int i) {
    const float* x = inp + static_cast<long>(i) * C;
    float sum_squares = 0.0f;
    for (int c = 0; c < C; ++c) sum_squares += x[c] * x[c];
    const float s = 1.0f / __builtin_sqrtf(sum_squares / static_cast<float>(C) + eps);
    float* y = out + static_cast<long>(i) * C;
    for (int c = 0; c < C; ++c) y[c] = x[c] * s * weight[c];
    rstd[i] = s;
  });
}

// With y = x * r * w and r = (mean(x^2) + eps)^(-1/2), dr/dx_c = -r^3 x_c / C, so
// dx_c = r * (w_c dy_c - x_c * r^2 * <w dy, x> / C).
void rmsnorm_backward_row(float* dx, float* dw, const float* dy, const float* x, const float* weight, float r, int C) {
  float dot = 0.0f;
  for (int c = 0; c < C; ++c) dot += weight[c] * dy[c] * x[c];
  const float coefficient = r * r * dot / static_cast<float>(C);
  for (int c = 0; c < C; ++c) {
    dw[c] += x[c] * r * dy[c];
    dx[c] += (weight[c] * dy[c] - x[c] * coefficient) * r;
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
  // Row i's dinp is written by one task; dweight sums over rows in fixed blocks.
  const std::vector<float> sums = blocked_row_sum(N, kTokenBlock, C, [&](std::int64_t r0, std::int64_t r1,
                                                                          float* partial) {
    for (std::int64_t i = r0; i < r1; ++i) {
      rmsnorm_backward_row(dinp + i * C, partial, dout + i * C, inp + i * C, weight, rstd[i], C);
    }
  });
  add_inplace(dweight, sums.data(), C);
}

// ---- RoPE --------------------------------------------------------------------------------

void rope_tables(float* cos_table, float* sin_table, int T, int hd, double theta) {
  const int half = hd / 2;
  const double log_theta = numerics::det_log(theta);
  for (int i = 0; i < half; ++i) {
    const double inverse_frequency = numerics::det_exp(-(2.0 * i / hd) * log_theta);
    for (int t = 0; t < T; ++t) {
      const double angle = t * inverse_frequency;
      cos_table[static_cast<long>(t) * half + i] = static_cast<float>(numerics::det_cos(angle));
      sin_table[static_cast<long>(t) * half + i] = static_cast<float>(numerics::det_sin(angle));
    }
  }
}

RopeTables make_rope_tables(int T, int hd, double theta) {
  RopeTables tables{T, hd, theta, std::vector<float>(static_cast<std::size_t>(T) * (hd / 2)),
                    std::vector<float>(static_cast<std::size_t>(T) * (hd / 2))};
  rope_tables(tables.cos.data(), tables.sin.data(), T, hd, theta);
  return tables;
}

const RopeTables& RopeTableCache::get(int T, int hd, double theta) {
  for (const RopeTables& t : tables_) {
    if (t.T == T && t.head_size == hd && t.theta == theta) return t;
  }
  tables_.push_back(make_rope_tables(T, hd, theta));
  return tables_.back();
}

void rope_forward(float* out, const float* inp, const float* cos_table, const float* sin_table, int B, int T, int heads,
                  int hd) {
  const int half = hd / 2;
  tbb::parallel_for(0, B * T, [&](int bt) {
    const int t = bt % T;
    const float* c = cos_table + static_cast<long>(t) * half;
    const float* s = sin_table + static_cast<long>(t) * half;
    for (int h = 0; h < heads; ++h) {
      const float* x = inp + (static_cast<long>(bt) * heads + h) * hd;
      float* y = out + (static_cast<long>(bt) * heads + h) * hd;
      for (int i = 0; i < half; ++i) {
        y[i] = x[i] * c[i] - x[i + half] * s[i];
        y[i + half] = x[i + half] * c[i] + x[i] * s[i];
      }
    }
  });
}

void rope_backward(float* dinp, const float* dout, const float* cos_table, const float* sin_table, int B, int T,
                   int heads, int hd) {
  const int half = hd / 2;
  tbb::parallel_for(0, B * T, [&](int bt) {
    const int t = bt % T;
    const float* c = cos_table + static_cast<long>(t) * half;
    const float* s = sin_table + static_cast<long>(t) * half;
    for (int h = 0; h < heads; ++h) {
      const float* dy = dout + (static_cast<long>(bt) * heads + h) * hd;
      float* dx = dinp + (static_cast<long>(bt) * heads + h) * hd;
      for (int i = 0; i < half; ++i) {
        dx[i] += dy[i] * c[i] + dy[i + half] * s[i];
        dx[i + half] += dy[i + half] * c[i] - dy[i] * s[i];
      }
    }
  });
}

// ---- SwiGLU ------------------------------------------------------------------------------

namespace {

constexpr std::int64_t kElementwiseGrain = 4096;

}  // namespace

// On the widest vectors this CPU has (kernels/vector_lanes.h): the same bits at any width.
void swiglu_forward(float* out, const float* gate, const float* up, std::int64_t n) {
  const LaneKernels& lanes = lane_kernels();
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, kElementwiseGrain),
                    [&](const auto& r) { lanes.swiglu_forward(out, gate, up, r.begin(), r.end()); });
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, std::int64_t n) {
  const LaneKernels& lanes = lane_kernels();
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, kElementwiseGrain),
                    [&](const auto& r) { lanes.swiglu_backward(dgate, dup, dout, gate, up, r.begin(), r.end()); });
}

// ---- grouped-query attention ---------------------------------------------------------------
//
// As kernels.cpp's attention: the four products of a head through the serial deterministic
// GEMM, scores for every (t, t2) and the causal mask after (masked probabilities are exact
// zeros, so products over t2 add exact zeros).

namespace {

struct GqaScratch {  // per thread: T x T and max(T, hd) x T buffers
  std::vector<float> a, b;
  void size_for(int T, int hd) {
    a.resize(static_cast<std::size_t>(T) * T);
    b.resize(static_cast<std::size_t>(T) * (T > hd ? T : hd));
  }
};
thread_local GqaScratch gqa_scratch;

}  // namespace

void gqa_attention_forward(float* out, float* att, const float* q, const float* k, const float* v, int B, int T, int NH,
                           int NKV, int hd, SoftmaxExp exp) {
  const int group = NH / NKV;
  const int q_ld = NH * hd, kv_ld = NKV * hd;
  const float scale = 1.0f / __builtin_sqrtf(static_cast<float>(hd));
  tbb::parallel_for(0, B * NH, [&](int bh) {
    const int b = bh / NH, h = bh % NH, g = h / group;
    const float* qh = q + static_cast<long>(b) * T * q_ld + h * hd;
    const float* kg = k + static_cast<long>(b) * T * kv_ld + g * hd;
    const float* vg = v + static_cast<long>(b) * T * kv_ld + g * hd;
    GqaScratch& s = gqa_scratch;
    s.size_for(T, hd);
    float* att_bh = att + static_cast<long>(bh) * T * T;
    transpose_serial(kg, T, hd, kv_ld, s.b.data(), T);  // preatt (T,T) = q (T,hd) @ k^T (hd,T)
    gemm_serial(T, T, hd, qh, q_ld, s.b.data(), T, att_bh, T, GemmEpilogue::Store);
    for (int t = 0; t < T; ++t) causal_softmax_row(att_bh + static_cast<long>(t) * T, t, T, scale, exp);
    gemm_serial(T, hd, T, att_bh, T, vg, kv_ld, out + static_cast<long>(b) * T * q_ld + h * hd, q_ld,
                GemmEpilogue::Store);  // out (T,hd) = att (T,T) @ v (T,hd)
  });
}

void gqa_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q, const float* k,
                            const float* v, const float* att, int B, int T, int NH, int NKV, int hd) {
  const int group = NH / NKV;
  const int q_ld = NH * hd, kv_ld = NKV * hd;
  const float scale = 1.0f / __builtin_sqrtf(static_cast<float>(hd));
  tbb::parallel_for(0, B * NKV, [&](int bg) {
    const int b = bg / NKV, g = bg % NKV;
    const float* kg = k + static_cast<long>(b) * T * kv_ld + g * hd;
    const float* vg = v + static_cast<long>(b) * T * kv_ld + g * hd;
    float* dkg = dk + static_cast<long>(b) * T * kv_ld + g * hd;
    float* dvg = dv + static_cast<long>(b) * T * kv_ld + g * hd;
    GqaScratch& s = gqa_scratch;
    s.size_for(T, hd);
    float* datt = s.a.data();
    float* transposed = s.b.data();
    for (int h = g * group; h < (g + 1) * group; ++h) {  // the group's query heads, in order
      const float* qh = q + static_cast<long>(b) * T * q_ld + h * hd;
      const float* dy = dout + static_cast<long>(b) * T * q_ld + h * hd;
      float* dqh = dq + static_cast<long>(b) * T * q_ld + h * hd;
      const float* att_bh = att + (static_cast<long>(b) * NH + h) * T * T;
      // out = att @ v  =>  datt (T,T) = dout (T,hd) @ v^T (hd,T); dv += att^T @ dout
      transpose_serial(vg, T, hd, kv_ld, transposed, T);
      gemm_serial(T, T, hd, dy, q_ld, transposed, T, datt, T, GemmEpilogue::Store);
      transpose_serial(att_bh, T, T, T, transposed, T);
      gemm_serial(T, hd, T, transposed, T, dy, q_ld, dvg, kv_ld, GemmEpilogue::Accumulate);
      // att = softmax(scale * preatt)  =>  dpreatt = scale * att * (datt - <att, datt>)
      for (int t = 0; t < T; ++t) {
        causal_softmax_backward_row(datt + static_cast<long>(t) * T, att_bh + static_cast<long>(t) * T, t, T, scale);
      }
      // preatt = q @ k^T  =>  dq += dpreatt @ k; dk += dpreatt^T @ q
      gemm_serial(T, hd, T, datt, T, kg, kv_ld, dqh, q_ld, GemmEpilogue::Accumulate);
      transpose_serial(datt, T, T, T, transposed, T);
      gemm_serial(T, hd, T, transposed, T, qh, q_ld, dkg, kv_ld, GemmEpilogue::Accumulate);
    }
  });
}

}  // namespace harness::kernels
