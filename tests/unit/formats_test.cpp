// bf16 and fp8 conversions: exhaustive over every code, and fp32 inputs at and around
// every rounding boundary, against an independent reference (nearest representable
// value found by search in double precision, ties to the even code).
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "numerics/formats.h"
#include "numerics/philox.h"

namespace harness::numerics {
namespace {

bool is_nan(float x) { return x != x; }
float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

// ---- bf16 ------------------------------------------------------------------------------

// Reference: the two bf16 neighbours of x (truncation and one code up), the nearer one in
// exact double arithmetic, ties to the even code; overflow past the largest bf16 is inf.
std::uint16_t reference_bf16(float x) {
  if (is_nan(x)) return 0x7FC0;
  const std::uint32_t u = bits(x);
  const auto down = static_cast<std::uint16_t>(u >> 16);
  const auto up = static_cast<std::uint16_t>(down + 1);
  const double dx = x, d_down = bf16_to_fp32(down);
  // one code up in magnitude; past the largest finite it is infinity, reached at the
  // midpoint 2^128 - 2^119 (IEEE rounding at overflow)
  const double d_up = (up & 0x7FFF) == 0x7F80 ? std::ldexp(1.0, 128) * (dx < 0 ? -1 : 1) : bf16_to_fp32(up);
  if ((u & 0xFFFF) == 0) return down;
  const double e_down = std::fabs(dx - d_down), e_up = std::fabs(d_up - dx);
  if (e_down < e_up) return down;
  if (e_up < e_down) return up;
  return (down & 1) == 0 ? down : up;
}

TEST(Bf16, EveryCodeRoundTripsExactly) {
  for (std::uint32_t code = 0; code < 65536; ++code) {
    const auto c = static_cast<std::uint16_t>(code);
    const float x = bf16_to_fp32(c);
    EXPECT_EQ(bits(x), code << 16) << code;  // decoding is the top 16 bits
    if (is_nan(x)) {
      EXPECT_EQ(fp32_to_bf16(x), 0x7FC0) << code;
    } else {
      EXPECT_EQ(fp32_to_bf16(x), c) << code;
    }
  }
}

TEST(Bf16, TiesAndNeighboursOfEveryBoundaryMatchTheReference) {
  // For every finite code: the tie above it, one fp32 ulp either side of the tie, and
  // the next fp32 value above the code. Covers subnormals, max and both signs.
  std::size_t checked = 0;
  for (std::uint32_t code = 0; code < 65536; ++code) {
    if ((code & 0x7F80) == 0x7F80) continue;  // inf / NaN
    const std::uint32_t base = code << 16;
    for (std::uint32_t offset : {0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      const float x = from_bits(base | offset);
      ASSERT_EQ(fp32_to_bf16(x), reference_bf16(x)) << std::hex << (base | offset);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 5u * (65536 - 256));  // all but the 256 inf/NaN codes
}

TEST(Bf16, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(fp32_to_bf16(inf), 0x7F80);
  EXPECT_EQ(fp32_to_bf16(-inf), 0xFF80);
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds past the max: inf
  EXPECT_EQ(fp32_to_bf16(from_bits(0x7F7F7FFF)), 0x7F7F);              // just below that tie: max bf16
  EXPECT_EQ(fp32_to_bf16(from_bits(0xFFC12345)), 0x7FC0);              // every NaN -> 0x7FC0
  EXPECT_EQ(fp32_to_bf16(from_bits(0x7F800001)), 0x7FC0);              // (a NaN that would round to inf)
  EXPECT_EQ(fp32_to_bf16(from_bits(0x00010000)), 0x0001);              // subnormals are kept
  EXPECT_EQ(fp32_to_bf16(-0.0f), 0x8000);
}

TEST(Bf16, InPlaceRoundingEqualsTheScalarFormula) {
  std::vector<float> x(100000);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = from_bits(philox_at(7, 1, i)[0]);
  std::vector<float> y = x;
  round_to_bf16_inplace(y.data(), static_cast<std::int64_t>(y.size()));
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(bits(y[i]), bits(round_to_bf16(x[i]))) << i;
}

// ---- fp8 -------------------------------------------------------------------------------

struct Fp8Case {
  Fp8Format format;
  std::uint8_t max_code;
  float max_value, least_subnormal;
};
const Fp8Case kE4M3{Fp8Format::E4M3, 0x7E, 448.0f, 0.001953125f};        // 2^-9
const Fp8Case kE5M2{Fp8Format::E5M2, 0x7B, 57344.0f, 1.52587890625e-05f};  // 2^-16

class Fp8 : public ::testing::TestWithParam<Fp8Case> {};

bool is_nan_code(std::uint8_t c, Fp8Format f) {
  return f == Fp8Format::E4M3 ? (c & 0x7F) == 0x7F : (c & 0x7F) > 0x7C;
}

// Reference decoder for finite codes, from the format's definition with ldexp:
// (-1)^s * 2^(1-bias) * m/2^M for exponent 0, else (-1)^s * 2^(e-bias) * (1 + m/2^M).
double reference_decode(std::uint8_t c, Fp8Format f) {
  const Fp8Traits t = fp8_traits(f);
  const int e = (c & 0x7F) >> t.mantissa_bits, m = c & ((1 << t.mantissa_bits) - 1);
  const double fraction = static_cast<double>(m) / (1 << t.mantissa_bits);
  const double magnitude = e == 0 ? std::ldexp(fraction, 1 - t.bias) : std::ldexp(1.0 + fraction, e - t.bias);
  return (c & 0x80) ? -magnitude : magnitude;
}

// Reference encoder: search every finite code for the nearest value (double arithmetic),
// ties to the even code, saturating beyond the max.
std::uint8_t reference_fp8(float x, const Fp8Case& p) {
  if (is_nan(x)) return 0x7F | (std::signbit(x) ? 0x80 : 0);
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= p.max_value) return sign | p.max_code;
  std::uint8_t best = 0;
  double best_error = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= p.max_code; ++c) {
    const double e = std::fabs(reference_decode(static_cast<std::uint8_t>(c), p.format) - a);
    if (e < best_error || (e == best_error && (c & 1) == 0)) {
      best = static_cast<std::uint8_t>(c);
      best_error = e;
    }
  }
  return sign | best;
}

TEST_P(Fp8, EveryCodeDecodesAndRoundTrips) {
  const Fp8Case p = GetParam();
  for (int code = 0; code < 256; ++code) {
    const auto c = static_cast<std::uint8_t>(code);
    const float x = fp8_to_fp32(c, p.format);
    if (is_nan_code(c, p.format)) {
      EXPECT_TRUE(is_nan(x)) << code;
      EXPECT_EQ(fp32_to_fp8(x, p.format) & 0x7F, 0x7F) << code;
    } else if (std::isinf(x)) {
      EXPECT_EQ(p.format, Fp8Format::E5M2);
      EXPECT_EQ(fp32_to_fp8(x, p.format), (c & 0x80) | p.max_code) << "satfinite";
    } else {
      EXPECT_EQ(static_cast<double>(x), reference_decode(c, p.format)) << code;
      EXPECT_EQ(fp32_to_fp8(x, p.format), c) << code;
      EXPECT_EQ(bits(round_to_fp8(x, p.format)), bits(x)) << code;
    }
  }
}

TEST_P(Fp8, MidpointsRoundToEvenAndNeighboursToTheNearer) {
  const Fp8Case p = GetParam();
  for (int code = 0; code < p.max_code; ++code) {
    const float lo = fp8_to_fp32(static_cast<std::uint8_t>(code), p.format);
    const float hi = fp8_to_fp32(static_cast<std::uint8_t>(code + 1), p.format);
    const float mid = (lo + hi) / 2;  // exact: fp8 neighbours are far apart in fp32
    const auto even = static_cast<std::uint8_t>(code % 2 == 0 ? code : code + 1);
    for (float sign : {1.0f, -1.0f}) {
      const std::uint8_t s = sign < 0 ? 0x80 : 0;
      const float inputs[3] = {sign * mid, sign * std::nextafter(mid, 0.0f), sign * std::nextafter(mid, 1e9f)};
      const std::uint8_t expected[3] = {static_cast<std::uint8_t>(s | even), static_cast<std::uint8_t>(s | code),
                                        static_cast<std::uint8_t>(s | (code + 1))};
      float fast[3];
      scale_round_to_fp8(inputs, 1.0f, fast, 3, p.format);  // the engine's vectorised quantiser
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(fp32_to_fp8(inputs[i], p.format), expected[i]) << code << " case " << i;
        EXPECT_EQ(round_to_fp8(inputs[i], p.format), fp8_to_fp32(expected[i], p.format)) << code << " case " << i;
        EXPECT_EQ(fast[i], fp8_to_fp32(expected[i], p.format)) << code << " case " << i;
      }
    }
  }
}

TEST_P(Fp8, SubnormalsSaturationAndNan) {
  const Fp8Case p = GetParam();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(fp8_to_fp32(0x01, p.format), p.least_subnormal);
  EXPECT_EQ(fp32_to_fp8(p.least_subnormal, p.format), 0x01);
  EXPECT_EQ(fp32_to_fp8(p.least_subnormal / 2, p.format), 0x00);                       // tie to even: 0
  EXPECT_EQ(fp32_to_fp8(std::nextafter(p.least_subnormal / 2, 1.0f), p.format), 0x01);  // above the tie
  EXPECT_EQ(fp32_to_fp8(1e-30f, p.format), 0x00);
  EXPECT_EQ(fp32_to_fp8(from_bits(1), p.format), 0x00);  // fp32 subnormal
  EXPECT_EQ(fp8_to_fp32(p.max_code, p.format), p.max_value);
  for (float big : {p.max_value * 1.0625f, p.max_value * 1.5f, p.max_value * 4.0f, 1e30f, inf}) {
    EXPECT_EQ(fp32_to_fp8(big, p.format), p.max_code) << big;
    EXPECT_EQ(fp32_to_fp8(-big, p.format), 0x80 | p.max_code) << big;
    EXPECT_EQ(round_to_fp8(big, p.format), p.max_value) << big;
  }
  EXPECT_TRUE(is_nan_code(fp32_to_fp8(std::numeric_limits<float>::quiet_NaN(), p.format), p.format));
  EXPECT_TRUE(is_nan(round_to_fp8(std::numeric_limits<float>::quiet_NaN(), p.format)));
  EXPECT_EQ(fp32_to_fp8(-0.0f, p.format), 0x80);
}

TEST_P(Fp8, EncoderAndFastRoundingMatchTheReferenceOnRandomInputs) {
  const Fp8Case p = GetParam();
  for (std::uint64_t i = 0; i < 200000; ++i) {
    // Random magnitudes spanning below the least subnormal to beyond the max.
    const auto w = philox_at(11, static_cast<std::uint64_t>(p.format), i);
    const float scale = from_bits(static_cast<std::uint32_t>((w[1] % 40u) + 127u - 26u) << 23);
    const float x = (static_cast<float>(w[0] >> 8) / 16777216.0f) * scale * p.max_value * ((w[2] & 1) ? -1.0f : 1.0f);
    const std::uint8_t code = fp32_to_fp8(x, p.format);
    ASSERT_EQ(code, reference_fp8(x, p)) << x;
    ASSERT_EQ(bits(round_to_fp8(x, p.format)), bits(fp8_to_fp32(code, p.format))) << x;
    float fast = 0;
    scale_round_to_fp8(&x, 1.0f, &fast, 1, p.format);
    ASSERT_EQ(bits(fast), bits(fp8_to_fp32(code, p.format))) << x;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8, ::testing::Values(kE4M3, kE5M2),
                         [](const auto& param_info) { return std::string(to_string(param_info.param.format)); });

}  // namespace
}  // namespace harness::numerics
