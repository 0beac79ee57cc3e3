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
// --fp8-saturate's fault: a scale 2^10 too large, as a stale amax 1024 times too small
// makes it; operands past the format's largest value clip there.
inline constexpr float kSaturatingOverscale = 1024.0f;
inline constexpr int kTokenChunk = 64;
inline constexpr int kAttentionChunk = 16;

// The split-K chunk a GEMM library's heuristic picks for an (M,N) output over K (--split-k
// rows): enough K splits to give each of an emulated GPU's 108 multiprocessors one
// 128x128 output tile, at most K/16 of them, each chunk a multiple of 16 deep. Fewer rows
// (a smaller batch) mean fewer tiles and more, shorter splits: another association order.
int row_split_k_chunk(int M, int N, int K);

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

// What split_k_gemm's output starts from and how it is stored: done on each row tile of C
// while it is in cache, instead of as passes of their own over C.
struct SplitKOutput {
  enum class Start { Accumulate, Zero, Row };
  Start start = Start::Accumulate;  // C += the product; C = 0 + ...; C = first_row (each row) + ...
  const float* first_row = nullptr;  // N floats, for Start::Row (a bias)
  bool round_to_bf16 = false;        // C rounded to bf16 once the parts are added (numerics::round_to_bf16_inplace)
};

// C (M,N, contiguous) = start + A (M,K) @ B (K,N), K split into chunks of `chunk`, the
// parts added in the noise source's order onto `output.start`, then stored as `output` says.
void split_k_gemm(ReduceContext& ctx, int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C,
                  int chunk, const GemmNumerics& numerics, const SplitKOutput& output = {});

// out (C) += sum over the N rows of x (N,C), rows in blocks of kTokenChunk.
void token_sum(ReduceContext& ctx, const float* x, int N, int C, float* out);

// dwpe may be nullptr (a canary without position embeddings).
void encoder_backward(ReduceContext& ctx, float* dwte, float* dwpe, const float* dout, const std::int32_t* inp, int B,
                      int T, int C, int V);

void layernorm_backward(ReduceContext& ctx, float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd, int N, int C);

void rmsnorm_backward(ReduceContext& ctx, float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C);

// Where attention's heads live: head h of token t of sequence b at
// q + (b*T + t) * q_ld + h * head_size, kv head g at k/v + (b*T + t) * kv_ld + g * head_size.
// Query head h reads kv head h / (heads / kv_heads). gpt2's fused qkv (B,T,3C) is q = qkv,
// k = qkv + C, v = qkv + 2C with q_ld = kv_ld = 3C and kv_heads = heads.
struct AttentionHeads {
  const float *q, *k, *v;
  int q_ld, kv_ld;
  int heads, kv_heads, head_size;
};
// The gradients of q, k and v, in the same layout.
struct AttentionGradients {
  float *dq, *dk, *dv;
};

// As cpu-ref's causal attention, but with bf16 rounding where a bf16 attention kernel
// converts: the probabilities before att @ v. out row stride out_ld, att (B,heads,T,T).
void gqa_attention_forward(float* out, int out_ld, float* att, const AttentionHeads& x, int B, int T, bool bf16);
// dq, dk, dv += the gradients, each summed over key/query blocks of kAttentionChunk in the
// noise source's order; dpreatt rounded to bf16 before its two GEMMs under bf16.
void gqa_attention_backward(const NoiseSource& noise, Reduction reduction, const AttentionGradients& d,
                            const float* dout, int dout_ld, const AttentionHeads& x, const float* att, int B, int T,
                            bool bf16);

// Sum of x (n) in blocks of kTokenChunk, blocks added in the noise source's order.
float noisy_sum(ReduceContext& ctx, const float* x, std::int64_t n);

}  // namespace harness::accel
