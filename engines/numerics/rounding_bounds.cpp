#include "rounding_bounds.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

namespace harness::numerics {
namespace {

// One set of traits from the two numbers that define a binary format's grid; u, the
// subnormal step and the least normal follow from them exactly (ldexp is exact).
PrecisionTraits traits_from(int mantissa_bits, int min_normal_exponent, double max_finite) {
  return {mantissa_bits, min_normal_exponent, std::ldexp(1.0, -(mantissa_bits + 1)),
          std::ldexp(1.0, min_normal_exponent - mantissa_bits), max_finite};
}

std::string describe(double value) {
  std::ostringstream out;
  out.precision(17);
  out << value;
  return out.str();
}

// ceil(log2 n) for n >= 1, from the bit width of n - 1: no libm, exact for every n.
std::int64_t ceil_log2(std::int64_t n) {
  return n <= 1 ? 0 : static_cast<std::int64_t>(std::bit_width(static_cast<std::uint64_t>(n - 1)));
}

}  // namespace

std::string_view to_string(Precision precision) {
  switch (precision) {
    case Precision::Fp32: return "fp32";
    case Precision::Bf16: return "bf16";
    case Precision::Fp8E4M3: return "e4m3";
    case Precision::Fp8E5M2: return "e5m2";
  }
  return "unknown";
}

Precision fp8_precision(Fp8Format format) {
  return format == Fp8Format::E4M3 ? Precision::Fp8E4M3 : Precision::Fp8E5M2;
}

PrecisionTraits precision_traits(Precision precision) {
  switch (precision) {
    case Precision::Fp32: return traits_from(23, -126, std::numeric_limits<float>::max());
    // bf16 is fp32's top 16 bits: fp32's exponent range with 7 fraction bits.
    case Precision::Bf16: return traits_from(7, -126, bf16_to_fp32(0x7F7F));
    case Precision::Fp8E4M3:
    case Precision::Fp8E5M2: {
      const Fp8Format format = precision == Precision::Fp8E4M3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
      const Fp8Traits t = fp8_traits(format);
      return traits_from(t.mantissa_bits, 1 - t.bias, t.max_finite);
    }
  }
  throw std::invalid_argument("precision_traits: unknown precision " +
                              std::to_string(static_cast<int>(precision)));
}

double gamma(std::int64_t n, double u) {
  if (n < 0) throw std::invalid_argument("gamma: n = " + std::to_string(n) + " is negative; n counts roundings");
  const double nu = static_cast<double>(n) * u;
  if (!(nu < 1.0)) {
    throw std::invalid_argument("gamma: n*u = " + std::to_string(n) + " * " + describe(u) + " = " + describe(nu) +
                                " is not below 1, so n*u/(1 - n*u) bounds nothing (Higham, Lemma 3.1); "
                                "use a wider accumulator or fewer terms per rounding chain");
  }
  return nu / (1.0 - nu);
}

double ulp_of(double value, Precision precision) {
  if (!std::isfinite(value)) return std::numeric_limits<double>::quiet_NaN();
  const PrecisionTraits t = precision_traits(precision);
  if (value == 0.0) return t.smallest_spacing;
  int exponent = 0;
  std::frexp(value, &exponent);  // |value| = m 2^exponent, m in [0.5, 1): the binade is exponent - 1
  const int binade = std::max(exponent - 1, t.min_normal_exponent);
  return std::ldexp(1.0, binade - t.mantissa_bits);
}

double error_in_ulps(double computed, double exact, Precision precision) {
  return std::fabs(computed - exact) / ulp_of(exact, precision);
}

double dot_product_bound(std::int64_t k, double sum_abs_products, Precision accumulate) {
  return gamma(k, precision_traits(accumulate).unit_roundoff) * sum_abs_products;
}

double recursive_sum_bound(std::int64_t n, double sum_abs, Precision precision) {
  return gamma(std::max<std::int64_t>(n - 1, 0), precision_traits(precision).unit_roundoff) * sum_abs;
}

double pairwise_sum_bound(std::int64_t n, double sum_abs, Precision precision) {
  return gamma(ceil_log2(n), precision_traits(precision).unit_roundoff) * sum_abs;
}

double rounding_bound(double exact, Precision precision, double scale) {
  if (scale == 0.0 || !std::isfinite(scale)) {
    throw std::invalid_argument("rounding_bound: scale = " + describe(scale) +
                                " must be finite and nonzero (it divides the rounded value)");
  }
  const PrecisionTraits t = precision_traits(precision);
  if (!(std::fabs(exact * scale) <= t.max_finite)) return std::numeric_limits<double>::infinity();
  // The relative term in x's own units (u |x s| / |s|), plus the underflow term, which the
  // division by s scales: a large scale shrinks it, which is what scaling is for.
  return t.unit_roundoff * std::fabs(exact) + 0.5 * t.smallest_spacing / std::fabs(scale);
}

OperandRounding format_rounding(Precision precision) { return {precision_traits(precision).unit_roundoff, 0.0}; }

OperandRounding scaled_rounding(Precision format, double scale) {
  if (scale == 0.0 || !std::isfinite(scale)) {
    throw std::invalid_argument("scaled_rounding: scale = " + describe(scale) + " must be finite and nonzero");
  }
  const PrecisionTraits t = precision_traits(format);
  const double u = precision_traits(Precision::Fp32).unit_roundoff;
  return {t.unit_roundoff + u + t.unit_roundoff * u, 0.5 * t.smallest_spacing / std::fabs(scale)};
}

// Relative for normal numbers only (the cut clears low bits: on a subnormal it is an absolute
// loss). An FP8 GEMM's running sums are multiples of 2^-25 at least (its operands lie on E4M3's
// and E5M2's grids), never fp32 subnormals.
double limited_step_error(const LimitedAccumulator& accumulator) {
  const double u = precision_traits(Precision::Fp32).unit_roundoff;
  const double cut = std::ldexp(1.0, -accumulator.kept_fraction_bits);
  return u + cut + u * cut;
}

double rounded_operands_dot_bound(const DotSums& s, OperandRounding a, OperandRounding b, int extra_roundings,
                                  const LimitedAccumulator& accumulator) {
  const double q = (a.relative + b.relative + a.relative * b.relative) * s.abs_products +
                   b.absolute * (1 + a.relative) * s.abs_a + a.absolute * (1 + b.relative) * s.abs_b +
                   static_cast<double>(s.k) * a.absolute * b.absolute;
  if (accumulator.interval == 0) {
    return q + dot_product_bound(s.k + 1 + extra_roundings, s.abs_products + q + s.abs_extra, Precision::Fp32);
  }
  const double u_run = limited_step_error(accumulator);
  const std::int64_t n = std::min(accumulator.interval, s.k);
  if (!(static_cast<double>(n) * u_run < 1.0)) return std::numeric_limits<double>::infinity();
  const double g_run = gamma(n, u_run);
  const double g = gamma(s.k + 1 + extra_roundings, precision_traits(Precision::Fp32).unit_roundoff);
  return q + (g_run + g * (1 + g_run)) * (s.abs_products + q) + g * s.abs_extra;
}

double layer_norm_rstd_error(std::int64_t channels, double conditioning) {
  const double u = precision_traits(Precision::Fp32).unit_roundoff;
  const std::int64_t C = channels;
  if (C < 1 || static_cast<double>(8 * C + 15) * u >= 1) return std::numeric_limits<double>::infinity();
  const double variance = gamma(8 * C + 15, u) * conditioning + gamma(2, u);
  if (!(variance < 1)) return std::numeric_limits<double>::infinity();
  return (1 + variance / (2 * (1 - variance))) * (1 + gamma(3, u)) - 1;
}

double layer_norm_output_bound(const LayerNormTerms& t) {
  const double u = precision_traits(Precision::Fp32).unit_roundoff;
  const double rstd = layer_norm_rstd_error(t.channels, t.conditioning);
  if (!std::isfinite(rstd)) return std::numeric_limits<double>::infinity();
  // rstd finite: 8C + 15 > 2C + 3, so gamma_{2C+3} is defined
  const double mean = t.mean_term * gamma(2 * t.channels + 3, u);
  return t.scaled * rstd + mean * (1 + rstd) + gamma(4, u) * ((t.scaled + mean) * (1 + rstd) + t.offset);
}

}  // namespace harness::numerics
