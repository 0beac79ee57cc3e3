// The accel engine's kernels: the ops whose reductions a GPU leaves unordered, written as
// fixed partial results (split-K chunks, token blocks, query/key blocks) whose sum is
// ordered by the noise source (noise.h). Everything else reuses cpu-ref's kernels.
//
// Dimension key: B = batch, T = time, C = channels, V = vocab, NH = heads, N = rows.
#pragma once

#include <cstdint>
#include <vector>

#include "noise.h"

namespace harness::accel {

// Sizes of the partial results. GPUs split K for skinny GEMMs and reduce weight gradients
// over token tiles; these chunk sizes give 2-8 parts on the canary's shapes.
inline constexpr int kSplitKChunk = 64;
inline constexpr int kTokenChunk = 64;
inline constexpr int kAttentionChunk = 16;

// Shared state of one op's reductions: the noise source and a workspace for partials.
struct ReduceContext {
  NoiseSource& noise;
  std::vector<float>& workspace;
  Reduction next() { return {noise.take_reduction_index()}; }
};

// How the GEMM accumulates: fp32 throughout, or FP8's limited accumulator promoted every
// `limited_interval` products (0: fp32).
struct GemmNumerics {
  float output_scale = 1.0f;  // applied to each partial (FP8 descale: 1/(scale_a*scale_b))
  int limited_interval = 0;
};

// C (M,N, contiguous) += A (M,K) @ B (K,N), K split into chunks of `chunk`.
void split_k_gemm(ReduceContext& ctx, int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C,
                  int chunk, const GemmNumerics& numerics);

// out (C) += sum over the N rows of x (N,C), rows in blocks of kTokenChunk.
void token_sum(ReduceContext& ctx, const float* x, int N, int C, float* out);

void encoder_backward(ReduceContext& ctx, float* dwte, float* dwpe, const float* dout, const std::int32_t* inp, int B,
                      int T, int C, int V);

void layernorm_backward(ReduceContext& ctx, float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd, int N, int C);

// As cpu-ref, but with bf16 rounding where a bf16 attention kernel converts: the
// probabilities before att @ v (forward) and dpreatt before its two GEMMs (backward).
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH, bool bf16);
// dq, dk, dv sum over key/query blocks of kAttentionChunk, ordered by the noise source.
void attention_backward(const NoiseSource& noise, Reduction reduction, float* dqkv, const float* dout,
                        const float* qkv, const float* att, int B, int T, int C, int NH, bool bf16);

// Sum of x (n) in blocks of kTokenChunk, blocks added in the noise source's order.
float noisy_sum(ReduceContext& ctx, const float* x, std::int64_t n);

}  // namespace harness::accel
