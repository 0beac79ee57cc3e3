#include "drift_bias.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace harness::check {
namespace {

// The regularized incomplete beta function I_x(a, b), by its continued fraction (modified
// Lentz), on the side where it converges fast. Report-only arithmetic: libm is fine here.
double incomplete_beta(double x, double a, double b) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  if (x > (a + 1) / (a + b + 2)) return 1 - incomplete_beta(1 - x, b, a);
  const double front = std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) +
                                b * std::log1p(-x)) / a;
  constexpr double kTiny = 1e-300;
  double f = 1, c = 1, d = 0;
  for (int i = 0; i <= 400; ++i) {
    const int m = i / 2;
    double numerator = 1;
    if (i > 0 && i % 2 == 0) numerator = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m));
    if (i % 2 == 1) numerator = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1));
    d = 1 + numerator * d;
    d = std::abs(d) < kTiny ? kTiny : d;
    d = 1 / d;
    c = 1 + numerator / c;
    c = std::abs(c) < kTiny ? kTiny : c;
    const double step = c * d;
    f *= step;
    if (std::abs(1 - step) < 1e-15) break;
  }
  return front * (f - 1);
}

// A signed metric's per-step values (kSignedMetrics).
const std::vector<double>& series(const ReceiptData& r, const std::string& metric) {
  return metric == "loss" ? r.loss : r.grad_norm;
}

// The signed residual of `metric` at `step`.
double residual(const ReceiptData& run, const ReceiptData& reference, const std::string& metric, int step) {
  const auto at = static_cast<std::size_t>(step);
  return series(run, metric)[at] - series(reference, metric)[at];
}

// One window's test over the repeats, each against its reference; `tests` is the Bonferroni
// count.
DriftBias window_test(const std::vector<const ReceiptData*>& repeats, const std::vector<const ReceiptData*>& references,
                      const std::string& metric, const Window& window, double alpha, int tests) {
  DriftBias b{metric, window};
  const ReceiptData& first_reference = *references.front();
  const int last = std::min(window.last, first_reference.steps() - 1);
  std::vector<double> means;
  for (std::size_t i = 0; i < repeats.size(); ++i) {
    const ReceiptData& run = *repeats[i];
    const int end = std::min({last, run.steps() - 1, references[i]->steps() - 1});
    if (end < window.first) continue;
    double sum = 0;
    for (int step = window.first; step <= end; ++step) sum += residual(run, *references[i], metric, step);
    const double mean = sum / (end - window.first + 1);
    if (mean > 0) ++b.above;
    if (mean < 0) ++b.below;
    means.push_back(mean);
  }
  b.repeats = static_cast<int>(means.size());
  if (means.empty()) return b;
  double reference_mean = 0;
  for (int step = window.first; step <= last; ++step) reference_mean += series(first_reference, metric)[step];
  b.allowed = window.allowance(reference_mean / std::max(1, last - window.first + 1));
  for (double m : means) b.mean += m;
  b.mean /= static_cast<double>(means.size());
  b.p_sign = sign_test_p(b.above, b.below);
  if (means.size() >= 2) {
    double squares = 0;
    for (double m : means) squares += (m - b.mean) * (m - b.mean);
    const double sd = std::sqrt(squares / static_cast<double>(means.size() - 1));
    b.t = sd > 0 ? b.mean / (sd / std::sqrt(static_cast<double>(means.size())))
                 : (b.mean == 0 ? 0 : std::copysign(std::numeric_limits<double>::infinity(), b.mean));
    b.p_mean = student_t_p(b.t, static_cast<int>(means.size()) - 1);
  }
  b.biased = std::min(b.p_sign, b.p_mean) < alpha / (2.0 * tests);
  return b;
}

}  // namespace

double sign_test_p(int above, int below) {
  const int n = above + below, k = std::min(above, below);
  if (n == 0) return 1;
  double tail = 0;  // P(X <= k), X ~ Binomial(n, 1/2), summed in logs
  for (int i = 0; i <= k; ++i) {
    tail += std::exp(std::lgamma(n + 1.0) - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) - n * std::log(2.0));
  }
  return std::min(1.0, 2 * tail);
}

double student_t_p(double t, int dof) {
  if (dof < 1 || std::isnan(t)) return 1;
  if (std::isinf(t)) return 0;
  return incomplete_beta(dof / (dof + t * t), dof / 2.0, 0.5);
}

std::vector<DriftBias> one_sided_drift(const std::vector<const ReceiptData*>& repeats,
                                       const std::vector<const ReceiptData*>& references,
                                       const std::map<std::string, std::vector<Window>>& windows, double alpha) {
  if (repeats.empty() || references.size() != repeats.size()) return {};
  std::vector<std::pair<std::string, Window>> tested;
  for (const char* metric : kSignedMetrics) {
    const auto it = windows.find(metric);
    if (it == windows.end()) continue;
    for (const Window& w : it->second) {
      if (!w.from_decisions_part && w.first < references.front()->steps()) tested.emplace_back(metric, w);
    }
  }
  std::vector<DriftBias> out;
  for (const auto& [metric, window] : tested) {
    out.push_back(window_test(repeats, references, metric, window, alpha, static_cast<int>(tested.size())));
  }
  return out;
}

std::vector<DriftBias> one_sided_drift(const std::vector<ReceiptData>& repeats, const ReceiptData& reference,
                                       const std::map<std::string, std::vector<Window>>& windows, double alpha) {
  std::vector<const ReceiptData*> runs;
  for (const ReceiptData& r : repeats) runs.push_back(&r);
  return one_sided_drift(runs, std::vector<const ReceiptData*>(runs.size(), &reference), windows, alpha);
}

std::string drift_bias_line(const DriftBias& b) {
  const std::string steps = b.window.last == std::numeric_limits<int>::max()
                                ? fmt::format("{}-", b.window.first)
                                : fmt::format("{}-{}", b.window.first, b.window.last);
  const std::string share = b.allowed > 0 ? fmt::format(" ({:.0f}% of the budget)", 100 * std::abs(b.mean) / b.allowed)
                                          : "";
  return fmt::format("{} steps {}: {} of {} repeats above the reference, {} below, mean {:+.2g}{}; sign p {:.2g}, "
                     "t {:.2g} p {:.2g}: {}",
                     b.metric, steps, b.above, b.repeats, b.below, b.mean, share, b.p_sign, b.t, b.p_mean,
                     b.biased ? "biased" : "no one-sided drift");
}

}  // namespace harness::check
