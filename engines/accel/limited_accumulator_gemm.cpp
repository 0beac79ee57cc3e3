#include "limited_accumulator_gemm.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <immintrin.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "kernels/gemm.h"

namespace harness::accel {
namespace {

constexpr std::uint32_t kCutMask = ~((1u << (23 - kLimitedAccumulatorFractionBits)) - 1u);

inline float cut(float x) { return std::bit_cast<float>(std::bit_cast<std::uint32_t>(x) & kCutMask); }

void rows_generic(int m0, int m1, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                  int interval) {
  for (int m = m0; m < m1; ++m) {
    const float* a = A + static_cast<long>(m) * lda;
    for (int n = 0; n < N; ++n) {
      float total = 0.0f;
      for (int k0 = 0; k0 < K; k0 += interval) {
        const int k1 = k0 + interval < K ? k0 + interval : K;
        float run = 0.0f;
        for (int k = k0; k < k1; ++k) run = cut(std::fma(a[k], B[static_cast<long>(k) * ldb + n], run));
        total += run;
      }
      C[static_cast<long>(m) * ldc + n] = total;
    }
  }
}

__attribute__((target("avx2,fma"))) void rows_avx2(int m0, int m1, int N, int K, const float* A, int lda,
                                                   const float* B, int ldb, float* C, int ldc, int interval) {
  const __m256 mask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kCutMask)));
  const int n_vec = N / 8 * 8;
  for (int m = m0; m < m1; ++m) {
    const float* a = A + static_cast<long>(m) * lda;
    for (int n = 0; n < n_vec; n += 8) {
      __m256 total = _mm256_setzero_ps();
      for (int k0 = 0; k0 < K; k0 += interval) {
        const int k1 = k0 + interval < K ? k0 + interval : K;
        __m256 run = _mm256_setzero_ps();
        for (int k = k0; k < k1; ++k) {
          run = _mm256_fmadd_ps(_mm256_broadcast_ss(a + k), _mm256_loadu_ps(B + static_cast<long>(k) * ldb + n), run);
          run = _mm256_and_ps(run, mask);
        }
        total = _mm256_add_ps(total, run);
      }
      _mm256_storeu_ps(C + static_cast<long>(m) * ldc + n, total);
    }
  }
  // The last columns by the same arithmetic, one at a time.
  if (n_vec < N) rows_generic(m0, m1, N - n_vec, K, A, lda, B + n_vec, ldb, C + n_vec, ldc, interval);
}

// As the main GEMM: AVX2+FMA when the CPU has it, unless HARNESS_GEMM_KERNEL=generic.
bool use_avx2_fma() {
  const char* forced = std::getenv(kernels::kGemmKernelVariable);
  if (forced != nullptr && std::strcmp(forced, "generic") == 0) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

}  // namespace

void gemm_limited_accumulator_generic(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C,
                                      int ldc, int interval) {
  rows_generic(0, M, N, K, A, lda, B, ldb, C, ldc, interval);
}

void gemm_limited_accumulator(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                              int interval) {
  static const bool avx2 = use_avx2_fma();
  constexpr int kRowGrain = 16;
  tbb::parallel_for(tbb::blocked_range<int>(0, M, kRowGrain), [&](const tbb::blocked_range<int>& r) {
    if (avx2) rows_avx2(r.begin(), r.end(), N, K, A, lda, B, ldb, C, ldc, interval);
    else rows_generic(r.begin(), r.end(), N, K, A, lda, B, ldb, C, ldc, interval);
  });
}

}  // namespace harness::accel
