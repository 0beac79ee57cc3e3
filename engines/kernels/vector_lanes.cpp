#include "kernels/vector_lanes.h"

#include <bit>
#include <cstdlib>
#include <cstring>

#include "numerics/det_math.h"
#include "numerics/isa_dispatch.h"

namespace harness::kernels {
namespace {

using numerics::Floats16;
using numerics::Floats4;
using numerics::Floats8;

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

// Real: float or a vector of floats; the same operations in the same order either way.
template <typename Real>
[[gnu::always_inline]] inline Real gelu_value(Real x) {
  const Real cube = kGeluCubic * x * x * x;
  return 0.5f * x * (1.0f + numerics::tanh_rational(kGeluScale * (x + cube)));
}

// d gelu / dx; sech^2 = 1 - tanh^2
template <typename Real>
[[gnu::always_inline]] inline Real gelu_slope(Real x) {
  const Real cube = kGeluCubic * x * x * x;
  const Real th = numerics::tanh_rational(kGeluScale * (x + cube));
  const Real sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + x * 0.5f * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}

template <typename Real>
[[gnu::always_inline]] inline Real sigmoid(Real x) {
  return 1.0f / (1.0f + numerics::exp_poly(-x));
}

// A NaN result as the one quiet NaN 0x7FC00000. Where two NaNs meet, x86 keeps the payload
// of the first operand, and the compiler orders a commutative operation's operands as it
// likes per ISA: without this a NaN's payload (not its NaN-ness) could depend on the width.
template <typename Real>
[[gnu::always_inline]] inline Real canonical_nan(Real x) {
  const Real quiet_nan = Real{} + std::bit_cast<float>(0x7FC00000u);
  return x != x ? quiet_nan : x;
}

template <typename Vec>
constexpr std::int64_t kLanes = static_cast<std::int64_t>(sizeof(Vec) / sizeof(float));

template <typename Vec>
[[gnu::always_inline]] inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename Vec>
[[gnu::always_inline]] inline void store(float* p, Vec v) {
  std::memcpy(p, &v, sizeof v);
}

// Whole vectors, then the tail one element at a time with the scalar code.
template <typename Vec>
[[gnu::always_inline]] inline void gelu_forward_lanes(float* out, const float* inp, std::int64_t i, std::int64_t end) {
  for (; i + kLanes<Vec> <= end; i += kLanes<Vec>) store(out + i, canonical_nan(gelu_value(load<Vec>(inp + i))));
  for (; i < end; ++i) out[i] = canonical_nan(gelu_value(inp[i]));
}
template <typename Vec>
[[gnu::always_inline]] inline void gelu_backward_lanes(float* dinp, const float* inp, const float* dout, std::int64_t i,
                                                       std::int64_t end) {
  for (; i + kLanes<Vec> <= end; i += kLanes<Vec>) {
    store(dinp + i, canonical_nan(load<Vec>(dinp + i) + gelu_slope(load<Vec>(inp + i)) * load<Vec>(dout + i)));
  }
  for (; i < end; ++i) dinp[i] = canonical_nan(dinp[i] + gelu_slope(inp[i]) * dout[i]);
}
template <typename Vec>
[[gnu::always_inline]] inline void exp_lanes(float* x, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + kLanes<Vec> <= n; i += kLanes<Vec>) store(x + i, canonical_nan(numerics::exp_poly(load<Vec>(x + i))));
  for (; i < n; ++i) x[i] = canonical_nan(numerics::exp_poly(x[i]));
}

template <typename Vec>
[[gnu::always_inline]] inline void swiglu_forward_lanes(float* out, const float* gate, const float* up, std::int64_t i,
                                                        std::int64_t end) {
  for (; i + kLanes<Vec> <= end; i += kLanes<Vec>) {
    const Vec g = load<Vec>(gate + i);
    store(out + i, canonical_nan(g * sigmoid(g) * load<Vec>(up + i)));
  }
  for (; i < end; ++i) out[i] = canonical_nan(gate[i] * sigmoid(gate[i]) * up[i]);
}
// silu'(g) = s + g s (1 - s) = s (1 + g (1 - s)), s = sigmoid(g)
template <typename Real>
[[gnu::always_inline]] inline void swiglu_backward_one(Real& dgate, Real& dup, Real dout, Real gate, Real up) {
  const Real s = sigmoid(gate);
  const Real silu = gate * s;
  dgate = canonical_nan(dgate + dout * up * (s * (1.0f + gate * (1.0f - s))));
  dup = canonical_nan(dup + dout * silu);
}
template <typename Vec>
[[gnu::always_inline]] inline void swiglu_backward_lanes(float* dgate, float* dup, const float* dout, const float* gate,
                                                         const float* up, std::int64_t i, std::int64_t end) {
  for (; i + kLanes<Vec> <= end; i += kLanes<Vec>) {
    Vec dg = load<Vec>(dgate + i), du = load<Vec>(dup + i);
    swiglu_backward_one(dg, du, load<Vec>(dout + i), load<Vec>(gate + i), load<Vec>(up + i));
    store(dgate + i, dg);
    store(dup + i, du);
  }
  for (; i < end; ++i) swiglu_backward_one(dgate[i], dup[i], dout[i], gate[i], up[i]);
}

// One set per width, each compiled for its ISA (the x86-64 baseline has SSE2). They are
// spelled out per width because an ISA is a function attribute: the shared templates above
// are inlined into each and compiled with its instructions.
void gelu_forward_sse(float* out, const float* inp, std::int64_t b, std::int64_t e) { gelu_forward_lanes<Floats4>(out, inp, b, e); }
void gelu_backward_sse(float* d, const float* inp, const float* dout, std::int64_t b, std::int64_t e) {
  gelu_backward_lanes<Floats4>(d, inp, dout, b, e);
}
void exp_sse(float* x, std::int64_t n) { exp_lanes<Floats4>(x, n); }
void swiglu_forward_sse(float* out, const float* g, const float* u, std::int64_t b, std::int64_t e) {
  swiglu_forward_lanes<Floats4>(out, g, u, b, e);
}
void swiglu_backward_sse(float* dg, float* du, const float* dout, const float* g, const float* u, std::int64_t b,
                         std::int64_t e) {
  swiglu_backward_lanes<Floats4>(dg, du, dout, g, u, b, e);
}

__attribute__((target("avx2"))) void gelu_forward_avx2(float* out, const float* inp, std::int64_t b, std::int64_t e) {
  gelu_forward_lanes<Floats8>(out, inp, b, e);
}
__attribute__((target("avx2"))) void gelu_backward_avx2(float* d, const float* inp, const float* dout, std::int64_t b,
                                                        std::int64_t e) {
  gelu_backward_lanes<Floats8>(d, inp, dout, b, e);
}
__attribute__((target("avx2"))) void exp_avx2(float* x, std::int64_t n) { exp_lanes<Floats8>(x, n); }
__attribute__((target("avx2"))) void swiglu_forward_avx2(float* out, const float* g, const float* u, std::int64_t b,
                                                         std::int64_t e) {
  swiglu_forward_lanes<Floats8>(out, g, u, b, e);
}
__attribute__((target("avx2"))) void swiglu_backward_avx2(float* dg, float* du, const float* dout, const float* g,
                                                          const float* u, std::int64_t b, std::int64_t e) {
  swiglu_backward_lanes<Floats8>(dg, du, dout, g, u, b, e);
}

__attribute__((target("avx512f"))) void gelu_forward_avx512(float* out, const float* inp, std::int64_t b, std::int64_t e) {
  gelu_forward_lanes<Floats16>(out, inp, b, e);
}
__attribute__((target("avx512f"))) void gelu_backward_avx512(float* d, const float* inp, const float* dout, std::int64_t b,
                                                             std::int64_t e) {
  gelu_backward_lanes<Floats16>(d, inp, dout, b, e);
}
__attribute__((target("avx512f"))) void exp_avx512(float* x, std::int64_t n) { exp_lanes<Floats16>(x, n); }
__attribute__((target("avx512f"))) void swiglu_forward_avx512(float* out, const float* g, const float* u, std::int64_t b,
                                                              std::int64_t e) {
  swiglu_forward_lanes<Floats16>(out, g, u, b, e);
}
__attribute__((target("avx512f"))) void swiglu_backward_avx512(float* dg, float* du, const float* dout, const float* g,
                                                               const float* u, std::int64_t b, std::int64_t e) {
  swiglu_backward_lanes<Floats16>(dg, du, dout, g, u, b, e);
}

struct LaneEntry {
  LaneKernels kernels;
  bool (*supported)();
};

// Widest first.
const std::vector<LaneEntry>& lane_entries() {
  static const std::vector<LaneEntry> entries = {
      {{"avx512-16", gelu_forward_avx512, gelu_backward_avx512, exp_avx512, swiglu_forward_avx512, swiglu_backward_avx512},
       [] { return __builtin_cpu_supports("avx512f") != 0; }},
      {{"avx2-8", gelu_forward_avx2, gelu_backward_avx2, exp_avx2, swiglu_forward_avx2, swiglu_backward_avx2},
       [] { return __builtin_cpu_supports("avx2") != 0; }},
      {{"sse-4", gelu_forward_sse, gelu_backward_sse, exp_sse, swiglu_forward_sse, swiglu_backward_sse}, [] { return true; }},
  };
  return entries;
}

const LaneKernels& choose_lane_kernels() {
  __builtin_cpu_init();
  const char* forced = std::getenv(numerics::kElementwiseKernelVariable);
  if (forced != nullptr && *forced != '\0') {
    for (const LaneEntry& e : lane_entries()) {
      if (e.kernels.name == forced && e.supported()) return e.kernels;
    }
  }
  for (const LaneEntry& e : lane_entries()) {
    if (e.supported()) return e.kernels;
  }
  return lane_entries().back().kernels;
}

}  // namespace

const LaneKernels& lane_kernels() {
  static const LaneKernels& chosen = choose_lane_kernels();
  return chosen;
}

std::vector<const LaneKernels*> supported_lane_kernels() {
  __builtin_cpu_init();
  std::vector<const LaneKernels*> supported;
  for (const LaneEntry& e : lane_entries()) {
    if (e.supported()) supported.push_back(&e.kernels);
  }
  return supported;
}

}  // namespace harness::kernels
