// The GEMM's contract: every output element equals the sequential fma chain over k,
// bit for bit, whatever the shape, tile edges, epilogue or thread count.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string_view>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include "kernels/gemm.h"
#include "numerics/philox.h"

namespace harness::kernels {
namespace {

std::vector<float> values(int n, std::uint64_t stream) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>(numerics::normal_at(1, stream, static_cast<std::uint64_t>(i)));
  return v;
}

struct GemmCase {
  int M, N, K;
  GemmEpilogue epilogue;
};

std::vector<float> reference(const GemmCase& c, const std::vector<float>& A, const std::vector<float>& B,
                             const std::vector<float>& C0, const std::vector<float>& bias) {
  std::vector<float> C = C0;
  for (int m = 0; m < c.M; ++m) {
    for (int n = 0; n < c.N; ++n) {
      float acc = 0.0f;
      for (int k = 0; k < c.K; ++k) acc = std::fma(A[static_cast<std::size_t>(m * c.K + k)], B[static_cast<std::size_t>(k * c.N + n)], acc);
      float& out = C[static_cast<std::size_t>(m * c.N + n)];
      switch (c.epilogue) {
        case GemmEpilogue::Store: out = acc; break;
        case GemmEpilogue::AddBias: out = acc + bias[static_cast<std::size_t>(n)]; break;
        case GemmEpilogue::Accumulate: out = out + acc; break;
        case GemmEpilogue::Scale: out = acc * bias[0]; break;  // bias holds the one factor
      }
    }
  }
  return C;
}

class GemmBitwise : public ::testing::TestWithParam<GemmCase> {};

// Restores the process's kernel choice after a test that switched it.
class KernelScope {
 public:
  KernelScope() : saved_(gemm_kernel_name()) {}
  ~KernelScope() { select_gemm_kernel(saved_); }

 private:
  std::string_view saved_;
};

TEST_P(GemmBitwise, EqualsSequentialFmaChainForEveryKernelAndThreadCount) {
  const GemmCase c = GetParam();
  const auto A = values(c.M * c.K, 1), B = values(c.K * c.N, 2), C0 = values(c.M * c.N, 3), bias = values(c.N, 4);
  const std::vector<float> expected = reference(c, A, B, C0, bias);
  const KernelScope scope;
  for (std::string_view kernel : available_gemm_kernels()) {
    select_gemm_kernel(kernel);
    for (int threads : {1, 2, 3, 8}) {
      const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads));
      std::vector<float> C = C0;
      gemm(c.M, c.N, c.K, A.data(), c.K, B.data(), c.N, C.data(), c.N, c.epilogue, bias.data());
      for (std::size_t i = 0; i < C.size(); ++i) {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(C[i]), std::bit_cast<std::uint32_t>(expected[i]))
            << "element " << i << " threads " << threads << " kernel " << gemm_kernel_name();
      }
      std::vector<float> serial = C0;
      gemm_serial(c.M, c.N, c.K, A.data(), c.K, B.data(), c.N, serial.data(), c.N, c.epilogue, bias.data());
      ASSERT_EQ(serial, C);
    }
    // B packed once and used by row tiles of 5 rows (accel's split-K): the reference's bits.
    std::vector<float> from_packed = C0;
    const PackedMatrix packed(c.K, c.N, B.data(), c.N);
    for (int first = 0; first < c.M; first += 5) {
      const int rows = std::min(5, c.M - first);
      gemm_serial_packed(rows, A.data() + first * c.K, c.K, packed, from_packed.data() + first * c.N, c.N,
                         c.epilogue, bias.data());
    }
    for (std::size_t i = 0; i < expected.size(); ++i) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(from_packed[i]), std::bit_cast<std::uint32_t>(expected[i]))
          << "element " << i << " kernel " << gemm_kernel_name() << " (packed)";
    }
  }
}

// accel's split-K hands gemm_serial_packed a column slice of a wider A (lda > K, row tiles
// from an offset) and the rows of B of one K part.
TEST(GemmPacked, SlicesOfWiderOperandsGiveGemmSerialsBits) {
  const int M = 29, N = 75, K = 13, lda = 40, k0 = 9;
  const auto A = values(M * lda, 5), B = values((k0 + K) * N, 6);
  const float* a = A.data() + k0;
  const float* b = B.data() + k0 * N;
  const KernelScope scope;
  for (std::string_view kernel : available_gemm_kernels()) {
    select_gemm_kernel(kernel);
    std::vector<float> expected(static_cast<std::size_t>(M * N)), packed_result(expected.size());
    gemm_serial(M, N, K, a, lda, b, N, expected.data(), N, GemmEpilogue::Store);
    const PackedMatrix packed(K, N, b, N);
    for (int first = 0; first < M; first += 7) {
      gemm_serial_packed(std::min(7, M - first), a + first * lda, lda, packed, packed_result.data() + first * N, N);
    }
    for (std::size_t i = 0; i < expected.size(); ++i) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(packed_result[i]), std::bit_cast<std::uint32_t>(expected[i]))
          << "element " << i << " kernel " << kernel;
    }
  }
}

TEST(GemmKernels, TheDispatchedKernelIsTheFastestTheCpuHas) {
  const std::vector<std::string_view> kernels = available_gemm_kernels();
  ASSERT_FALSE(kernels.empty());
  EXPECT_EQ(kernels.back(), "generic");  // every CPU runs the portable one
  EXPECT_THROW(select_gemm_kernel("avx1024"), std::invalid_argument);
  if (std::getenv("HARNESS_GEMM_KERNEL") == nullptr) {
    EXPECT_EQ(gemm_kernel_name(), kernels.front());
  }
}

std::string case_name(const ::testing::TestParamInfo<GemmCase>& info) {
  const char* epilogue[] = {"store", "bias", "accumulate", "scale"};
  const GemmCase& c = info.param;
  std::ostringstream name;  // (not string operator+: GCC 12 raises a false -Wrestrict on it)
  name << "M" << c.M << "_N" << c.N << "_K" << c.K << "_" << epilogue[static_cast<int>(c.epilogue)];
  return name.str();
}

INSTANTIATE_TEST_SUITE_P(OddAndCanaryShapes, GemmBitwise,
                         ::testing::Values(GemmCase{1, 1, 1, GemmEpilogue::Store}, GemmCase{5, 7, 11, GemmEpilogue::Store},
                                           GemmCase{7, 13, 5, GemmEpilogue::AddBias},
                                           GemmCase{13, 17, 33, GemmEpilogue::Accumulate},
                                           GemmCase{49, 129, 7, GemmEpilogue::AddBias},
                                           GemmCase{100, 48, 64, GemmEpilogue::Accumulate},
                                           GemmCase{64, 384, 128, GemmEpilogue::AddBias},
                                           GemmCase{128, 128, 512, GemmEpilogue::Accumulate},
                                           // 12x32 tiles: row and column edges of every size
                                           GemmCase{25, 95, 9, GemmEpilogue::AddBias},
                                           GemmCase{37, 67, 19, GemmEpilogue::Accumulate},
                                           GemmCase{512, 384, 128, GemmEpilogue::Store},
                                           // accel's fp8 descale in the store: every kernel's edges
                                           GemmCase{5, 7, 11, GemmEpilogue::Scale},
                                           GemmCase{37, 67, 19, GemmEpilogue::Scale},
                                           GemmCase{64, 384, 128, GemmEpilogue::Scale}),
                         case_name);

// Every shape around the 8x8 tiles and the 64x64 blocks: full tiles, both edges, both.
TEST(Transpose, EveryShapeAroundTheTilesSwapsIndices) {
  for (int rows : {1, 7, 8, 9, 63, 64, 65, 130}) {
    for (int cols : {1, 5, 8, 16, 31, 64, 67, 129}) {
      const auto in = values(static_cast<std::size_t>(rows * cols), 11);
      std::vector<float> out(in.size(), -1.0f), serial(in.size(), -1.0f);
      transpose(in.data(), rows, cols, out.data());
      transpose_serial(in.data(), rows, cols, cols, serial.data(), rows);
      bool swapped = true;
      for (int i = 0; i < rows; ++i) {
        for (int j = 0; j < cols; ++j) swapped &= out[static_cast<std::size_t>(j * rows + i)] == in[static_cast<std::size_t>(i * cols + j)];
      }
      EXPECT_TRUE(swapped) << rows << "x" << cols;
      EXPECT_EQ(out, serial) << rows << "x" << cols;
    }
  }
}

TEST(Transpose, SwapsIndices) {
  const auto in = values(5 * 7, 9);
  std::vector<float> out(35), serial(35);
  transpose(in.data(), 5, 7, out.data());
  transpose_serial(in.data(), 5, 7, 7, serial.data(), 5);
  for (int i = 0; i < 5; ++i) {
    for (int j = 0; j < 7; ++j) EXPECT_EQ(out[static_cast<std::size_t>(j * 5 + i)], in[static_cast<std::size_t>(i * 7 + j)]);
  }
  EXPECT_EQ(out, serial);
}

}  // namespace
}  // namespace harness::kernels
