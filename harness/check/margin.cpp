#include "margin.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace harness::check {
namespace {

// The standard normal's quantile, by bisection on erfc (the margin needs 3 digits, not speed).
double normal_quantile(double p) {
  double lo = -10, hi = 10;
  for (int i = 0; i < 200; ++i) {
    const double mid = (lo + hi) / 2;
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

}  // namespace

double tolerance_factor(int n, double coverage, double confidence) {
  if (n < kMinSpreadSamples) throw std::invalid_argument("tolerance_factor: needs at least 3 samples");
  if (!(coverage > 0.5 && coverage < 1) || !(confidence > 0.5 && confidence < 1)) {
    throw std::invalid_argument("tolerance_factor: coverage and confidence must lie in (0.5, 1)");
  }
  const double zp = normal_quantile(coverage), zg = normal_quantile(confidence);
  const double a = 1 - zg * zg / (2.0 * (n - 1));
  const double b = zp * zp - zg * zg / n;
  if (a <= 0) throw std::invalid_argument("tolerance_factor: too few samples for this confidence");  // a high gamma, few n
  return (zp + std::sqrt(zp * zp - a * b)) / a;
}

Margin margin_from_spread(std::span<const double> needs) {
  std::vector<double> logs;
  double largest = 0;
  for (const double need : needs) {
    if (need > 0 && std::isfinite(need)) logs.push_back(std::log(need));
    largest = std::max(largest, need);
  }
  Margin m;
  m.samples = static_cast<int>(logs.size());
  if (m.samples < kMinSpreadSamples || largest <= 0) return m;
  double mean = 0;
  for (const double l : logs) mean += l;
  mean /= static_cast<double>(logs.size());
  double squares = 0;
  for (const double l : logs) squares += (l - mean) * (l - mean);
  const double sd = std::sqrt(squares / static_cast<double>(logs.size() - 1));
  m.bound = std::exp(mean + tolerance_factor(m.samples) * sd);
  m.factor = std::max(kMinMargin, m.bound / largest);
  return m;
}

ScaleProposal propose_scale(const std::vector<std::vector<NeedSample>>& repeats, MarginFrom from) {
  std::vector<double> largest_deviations;  // per repeat, in units of the shape
  for (const std::vector<NeedSample>& repeat : repeats) {
    double largest = 0;  // of the deviations the shares do not cover whole: this window's to answer for
    for (const NeedSample& s : repeat) {
      if (s.unit > 0 && s.deviation > s.covered) largest = std::max(largest, s.deviation / s.unit);
    }
    largest_deviations.push_back(largest);
  }
  ScaleProposal p;
  p.margin = margin_from_spread(largest_deviations);
  if (from == MarginFrom::kLargestEvent) p.margin = {kMinMargin, 0, p.margin.samples};
  for (const std::vector<NeedSample>& repeat : repeats) {
    for (const NeedSample& s : repeat) {
      if (s.unit <= 0) continue;
      p.needed = std::max(p.needed, std::max(0.0, s.deviation - s.covered) / s.unit);
      p.scale = std::max(p.scale, std::max(0.0, p.margin.factor * s.deviation - s.covered) / s.unit);
    }
  }
  return p;
}

double distribution_free_coverage(int n, double confidence) {
  if (n < 1) return 0;
  return std::pow(1 - confidence, 1.0 / n);
}

}  // namespace harness::check
