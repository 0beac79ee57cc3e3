// The false-alarm bound from held-out samples (harness/check/false_alarm.h): its closed form,
// its defining equation, and its frequentist coverage, computed exactly over every outcome.
#include "false_alarm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

namespace harness::check {
namespace {

// P(X = x) for X ~ Binomial(n, p) by the product formula, independent of the library's
// log-space sum (small n only).
double binomial_pmf(int x, int n, double p) {
  double choose = 1.0;
  for (int i = 1; i <= x; ++i) choose = choose * (n - x + i) / i;
  return choose * std::pow(p, x) * std::pow(1.0 - p, n - x);
}

TEST(FalseAlarm, NoneOutsideIsOneMinusAlphaToTheOneOverN) {
  EXPECT_NEAR(false_alarm_upper_bound(0, 16), 1.0 - std::pow(0.05, 1.0 / 16), 1e-15);
  // docs/budgets.md's table ("False alarms"): 8, 16, 30 and 59 held-out samples, none outside
  EXPECT_NEAR(false_alarm_upper_bound(0, 8), 0.312, 5e-4);
  EXPECT_NEAR(false_alarm_upper_bound(0, 16), 0.171, 5e-4);  // the "< 17% at 95%"
  EXPECT_NEAR(false_alarm_upper_bound(0, 30), 0.095, 5e-4);
  EXPECT_NEAR(false_alarm_upper_bound(0, 59), 0.0495, 5e-5);
  EXPECT_NEAR(false_alarm_upper_bound(0, 8, 0.99), 1.0 - std::pow(0.01, 1.0 / 8), 1e-15);
}

TEST(FalseAlarm, TheBoundIsWhereSeeingAtMostKOutsideHasProbabilityAlpha) {
  for (int n : {8, 16, 30}) {
    for (int k = 1; k < n; k += 3) {
      const double p = false_alarm_upper_bound(k, n);
      double cdf = 0.0;
      for (int x = 0; x <= k; ++x) cdf += binomial_pmf(x, n, p);
      EXPECT_NEAR(cdf, 0.05, 1e-9) << k << " of " << n;
    }
  }
}

TEST(FalseAlarm, GrowsWithWhatWasSeenOutsideAndShrinksWithMoreSamples) {
  for (int n : {8, 16, 40}) {
    double before = 0.0;
    for (int k = 0; k <= n; ++k) {
      const double bound = false_alarm_upper_bound(k, n);
      EXPECT_GT(bound, before) << k << " of " << n;
      EXPECT_GE(bound, static_cast<double>(k) / n);  // never below the rate seen
      before = bound;
    }
    EXPECT_EQ(false_alarm_upper_bound(n, n), 1.0);
    EXPECT_LT(false_alarm_upper_bound(1, n + 8), false_alarm_upper_bound(1, n));
  }
}

// Coverage, exactly: whatever the true rate p, the bound computed from the outcome lies at or
// above p with probability at least 95% (summed over every outcome X of Binomial(n, p)).
TEST(FalseAlarm, CoversTheTrueRateAtLeastAtItsConfidenceForEveryRate) {
  for (int n : {8, 16, 24}) {
    std::vector<double> bounds;
    for (int x = 0; x <= n; ++x) bounds.push_back(false_alarm_upper_bound(x, n));
    for (double p = 0.005; p < 1.0; p += 0.005) {
      double covered = 0.0;
      for (int x = 0; x <= n; ++x) covered += bounds[x] >= p ? binomial_pmf(x, n, p) : 0.0;
      EXPECT_GE(covered, 0.95 - 1e-9) << "p " << p << ", n " << n;
    }
  }
}

TEST(FalseAlarm, SamplesNeededIsTheFewestWhoseBoundIsAtMostTheRate) {
  EXPECT_EQ(held_out_samples_needed(0.05), 59);  // the "rule of three": about 3 / 0.05
  EXPECT_EQ(held_out_samples_needed(0.1707), 17);  // 16 give 0.17071, just above
  for (double rate : {0.01, 0.05, 0.1, 0.2, 0.5}) {
    const int n = held_out_samples_needed(rate);
    EXPECT_LE(false_alarm_upper_bound(0, n), rate);
    EXPECT_GT(false_alarm_upper_bound(0, n - 1), rate);
  }
}

TEST(FalseAlarm, AMatrixsBoundIsTheSumOfItsEntriesCappedAtOne) {
  const std::vector<double> two{0.1, 0.05}, many(16, 0.171);
  EXPECT_DOUBLE_EQ(any_false_alarm_bound(two), 0.15);
  EXPECT_EQ(any_false_alarm_bound(many), 1.0);
  EXPECT_EQ(any_false_alarm_bound({}), 0.0);
  EXPECT_THROW(any_false_alarm_bound(std::vector<double>{1.5}), std::invalid_argument);
}

TEST(FalseAlarm, ImpossibleCountsAreRefused) {
  EXPECT_THROW(false_alarm_upper_bound(0, 0), std::invalid_argument);
  EXPECT_THROW(false_alarm_upper_bound(-1, 8), std::invalid_argument);
  EXPECT_THROW(false_alarm_upper_bound(9, 8), std::invalid_argument);
  EXPECT_THROW(false_alarm_upper_bound(0, 8, 1.0), std::invalid_argument);
  EXPECT_THROW(held_out_samples_needed(0.0), std::invalid_argument);
  EXPECT_THROW(held_out_samples_needed(0.05, 0.0), std::invalid_argument);
}

}  // namespace
}  // namespace harness::check
