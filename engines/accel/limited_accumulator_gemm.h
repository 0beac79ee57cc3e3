// A GEMM with the reduced-precision accumulator of FP8 tensor cores.
//
// Hopper's FP8 tensor cores were reported to keep only about 14 bits of the running sum;
// the known fix (DeepSeek-V3, DeepGEMM) promotes the partial sum to an fp32 register
// every 128 products along K. This kernel models it: within each run of `interval`
// products, each fused multiply-add's fp32 result is cut to 14 significant bits (its low
// 10 fraction bits cleared: truncation); at the end of the run the run's sum is added to
// an fp32 total. The model is documented in docs/engines/accel.md; the cut is a bit mask,
// so the AVX2 and the portable kernel give the same bits.
//
//   C[m,n] = sum over runs r of ( limited sum_{k in r} A[m*lda+k] * B[k*ldb+n] )
#pragma once

namespace harness::accel {

inline constexpr int kLimitedAccumulatorFractionBits = 13;

void gemm_limited_accumulator(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                              int interval);

// The portable kernel alone (tests compare it with the dispatched one).
void gemm_limited_accumulator_generic(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C,
                                      int ldc, int interval);

}  // namespace harness::accel
