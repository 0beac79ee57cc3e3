// The elementwise math of GELU, SwiGLU and softmax's exp on the widest vectors this CPU has: 4
// fp32 lanes (SSE, the x86-64 baseline), 8 (AVX2) or 16 (AVX-512F), chosen once at run time.
// Every lane runs the same fp32 operations in the same order as the scalar code
// (numerics::tanh_rational, numerics::exp_poly; mul, add, div and selects only, never a
// fused multiply-add), so every width gives the same bits: the width is a speed choice,
// never a numerics one (tests/unit/det_math_test.cpp, tests/cli/gemm_kernels.sh). A NaN
// result is always the quiet NaN 0x7FC00000, so that not even a NaN's payload depends on it.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace harness::kernels {

struct LaneKernels {
  std::string_view name;  // "sse-4", "avx2-8", "avx512-16": the receipt's `kernels` line
  // out[i] = gelu(inp[i]) for i in [begin, end)
  void (*gelu_forward)(float* out, const float* inp, std::int64_t begin, std::int64_t end);
  // dinp[i] += gelu'(inp[i]) * dout[i] for i in [begin, end)
  void (*gelu_backward)(float* dinp, const float* inp, const float* dout, std::int64_t begin, std::int64_t end);
  // x[i] = e^x[i] for i in [0, n)
  void (*exp_inplace)(float* x, std::int64_t n);
  // out[i] = silu(gate[i]) * up[i] for i in [begin, end)
  void (*swiglu_forward)(float* out, const float* gate, const float* up, std::int64_t begin, std::int64_t end);
  // dgate[i] += dout[i] * up[i] * silu'(gate[i]); dup[i] += dout[i] * silu(gate[i])
  void (*swiglu_backward)(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                          std::int64_t begin, std::int64_t end);
};

// The widest this CPU runs, or the one HARNESS_ELEMENTWISE_KERNEL=NAME names (tests, and
// the kernel-choice CLI test); an unknown or unsupported name falls back to the widest.
const LaneKernels& lane_kernels();
// Every width this CPU runs, widest first (tests compare them bit for bit).
std::vector<const LaneKernels*> supported_lane_kernels();

}  // namespace harness::kernels
