// Rounding-error bounds an op's output must satisfy: the first piece of a float64 oracle
// that says which of two engines is right. Each bound is an absolute error bound, worst
// case over every input that has the stated sums, for one op on its own inputs.
//
// The model is the standard one (Higham, "Accuracy and Stability of Numerical Algorithms",
// 2nd ed., §2.2): rounding to nearest in a format with unit roundoff u gives
//   fl(x) = x (1 + d) + e,   |d| <= u,   |e| <= half the subnormal step,
// and at most one of d, e is nonzero (e only below the least normal). The formats are
// the ones engines/numerics/formats.h converts to; tests/unit/rounding_bounds_test.cpp
// checks every bound against that code, exhaustively for fp8.
//
// Limits: no bound here covers overflow (rounding_bound says +inf), and the sum and dot
// product bounds assume no underflow in the partial sums (Higham's assumption too). They
// bound one op; errors carried in from earlier ops are the caller's to add.
#pragma once

#include <cstdint>
#include <string_view>

#include "formats.h"

namespace harness::numerics {

// The precision an op rounds its output (or its accumulator) to.
enum class Precision : std::uint8_t { Fp32, Bf16, Fp8E4M3, Fp8E5M2 };
std::string_view to_string(Precision precision);
Precision fp8_precision(Fp8Format format);

struct PrecisionTraits {
  int mantissa_bits;         // fraction bits stored; the significand has one more
  int min_normal_exponent;   // the least normal value is 2^min_normal_exponent
  double unit_roundoff;      // u = 2^-(mantissa_bits + 1), half the spacing at 1
  double smallest_spacing;   // the least subnormal, and the grid's step below the least normal
  double max_finite;
};
// fp32: u 2^-24, step 2^-149; bf16: u 2^-8, step 2^-133 (fp32's exponent range, 7 fraction
// bits); e4m3: u 2^-4, step 2^-9, max 448; e5m2: u 2^-3, step 2^-16, max 57344.
PrecisionTraits precision_traits(Precision precision);

// gamma_n = n u / (1 - n u), for n u < 1 (Higham §3.1, Lemma 3.1): the product of n
// factors (1 + d_i)^(+-1) with |d_i| <= u is 1 + theta with |theta| <= gamma_n.
// Throws std::invalid_argument when n < 0 or n u >= 1 (the lemma says nothing there).
double gamma(std::int64_t n, double u);

// The spacing of the precision's grid at |value|: 2^(e - mantissa_bits) for
// 2^e <= |value| < 2^(e+1), and the subnormal step below the least normal (so also at 0).
// Beyond max finite it continues as if the exponent range were unbounded. NaN for a
// non-finite value.
double ulp_of(double value, Precision precision);

// |computed - exact| / ulp_of(exact): a rounding to nearest is within 0.5.
double error_in_ulps(double computed, double exact, Precision precision);

// Recursive (sequential) dot product of k terms: each product rounded to `accumulate`,
// then added left to right in it. Higham §3.1:
//   |sum a_i b_i - fl(sum a_i b_i)| <= gamma_k(u) * sum |a_i b_i|.
// An fp32 kernel that forms the product in fp32 and adds it to an fp32 accumulator is
// this case; so is an FMA chain (one rounding fewer per term, the bound still holds).
double dot_product_bound(std::int64_t k, double sum_abs_products, Precision accumulate);

// Recursive summation of n terms, each add rounded to the precision (Higham §4.2):
//   |sum x_i - fl(sum x_i)| <= gamma_{n-1}(u) * sum |x_i|.   (0 for n <= 1)
double recursive_sum_bound(std::int64_t n, double sum_abs, Precision precision);

// Pairwise summation (halves summed recursively, then added; Higham §4.2): each term
// goes through at most ceil(log2 n) roundings, so
//   |sum x_i - fl(sum x_i)| <= gamma_{ceil(log2 n)}(u) * sum |x_i|.   (0 for n <= 1)
double pairwise_sum_bound(std::int64_t n, double sum_abs, Precision precision);

// Rounding exact * scale to the precision, to nearest, then dividing by scale (the
// quantise/dequantise of engines/numerics/fp8_scaling.h). Higham §2.2 with gradual
// underflow: |fl(x s)/s - x| <= u |x| + (smallest_spacing / 2) / |s|.
// The multiply and divide by scale are exact here; a power-of-two scale makes them exact
// in fp32 code too, any other scale adds fp32 roundings (~2^-24 |x| each) not included.
// +inf when |exact * scale| > max_finite: fp8 saturates and bf16/fp32 overflow, and no
// relative bound holds there. Throws std::invalid_argument for a zero or non-finite scale.
double rounding_bound(double exact, Precision precision, double scale = 1.0);

// How far an operand may be from the value it was given when a product reads it: within
// relative * |x| + absolute. {u, 0} for a rounding to a format (gradual underflow's half
// step left out, as in the bounds above: a product of weights never comes near it).
struct OperandRounding {
  double relative = 0, absolute = 0;
};
OperandRounding format_rounding(Precision precision);
// An FP8 quantisation in fp32 code (engines/numerics/fp8_scaling.h): x -> fl_f(fl32(x s)) / s,
// the product x s rounded to fp32 first, then to the format: relative u_f + u + u_f u
// (u: fp32's), absolute (least spacing / 2) / |s|. Holds while |x s| <= the format's max
// finite (past it the format saturates: the caller checks, see max_finite). Throws
// std::invalid_argument for a zero or non-finite scale.
OperandRounding scaled_rounding(Precision format, double scale);

// The sums a dot product's bound is made of, for one output: k terms a_i b_i,
// S_ab = sum |a_i b_i|, S_a = sum |a_i|, S_b = sum |b_i|, and an extra term added in (a
// bias, or the value accumulated into).
struct DotSums {
  std::int64_t k = 0;
  double abs_products = 0, abs_a = 0, abs_b = 0, abs_extra = 0;
};
// An accumulator that keeps fewer bits than fp32 over runs of `interval` products, each
// run's sum then added to an fp32 total (FP8 tensor cores' accumulator, promoted every 128
// products as DeepSeek-V3 does; accel's model: engines/accel/limited_accumulator_gemm.h).
// Within a run each step is s = cut(fl32(s + a b)): the fused multiply-add rounded to fp32,
// then cut toward zero to `kept_fraction_bits` fraction bits (a relative error below
// 2^-kept_fraction_bits), so each step is s (1 + eps) with |eps| <= u_run = u + 2^-f + u 2^-f.
// interval 0: fp32 throughout.
struct LimitedAccumulator {
  std::int64_t interval = 0;
  int kept_fraction_bits = 23;
};
// u_run above: the relative error of one step of the accumulator's runs.
double limited_step_error(const LimitedAccumulator& accumulator);

// A dot product whose operands were rounded first as `a` and `b` say, its k products and
// the extra term then added in fp32 in any order, each term through at most
// k + 1 + extra_roundings roundings (an FP8 GEMM's descale: 1/s_a, 1/s_b, their product,
// the partial's multiply: 4):
//   Q = (r_a + r_b + r_a r_b) S_ab + e_b (1 + r_a) S_a + e_a (1 + r_b) S_b + k e_a e_b
//   bound = Q + gamma_{k + 1 + extra_roundings} (S_ab + Q + |extra|)
// (|â b̂ - a b| <= |a| |b̂ - b| + |b̂| |â - a|, summed; the rounded products are at most
// S_ab + Q in magnitude). With both operands {u_p, 0} and no extra roundings it is
// ((1 + u_p)^2 - 1) S_ab + gamma_{k+1} ((1 + u_p)^2 S_ab + |extra|).
// With a limited `accumulator` each product also goes through at most n = min(interval, k)
// steps of a run before the fp32 roundings (the extra term through none of them):
//   bound = Q + (g_run + g (1 + g_run)) (S_ab + Q) + g |extra|,
//   g_run = gamma_n(u_run), g = gamma_{k + 1 + extra_roundings}(u)
// (+inf where n u_run >= 1: such a run keeps no digit the bound can speak for).
double rounded_operands_dot_bound(const DotSums& sums, OperandRounding a, OperandRounding b, int extra_roundings = 0,
                                  const LimitedAccumulator& accumulator = {});

// A layer norm seen only at its input x (one row of C values), weight w, bias b and output
// (a module's: torch's nn.LayerNorm, XLA's lowering of it), whose mean and variance the
// oracle cannot read (docs/oracle.md, "A layer norm at its output"). Per row, with
// mu = sum x / C, A = sum |x| / C, S = sum x^2 / C, v = S - mu^2 and r = 1 / sqrt(v + eps):
//   mean:      |mu^ - mu| <= dmu = gamma_{2C+3} A      (any order of the C adds and the divide, or
//              Welford's updates, about (C + 2 ln C) u A; two more for an output formed as
//              (x r + (-r mu)) w + b, whose roundings of x r and r mu scale with |mu| <= A)
//   variance:  |v^ - v| / (v + eps) <= e_v = gamma_{8C+15} rho + gamma_2,  rho = (S + mu^2) / (v + eps)
//              (two-pass around mu^, sum x^2 / C - mu^2, or Welford's updates; A^2 <= S)
//   rstd:      |r^ - r| / r <= e_r = (1 + e_v / (2 (1 - e_v))) (1 + gamma_3) - 1   (e_v < 1)
//   output:    y_c = (x_c - mu) r w_c + b_c, four roundings (fewer where fused):
//     |y^_c - y_c| <= s e_r + m dmu' (1 + e_r) + gamma_4 ((s + m dmu') (1 + e_r) + o)
// where s = |x_c - mu| r |w_c|, m = |w_c| r A, dmu' = gamma_{2C+3} and o = |b_c|: the
// arguments, all exact (float64). +inf where e_v >= 1 (a row so far from zero against its
// spread that fp32 keeps no digit of its variance).
struct LayerNormTerms {
  std::int64_t channels = 0;  // C
  double conditioning = 0;    // rho of the element's row
  double scaled = 0;          // s
  double mean_term = 0;       // m
  double offset = 0;          // o
};
double layer_norm_output_bound(const LayerNormTerms& terms);
// e_r above: the relative error of a layer norm's rstd (aten.native_layer_norm's third
// result) from its row's C and rho; +inf where e_v >= 1 or gamma_{8C+15} is undefined.
double layer_norm_rstd_error(std::int64_t channels, double conditioning);

}  // namespace harness::numerics
