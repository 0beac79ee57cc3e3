#include "function_bounds.h"

#include <algorithm>
#include <cmath>

#include "det_math.h"
#include "rounding_bounds.h"

namespace harness::numerics {
namespace {

double fp32_unit_roundoff() { return precision_traits(Precision::Fp32).unit_roundoff; }

}  // namespace

double attention_score_error(std::int64_t head_size, double abs_products, double abs_dot, double scale) {
  const double g3 = gamma(3, fp32_unit_roundoff());
  return scale * (dot_product_bound(head_size, abs_products, Precision::Fp32) * (1 + g3) + g3 * abs_dot);
}

double softmax_exponent_error(double delta, double max_delta, double distance_from_max) {
  const double u = fp32_unit_roundoff();
  const double z = (distance_from_max + delta + max_delta) * (1 + u);  // |the computed exponent|
  return delta + max_delta + u * z / (1 - u);
}

double softmax_probability_factor(double eta, double max_eta, std::int64_t n, double exp_ulps) {
  const double u = fp32_unit_roundoff(), exp_relative = 2 * u * exp_ulps;  // an ulp at y is at most 2 u |y|
  const double low = (1 - exp_relative) * (1 - gamma(n - 1, u)) - static_cast<double>(n) * 0x1p-126;
  return det_exp(eta + max_eta) * (1 + exp_relative) * (1 + u) * (1 + u) / low;
}

double softmax_probability_bound(double p, double eta, double max_eta, std::int64_t n, double exp_ulps) {
  return (softmax_probability_factor(eta, max_eta, n, exp_ulps) - 1) * p + kSoftmaxUnderflow;
}

double attention_output_bound(const AttentionOutputTerms& t) {
  const double delta = attention_score_error(t.head_size, t.abs_products, t.abs_dot, t.scale);
  // A row of one key takes exp of exactly 0 (its score less itself), whatever its score's error.
  const double eta = t.keys == 1 ? 0.0 : softmax_exponent_error(delta, delta, t.spread);
  const double factor = softmax_probability_factor(eta, eta, t.keys, t.exp_ulps);
  const double underflow = kSoftmaxUnderflow * t.abs_values;
  const double flushed = static_cast<double>(t.keys + 1) * 0x1p-126;  // products and the sum, flushed
  return (factor - 1) * t.magnitude + underflow +
         dot_product_bound(t.keys, factor * t.magnitude + underflow, Precision::Fp32) + flushed;
}

std::int64_t gelu_argument_roundings(GeluForm form) { return form == GeluForm::Tanh ? 7 : 2; }

double gelu_output_bound(const GeluTerms& t) {
  const double u = fp32_unit_roundoff(), g2 = gamma(2, u);
  const double a = std::fabs(t.argument), da = gamma(gelu_argument_roundings(t.form), u) * a;
  const double z = std::max(0.0, a - da);
  double slope = 0;  // f' at z, its largest between a and a^
  if (t.form == GeluForm::Tanh) {
    const double e = det_exp(-2 * z);  // sech^2 z = 4 e^(-2z) / (1 + e^(-2z))^2
    slope = 4 * e / ((1 + e) * (1 + e));
  } else {
    slope = 1.1283791670955126 * det_exp(-z * z);  // 2 / sqrt(pi)
  }
  const double e = slope * da + t.function_error;  // E: f^(a^) against f(a)
  return 0.5 * std::fabs(t.x) * (e * (1 + g2) + g2 * (1 + std::fabs(t.function) + e)) +
         0x1p-126;  // a subnormal result flushed to zero
}

double gelu_erf_backward_bound(const GeluBackwardTerms& t, double erf_error, double exp_ulps) {
  const double u = fp32_unit_roundoff();
  const double a = std::fabs(t.x) * 0.7071067811865476, da = gamma(gelu_argument_roundings(GeluForm::Erf), u) * a;
  const double z = std::max(0.0, a - da);
  const double e = 1.1283791670955126 * det_exp(-z * z) * da + erf_error;  // erf(a^) against erf(a)
  const double cdf = 0.5 * (e + u * (1 + std::fabs(2 * t.cdf - 1) + e));
  const double pdf = det_exp(u * t.x * t.x / 2) * (1 + 2 * u * exp_ulps) * (1 + u) * (1 + u) - 1;
  const double term = std::fabs(t.x) * t.pdf;
  // x pdf's error; none where pdf is 0 (|x| past 1.5e5, where exp(u x^2 / 2) is infinite).
  const double term_error = term == 0 ? 0.0 : term * ((1 + pdf) * (1 + u) - 1);
  const double derivative = cdf + term_error + u * (t.cdf + term + cdf + term_error);
  const double g = std::fabs(t.grad);
  // A product g D^ below the least normal value is off by up to half a subnormal step (a step
  // taken: a subnormal gradient's, found by a helper's review at 10^6 times a relative bound).
  return g * derivative * (1 + u) + u * g * std::fabs(t.cdf + t.x * t.pdf) + g * (1 + std::fabs(t.x)) * 0x1p-126 +
         0x1p-149;
}

double silu_output_bound(double abs_silu, double silu_error) { return silu_error * abs_silu + kSiluLost; }

double swiglu_output_bound(double abs_product, double abs_up, double silu_error) {
  const double u = fp32_unit_roundoff();
  return (silu_error + u + silu_error * u) * abs_product + kSiluLost * abs_up * (1 + u) + 0x1p-126;
}

double log_softmax_bound(const CrossEntropyRow& r, std::int64_t classes, double exp_ulps, double log_ulps) {
  const double u = fp32_unit_roundoff(), g2 = gamma(2, u);
  const auto log_factor = [](double x) { return x / (1 - x); };  // >= -log(1 - x): a factor 1 +- x as a log
  const double rho = u * r.spread / (1 - u) + log_factor(2 * u * exp_ulps) + log_factor(gamma(classes - 1, u)) +
                     log_factor(static_cast<double>(classes) * 0x1p-126);
  const double log_error = rho + 2 * u * log_ulps * (r.log_sum + rho);
  return log_error * (1 + g2) + g2 * (std::fabs(r.max) + r.log_sum + std::fabs(r.target));
}

double cross_entropy_mean_bound(std::span<const CrossEntropyRow> rows, std::int64_t classes, double exp_ulps,
                                double log_ulps) {
  const auto count = static_cast<std::int64_t>(rows.size());
  const double g_mean = gamma(count + 1, fp32_unit_roundoff());
  double errors = 0, losses = 0;
  for (const CrossEntropyRow& r : rows) {
    errors += log_softmax_bound(r, classes, exp_ulps, log_ulps);
    losses += r.max + r.log_sum - r.target;
  }
  return (errors * (1 + g_mean) + g_mean * losses) / static_cast<double>(count);
}

double log_softmax_backward_bound(double probability, double abs_sum, double sum_abs, double abs_result,
                                  std::int64_t n, double exp_ulps) {
  const double u = fp32_unit_roundoff(), e = 2 * u * exp_ulps, g = gamma(n - 1, u);
  const double product = probability * g * sum_abs * (1 + e) * (1 + u) + probability * abs_sum * ((1 + e) * (1 + u) - 1);
  // Below the least normal value the relative model fails: exp's result within exp_ulps of
  // the subnormal step (2^-149) times |a^|, the product's rounding half a step (a one-hot g's
  // row off its target, p_j |a| < 2^-126 where the logits part by about 87).
  const double underflow = exp_ulps * 0x1p-149 * (abs_sum + g * sum_abs) + 0x1p-150;
  return (1 + u) * (product + underflow) + u * abs_result;
}

}  // namespace harness::numerics
