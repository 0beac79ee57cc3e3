// Accuracy and portability properties of the project's own elementary functions.
// libm (long double) appears here only as the accuracy yardstick; it never reaches a receipt.
#include <bit>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <limits>

#include <gtest/gtest.h>

#include "numerics/det_math.h"
#include "numerics/philox.h"

namespace harness::numerics {
namespace {

// Distance in units in the last place between two finite floats of the same sign.
std::int64_t ulp_distance(float a, float b) {
  const auto key = [](float x) {
    const auto bits = std::bit_cast<std::int32_t>(x);
    return bits < 0 ? std::int64_t{std::numeric_limits<std::int32_t>::min()} - bits : std::int64_t{bits};
  };
  const std::int64_t d = key(a) - key(b);
  return d < 0 ? -d : d;
}

// Every float in [lo, hi] on a grid of `count` points.
template <typename Fn>
void sweep(float lo, float hi, int count, Fn fn) {
  for (int i = 0; i <= count; ++i) fn(lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(count));
}

TEST(DetMath, DoubleFunctionsMatchLibmToAFewUlpOfDouble) {
  for (double x = -30.0; x <= 30.0; x += 0.01731) {
    EXPECT_NEAR(det_exp(x), static_cast<double>(std::exp(static_cast<long double>(x))), 4e-16 * std::exp(x)) << x;
    EXPECT_NEAR(det_tanh(x), static_cast<double>(std::tanh(static_cast<long double>(x))), 4e-16) << x;
    EXPECT_NEAR(det_sin(x), static_cast<double>(std::sin(static_cast<long double>(x))), 4e-16) << x;
    EXPECT_NEAR(det_cos(x), static_cast<double>(std::cos(static_cast<long double>(x))), 4e-16) << x;
  }
  for (double x = 1e-300; x < 1e300; x *= 1.7) {
    EXPECT_NEAR(det_log(x), static_cast<double>(std::log(static_cast<long double>(x))), 4e-16 * std::fabs(std::log(x)) + 1e-300) << x;
  }
  EXPECT_EQ(det_exp(0.0), 1.0);
  EXPECT_EQ(det_log(1.0), 0.0);
  EXPECT_TRUE(std::isnan(det_log(-1.0)));
  EXPECT_EQ(det_exp(-1000.0), 0.0);
  EXPECT_TRUE(std::isinf(det_exp(1000.0)));
}

TEST(DetMath, SubnormalLogIsAccurate) {
  const double tiny = 4.9406564584124654e-324;  // smallest subnormal
  EXPECT_NEAR(det_log(tiny), static_cast<double>(std::log(static_cast<long double>(tiny))), 1e-12);
}

// Near saturation (|x| ~ 6) the rational fit loses a few ulp of 0.99998, so the bound is
// in ulp where GELU's arguments live and absolute everywhere.
TEST(DetMath, RationalTanhIsWithinFourUlpOnCentralRangeAndHalfMicroEverywhere) {
  std::int64_t worst_central_ulp = 0;
  long double worst_abs = 0;
  sweep(-10.0f, 10.0f, 2000003, [&](float x) {
    const long double exact = std::tanh(static_cast<long double>(x));
    const float approx = det_tanhf_rational(x);
    if (std::fabs(x) <= 3.0f) {
      worst_central_ulp = std::max(worst_central_ulp, ulp_distance(approx, static_cast<float>(exact)));
    }
    worst_abs = std::max(worst_abs, std::fabs(approx - exact));
  });
  EXPECT_LE(worst_central_ulp, 4);
  EXPECT_LT(worst_abs, 5e-7L);
  EXPECT_EQ(det_tanhf_rational(0.0f), 0.0f);
  EXPECT_EQ(det_tanhf_rational(100.0f), det_tanhf_rational(8.0f));
  EXPECT_TRUE(std::isnan(det_tanhf_rational(std::numeric_limits<float>::quiet_NaN())));
}

TEST(DetMath, PolynomialExpIsWithinThreeUlpOnItsDomain) {
  std::int64_t worst = 0;
  sweep(-87.0f, 88.0f, 2000003, [&](float x) {
    const auto exact = static_cast<float>(static_cast<double>(std::exp(static_cast<long double>(x))));
    worst = std::max(worst, ulp_distance(exp_poly(x), exact));
  });
  EXPECT_LE(worst, 3);
  EXPECT_EQ(exp_poly(0.0f), 1.0f);
  EXPECT_EQ(exp_poly(-100.0f), 0.0f);
  EXPECT_TRUE(std::isnan(exp_poly(std::numeric_limits<float>::quiet_NaN())));
}

// The vector path must give each lane exactly the scalar result: that is what lets a
// baseline (SSE2) and a native (AVX2) build agree bit for bit.
TEST(DetMath, VectorLanesEqualScalarBitForBit) {
  int checked = 0;
  for (std::uint32_t bits = 0; bits < 0xFFFFFFFFu - 4096u * 4u; bits += 4096u * 4u + 3u) {
    Floats4 v;
    float lanes[4];
    for (int l = 0; l < 4; ++l) lanes[l] = std::bit_cast<float>(bits + static_cast<std::uint32_t>(l) * 977u);
    std::memcpy(&v, lanes, sizeof v);
    const Floats4 e = exp_poly(v), t = tanh_rational(v);
    for (int l = 0; l < 4; ++l) {
      const float x = lanes[l];
      if (std::isnan(x)) continue;
      ASSERT_EQ(std::bit_cast<std::uint32_t>(e[l]), std::bit_cast<std::uint32_t>(exp_poly(x))) << x;
      ASSERT_EQ(std::bit_cast<std::uint32_t>(t[l]), std::bit_cast<std::uint32_t>(tanh_rational(x))) << x;
      ++checked;
    }
  }
  EXPECT_GT(checked, 100000);
}

// Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors).
TEST(Philox, MatchesRandom123KnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (PhiloxBlock{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (PhiloxBlock{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (PhiloxBlock{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, NormalSamplesHaveUnitMomentsAndDependOnlyOnTheirIndex) {
  constexpr int kSamples = 200000;
  double sum = 0, sum_sq = 0, sum_4 = 0;
  for (int i = 0; i < kSamples; ++i) {
    const double z = normal_at(7, 11, static_cast<std::uint64_t>(i));
    sum += z;
    sum_sq += z * z;
    sum_4 += z * z * z * z;
  }
  EXPECT_NEAR(sum / kSamples, 0.0, 0.01);
  EXPECT_NEAR(sum_sq / kSamples, 1.0, 0.01);
  EXPECT_NEAR(sum_4 / kSamples, 3.0, 0.05);  // Gaussian kurtosis
  EXPECT_EQ(normal_at(7, 11, 12345), normal_at(7, 11, 12345));
  EXPECT_NE(normal_at(7, 11, 12345), normal_at(7, 12, 12345));
  EXPECT_NE(normal_at(7, 11, 12345), normal_at(8, 11, 12345));
}

}  // namespace
}  // namespace harness::numerics
