// The deterministic GEMM shared by every engine.
//
//   C[m,n] (=|+=) sum_{k=0..K-1} A[m*lda + k] * B[k*ldb + n]   (+ bias[n])
//
// Each output element is accumulated by exactly one task, sequentially over k = 0..K-1,
// with a fused multiply-add per product, starting from 0; the epilogue then adds bias or
// the old value of C. Vectorisation runs across n (output columns), never across k, so
// the bits do not depend on the vector width, the tile shape or the thread count.
//
// Two kernels compute identical bits: an AVX2+FMA kernel chosen at run time when the CPU
// has it, and a portable kernel (std::fma per product, exactly rounded by IEEE-754 on any
// CPU). A -march=x86-64 build and a -march=native build therefore agree bit for bit.
// HARNESS_GEMM_KERNEL=generic forces the portable kernel (tests use it).
#pragma once

#include <string_view>

namespace harness::kernels {

enum class GemmEpilogue { Store, AddBias, Accumulate };

void gemm(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
          GemmEpilogue epilogue, const float* bias = nullptr);

// The same computation on the calling thread only: for small products inside a task
// that is already parallel (attention runs one per batch row and head).
void gemm_serial(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                 GemmEpilogue epilogue, const float* bias = nullptr);

// Serial out (cols x rows, leading dimension ld_out) = in (rows x cols, leading dimension ld_in)^T.
void transpose_serial(const float* in, int rows, int cols, int ld_in, float* out, int ld_out);

// The kernel in use: "avx2-fma" or "generic". Recorded in receipts.
std::string_view gemm_kernel_name();

// out (cols x rows) = in (rows x cols)^T, parallel over blocks.
void transpose(const float* in, int rows, int cols, float* out);

}  // namespace harness::kernels
