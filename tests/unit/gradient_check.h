// Central finite differences for gradient checks. The probe loss is accumulated in
// double so that the only fp32 error left is the op's own.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace harness::testing {

struct Tolerance {
  double rtol = 3e-2;
  double atol = 2e-3;
  float relative_step = 1e-2f;  // h = relative_step * max(1, |x_j|)
};

// For each of up to `max_checks` indices of x (spread evenly), compares analytic[j]
// against (L(x + h e_j) - L(x - h e_j)) / 2h, with h scaled to |x_j|.
inline void expect_gradient(const std::string& what, std::vector<float>& x, const std::function<double()>& loss,
                            const std::vector<float>& analytic, Tolerance tol = {}, std::size_t max_checks = 64) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  const std::size_t stride = x.size() > max_checks ? x.size() / max_checks : 1;
  for (std::size_t j = 0; j < x.size(); j += stride) {
    const float saved = x[j];
    const float h = tol.relative_step * std::max(1.0f, std::fabs(saved));
    x[j] = saved + h;
    const double up = loss();
    x[j] = saved - h;
    const double down = loss();
    x[j] = saved;
    const double numeric = (up - down) / (2.0 * static_cast<double>(h));
    const double a = analytic[j];
    EXPECT_LE(std::fabs(a - numeric), tol.atol + tol.rtol * std::max(std::fabs(a), std::fabs(numeric)))
        << what << "[" << j << "]: analytic " << a << " vs numeric " << numeric;
  }
}

// sum_i w_i * out_i in double: the probe loss whose gradient w.r.t. out is w.
inline double weighted_sum(const std::vector<float>& out, const std::vector<float>& w) {
  double s = 0.0;
  for (std::size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * w[i];
  return s;
}

}  // namespace harness::testing
