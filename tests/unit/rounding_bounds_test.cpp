// Rounding bounds against the code that runs: every fp8 code and the midpoints between
// codes, a million bf16 roundings, sequential and pairwise fp32/bf16 reductions against a
// double-double reference. Each bound must hold, and must be nearly attained where the
// theory says it is, so that a vacuous bound fails too. A negative control checks that
// the fp32 dot product bound rejects an accumulation that rounded its products to bf16.
// Random inputs come from Philox keyed by the case, so any failure replays.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "limited_accumulator_gemm.h"
#include "numerics/formats.h"
#include "numerics/philox.h"
#include "numerics/rounding_bounds.h"

namespace harness::numerics {
namespace {

float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }
double pow2(int e) { return std::ldexp(1.0, e); }
float pow2f(int e) { return from_bits(static_cast<std::uint32_t>(e + 127) << 23); }  // normal range only

constexpr Precision kAllPrecisions[] = {Precision::Fp32, Precision::Bf16, Precision::Fp8E4M3, Precision::Fp8E5M2};
constexpr double kUnitRoundoffFp32 = 0x1p-24;

// The largest error / bound seen, and where: the tightness a test reports and asserts.
struct WorstRatio {
  double ratio = 0, at = 0;
  void observe(double error, double bound, double x) {
    if (error / bound > ratio) ratio = error / bound, at = x;
  }
};

std::string number(double value) {
  std::ostringstream out;
  out.precision(7);
  out << value;
  return out.str();
}

std::string describe(const WorstRatio& worst) { return number(worst.ratio) + " at " + number(worst.at); }

// ---- exact reference -------------------------------------------------------------------

// A sum kept as an unevaluated pair hi + lo, added to with Knuth's TwoSum (exact under
// round-to-nearest without contraction): its error is ~n 2^-106 sum|x|, far below any
// fp32 bound. Products of two floats are exact in double (48 significant bits).
struct DoubleDouble {
  double hi = 0, lo = 0;
  void add(double x) {
    const double sum = hi + x;
    const double x_part = sum - hi;
    lo += (hi - (sum - x_part)) + (x - x_part);
    hi = sum;
  }
  double value() const { return hi + lo; }
};

// ---- seeded inputs ---------------------------------------------------------------------

enum class Distribution { UniformSigned, AllPositive, WideExponents, HeavyCancellation };
constexpr Distribution kAllDistributions[] = {Distribution::UniformSigned, Distribution::AllPositive,
                                              Distribution::WideExponents, Distribution::HeavyCancellation};

const char* name(Distribution distribution) {
  switch (distribution) {
    case Distribution::UniformSigned: return "uniform_signed";
    case Distribution::AllPositive: return "all_positive";
    case Distribution::WideExponents: return "wide_exponents";
    case Distribution::HeavyCancellation: return "heavy_cancellation";
  }
  return "unknown";
}

// Uniform floats from integer bits, exact: 24 random bits times a power of two.
float uniform_signed(std::uint32_t word) {
  return static_cast<float>(static_cast<std::int32_t>(word >> 8) - (1 << 23)) * 0x1p-23f;
}
float uniform_positive(std::uint32_t word) { return static_cast<float>((word >> 8) + 1) * 0x1p-24f; }
float wide_signed(std::uint32_t mantissa_word, std::uint32_t exponent_word) {
  return uniform_signed(mantissa_word) * pow2f(static_cast<int>(exponent_word % 33u) - 16);
}

struct Operands {
  std::vector<float> a, b;
};

// Heavy cancellation: pairs a_j b_j and -a_j b_j' with b_j' one fp32 ulp above b_j, the
// second of each pair in reverse order, so partial sums climb to ~sum|a b| / 2 and then
// cancel down to ~2^-23 of it; an odd k adds one small middle term.
Operands draw_cancelling(std::int64_t k, std::uint64_t seed, std::uint64_t stream) {
  Operands ops{std::vector<float>(static_cast<std::size_t>(k)), std::vector<float>(static_cast<std::size_t>(k))};
  const std::int64_t pairs = k / 2;
  for (std::int64_t j = 0; j < pairs; ++j) {
    const PhiloxBlock w = philox_at(seed, stream, static_cast<std::uint64_t>(j));
    const auto first = static_cast<std::size_t>(j), second = static_cast<std::size_t>(k - 1 - j);
    ops.a[first] = wide_signed(w[0], w[2]);
    ops.b[first] = uniform_positive(w[1]);
    ops.a[second] = -ops.a[first];
    ops.b[second] = from_bits(bits(ops.b[first]) + 1);
  }
  if (k % 2 == 1) {
    const PhiloxBlock w = philox_at(seed, stream, static_cast<std::uint64_t>(k));
    ops.a[static_cast<std::size_t>(pairs)] = uniform_signed(w[0]) * 0x1p-12f;
    ops.b[static_cast<std::size_t>(pairs)] = uniform_positive(w[1]);
  }
  return ops;
}

// k operand pairs of trial `trial`, a pure function of (distribution, k, trial).
Operands draw_operands(Distribution distribution, std::int64_t k, std::uint64_t trial) {
  const std::uint64_t seed = static_cast<std::uint64_t>(k) * 1000 + trial;
  const std::uint64_t stream = stream_id(name(distribution));
  if (distribution == Distribution::HeavyCancellation) return draw_cancelling(k, seed, stream);
  Operands ops{std::vector<float>(static_cast<std::size_t>(k)), std::vector<float>(static_cast<std::size_t>(k))};
  for (std::int64_t i = 0; i < k; ++i) {
    const PhiloxBlock w = philox_at(seed, stream, static_cast<std::uint64_t>(i));
    const auto at = static_cast<std::size_t>(i);
    switch (distribution) {
      case Distribution::UniformSigned: ops.a[at] = uniform_signed(w[0]), ops.b[at] = uniform_signed(w[1]); break;
      case Distribution::AllPositive: ops.a[at] = uniform_positive(w[0]), ops.b[at] = uniform_positive(w[1]); break;
      default: ops.a[at] = wide_signed(w[0], w[2]), ops.b[at] = wide_signed(w[1], w[3]); break;
    }
  }
  return ops;
}

constexpr std::int64_t kDotLengths[] = {1, 2, 3, 7, 64, 1000, 4097};
constexpr std::uint64_t kTrials = 16;

std::string case_id(std::string_view op, std::int64_t k, Distribution distribution, std::uint64_t trial) {
  return std::string(op) + "(k=" + std::to_string(k) + "," + name(distribution) + ",trial=" + std::to_string(trial) + ")";
}

// ---- the reductions under test -----------------------------------------------------------

// An fp32 kernel's inner loop: each product rounded to float, then added in order.
// (The product is a named float and the build uses -ffp-contract=off: no FMA.)
float sequential_dot_fp32(const Operands& ops) {
  float sum = 0.0f;
  for (std::size_t i = 0; i < ops.a.size(); ++i) {
    const float product = ops.a[i] * ops.b[i];
    sum = sum + product;
  }
  return sum;
}

// engines/kernels/gemm.h's inner loop: one FMA chain, one rounding per term.
float fma_chain_dot_fp32(const Operands& ops) {
  float sum = 0.0f;
  for (std::size_t i = 0; i < ops.a.size(); ++i) sum = std::fma(ops.a[i], ops.b[i], sum);
  return sum;
}

// What "an fp32 matmul that silently ran in bf16" computes: products rounded to bf16.
float sequential_dot_bf16_products(const Operands& ops) {
  float sum = 0.0f;
  for (std::size_t i = 0; i < ops.a.size(); ++i) {
    const float product = round_to_bf16(ops.a[i] * ops.b[i]);
    sum = sum + product;
  }
  return sum;
}

// A bf16 accumulator: the fp32 add then rounded to bf16. That rounds twice, yet each step
// stays within u_bf16 |s + x| in the normal range: the fp32 rounding can move a sum only
// 2^-24 relative, and the one place it matters (a bf16 tie) lies at least 2^-16 relative
// inside the bound.
float sequential_sum_bf16(const std::vector<float>& x) {
  float sum = 0.0f;
  for (float value : x) sum = round_to_bf16(sum + value);
  return sum;
}

float pairwise_sum_fp32(const float* x, std::size_t n) {
  if (n == 0) return 0.0f;
  if (n == 1) return x[0];
  const std::size_t half = n / 2;
  return pairwise_sum_fp32(x, half) + pairwise_sum_fp32(x + half, n - half);
}

float pairwise_sum_bf16(const float* x, std::size_t n) {
  if (n == 0) return 0.0f;
  if (n == 1) return x[0];
  const std::size_t half = n / 2;
  return round_to_bf16(pairwise_sum_bf16(x, half) + pairwise_sum_bf16(x + half, n - half));
}

struct ExactDot {
  double value, sum_abs;
};

ExactDot exact_dot(const Operands& ops) {
  DoubleDouble sum, sum_abs;
  for (std::size_t i = 0; i < ops.a.size(); ++i) {
    const double product = static_cast<double>(ops.a[i]) * static_cast<double>(ops.b[i]);
    sum.add(product);
    sum_abs.add(std::fabs(product));
  }
  return {sum.value(), sum_abs.value()};
}

ExactDot exact_sum(const std::vector<float>& x) {
  DoubleDouble sum, sum_abs;
  for (float value : x) sum.add(value), sum_abs.add(std::fabs(static_cast<double>(value)));
  return {sum.value(), sum_abs.value()};
}

std::vector<float> to_bf16(const std::vector<float>& x) {
  std::vector<float> rounded(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) rounded[i] = round_to_bf16(x[i]);
  return rounded;
}

// ---- gamma, ulp_of, error_in_ulps ----------------------------------------------------------

TEST(Gamma, IsHighamsFormulaBelowOne) {
  EXPECT_EQ(gamma(0, kUnitRoundoffFp32), 0.0);
  EXPECT_EQ(gamma(1, kUnitRoundoffFp32), 0x1p-24 / (1.0 - 0x1p-24));
  EXPECT_EQ(gamma(std::int64_t{1} << 23, kUnitRoundoffFp32), 1.0);  // n u = 1/2
  EXPECT_EQ(gamma(15, 0x1p-4), 15.0);                                  // e4m3, n u = 15/16
}

TEST(Gamma, RefusesWhenNuReachesOneAndSaysWhy) {
  const std::pair<std::int64_t, double> n_and_u[] = {{std::int64_t{1} << 24, 0x1p-24}, {16, 0x1p-4}, {8, 0x1p-3}, {300, 0x1p-8}};
  for (const auto& [n, u] : n_and_u) {
    try {
      gamma(n, u);
      ADD_FAILURE() << "gamma(" << n << ", " << u << ") returned";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("n*u"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::to_string(n)), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(gamma(-1, kUnitRoundoffFp32), std::invalid_argument);
  // A bf16 accumulator has a sequential bound for at most 256 terms; pairwise for far more.
  EXPECT_EQ(recursive_sum_bound(256, 1.0, Precision::Bf16), 255.0);
  EXPECT_THROW(recursive_sum_bound(257, 1.0, Precision::Bf16), std::invalid_argument);
  EXPECT_THROW(dot_product_bound(256, 1.0, Precision::Bf16), std::invalid_argument);
  EXPECT_EQ(pairwise_sum_bound(4097, 1.0, Precision::Bf16), gamma(13, 0x1p-8));
}

TEST(Gamma, PairwiseDepthIsCeilLog2) {
  const std::pair<std::int64_t, std::int64_t> n_and_depth[] = {
      {0, 0}, {1, 0}, {2, 1}, {3, 2}, {4, 2}, {5, 3}, {1024, 10}, {1025, 11}, {(std::int64_t{1} << 40) + 1, 41}};
  for (const auto& [n, depth] : n_and_depth) {
    EXPECT_EQ(pairwise_sum_bound(n, 1.0, Precision::Fp32), gamma(depth, kUnitRoundoffFp32)) << n;
  }
  EXPECT_EQ(recursive_sum_bound(0, 1.0, Precision::Fp32), 0.0);
  EXPECT_EQ(recursive_sum_bound(1, 1.0, Precision::Fp32), 0.0);
  EXPECT_EQ(recursive_sum_bound(1001, 2.0, Precision::Fp32), gamma(1000, kUnitRoundoffFp32) * 2.0);
  EXPECT_EQ(dot_product_bound(64, 2.0, Precision::Fp32), gamma(64, kUnitRoundoffFp32) * 2.0);
}

TEST(PrecisionTraits, MatchTheFormatsCode) {
  const PrecisionTraits fp32 = precision_traits(Precision::Fp32), bf16 = precision_traits(Precision::Bf16);
  const PrecisionTraits e4m3 = precision_traits(Precision::Fp8E4M3), e5m2 = precision_traits(Precision::Fp8E5M2);
  EXPECT_EQ(fp32.unit_roundoff, 0x1p-24);
  EXPECT_EQ(bf16.unit_roundoff, 0x1p-8);
  EXPECT_EQ(e4m3.unit_roundoff, 0x1p-4);
  EXPECT_EQ(e5m2.unit_roundoff, 0x1p-3);
  // The least positive code of each format, decoded by formats.h.
  EXPECT_EQ(fp32.smallest_spacing, static_cast<double>(from_bits(1)));  // 2^-149
  EXPECT_EQ(bf16.smallest_spacing, static_cast<double>(bf16_to_fp32(1)));
  EXPECT_EQ(bf16.smallest_spacing, 0x1p-133);  // fp32's exponent range with 7 fraction bits
  EXPECT_EQ(e4m3.smallest_spacing, static_cast<double>(fp8_to_fp32(1, Fp8Format::E4M3)));
  EXPECT_EQ(e4m3.smallest_spacing, 0x1p-9);
  EXPECT_EQ(e5m2.smallest_spacing, static_cast<double>(fp8_to_fp32(1, Fp8Format::E5M2)));
  EXPECT_EQ(e5m2.smallest_spacing, 0x1p-16);
  EXPECT_EQ(fp32.max_finite, static_cast<double>(std::numeric_limits<float>::max()));
  EXPECT_EQ(bf16.max_finite, static_cast<double>(bf16_to_fp32(0x7F7F)));
  EXPECT_EQ(e4m3.max_finite, 448.0);
  EXPECT_EQ(e5m2.max_finite, 57344.0);
  EXPECT_EQ(fp8_precision(Fp8Format::E4M3), Precision::Fp8E4M3);
  EXPECT_EQ(fp8_precision(Fp8Format::E5M2), Precision::Fp8E5M2);
  EXPECT_EQ(to_string(Precision::Fp8E5M2), "e5m2");
}

TEST(UlpOf, AtOneAndAcrossTheNormalSubnormalBoundary) {
  EXPECT_EQ(ulp_of(1.0, Precision::Fp32), 0x1p-23);
  EXPECT_EQ(ulp_of(1.0, Precision::Bf16), 0x1p-7);
  EXPECT_EQ(ulp_of(1.0, Precision::Fp8E4M3), 0x1p-3);
  EXPECT_EQ(ulp_of(1.0, Precision::Fp8E5M2), 0x1p-2);
  EXPECT_EQ(ulp_of(-1.0, Precision::Fp8E5M2), 0x1p-2);
  EXPECT_EQ(ulp_of(2.0 - 0x1p-30, Precision::Fp32), 0x1p-23);
  EXPECT_EQ(ulp_of(2.0, Precision::Fp32), 0x1p-22);
  for (Precision p : kAllPrecisions) {
    const PrecisionTraits t = precision_traits(p);
    const double least_normal = pow2(t.min_normal_exponent);
    // The spacing is the subnormal step from zero up to and including the least normal's binade.
    EXPECT_EQ(ulp_of(0.0, p), t.smallest_spacing) << to_string(p);
    EXPECT_EQ(ulp_of(t.smallest_spacing, p), t.smallest_spacing) << to_string(p);
    EXPECT_EQ(ulp_of(least_normal / 2, p), t.smallest_spacing) << to_string(p);
    EXPECT_EQ(ulp_of(least_normal, p), t.smallest_spacing) << to_string(p);
    EXPECT_EQ(ulp_of(2 * least_normal, p), 2 * t.smallest_spacing) << to_string(p);
    EXPECT_TRUE(std::isnan(ulp_of(std::numeric_limits<double>::infinity(), p)));
  }
  EXPECT_EQ(ulp_of(448.0, Precision::Fp8E4M3), 32.0);
  EXPECT_EQ(ulp_of(57344.0, Precision::Fp8E5M2), 8192.0);
}

// ulp_of(v) is the distance to the next code up, for every finite fp8 and bf16 code.
TEST(UlpOf, IsTheGapToTheNextCodeForEveryCode) {
  for (Fp8Format format : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const Precision p = fp8_precision(format);
    for (int code = 0; code < 0x7F; ++code) {
      const double v = fp8_to_fp32(static_cast<std::uint8_t>(code), format);
      const double next = fp8_to_fp32(static_cast<std::uint8_t>(code + 1), format);
      if (!std::isfinite(next)) break;
      ASSERT_EQ(ulp_of(v, p), next - v) << to_string(format) << " code " << code;
      ASSERT_EQ(ulp_of(-v, p), next - v) << to_string(format) << " code " << code;
    }
  }
  for (std::uint32_t code = 0; code < 0x7F7F; ++code) {
    const double v = bf16_to_fp32(static_cast<std::uint16_t>(code));
    ASSERT_EQ(ulp_of(v, Precision::Bf16), bf16_to_fp32(static_cast<std::uint16_t>(code + 1)) - v) << code;
  }
  for (std::uint64_t i = 0; i < 100000; ++i) {
    const std::uint32_t u = philox_at(3, stream_id("ulp_of/fp32"), i)[0] & 0x7FFFFFFFu;
    if (u >= 0x7F7FFFFFu) continue;  // the largest finite and inf/NaN have no finite next code
    const double v = from_bits(u);
    ASSERT_EQ(ulp_of(v, Precision::Fp32), static_cast<double>(from_bits(u + 1)) - v) << std::hex << u;
  }
}

TEST(ErrorInUlps, MeasuresAgainstTheExactValuesSpacing) {
  EXPECT_EQ(error_in_ulps(1.0 + 0x1p-23, 1.0, Precision::Fp32), 1.0);
  EXPECT_EQ(error_in_ulps(1.0, 1.0 + 0x1p-4, Precision::Fp8E4M3), 0.5);
  EXPECT_EQ(error_in_ulps(0x1p-149, 0.0, Precision::Fp32), 1.0);   // exact zero: the least spacing
  EXPECT_EQ(error_in_ulps(0x1p-10, 0.0, Precision::Fp8E4M3), 0.5);
  EXPECT_EQ(error_in_ulps(-0x1p-16, 0.0, Precision::Fp8E5M2), 1.0);
}

// ---- rounding to a format ------------------------------------------------------------------

// Checks |fl(x) - x| <= rounding_bound(x) and error_in_ulps <= 1/2 for one input, and
// records the ratio separately for normal and subnormal x (the two terms of the bound).
struct RoundingCheck {
  explicit RoundingCheck(Precision checked_precision) : precision(checked_precision) {}

  Precision precision;
  WorstRatio normal, subnormal;
  std::int64_t checked = 0, beyond_max = 0;

  void check(float x, float rounded) {
    const double bound = rounding_bound(x, precision);
    const PrecisionTraits t = precision_traits(precision);
    if (std::fabs(static_cast<double>(x)) > t.max_finite) {
      ASSERT_TRUE(std::isinf(bound)) << x;  // the format does not hold x: no bound
      ++beyond_max;
      return;
    }
    const double error = std::fabs(static_cast<double>(rounded) - static_cast<double>(x));  // exact: nearby floats
    ASSERT_LE(error, bound) << to_string(precision) << " x=" << x << " rounded=" << rounded;
    ASSERT_LE(error_in_ulps(rounded, x, precision), 0.5) << to_string(precision) << " x=" << x;
    (std::fabs(static_cast<double>(x)) < pow2(t.min_normal_exponent) ? subnormal : normal).observe(error, bound, x);
    ++checked;
  }
};

// The worst case of rounding to nearest: the midpoint just above a power of two has
// error u 2^e against a bound u 2^e (1 + u); the first subnormal midpoint has error s/2
// against u s/2 + s/2. Either way error/bound reaches 1/(1 + u).
double attainable_ratio(Precision p) { return 1.0 / (1.0 + precision_traits(p).unit_roundoff); }

TEST(RoundingBound, EveryFp8CodeMidpointAndNeighbourIsWithinTheBoundAndTheBoundIsAttained) {
  for (Fp8Format format : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    RoundingCheck check{fp8_precision(format)};
    for (int code = 0; code < 0x7F; ++code) {
      const float v = fp8_to_fp32(static_cast<std::uint8_t>(code), format);
      const float next = fp8_to_fp32(static_cast<std::uint8_t>(code + 1), format);
      if (!std::isfinite(next)) break;  // v is the largest finite code
      const float midpoint = (v + next) / 2;  // exact: one bit more than the format holds
      const std::uint32_t m = bits(midpoint);
      for (float x : {v, midpoint, from_bits(m - 1), from_bits(m + 1), from_bits(bits(v) + 1), from_bits(bits(next) - 1)}) {
        ASSERT_NO_FATAL_FAILURE(check.check(x, round_to_fp8(x, format)));
        ASSERT_NO_FATAL_FAILURE(check.check(-x, round_to_fp8(-x, format)));
      }
    }
    const double max_finite = fp8_traits(format).max_finite;
    check.check(from_bits(bits(static_cast<float>(max_finite)) + 1), 0.0f);  // beyond max: +inf bound
    EXPECT_EQ(check.beyond_max, 1);
    EXPECT_GE(check.checked, 6 * 2 * 100);
    // Tight: the worst case reaches 1/(1 + u) in both ranges (up to the other term).
    EXPECT_GE(check.normal.ratio, attainable_ratio(check.precision) * (1 - 0x1p-12)) << to_string(format);
    EXPECT_EQ(check.subnormal.ratio, attainable_ratio(check.precision)) << to_string(format);
    RecordProperty(std::string(to_string(format)) + "_normal_worst_error_over_bound", describe(check.normal));
    RecordProperty(std::string(to_string(format)) + "_subnormal_worst_error_over_bound", describe(check.subnormal));
  }
}

TEST(RoundingBound, Bf16OverEveryExponentWithRandomMantissasIsWithinTheBoundAndAttained) {
  RoundingCheck check{Precision::Bf16};
  // 255 fp32 exponents (all but inf/NaN) x 4096 random sign and mantissa patterns.
  for (std::uint32_t exponent = 0; exponent < 255; ++exponent) {
    for (std::uint64_t i = 0; i < 4096; ++i) {
      const std::uint32_t w = philox_at(exponent, stream_id("rounding_bound/bf16"), i)[0];
      const float x = from_bits((w & 0x80000000u) | exponent << 23 | (w & 0x7FFFFFu));
      ASSERT_NO_FATAL_FAILURE(check.check(x, round_to_bf16(x)));
    }
  }
  // Every bf16 tie, where the bound is attained.
  for (std::uint32_t code = 0; code < 0x7F80; ++code) {
    const float tie = from_bits(code << 16 | 0x8000u);
    ASSERT_NO_FATAL_FAILURE(check.check(tie, round_to_bf16(tie)));
  }
  EXPECT_GE(check.checked, 1000000);
  EXPECT_GE(check.normal.ratio, attainable_ratio(Precision::Bf16) * (1 - 0x1p-20));
  EXPECT_EQ(check.subnormal.ratio, attainable_ratio(Precision::Bf16));
  RecordProperty("bf16_normal_worst_error_over_bound", describe(check.normal));
  RecordProperty("bf16_subnormal_worst_error_over_bound", describe(check.subnormal));
  RecordProperty("bf16_values_checked", std::to_string(check.checked));
}

TEST(RoundingBound, Fp32FromRandomDoublesIsWithinTheBound) {
  WorstRatio worst;
  for (std::uint64_t i = 0; i < 200000; ++i) {
    const PhiloxBlock w = philox_at(5, stream_id("rounding_bound/fp32"), i);
    const std::uint64_t bits53 = (static_cast<std::uint64_t>(w[0]) << 21 | w[1] >> 11) | (std::uint64_t{1} << 52);
    const double mantissa = static_cast<double>(bits53) * 0x1p-52;  // [1, 2), all 53 bits random
    const double x = std::ldexp(mantissa, static_cast<int>(w[2] % 280u) - 152) * ((w[3] & 1) ? -1 : 1);  // 2^-152 .. 2^128
    const auto rounded = static_cast<float>(x);
    const double bound = rounding_bound(x, Precision::Fp32);
    if (std::isinf(bound)) continue;
    const double error = std::fabs(static_cast<double>(rounded) - x);
    ASSERT_LE(error, bound) << x;
    worst.observe(error, bound, x);
  }
  EXPECT_GE(worst.ratio, 0.5);
  RecordProperty("fp32_worst_error_over_bound", describe(worst));
}

TEST(RoundingBound, ScaleDividesTheUnderflowTermAndMaxFiniteIsTheEdge) {
  EXPECT_EQ(rounding_bound(0.0, Precision::Fp8E4M3), 0x1p-10);
  EXPECT_EQ(rounding_bound(0.0, Precision::Fp8E4M3, 0x1p10), 0x1p-20);
  EXPECT_EQ(rounding_bound(1.0, Precision::Fp8E5M2), 0x1p-3 + 0x1p-17);
  EXPECT_EQ(rounding_bound(448.0, Precision::Fp8E4M3), 28.0 + 0x1p-10);
  EXPECT_TRUE(std::isinf(rounding_bound(448.5, Precision::Fp8E4M3)));
  EXPECT_TRUE(std::isinf(rounding_bound(-448.5, Precision::Fp8E4M3)));
  EXPECT_TRUE(std::isinf(rounding_bound(1.0, Precision::Fp8E4M3, 449.0)));
  EXPECT_TRUE(std::isinf(rounding_bound(std::numeric_limits<double>::quiet_NaN(), Precision::Fp32)));
  EXPECT_THROW(rounding_bound(1.0, Precision::Fp8E4M3, 0.0), std::invalid_argument);
  EXPECT_THROW(rounding_bound(1.0, Precision::Fp8E4M3, std::numeric_limits<double>::infinity()), std::invalid_argument);
}

// scale_round_to_fp8 then an exact division: with a power-of-two scale the code's own
// multiply is exact, so the bound applies as stated.
TEST(RoundingBound, PowerOfTwoScalesThroughScaleRoundToFp8) {
  for (Fp8Format format : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const Precision p = fp8_precision(format);
    WorstRatio worst;
    std::int64_t in_range = 0;
    for (int k = -20; k <= 20; ++k) {
      const float scale = pow2f(k);
      for (std::uint64_t i = 0; i < 2000; ++i) {
        const PhiloxBlock w = philox_at(static_cast<std::uint64_t>(k + 100), stream_id(to_string(format).data()), i);
        const float x = wide_signed(w[0], w[1]) * pow2f(static_cast<int>(w[2] % 21u) - 10);
        float quantised = 0;
        scale_round_to_fp8(&x, scale, &quantised, 1, format);
        const float dequantised = quantised / scale;  // exact: a power of two, no underflow here
        const double bound = rounding_bound(x, p, scale);
        if (std::isinf(bound)) continue;  // saturated
        const double error = std::fabs(static_cast<double>(dequantised) - static_cast<double>(x));
        ASSERT_LE(error, bound) << to_string(format) << " x=" << x << " scale=2^" << k;
        worst.observe(error, bound, x);
        ++in_range;
      }
    }
    EXPECT_GE(in_range, 20000);
    EXPECT_GE(worst.ratio, 0.85);
    RecordProperty(std::string(to_string(format)) + "_scaled_worst_error_over_bound", describe(worst));
  }
}

// Transformer Engine's scales (fp8_max / amax) are not powers of two: the code's multiply
// fl(x s), the inverse fl(1/s) and the dequantising multiply each round in fp32. With
// fl(x s) = x s (1+d1), q = fl8(.) (1+d2) + e, out = q fl(1/s) (1+d4), fl(1/s) = (1+d3)/s:
//   |out - x| <= rounding_bound(x, s) (1+u32)^2 + (1 + u8) gamma_3(u32) |x|.
TEST(RoundingBound, TransformerEngineScalesWithinTheBoundPlusTheFp32Roundings) {
  for (Fp8Format format : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const Precision p = fp8_precision(format);
    const double u8 = precision_traits(p).unit_roundoff;
    const float fp8_max = fp8_traits(format).max_finite;
    WorstRatio worst;
    for (std::uint64_t i = 0; i < 50000; ++i) {
      const PhiloxBlock w = philox_at(9, stream_id(to_string(format).data()), i);
      const float amax = uniform_positive(w[0]) * pow2f(static_cast<int>(w[1] % 21u) - 10);
      const float x = uniform_signed(w[2]) * amax * uniform_positive(w[3]);
      const float scale = fp8_max / amax;
      float quantised = 0;
      scale_round_to_fp8(&x, scale, &quantised, 1, format);
      const float dequantised = quantised * (1.0f / scale);
      const double stated = rounding_bound(x, p, scale);
      if (std::isinf(stated)) continue;
      const double bound = stated * (1 + kUnitRoundoffFp32) * (1 + kUnitRoundoffFp32) +
                           (1 + u8) * gamma(3, kUnitRoundoffFp32) * std::fabs(static_cast<double>(x));
      const double error = std::fabs(static_cast<double>(dequantised) - static_cast<double>(x));
      ASSERT_LE(error, bound) << to_string(format) << " x=" << x << " amax=" << amax;
      worst.observe(error, bound, x);
    }
    EXPECT_GE(worst.ratio, 0.85);
    RecordProperty(std::string(to_string(format)) + "_te_scale_worst_error_over_bound", describe(worst));
  }
}

// ---- dot products and sums ------------------------------------------------------------------

TEST(DotProductBound, SequentialFp32DotAndFmaChainAreWithinGammaK) {
  std::ostringstream tightness;
  tightness.precision(3);
  for (Distribution distribution : kAllDistributions) {
    for (std::int64_t k : kDotLengths) {
      WorstRatio worst, worst_fma;
      for (std::uint64_t trial = 0; trial < kTrials; ++trial) {
        const Operands ops = draw_operands(distribution, k, trial);
        const ExactDot exact = exact_dot(ops);
        const double bound = dot_product_bound(k, exact.sum_abs, Precision::Fp32);
        const double error = std::fabs(static_cast<double>(sequential_dot_fp32(ops)) - exact.value);
        ASSERT_LE(error, bound) << case_id("dot_fp32", k, distribution, trial);
        worst.observe(error, bound, static_cast<double>(trial));
        const double error_fma = std::fabs(static_cast<double>(fma_chain_dot_fp32(ops)) - exact.value);
        ASSERT_LE(error_fma, bound) << case_id("dot_fp32_fma", k, distribution, trial);
        worst_fma.observe(error_fma, bound, static_cast<double>(trial));
      }
      tightness << name(distribution) << "/k=" << k << ":" << worst.ratio << ",fma " << worst_fma.ratio << " ";
    }
  }
  RecordProperty("worst_error_over_bound", tightness.str());
}

// The bound can tell precisions apart: products rounded to bf16 leave errors of order
// 2^-9 |a b| each, far beyond gamma_64(2^-24), yet within the bf16 bound.
TEST(DotProductBound, Fp32BoundRejectsProductsRoundedToBf16) {
  constexpr std::int64_t k = 64;
  std::int64_t rejected = 0;
  WorstRatio smallest_excess{1e300, 0};
  for (std::uint64_t trial = 0; trial < kTrials; ++trial) {
    const Operands ops = draw_operands(Distribution::UniformSigned, k, trial);
    const ExactDot exact = exact_dot(ops);
    const double error = std::fabs(static_cast<double>(sequential_dot_bf16_products(ops)) - exact.value);
    const double fp32_bound = dot_product_bound(k, exact.sum_abs, Precision::Fp32);
    ASSERT_LE(error, dot_product_bound(k, exact.sum_abs, Precision::Bf16))
        << case_id("dot_bf16_products", k, Distribution::UniformSigned, trial);
    if (error > fp32_bound) ++rejected;
    if (error / fp32_bound < smallest_excess.ratio) smallest_excess = {error / fp32_bound, static_cast<double>(trial)};
  }
  EXPECT_EQ(rejected, static_cast<std::int64_t>(kTrials));
  RecordProperty("rejected_trials", std::to_string(rejected) + "/" + std::to_string(kTrials));
  RecordProperty("least_error_over_fp32_bound", describe(smallest_excess));
}

// An FP8 GEMM as accel runs one (engines/accel/accel_engine.cpp): each operand quantised with
// its scale (scale_round_to_fp8), the products summed in fp32, the sum multiplied by the
// descale (1/s_a)(1/s_b) in fp32 and added to a bias. `descale_fault` multiplies the
// descale's s_a (a scale off by a power of two between quantising and dequantising).
float scaled_dot_fp32(const Operands& ops, float scale_a, float scale_b, float bias, Fp8Format format,
                      float descale_fault = 1.0f) {
  const std::size_t k = ops.a.size();
  std::vector<float> qa(k), qb(k);
  scale_round_to_fp8(ops.a.data(), scale_a, qa.data(), static_cast<std::int64_t>(k), format);
  scale_round_to_fp8(ops.b.data(), scale_b, qb.data(), static_cast<std::int64_t>(k), format);
  float partial = 0;
  for (std::size_t i = 0; i < k; ++i) partial += qa[i] * qb[i];
  const float descale = (1.0f / (scale_a * descale_fault)) * (1.0f / scale_b);
  return bias + partial * descale;
}

float amax(const std::vector<float>& x) {
  float m = 0;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m;
}

// Scales as Transformer Engine's current scaling makes them (fp8_max / amax, no power of
// two), and that scale times 2^-3 (the tensor far from the format's top, its small values
// in the subnormal steps): each within the bound, the bound attained within a small factor,
// and the descale fault over it in every trial.
TEST(ScaledDotBound, Fp8GemmsWithTheirScalesAreWithinAndADescaleFaultIsNot) {
  std::ostringstream tightness;
  tightness.precision(3);
  for (Fp8Format format : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const Precision p = fp8_precision(format);
    const float fp8_max = fp8_traits(format).max_finite;
    double format_worst = 0;
    for (Distribution distribution : kAllDistributions) {
      WorstRatio worst;
      for (std::int64_t k : kDotLengths) {
        for (std::uint64_t trial = 0; trial < kTrials; ++trial) {
          const Operands ops = draw_operands(distribution, k, trial);
          const float bias = ops.a[0] * 0.5f;
          for (const float under : {1.0f, 0.125f}) {
            const float scale_a = fp8_max / amax(ops.a) * under, scale_b = fp8_max / amax(ops.b) * under;
            DoubleDouble exact;
            DotSums sums{k, 0, 0, 0, std::fabs(static_cast<double>(bias))};
            for (std::size_t i = 0; i < ops.a.size(); ++i) {
              const double product = static_cast<double>(ops.a[i]) * ops.b[i];
              exact.add(product);
              sums.abs_products += std::fabs(product);
              sums.abs_a += std::fabs(static_cast<double>(ops.a[i]));
              sums.abs_b += std::fabs(static_cast<double>(ops.b[i]));
            }
            exact.add(bias);
            const double bound = rounded_operands_dot_bound(sums, scaled_rounding(p, scale_a), scaled_rounding(p, scale_b), 4);
            const double error = std::fabs(static_cast<double>(scaled_dot_fp32(ops, scale_a, scale_b, bias, format)) - exact.value());
            ASSERT_LE(error, bound) << case_id(to_string(format), k, distribution, trial) << " under " << under;
            worst.observe(error, bound, static_cast<double>(k));
            const double faulty = scaled_dot_fp32(ops, scale_a, scale_b, bias, format, 2.0f);
            if (sums.abs_products > 0 && std::fabs(exact.value() - bias) > 4 * bound) {  // not a cancelled sum
              EXPECT_GT(std::fabs(faulty - exact.value()), bound) << case_id("descale_fault", k, distribution, trial);
            }
          }
        }
      }
      tightness << to_string(format) << "/" << name(distribution) << ":" << worst.ratio << " ";
      format_worst = std::max(format_worst, worst.ratio);
    }
    // Attained within a small factor on some distribution (not on heavy cancellation, whose
    // pairs quantise to the same code and cancel exactly).
    EXPECT_GE(format_worst, 0.25) << to_string(format) << ": " << tightness.str();
  }
  RecordProperty("worst_error_over_bound", tightness.str());
}

// The general form reduces to the format-rounded one the oracle used before it: both
// operands rounded to bf16, no scale, no descale.
TEST(ScaledDotBound, WithFormatRoundingsIsTheRoundedOperandsBound) {
  const double u = precision_traits(Precision::Bf16).unit_roundoff, grow = (1 + u) * (1 + u);
  const DotSums sums{64, 10.0, 3.0, 5.0, 0.5};
  const double bound = rounded_operands_dot_bound(sums, format_rounding(Precision::Bf16), format_rounding(Precision::Bf16));
  const double before = (grow - 1) * 10.0 + dot_product_bound(65, grow * 10.0 + 0.5, Precision::Fp32);
  EXPECT_NEAR(bound, before, 1e-15 * before);
  EXPECT_THROW(scaled_rounding(Precision::Fp8E4M3, 0.0), std::invalid_argument);
}

// ---- a limited accumulator ------------------------------------------------------------------

// accel's FP8 GEMM accumulator (engines/accel/limited_accumulator_gemm.h), the real kernels
// on one dot product copied to 8 columns (the AVX2 kernel's width; the portable one too):
// within rounded_operands_dot_bound with the accumulator accel declares, for every
// distribution, length and interval. On all-positive terms every cut loses toward zero and
// the losses add up: there the bound is approached within a small factor, and the fp32
// bound, which the oracle applied to it before, is exceeded wherever a run is 64 products long.
TEST(LimitedAccumulatorBound, TheKernelsAreWithinAndAllPositiveRunsComeNearIt) {
  constexpr int kColumns = 8;
  std::ostringstream tightness;
  tightness.precision(3);
  for (const std::int64_t interval : {1, 16, 128}) {
    const LimitedAccumulator accumulator{interval, accel::kLimitedAccumulatorFractionBits};
    for (Distribution distribution : kAllDistributions) {
      WorstRatio worst;
      for (std::int64_t k : kDotLengths) {
        for (std::uint64_t trial = 0; trial < kTrials; ++trial) {
          const Operands ops = draw_operands(distribution, k, trial);
          std::vector<float> b(static_cast<std::size_t>(k) * kColumns);
          for (std::int64_t t = 0; t < k; ++t) std::fill_n(b.begin() + t * kColumns, kColumns, ops.b[t]);
          std::vector<float> dispatched(kColumns), portable(kColumns);
          const int K = static_cast<int>(k), run = static_cast<int>(interval);
          accel::gemm_limited_accumulator(1, kColumns, K, ops.a.data(), K, b.data(), kColumns, dispatched.data(), kColumns, run);
          accel::gemm_limited_accumulator_generic(1, kColumns, K, ops.a.data(), K, b.data(), kColumns, portable.data(),
                                                  kColumns, run);
          const ExactDot exact = exact_dot(ops);
          const double bound = rounded_operands_dot_bound({k, exact.sum_abs, 0, 0, 0}, {0, 0}, {0, 0}, 0, accumulator);
          const std::string id = case_id("limited_" + std::to_string(interval), k, distribution, trial);
          for (int n = 0; n < kColumns; ++n) {
            ASSERT_LE(std::fabs(static_cast<double>(dispatched[n]) - exact.value), bound) << id << " column " << n;
            ASSERT_LE(std::fabs(static_cast<double>(portable[n]) - exact.value), bound) << id << " portable";
          }
          const double error = std::fabs(static_cast<double>(dispatched[0]) - exact.value);
          worst.observe(error, bound, static_cast<double>(k));
          if (distribution == Distribution::AllPositive && std::min(k, interval) >= 64) {
            EXPECT_GT(error, dot_product_bound(k, exact.sum_abs, Precision::Fp32)) << id << ": within fp32's bound";
          }
        }
      }
      tightness << interval << "/" << name(distribution) << ":" << worst.ratio << " ";
      if (distribution == Distribution::AllPositive && interval >= 16) {
        EXPECT_GE(worst.ratio, 0.1) << tightness.str();
      }
    }
  }
  RecordProperty("worst_error_over_bound", tightness.str());
}

// With interval 0 it is the fp32 bound; a run longer than the dot product is the dot
// product; a run whose n u_run reaches 1 bounds nothing (+inf), never a throw.
TEST(LimitedAccumulatorBound, ReducesToTheFp32BoundAndSaysInfinityWhereARunKeepsNoDigit) {
  const DotSums sums{64, 10.0, 3.0, 5.0, 0.5};
  const OperandRounding exact{0, 0};
  EXPECT_NEAR(rounded_operands_dot_bound(sums, exact, exact, 4, {}), dot_product_bound(64 + 1 + 4, 10.5, Precision::Fp32),
              1e-15);
  const LimitedAccumulator fourteen_bits{128, 13};
  EXPECT_EQ(rounded_operands_dot_bound(sums, exact, exact, 0, fourteen_bits),
            rounded_operands_dot_bound(sums, exact, exact, 0, {64, 13}));
  EXPECT_NEAR(limited_step_error(fourteen_bits), pow2(-24) + pow2(-13) + pow2(-37), 1e-30);
  const double g_run = gamma(64, limited_step_error(fourteen_bits)), g = gamma(65, pow2(-24));
  EXPECT_NEAR(rounded_operands_dot_bound(sums, exact, exact, 0, fourteen_bits), (g_run + g * (1 + g_run)) * 10.0 + g * 0.5,
              1e-15);
  EXPECT_EQ(rounded_operands_dot_bound({20000, 1.0, 0, 0, 0}, exact, exact, 0, {20000, 13}),
            std::numeric_limits<double>::infinity());
}

TEST(SumBound, SequentialBf16SumIsWithinGammaNMinus1AndRefusesPast256Terms) {
  std::ostringstream tightness;
  tightness.precision(3);
  for (Distribution distribution : kAllDistributions) {
    for (std::int64_t n : kDotLengths) {
      if (n > 256) {
        EXPECT_THROW(recursive_sum_bound(n, 1.0, Precision::Bf16), std::invalid_argument) << n;
        continue;
      }
      WorstRatio worst;
      for (std::uint64_t trial = 0; trial < kTrials; ++trial) {
        const std::vector<float> x = to_bf16(draw_operands(distribution, n, trial).a);
        const ExactDot exact = exact_sum(x);
        const double error = std::fabs(static_cast<double>(sequential_sum_bf16(x)) - exact.value);
        const double bound = recursive_sum_bound(n, exact.sum_abs, Precision::Bf16);
        ASSERT_LE(error, bound) << case_id("sum_bf16", n, distribution, trial);
        if (bound > 0) worst.observe(error, bound, static_cast<double>(trial));
      }
      tightness << name(distribution) << "/n=" << n << ":" << worst.ratio << " ";
    }
  }
  RecordProperty("worst_error_over_bound", tightness.str());
}

// The sequential bound is attained to first order: 1 + u + u + ... rounds back to 1 at
// every add (each is a tie, to even), an error of (n-1) u against gamma_{n-1} (1 + (n-1) u).
TEST(SumBound, HalfUlpsAddedToOneAttainTheSequentialBound) {
  for (const auto& [p, n] : {std::pair<Precision, std::int64_t>{Precision::Fp32, 1001}, {Precision::Bf16, 11}}) {
    const double u = precision_traits(p).unit_roundoff;
    std::vector<float> x(static_cast<std::size_t>(n), static_cast<float>(u));
    x[0] = 1.0f;
    float sum = 0.0f;
    for (float value : x) sum = p == Precision::Fp32 ? sum + value : round_to_bf16(sum + value);
    const ExactDot exact = exact_sum(x);
    const double error = std::fabs(static_cast<double>(sum) - exact.value);
    const double bound = recursive_sum_bound(n, exact.sum_abs, p);
    const double nu = static_cast<double>(n - 1) * u;
    EXPECT_EQ(sum, 1.0f) << to_string(p);
    EXPECT_EQ(error, nu) << to_string(p);
    EXPECT_LE(error, bound) << to_string(p);
    EXPECT_GE(error / bound, (1 - nu) / (1 + nu) * (1 - 0x1p-40)) << to_string(p);
    RecordProperty(std::string(to_string(p)) + "_error_over_bound", number(error / bound));
  }
}

// Puts 1 at the end of the deepest path of pairwise_sum's tree (the second half is the
// larger) and exactly u first in each sibling subtree on that path, zeros elsewhere: every
// add on the path is 1 + u, a tie that rounds to even (1), so each level loses u.
void place_ties_on_the_deepest_path(float* x, std::size_t n, float u) {
  if (n == 1) {
    x[0] = 1.0f;
    return;
  }
  const std::size_t half = n / 2;
  x[0] = u;
  place_ties_on_the_deepest_path(x + half, n - half, u);
}

// The pairwise bound is attained to first order, so its depth is ceil(log2 n), not less.
TEST(SumBound, TiesOnTheDeepestPathAttainThePairwiseBound) {
  for (Precision p : {Precision::Fp32, Precision::Bf16}) {
    const double u = precision_traits(p).unit_roundoff;
    for (std::int64_t n : {3, 7, 1000, 4097}) {
      std::vector<float> x(static_cast<std::size_t>(n), 0.0f);
      place_ties_on_the_deepest_path(x.data(), x.size(), static_cast<float>(u));
      const float sum = p == Precision::Fp32 ? pairwise_sum_fp32(x.data(), x.size()) : pairwise_sum_bf16(x.data(), x.size());
      const ExactDot exact = exact_sum(x);
      const double error = std::fabs(static_cast<double>(sum) - exact.value);
      const double bound = pairwise_sum_bound(n, exact.sum_abs, p);
      const double depth_u = exact.sum_abs - 1.0;  // one u per level
      EXPECT_EQ(sum, 1.0f) << to_string(p) << " n=" << n;
      EXPECT_LE(error, bound) << to_string(p) << " n=" << n;
      EXPECT_GE(error / bound, (1 - depth_u) / (1 + depth_u) * (1 - 0x1p-40)) << to_string(p) << " n=" << n;
      RecordProperty(std::string(to_string(p)) + "_n" + std::to_string(n) + "_error_over_bound", number(error / bound));
    }
  }
}

TEST(SumBound, PairwiseSumsAreWithinGammaCeilLog2N) {
  std::ostringstream tightness;
  tightness.precision(3);
  for (Distribution distribution : kAllDistributions) {
    for (std::int64_t n : kDotLengths) {
      WorstRatio worst_fp32, worst_bf16;
      for (std::uint64_t trial = 0; trial < kTrials; ++trial) {
        const std::vector<float> x = draw_operands(distribution, n, trial).a;
        const ExactDot exact = exact_sum(x);
        const double error = std::fabs(static_cast<double>(pairwise_sum_fp32(x.data(), x.size())) - exact.value);
        const double bound = pairwise_sum_bound(n, exact.sum_abs, Precision::Fp32);
        ASSERT_LE(error, bound) << case_id("pairwise_fp32", n, distribution, trial);
        if (bound > 0) worst_fp32.observe(error, bound, static_cast<double>(trial));

        const std::vector<float> x_bf16 = to_bf16(x);
        const ExactDot exact_bf16 = exact_sum(x_bf16);
        const float sum_bf16 = pairwise_sum_bf16(x_bf16.data(), x_bf16.size());
        const double error_bf16 = std::fabs(static_cast<double>(sum_bf16) - exact_bf16.value);
        const double bound_bf16 = pairwise_sum_bound(n, exact_bf16.sum_abs, Precision::Bf16);
        ASSERT_LE(error_bf16, bound_bf16) << case_id("pairwise_bf16", n, distribution, trial);
        if (bound_bf16 > 0) worst_bf16.observe(error_bf16, bound_bf16, static_cast<double>(trial));
      }
      tightness << name(distribution) << "/n=" << n << ":fp32 " << worst_fp32.ratio << ",bf16 " << worst_bf16.ratio << " ";
    }
  }
  RecordProperty("worst_error_over_bound", tightness.str());
}

// ---- a layer norm at its output ----------------------------------------------------------

// One row of a layer norm: x, w, b of C values each.
struct LayerNormRow {
  std::vector<float> x, w, b;
};

enum class RowShape { Centred, FarFromZero, NearlyConstant, WideExponents };
constexpr RowShape kAllRowShapes[] = {RowShape::Centred, RowShape::FarFromZero, RowShape::NearlyConstant,
                                      RowShape::WideExponents};
const char* name(RowShape shape) {
  switch (shape) {
    case RowShape::Centred: return "centred";
    case RowShape::FarFromZero: return "far_from_zero";       // 100 + U(-1, 1): rho ~ 6e4
    case RowShape::NearlyConstant: return "nearly_constant";  // spread 1e-4: eps dominates
    case RowShape::WideExponents: return "wide_exponents";
  }
  return "unknown";
}

LayerNormRow draw_row(RowShape shape, std::int64_t C, std::uint64_t trial) {
  LayerNormRow row{std::vector<float>(C), std::vector<float>(C), std::vector<float>(C)};
  for (std::int64_t c = 0; c < C; ++c) {
    const PhiloxBlock w = philox_at(static_cast<std::uint64_t>(C) * 1000 + trial, stream_id(name(shape)),
                                    static_cast<std::uint64_t>(c));
    const float noise = uniform_signed(w[0]);
    switch (shape) {
      case RowShape::Centred: row.x[c] = noise; break;
      case RowShape::FarFromZero: row.x[c] = 100.0f + noise; break;
      case RowShape::NearlyConstant: row.x[c] = 0.5f + noise * 1e-4f; break;
      case RowShape::WideExponents: row.x[c] = wide_signed(w[0], w[3]); break;
    }
    row.w[c] = uniform_signed(w[1]) * 2.0f;
    row.b[c] = uniform_signed(w[2]);
  }
  return row;
}

constexpr float kLayerNormEps = 1e-5f;

// The ways a kernel computes a layer norm in fp32: the mean, then the variance two-pass
// around it, as sum x^2 / C - mean^2 (a one-pass lowering), by Welford's updates, or by
// Welford's updates over chunks of 16 combined as Chan et al. (torch's CPU RowwiseMoments);
// the output as (x - mean) * rstd * w + b, or (torch's CPU kernel) as
// (x * rstd + (-rstd * mean)) * w + b after the chunked moments. `FastRstd` models a
// fast-math reciprocal square root, right to 12 bits (the negative control).
enum class LayerNormKernel { TwoPass, SumOfSquares, Welford, ChunkedWelfordTorchOutput, FastRstd };

struct Moments {
  float mean = 0, m2 = 0, count = 0;
};

Moments welford(const float* x, std::size_t n) {
  Moments m;
  for (std::size_t c = 0; c < n; ++c) {
    m.count = m.count + 1.0f;
    const float delta = x[c] - m.mean;
    m.mean = m.mean + delta / m.count;
    m.m2 = m.m2 + delta * (x[c] - m.mean);
  }
  return m;
}

// Chan, Golub and LeVeque's combination of two partial moments.
Moments combine(const Moments& a, const Moments& b) {
  if (a.count == 0) return b;
  const float count = a.count + b.count, delta = b.mean - a.mean, share = b.count / count;
  return {a.mean + delta * share, a.m2 + b.m2 + delta * delta * a.count * share, count};
}

// A row's mean and rstd as the kernel computes them.
struct RowMoments {
  float mean = 0, rstd = 0;
};

RowMoments moments_fp32(const LayerNormRow& row, LayerNormKernel kernel) {
  const std::size_t C = row.x.size();
  const float n = static_cast<float>(C);
  float mean = 0, variance = 0;
  if (kernel == LayerNormKernel::Welford) {
    const Moments m = welford(row.x.data(), C);
    mean = m.mean, variance = m.m2 / n;
  } else if (kernel == LayerNormKernel::ChunkedWelfordTorchOutput) {
    Moments m;
    for (std::size_t at = 0; at < C; at += 16) m = combine(m, welford(row.x.data() + at, std::min<std::size_t>(16, C - at)));
    mean = m.mean, variance = m.m2 / n;
  } else {
    for (float v : row.x) mean = mean + v;
    mean = mean / n;
    if (kernel == LayerNormKernel::SumOfSquares) {
      for (float v : row.x) variance = variance + v * v;
      variance = variance / n - mean * mean;
    } else {
      for (float v : row.x) variance = variance + (v - mean) * (v - mean);
      variance = variance / n;
    }
  }
  float rstd = 1.0f / std::sqrt(variance + kLayerNormEps);
  if (kernel == LayerNormKernel::FastRstd) rstd = rstd * (1.0f + 0x1p-12f);
  return {mean, rstd};
}

std::vector<float> layer_norm_fp32(const LayerNormRow& row, LayerNormKernel kernel) {
  const std::size_t C = row.x.size();
  const auto [mean, rstd] = moments_fp32(row, kernel);
  std::vector<float> y(C);
  const float shift = -rstd * mean;
  for (std::size_t c = 0; c < C; ++c) {
    y[c] = kernel == LayerNormKernel::ChunkedWelfordTorchOutput ? (row.x[c] * rstd + shift) * row.w[c] + row.b[c]
                                                                : (row.x[c] - mean) * rstd * row.w[c] + row.b[c];
  }
  return y;
}

// The exact output (double-double sums) and each element's bound.
struct JudgedRow {
  std::vector<double> exact, bound;
};

JudgedRow judge_layer_norm(const LayerNormRow& row) {
  const std::size_t C = row.x.size();
  DoubleDouble sum, sum_abs, squares;
  for (float v : row.x) {
    sum.add(v), sum_abs.add(std::fabs(static_cast<double>(v))), squares.add(static_cast<double>(v) * v);
  }
  const double mu = sum.value() / static_cast<double>(C), A = sum_abs.value() / static_cast<double>(C);
  const double S = squares.value() / static_cast<double>(C);
  DoubleDouble deviations;
  for (float v : row.x) deviations.add((static_cast<double>(v) - mu) * (static_cast<double>(v) - mu));
  const double variance = deviations.value() / static_cast<double>(C);
  const double r = 1.0 / std::sqrt(variance + static_cast<double>(kLayerNormEps));
  JudgedRow judged{std::vector<double>(C), std::vector<double>(C)};
  for (std::size_t c = 0; c < C; ++c) {
    const double scaled = (static_cast<double>(row.x[c]) - mu) * r * row.w[c];
    judged.exact[c] = scaled + row.b[c];
    judged.bound[c] = layer_norm_output_bound({static_cast<std::int64_t>(C),
                                               (S + mu * mu) / (variance + static_cast<double>(kLayerNormEps)),
                                               std::fabs(scaled), std::fabs(static_cast<double>(row.w[c])) * r * A,
                                               std::fabs(static_cast<double>(row.b[c]))});
  }
  return judged;
}

constexpr std::int64_t kLayerNormWidths[] = {2, 8, 64, 768, 4096};

// Every way of computing it is within the bound, on rows near zero, far from it (the
// one-pass variance's cancellation), nearly constant (eps dominates) and of wide exponents.
TEST(LayerNormOutputBound, TwoPassSumOfSquaresAndWelfordAreWithin) {
  std::ostringstream tightness;
  tightness.precision(3);
  for (RowShape shape : kAllRowShapes) {
    for (std::int64_t C : kLayerNormWidths) {
      for (LayerNormKernel kernel : {LayerNormKernel::TwoPass, LayerNormKernel::SumOfSquares, LayerNormKernel::Welford,
                                     LayerNormKernel::ChunkedWelfordTorchOutput}) {
        WorstRatio worst;
        for (std::uint64_t trial = 0; trial < kTrials; ++trial) {
          const LayerNormRow row = draw_row(shape, C, trial);
          const JudgedRow judged = judge_layer_norm(row);
          const std::vector<float> y = layer_norm_fp32(row, kernel);
          for (std::size_t c = 0; c < y.size(); ++c) {
            const double error = std::fabs(static_cast<double>(y[c]) - judged.exact[c]);
            ASSERT_LE(error, judged.bound[c]) << name(shape) << " C=" << C << " kernel " << static_cast<int>(kernel)
                                              << " trial " << trial << " element " << c;
            worst.observe(error, judged.bound[c], static_cast<double>(trial));
          }
        }
        tightness << name(shape) << "/C=" << C << "/" << static_cast<int>(kernel) << ":" << worst.ratio << " ";
      }
    }
  }
  RecordProperty("worst_error_over_bound", tightness.str());
}

// It is not vacuous: an rstd off by 2^-12 (a fast-math rsqrt) leaves it on every centred row
// of 8 to 256 channels (the canaries' widths; past them gamma_{8C+15} / 2 nears 2^-12).
TEST(LayerNormOutputBound, AnRstdRightTo12BitsIsOutside) {
  for (std::int64_t C : {8, 64, 256}) {
    for (std::uint64_t trial = 0; trial < kTrials; ++trial) {
      const LayerNormRow row = draw_row(RowShape::Centred, C, trial);
      const JudgedRow judged = judge_layer_norm(row);
      const std::vector<float> y = layer_norm_fp32(row, LayerNormKernel::FastRstd);
      bool outside = false;
      for (std::size_t c = 0; c < y.size(); ++c) {
        outside = outside || std::fabs(static_cast<double>(y[c]) - judged.exact[c]) > judged.bound[c];
      }
      EXPECT_TRUE(outside) << "C=" << C << " trial " << trial;
    }
  }
}

// The row's exact mean, mean |x|, rstd and rho (double-double sums).
struct ExactMoments {
  double mean, mean_abs, rstd, conditioning;
};

ExactMoments exact_moments(const LayerNormRow& row) {
  const double C = static_cast<double>(row.x.size());
  DoubleDouble sum, sum_abs, squares;
  for (float v : row.x) sum.add(v), sum_abs.add(std::fabs(static_cast<double>(v))), squares.add(static_cast<double>(v) * v);
  const double mu = sum.value() / C;
  DoubleDouble deviations;
  for (float v : row.x) deviations.add((static_cast<double>(v) - mu) * (static_cast<double>(v) - mu));
  const double variance = deviations.value() / C, eps = static_cast<double>(kLayerNormEps);
  return {mu, sum_abs.value() / C, 1.0 / std::sqrt(variance + eps), (squares.value() / C + mu * mu) / (variance + eps)};
}

// aten.native_layer_norm's mean and rstd (judged at the aten level as the output is): every
// kernel's within gamma_{2C+3} A and layer_norm_rstd_error's relative error on every row
// shape and width; a fast-math rstd (2^-12 off) is outside on centred rows of the
// canaries' widths.
TEST(LayerNormRstdError, EveryKernelsMeanAndRstdAreWithinAndAFastRstdIsNot) {
  const double u = precision_traits(Precision::Fp32).unit_roundoff;
  std::ostringstream tightness;
  tightness.precision(3);
  for (RowShape shape : kAllRowShapes) {
    for (std::int64_t C : kLayerNormWidths) {
      WorstRatio worst;
      for (LayerNormKernel kernel : {LayerNormKernel::TwoPass, LayerNormKernel::SumOfSquares, LayerNormKernel::Welford,
                                     LayerNormKernel::ChunkedWelfordTorchOutput}) {
        for (std::uint64_t trial = 0; trial < kTrials; ++trial) {
          const LayerNormRow row = draw_row(shape, C, trial);
          const ExactMoments exact = exact_moments(row);
          const RowMoments got = moments_fp32(row, kernel);
          const double rstd_bound = layer_norm_rstd_error(C, exact.conditioning) * exact.rstd;
          const double rstd_error = std::fabs(static_cast<double>(got.rstd) - exact.rstd);
          ASSERT_LE(rstd_error, rstd_bound) << name(shape) << " C=" << C << " kernel " << static_cast<int>(kernel);
          ASSERT_LE(std::fabs(static_cast<double>(got.mean) - exact.mean), gamma(2 * C + 3, u) * exact.mean_abs)
              << name(shape) << " C=" << C << " kernel " << static_cast<int>(kernel);
          worst.observe(rstd_error, rstd_bound, static_cast<double>(trial));
        }
      }
      tightness << name(shape) << "/C=" << C << ":" << worst.ratio << " ";
    }
  }
  RecordProperty("worst_rstd_error_over_bound", tightness.str());
  for (std::int64_t C : {8, 64, 256}) {
    for (std::uint64_t trial = 0; trial < kTrials; ++trial) {
      const LayerNormRow row = draw_row(RowShape::Centred, C, trial);
      const ExactMoments exact = exact_moments(row);
      const double error = std::fabs(static_cast<double>(moments_fp32(row, LayerNormKernel::FastRstd).rstd) - exact.rstd);
      EXPECT_GT(error, layer_norm_rstd_error(C, exact.conditioning) * exact.rstd) << "C=" << C << " trial " << trial;
    }
  }
}

TEST(LayerNormOutputBound, IsInfiniteWhereFp32KeepsNoDigitOfTheVariance) {
  EXPECT_TRUE(std::isinf(layer_norm_rstd_error(768, 1e9)));
  EXPECT_TRUE(std::isinf(layer_norm_output_bound({768, 1e9, 1.0, 1.0, 0.0})));
  EXPECT_TRUE(std::isinf(layer_norm_output_bound({0, 1.0, 1.0, 1.0, 0.0})));
  EXPECT_TRUE(std::isfinite(layer_norm_output_bound({768, 1e3, 1.0, 1.0, 0.0})));
}

}  // namespace
}  // namespace harness::numerics
