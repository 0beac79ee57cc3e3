// Accuracy and portability properties of the project's own elementary functions.
// libm (long double) appears here only as the accuracy yardstick; it never reaches a receipt.
#include <bit>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/kernels.h"
#include "kernels/vector_lanes.h"
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

// erf and erfc against libm's long double: erf within 2 ulp of double everywhere, erfc
// within 8 ulp where it is a normal double (its exp is det_exp's), and the identities
// erf(-x) = -erf(x), erfc(-x) = 2 - erfc(x) bit for bit.
TEST(DetMath, ErfAndErfcMatchLibmToAFewUlpOfDouble) {
  const auto ulps = [](double a, double b) {
    const auto key = [](double v) {
      const auto bits = std::bit_cast<std::int64_t>(v);
      return bits < 0 ? std::numeric_limits<std::int64_t>::min() - bits : bits;
    };
    return std::abs(key(a) - key(b));
  };
  std::int64_t worst_erf = 0, worst_erfc = 0;
  for (double x = -30.0; x <= 30.0; x += 0.000731) {
    worst_erf = std::max(worst_erf, ulps(det_erf(x), static_cast<double>(std::erf(static_cast<long double>(x)))));
    const auto exact = static_cast<double>(std::erfc(static_cast<long double>(x)));
    if (exact > std::numeric_limits<double>::min()) worst_erfc = std::max(worst_erfc, ulps(det_erfc(x), exact));
    ASSERT_EQ(std::bit_cast<std::uint64_t>(det_erf(-x)), std::bit_cast<std::uint64_t>(-det_erf(x))) << x;
  }
  EXPECT_LE(worst_erf, 2);
  EXPECT_LE(worst_erfc, 8);
  EXPECT_EQ(det_erf(0.0), 0.0);
  EXPECT_EQ(det_erfc(0.0), 1.0);
  EXPECT_EQ(det_erf(1e-300), std::erf(1e-300));
  EXPECT_EQ(det_erfc(30.0), 0.0);
  EXPECT_EQ(det_erfc(-30.0), 2.0);
  EXPECT_TRUE(std::isnan(det_erf(std::numeric_limits<double>::quiet_NaN())));
  static_assert(det_erf(0.5) > 0.52 && det_erf(0.5) < 0.521, "usable in constant expressions");
}

// Exact GELU in fp32 is the correctly rounded x Phi(x) (or one ulp off) over the range a
// model's activations take, including the far negative tail where Phi(x) underflows.
TEST(DetMath, ExactGeluIsWithinOneUlpOfLongDoubleGelu) {
  std::int64_t worst = 0;
  std::vector<float> inp, out;
  sweep(-20.0f, 20.0f, 400003, [&](float x) { inp.push_back(x); });
  out.resize(inp.size());
  kernels::gelu_erf_forward(out.data(), inp.data(), static_cast<std::int64_t>(inp.size()));
  for (std::size_t i = 0; i < inp.size(); ++i) {
    const long double x = inp[i];
    const auto exact = static_cast<float>(0.5L * x * std::erfc(-x / std::sqrt(2.0L)));
    if (exact == 0.0f) {
      EXPECT_EQ(out[i], 0.0f) << inp[i];
      continue;
    }
    worst = std::max(worst, ulp_distance(out[i], exact));
  }
  EXPECT_LE(worst, 1);
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

// The elementwise kernels (GELU, exp, SwiGLU) of every width this CPU runs (4, 8, 16 lanes,
// each with its ISA) give the bits of the 4-lane kernel, which VectorLanesEqualScalarBitForBit
// holds to the scalar code: on every length (the scalar tails of 1..15 elements included) and on inputs
// that cover the clamps, tiny and huge magnitudes, zeros of both signs, infinities and NaN.
TEST(DetMath, EveryLaneWidthGivesTheSameBits) {
  const std::vector<const kernels::LaneKernels*> widths = kernels::supported_lane_kernels();
  ASSERT_FALSE(widths.empty());
  const kernels::LaneKernels& four = *widths.back();
  ASSERT_EQ(four.name, "sse-4");
  std::vector<float> values;
  for (std::uint32_t bits = 0; bits < 0xFFFFFFFFu - 65536u; bits += 65536u * 7u + 13u) {
    values.push_back(std::bit_cast<float>(bits));
  }
  for (float special : {0.0f, -0.0f, 1e-30f, -7.9f, 7.9f, 8.0f, -88.5f, 89.0f, INFINITY, -INFINITY, NAN}) {
    values.push_back(special);
  }
  const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (const kernels::LaneKernels* k : widths) {
    for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{15}, std::size_t{16}, std::size_t{33}, values.size()}) {
      const std::vector<float> inp(values.begin(), values.begin() + static_cast<long>(n));
      std::vector<float> dout(n, 0.75f);
      for (std::size_t i = 0; i < n; ++i) dout[i] = static_cast<float>(i % 9) - 4.0f;
      std::vector<float> out(n), out4(n), dinp(n, 0.5f), dinp4(n, 0.5f), e(inp), e4(inp);
      std::vector<float> s(n), s4(n), dg(n, 0.25f), dg4(n, 0.25f), du(n, -1.0f), du4(n, -1.0f);
      k->gelu_forward(out.data(), inp.data(), 0, static_cast<std::int64_t>(n));
      four.gelu_forward(out4.data(), inp.data(), 0, static_cast<std::int64_t>(n));
      k->gelu_backward(dinp.data(), inp.data(), dout.data(), 0, static_cast<std::int64_t>(n));
      four.gelu_backward(dinp4.data(), inp.data(), dout.data(), 0, static_cast<std::int64_t>(n));
      k->exp_inplace(e.data(), static_cast<std::int64_t>(n));
      four.exp_inplace(e4.data(), static_cast<std::int64_t>(n));
      EXPECT_TRUE(same_bits(out, out4)) << k->name << " gelu_forward, n = " << n;
      EXPECT_TRUE(same_bits(dinp, dinp4)) << k->name << " gelu_backward, n = " << n;
      EXPECT_TRUE(same_bits(e, e4)) << k->name << " exp, n = " << n;
      k->swiglu_forward(s.data(), inp.data(), dout.data(), 0, static_cast<std::int64_t>(n));
      four.swiglu_forward(s4.data(), inp.data(), dout.data(), 0, static_cast<std::int64_t>(n));
      k->swiglu_backward(dg.data(), du.data(), dout.data(), inp.data(), out4.data(), 0, static_cast<std::int64_t>(n));
      four.swiglu_backward(dg4.data(), du4.data(), dout.data(), inp.data(), out4.data(), 0, static_cast<std::int64_t>(n));
      EXPECT_TRUE(same_bits(s, s4)) << k->name << " swiglu_forward, n = " << n;
      EXPECT_TRUE(same_bits(dg, dg4) && same_bits(du, du4)) << k->name << " swiglu_backward, n = " << n;
      for (std::size_t i = 0; i < n; ++i) {  // a NaN result is the one quiet NaN, whatever the payloads met
        for (float r : {out[i], dinp[i], e[i], s[i], dg[i], du[i]}) {
          if (r != r) {
            ASSERT_EQ(std::bit_cast<std::uint32_t>(r), 0x7FC00000u) << k->name << " at " << inp[i];
          }
        }
      }
    }
  }
}

// The 8- and 16-lane vector types, compiled here without their ISA (split into 4-lane
// operations), hold the same lane arithmetic as the scalar code too.
TEST(DetMath, WideVectorTypesEqualScalarBitForBit) {
  int checked = 0;
  for (std::uint32_t bits = 0; bits < 0xFFFFFFFFu - 65536u * 16u; bits += 65536u * 16u + 5u) {
    numerics::Floats16 v;
    float lanes[16];
    for (int l = 0; l < 16; ++l) lanes[l] = std::bit_cast<float>(bits + static_cast<std::uint32_t>(l) * 4099u);
    std::memcpy(&v, lanes, sizeof v);
    numerics::Floats8 half;
    std::memcpy(&half, lanes, sizeof half);
    const numerics::Floats16 e = exp_poly(v), t = tanh_rational(v);
    const numerics::Floats8 e8 = exp_poly(half);
    for (int l = 0; l < 16; ++l) {
      const float x = lanes[l];
      if (std::isnan(x)) continue;
      ASSERT_EQ(std::bit_cast<std::uint32_t>(e[l]), std::bit_cast<std::uint32_t>(exp_poly(x))) << x;
      ASSERT_EQ(std::bit_cast<std::uint32_t>(t[l]), std::bit_cast<std::uint32_t>(tanh_rational(x))) << x;
      if (l < 8) {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(e8[l]), std::bit_cast<std::uint32_t>(exp_poly(x))) << x;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 10000);
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
