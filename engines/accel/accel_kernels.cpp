#include "accel_kernels.h"

#include <algorithm>
#include <cassert>
#include <optional>
#include <vector>

#include <tbb/parallel_for.h>

#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/llama_kernels.h"
#include "limited_accumulator_gemm.h"
#include "numerics/formats.h"
#include "numerics/isa_dispatch.h"

namespace harness::accel {

using kernels::GemmEpilogue;

int row_split_k_chunk(int M, int N, int K) {
  constexpr int kMultiprocessors = 108, kTile = 128, kDepth = 16;
  const auto ceil_div = [](int a, int b) { return (a + b - 1) / b; };
  const int tiles = ceil_div(M, kTile) * ceil_div(N, kTile);
  const int splits = std::clamp(ceil_div(kMultiprocessors, tiles), 1, std::max(1, K / kDepth));
  return ceil_div(ceil_div(K, splits), kDepth) * kDepth;
}

void split_k_gemm(ReduceContext& ctx, int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C,
                  int chunk, const GemmNumerics& numerics, const SplitKOutput& output) {
  // A limited accumulator promotes every `limited_interval` products; a split-K chunk
  // shorter than that would hide the effect, so the chunk is at least one interval.
  chunk = std::max(chunk, numerics.limited_interval);
  const int parts = part_count(K, chunk);
  // Each part's rows of B packed once, for all its row tiles (kernels::PackedMatrix);
  // whole parts are parallel GEMMs, which pack for themselves.
  std::vector<std::optional<kernels::PackedMatrix>> packed(static_cast<std::size_t>(parts));
  if (numerics.limited_interval == 0 && row_tiles_apply(ctx.noise, M, N)) {
    tbb::parallel_for(0, parts, [&](int part) {
      const int k0 = part * chunk;
      packed[part].emplace(std::min(chunk, K - k0), N, B + static_cast<long>(k0) * ldb, ldb);
    });
  }
  const auto produce = [&](int part, int first, int last, float* partial) {
    const int k0 = part * chunk;
    const int kc = std::min(chunk, K - k0);
    const int rows = last - first;
    const float* a = A + static_cast<long>(first) * lda + k0;
    const float* b = B + static_cast<long>(k0) * ldb;
    if (numerics.limited_interval == 0) {
      // An fp8 GEMM's descale (output_scale) is the store's multiply: the product rounded
      // once, as a pass over the part would round it.
      const GemmEpilogue store = numerics.output_scale != 1.0f ? GemmEpilogue::Scale : GemmEpilogue::Store;
      if (rows == M) {  // whole parts (racy mode, few tiles): a parallel GEMM, the same bits
        kernels::gemm(rows, N, kc, a, lda, b, ldb, partial, N, store, &numerics.output_scale);
      } else {
        kernels::gemm_serial_packed(rows, a, lda, *packed[part], partial, N, store, &numerics.output_scale);
      }
      return;
    }
    gemm_limited_accumulator(rows, N, kc, a, lda, b, ldb, partial, N, numerics.limited_interval);
    if (numerics.output_scale != 1.0f) {  // its own kernel stores unscaled: a pass
      const std::int64_t n = static_cast<std::int64_t>(rows) * N;
      const float scale = numerics.output_scale;
      harness::numerics::run_widest([&]() __attribute__((always_inline)) {
        for (std::int64_t i = 0; i < n; ++i) partial[i] *= scale;
      });
    }
  };
  assert(output.start != SplitKOutput::Start::Row || output.first_row != nullptr);
  const auto start_rows = [&](int first, int last) {
    for (int m = first; m < last; ++m) {
      float* row = C + static_cast<long>(m) * N;
      if (output.start == SplitKOutput::Start::Row) {
        std::copy_n(output.first_row, N, row);
      } else {
        std::fill_n(row, N, 0.0f);
      }
    }
  };
  const auto round_rows = [&](int first, int last) {
    harness::numerics::round_to_bf16_inplace(C + static_cast<long>(first) * N, static_cast<std::int64_t>(last - first) * N);
  };
  reduce_row_tiles(ctx.noise, ctx.next(), parts, M, N, C, ctx.workspace, produce,
                   output.start == SplitKOutput::Start::Accumulate ? RowsFn{} : RowsFn{start_rows},
                   output.round_to_bf16 ? RowsFn{round_rows} : RowsFn{});
}

void token_sum(ReduceContext& ctx, const float* x, int N, int C, float* out) {
  reduce_parts(ctx.noise, ctx.next(), part_count(N, kTokenChunk), C, out, ctx.workspace, [&](int part, float* partial) {
    std::fill_n(partial, C, 0.0f);
    const int end = std::min(N, (part + 1) * kTokenChunk);
    for (int i = part * kTokenChunk; i < end; ++i) {
      for (int c = 0; c < C; ++c) partial[c] += x[static_cast<long>(i) * C + c];
    }
  });
}

void encoder_backward(ReduceContext& ctx, float* dwte, float* dwpe, const float* dout, const std::int32_t* inp, int B,
                      int T, int C, int V) {
  // dwte: a scatter-add over tokens (atomics on a GPU), token blocks as the parts.
  const int tokens = B * T;
  reduce_parts(ctx.noise, ctx.next(), part_count(tokens, kTokenChunk), static_cast<std::int64_t>(V) * C, dwte,
               ctx.workspace, [&](int part, float* partial) {
                 std::fill_n(partial, static_cast<std::int64_t>(V) * C, 0.0f);
                 const int end = std::min(tokens, (part + 1) * kTokenChunk);
                 for (int bt = part * kTokenChunk; bt < end; ++bt) {
                   float* row = partial + static_cast<long>(inp[bt]) * C;
                   for (int c = 0; c < C; ++c) row[c] += dout[static_cast<long>(bt) * C + c];
                 }
               });
  // dwpe: a sum over the batch, one part per sequence (none without position embeddings).
  if (dwpe == nullptr) return;
  const std::int64_t tc = static_cast<std::int64_t>(T) * C;
  reduce_parts(ctx.noise, ctx.next(), B, tc, dwpe, ctx.workspace,
               [&](int b, float* partial) { std::copy_n(dout + b * tc, tc, partial); });
}

void layernorm_backward(ReduceContext& ctx, float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd, int N, int C) {
  // Parts are token blocks: each writes its rows of dinp and its partial dweight/dbias.
  std::vector<float> sums(2 * static_cast<std::size_t>(C), 0.0f);
  reduce_parts(ctx.noise, ctx.next(), part_count(N, kTokenChunk), 2 * C, sums.data(), ctx.workspace,
               [&](int part, float* partial) {
                 std::fill_n(partial, 2 * C, 0.0f);
                 const int end = std::min(N, (part + 1) * kTokenChunk);
                 for (int i = part * kTokenChunk; i < end; ++i) {
                   const long row = static_cast<long>(i) * C;
                   kernels::layernorm_backward_row(dinp + row, partial, partial + C, dout + row, inp + row, weight,
                                                   mean[i], rstd[i], C);
                 }
               });
  for (int c = 0; c < C; ++c) {
    dweight[c] += sums[static_cast<std::size_t>(c)];
    dbias[c] += sums[static_cast<std::size_t>(C + c)];
  }
}

void rmsnorm_backward(ReduceContext& ctx, float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C) {
  // As layernorm_backward: token blocks as the parts, each with its partial dweight.
  std::vector<float> sums(static_cast<std::size_t>(C), 0.0f);
  reduce_parts(ctx.noise, ctx.next(), part_count(N, kTokenChunk), C, sums.data(), ctx.workspace,
               [&](int part, float* partial) {
                 std::fill_n(partial, C, 0.0f);
                 const int end = std::min(N, (part + 1) * kTokenChunk);
                 for (int i = part * kTokenChunk; i < end; ++i) {
                   const long row = static_cast<long>(i) * C;
                   kernels::rmsnorm_backward_row(dinp + row, partial, dout + row, inp + row, weight, rstd[i], C);
                 }
               });
  kernels::add_inplace(dweight, sums.data(), C);
}

// ---- attention ------------------------------------------------------------------------

namespace {

// out (T,hs, row stride ld) += sum over chunks of `contracted` rows: partial = A[:, chunk] @ Bm[chunk, :],
// A (T, T) row-major, Bm (T, hs) with row stride ldb. The chunks are the noisy parts.
void accumulate_over_chunks(const NoiseSource& noise, Reduction r, const float* A, const float* Bm, int ldb, float* out,
                            int ld, int T, int hs, std::vector<float>& workspace) {
  std::vector<float> dense(static_cast<std::size_t>(T) * hs);
  for (int t = 0; t < T; ++t) std::copy_n(out + static_cast<long>(t) * ld, hs, dense.data() + static_cast<long>(t) * hs);
  reduce_parts(
      noise, r, part_count(T, kAttentionChunk), static_cast<std::int64_t>(T) * hs, dense.data(), workspace,
      [&](int part, float* partial) {
        const int k0 = part * kAttentionChunk;
        const int kc = std::min(kAttentionChunk, T - k0);
        kernels::gemm_serial(T, hs, kc, A + k0, T, Bm + static_cast<long>(k0) * ldb, ldb, partial, hs,
                             GemmEpilogue::Store);
      },
      /*serial_parts=*/true);
  for (int t = 0; t < T; ++t) std::copy_n(dense.data() + static_cast<long>(t) * hs, hs, out + static_cast<long>(t) * ld);
}

}  // namespace

void gqa_attention_forward(float* out, int out_ld, float* att, const AttentionHeads& x, int B, int T, bool bf16) {
  const int hd = x.head_size, group = x.heads / x.kv_heads;
  const float scale = 1.0f / __builtin_sqrtf(static_cast<float>(hd));
  tbb::parallel_for(0, B * x.heads, [&](int bh) {
    const int b = bh / x.heads, h = bh % x.heads, g = h / group;
    const float* qh = x.q + static_cast<long>(b) * T * x.q_ld + h * hd;
    const float* kg = x.k + static_cast<long>(b) * T * x.kv_ld + g * hd;
    const float* vg = x.v + static_cast<long>(b) * T * x.kv_ld + g * hd;
    std::vector<float> k_transposed(static_cast<std::size_t>(hd) * T);
    float* att_bh = att + static_cast<long>(bh) * T * T;
    kernels::transpose_serial(kg, T, hd, x.kv_ld, k_transposed.data(), T);
    kernels::gemm_serial(T, T, hd, qh, x.q_ld, k_transposed.data(), T, att_bh, T, GemmEpilogue::Store);
    for (int t = 0; t < T; ++t) kernels::causal_softmax_row(att_bh + static_cast<long>(t) * T, t, T, scale);
    if (bf16) numerics::round_to_bf16_inplace(att_bh, static_cast<std::int64_t>(T) * T);
    kernels::gemm_serial(T, hd, T, att_bh, T, vg, x.kv_ld, out + static_cast<long>(b) * T * out_ld + h * hd, out_ld,
                         GemmEpilogue::Store);
  });
}

void gqa_attention_backward(const NoiseSource& noise, Reduction reduction, const AttentionGradients& d,
                            const float* dout, int dout_ld, const AttentionHeads& x, const float* att, int B, int T,
                            bool bf16) {
  const int hd = x.head_size, group = x.heads / x.kv_heads;
  const float scale = 1.0f / __builtin_sqrtf(static_cast<float>(hd));
  const std::uint64_t segments_per_output = (static_cast<std::uint64_t>(T) * hd + kNoiseSegment - 1) / kNoiseSegment;
  // One task per (batch, kv head): it owns that head's dk and dv, and adds the query heads
  // of its group in order (one query head per task without grouping).
  tbb::parallel_for(0, B * x.kv_heads, [&](int bg) {
    const int b = bg / x.kv_heads, g = bg % x.kv_heads;
    const float* kg = x.k + static_cast<long>(b) * T * x.kv_ld + g * hd;
    const float* vg = x.v + static_cast<long>(b) * T * x.kv_ld + g * hd;
    float* dk = d.dk + static_cast<long>(b) * T * x.kv_ld + g * hd;
    float* dv = d.dv + static_cast<long>(b) * T * x.kv_ld + g * hd;
    // Per task, never thread_local: a racy reduction below runs nested tasks, and a thread
    // waiting on them may pick up another head.
    std::vector<float> datt(static_cast<std::size_t>(T) * T), transposed(static_cast<std::size_t>(T) * T), workspace;
    for (int h = g * group; h < (g + 1) * group; ++h) {
      const int bh = b * x.heads + h;
      const float* qh = x.q + static_cast<long>(b) * T * x.q_ld + h * hd;
      float* dq = d.dq + static_cast<long>(b) * T * x.q_ld + h * hd;
      const float* dy = dout + static_cast<long>(b) * T * dout_ld + h * hd;
      const float* att_bh = att + static_cast<long>(bh) * T * T;
      const auto part_of = [&](std::uint64_t which) {
        return Reduction{reduction.index,
                         reduction.first_segment + (static_cast<std::uint64_t>(bh) * 3 + which) * segments_per_output};
      };
      // forward: out = att @ v  =>  datt = dout @ v^T (over hd: one GEMM); dv += att^T @ dout (over queries)
      kernels::transpose_serial(vg, T, hd, x.kv_ld, transposed.data(), T);
      kernels::gemm_serial(T, T, hd, dy, dout_ld, transposed.data(), T, datt.data(), T, GemmEpilogue::Store);
      kernels::transpose_serial(att_bh, T, T, T, transposed.data(), T);
      accumulate_over_chunks(noise, part_of(2), transposed.data(), dy, dout_ld, dv, x.kv_ld, T, hd, workspace);
      // forward: att = softmax(scale * preatt)  =>  dpreatt = scale * att * (datt - <att, datt>)
      for (int t = 0; t < T; ++t) {
        kernels::causal_softmax_backward_row(datt.data() + static_cast<long>(t) * T, att_bh + static_cast<long>(t) * T,
                                             t, T, scale);
      }
      if (bf16) numerics::round_to_bf16_inplace(datt.data(), static_cast<std::int64_t>(T) * T);
      // forward: preatt = q @ k^T  =>  dq += dpreatt @ k (over keys); dk += dpreatt^T @ q (over queries)
      accumulate_over_chunks(noise, part_of(0), datt.data(), kg, x.kv_ld, dq, x.q_ld, T, hd, workspace);
      kernels::transpose_serial(datt.data(), T, T, T, transposed.data(), T);
      accumulate_over_chunks(noise, part_of(1), transposed.data(), qh, x.q_ld, dk, x.kv_ld, T, hd, workspace);
    }
  });
}

float noisy_sum(ReduceContext& ctx, const float* x, std::int64_t n) {
  float total = 0.0f;
  reduce_parts(ctx.noise, ctx.next(), part_count(n, kTokenChunk), 1, &total, ctx.workspace, [&](int part, float* partial) {
    const std::int64_t end = std::min<std::int64_t>(n, (part + 1) * std::int64_t{kTokenChunk});
    float s = 0.0f;
    for (std::int64_t i = part * std::int64_t{kTokenChunk}; i < end; ++i) s += x[i];
    *partial = s;
  });
  return total;
}

}  // namespace harness::accel
