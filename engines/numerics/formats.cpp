#include "formats.h"

#include <bit>

#include "numerics/isa_dispatch.h"

namespace harness::numerics {
namespace {

constexpr std::uint32_t kSignMask = 0x80000000u;
constexpr std::uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr std::uint32_t kFp32Inf = 0x7F800000u;
constexpr std::uint32_t kBf16Nan = 0x7FC0u;
constexpr std::uint8_t kFp8NanMagnitude = 0x7F;  // S.1111.111 (E4M3) and S.11111.11 (E5M2)

__attribute__((always_inline)) inline bool is_nan_bits(std::uint32_t bits) { return (bits & kAbsMask) > kFp32Inf; }

// 2^e as an fp32, for e in the normal range.
float pow2(int e) { return std::bit_cast<float>(static_cast<std::uint32_t>(e + 127) << 23); }

std::uint8_t max_finite_code(Fp8Format format) { return format == Fp8Format::E4M3 ? 0x7E : 0x7B; }

}  // namespace

// ---- bf16 ---------------------------------------------------------------------------

std::uint16_t fp32_to_bf16(float x) {
  const auto u = std::bit_cast<std::uint32_t>(x);
  if (is_nan_bits(u)) return kBf16Nan;
  // Round to nearest even on the 16 bits dropped; a carry into the exponent is correct
  // rounding up to the next binade (or to infinity past the largest value).
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float bf16_to_fp32(std::uint16_t bits) { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

float round_to_bf16(float x) { return bf16_to_fp32(fp32_to_bf16(x)); }

void round_to_bf16_inplace(float* x, std::int64_t n) {
  // Branch-free so the loop vectorises (at the widest width: integer formulas): the same
  // formula as fp32_to_bf16.
  run_widest([&]() __attribute__((always_inline)) {
    for (std::int64_t i = 0; i < n; ++i) {
      const auto u = std::bit_cast<std::uint32_t>(x[i]);
      const std::uint32_t rounded = ((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) << 16;
      x[i] = std::bit_cast<float>(is_nan_bits(u) ? (kBf16Nan << 16) : rounded);
    }
  });
}

// ---- fp8 ----------------------------------------------------------------------------

std::string_view to_string(Fp8Format format) { return format == Fp8Format::E4M3 ? "e4m3" : "e5m2"; }

Fp8Traits fp8_traits(Fp8Format format) {
  if (format == Fp8Format::E4M3) return {4, 3, 7, 448.0f};
  return {5, 2, 15, 57344.0f};
}

std::uint8_t fp32_to_fp8(float x, Fp8Format format) {
  const Fp8Traits t = fp8_traits(format);
  const auto u = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint8_t>((u & kSignMask) >> 24);
  if (is_nan_bits(u)) return sign | kFp8NanMagnitude;
  const std::uint32_t magnitude = u & kAbsMask;
  if (std::bit_cast<float>(magnitude) >= 2.0f * t.max_finite) return sign | max_finite_code(format);
  const int fp32_exponent = static_cast<int>(magnitude >> 23);
  if (fp32_exponent == 0) return sign;  // fp32 subnormals are far below half the least fp8 step
  const int e = fp32_exponent - 127;
  const int e_min = 1 - t.bias;
  const std::uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;  // 24 bits
  // Bits of the significand to drop: 23 - M for a normal result, more for a subnormal one.
  const int shift = 23 - t.mantissa_bits + (e < e_min ? e_min - e : 0);
  if (shift > 25) return sign;  // below half the least subnormal
  std::uint32_t kept = significand >> shift;
  const std::uint32_t dropped = significand & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1);
  if (dropped > half || (dropped == half && (kept & 1u))) ++kept;
  // A normal result is (biased exponent << M) + fraction; `kept` holds the implicit one, so
  // a carry out of the fraction moves into the exponent as it should. A subnormal result's
  // code is `kept` itself (and kept == 2^M is exactly the least normal code).
  const std::uint32_t code =
      e < e_min ? kept : (static_cast<std::uint32_t>(e + t.bias - 1) << t.mantissa_bits) + kept;
  if (code > max_finite_code(format)) return sign | max_finite_code(format);
  return sign | static_cast<std::uint8_t>(code);
}

float fp8_to_fp32(std::uint8_t code, Fp8Format format) {
  const Fp8Traits t = fp8_traits(format);
  const bool negative = (code & 0x80) != 0;
  const int magnitude = code & 0x7F;
  const int exponent = magnitude >> t.mantissa_bits;
  const int fraction = magnitude & ((1 << t.mantissa_bits) - 1);
  const int exponent_all_ones = (1 << t.exponent_bits) - 1;
  float value;
  if (format == Fp8Format::E4M3 && magnitude == kFp8NanMagnitude) {
    value = std::bit_cast<float>(0x7FC00000u);
  } else if (format == Fp8Format::E5M2 && exponent == exponent_all_ones) {
    value = std::bit_cast<float>(fraction == 0 ? kFp32Inf : 0x7FC00000u);
  } else if (exponent == 0) {
    value = static_cast<float>(fraction) * pow2(1 - t.bias - t.mantissa_bits);  // exact
  } else {
    value = std::bit_cast<float>(static_cast<std::uint32_t>(exponent - t.bias + 127) << 23 |
                                 static_cast<std::uint32_t>(fraction) << (23 - t.mantissa_bits));
  }
  return negative ? -value : value;
}

// Float arithmetic instead of a code round trip, so quantising a tensor vectorises:
// adding C = 1.5 * 2^(23 + e - M) leaves a sum whose last place is exactly the fp8 step
// 2^(e - M) at x's exponent e (clamped to the subnormal step below the least normal), so
// the hardware's round-to-nearest-even puts x on the fp8 grid, and the subtraction is
// exact. Branch-free; tests check it against fp8_to_fp32(fp32_to_fp8(x)).
namespace {
__attribute__((always_inline)) inline float round_to_fp8_lane(float x, float max_finite, std::uint32_t least_normal_exponent, std::uint32_t mantissa_bits) {
  const auto u = std::bit_cast<std::uint32_t>(x);
  float magnitude = std::bit_cast<float>(u & kAbsMask);
  magnitude = magnitude < 2.0f * max_finite ? magnitude : 2.0f * max_finite;  // NaN -> 2 max, fixed below
  std::uint32_t exponent = std::bit_cast<std::uint32_t>(magnitude) >> 23;
  exponent = exponent > least_normal_exponent ? exponent : least_normal_exponent;
  const float c = std::bit_cast<float>((exponent + 23 - mantissa_bits) << 23 | 0x400000u);
  float rounded = (magnitude + c) - c;
  rounded = rounded < max_finite ? rounded : max_finite;
  const std::uint32_t result = std::bit_cast<std::uint32_t>(rounded) | (u & kSignMask);
  return std::bit_cast<float>(is_nan_bits(u) ? 0x7FC00000u : result);
}
}  // namespace

float round_to_fp8(float x, Fp8Format format) {
  const Fp8Traits t = fp8_traits(format);
  return round_to_fp8_lane(x, t.max_finite, static_cast<std::uint32_t>(128 - t.bias),
                           static_cast<std::uint32_t>(t.mantissa_bits));
}

void scale_round_to_fp8(const float* x, float scale, float* out, std::int64_t n, Fp8Format format) {
  const Fp8Traits t = fp8_traits(format);
  const auto least_normal_exponent = static_cast<std::uint32_t>(128 - t.bias);
  const auto mantissa_bits = static_cast<std::uint32_t>(t.mantissa_bits);
  // Each element alone, one IEEE operation at a time: the same bits at every width.
  run_widest([&]() __attribute__((always_inline)) {
    for (std::int64_t i = 0; i < n; ++i) {
      out[i] = round_to_fp8_lane(x[i] * scale, t.max_finite, least_normal_exponent, mantissa_bits);
    }
  });
}

}  // namespace harness::numerics
