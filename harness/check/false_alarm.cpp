#include "false_alarm.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace harness::check {
namespace {

void require_probability(double value, const char* what) {
  if (!(value > 0.0 && value < 1.0)) throw std::invalid_argument(std::string(what) + " must lie in (0, 1)");
}

// P(X <= k) for X ~ Binomial(n, p), summed in log space (lgamma): exact to a few ulps of
// double for the sample counts calibrations use, and no overflow of C(n, i) for large n.
double binomial_cdf(int k, int n, double p) {
  if (p <= 0.0) return 1.0;
  if (p >= 1.0) return k >= n ? 1.0 : 0.0;
  const double log_p = std::log(p), log_q = std::log1p(-p), log_n_factorial = std::lgamma(n + 1.0);
  double sum = 0.0;
  for (int i = 0; i <= k; ++i) {
    const double log_choose = log_n_factorial - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0);
    sum += std::exp(log_choose + i * log_p + (n - i) * log_q);
  }
  return std::min(sum, 1.0);
}

}  // namespace

double false_alarm_upper_bound(int outside, int held_out, double confidence) {
  if (held_out < 1) throw std::invalid_argument("a false-alarm bound needs at least one held-out sample");
  if (outside < 0 || outside > held_out) throw std::invalid_argument("outside must lie in [0, held_out]");
  require_probability(confidence, "confidence");
  const double alpha = 1.0 - confidence;
  if (outside == held_out) return 1.0;
  if (outside == 0) return -std::expm1(std::log(alpha) / held_out);  // 1 - alpha^(1/n), closed form
  // P(X <= outside) falls as p grows: bisect for the p where it reaches alpha.
  double low = 0.0, high = 1.0;
  for (int i = 0; i < 200 && high - low > 1e-15; ++i) {
    const double mid = 0.5 * (low + high);
    (binomial_cdf(outside, held_out, mid) > alpha ? low : high) = mid;
  }
  return high;
}

int held_out_samples_needed(double rate, double confidence) {
  require_probability(rate, "rate");
  require_probability(confidence, "confidence");
  // 1 - alpha^(1/n) <= rate  <=>  n >= ln(alpha) / ln(1 - rate), a positive ratio: n >= 1
  int n = static_cast<int>(std::ceil(std::log(1.0 - confidence) / std::log1p(-rate)));
  while (n > 1 && false_alarm_upper_bound(0, n - 1, confidence) <= rate) --n;  // rounding of the log ratio
  while (false_alarm_upper_bound(0, n, confidence) > rate) ++n;
  return n;
}

double any_false_alarm_bound(std::span<const double> bounds) {
  double sum = 0.0;
  for (const double b : bounds) {
    if (!(b >= 0.0 && b <= 1.0)) throw std::invalid_argument("a false-alarm bound must lie in [0, 1]");
    sum += b;
  }
  return std::min(sum, 1.0);
}

}  // namespace harness::check
