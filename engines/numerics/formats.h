// Low-precision number formats of accelerator training stacks: BF16 and the two OCP FP8
// formats. Conversions are bit formulas on integers, so they are exact and portable and
// any engine can use them.
//
//   bf16   1.8.7   fp32's top 16 bits; max 3.39e38, inf, NaN; machine epsilon 2^-7.
//   e4m3   1.4.3   bias 7, max 448, no infinity, NaN only S.1111.111 (0x7F / 0xFF).
//   e5m2   1.5.2   bias 15, max 57344, IEEE-like with infinity and NaN.
//
// Encoding rounds to nearest, ties to even. BF16 overflows to infinity and maps every NaN
// to 0x7FC0. FP8 encoding saturates ("satfinite"): a finite value or an infinity beyond
// the largest finite code becomes that code with the input's sign; NaN stays NaN.
// Decoding is exact in every format (each code is an fp32 value).
#pragma once

#include <cstdint>
#include <string_view>

namespace harness::numerics {

std::uint16_t fp32_to_bf16(float x);
float bf16_to_fp32(std::uint16_t bits);
// x rounded to the nearest bf16 value, as an fp32 (what a bf16 store followed by a load gives).
float round_to_bf16(float x);
void round_to_bf16_inplace(float* x, std::int64_t n);

enum class Fp8Format : std::uint8_t { E4M3, E5M2 };
std::string_view to_string(Fp8Format format);

struct Fp8Traits {
  int exponent_bits, mantissa_bits, bias;
  float max_finite;
};
Fp8Traits fp8_traits(Fp8Format format);

std::uint8_t fp32_to_fp8(float x, Fp8Format format);
float fp8_to_fp32(std::uint8_t code, Fp8Format format);
// Quantise and dequantise in one: the fp32 value of the code nearest to x (saturating).
float round_to_fp8(float x, Fp8Format format);
// out[i] = round_to_fp8(x[i] * scale): a tensor onto the FP8 grid (out may alias x).
void scale_round_to_fp8(const float* x, float scale, float* out, std::int64_t n, Fp8Format format);

}  // namespace harness::numerics
