// The margin a proposed window gets over its largest sample (harness/check/margin.h): the
// tolerance factor against published exact values, the bound's coverage by simulation, and
// the rule's edges (no spread, a zero need, scale), and the scale a window is proposed at.
#include "margin.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

namespace harness::check {
namespace {

// One-sided normal tolerance factors, 99% coverage at 95% confidence (exact, noncentral t;
// NIST/SEMATECH e-Handbook 7.2.6.3 and Odeh-Owen's tables).
TEST(Margin, ToleranceFactorIsWithinTwoPercentOfTheExactValue) {
  const std::vector<std::pair<int, double>> exact = {{8, 4.354}, {10, 3.981}, {15, 3.520}, {20, 3.295}, {30, 3.064}, {50, 2.863}};
  for (const auto& [n, k] : exact) EXPECT_NEAR(tolerance_factor(n), k, 0.02 * k) << n;
  for (int n = 3; n < 60; ++n) EXPECT_GT(tolerance_factor(n), tolerance_factor(n + 1)) << n;  // more samples, less margin
  EXPECT_THROW(tolerance_factor(2), std::invalid_argument);  // Natrella's form has no value there
  EXPECT_THROW(tolerance_factor(8, 1.0), std::invalid_argument);
}

// Over many sets of 8 log-normal samples, the bound covers 99% of the distribution in about
// 95% of the sets: the coverage and confidence the rule states.
TEST(Margin, TheBoundCoversNinetyNinePercentOfRunsInNinetyFivePercentOfCalibrations) {
  std::mt19937_64 bits(20261128);
  const auto normal = [&] {  // Box-Muller, for the test only
    const double u1 = (static_cast<double>(bits() >> 11) + 0.5) / 9007199254740992.0;
    const double u2 = (static_cast<double>(bits() >> 11) + 0.5) / 9007199254740992.0;
    return std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  };
  const double mu = -12, sigma = 0.4;  // a loss deviation of about 6e-6, spread by 40%
  const int trials = 4000;
  int covering = 0;
  for (int t = 0; t < trials; ++t) {
    std::vector<double> needs;
    for (int i = 0; i < 8; ++i) needs.push_back(std::exp(mu + sigma * normal()));
    const Margin m = margin_from_spread(needs);
    const double z = (std::log(m.bound) - mu) / sigma;
    covering += 0.5 * std::erfc(-z / std::sqrt(2.0)) >= kMarginCoverage ? 1 : 0;
  }
  const double confidence = static_cast<double>(covering) / trials;
  EXPECT_GT(confidence, 0.93);  // 0.95, less the approximation and 4000 trials' error
  EXPECT_LT(confidence, 0.97);
}

TEST(Margin, NoSpreadGivesTheFloorAndSpreadGivesMore) {
  const std::vector<double> same(8, 3e-6);
  EXPECT_EQ(margin_from_spread(same).factor, kMinMargin);
  EXPECT_NEAR(margin_from_spread(same).bound, 3e-6, 1e-18);
  const std::vector<double> two = {5e-6, 9e-6};  // too few to measure a spread
  EXPECT_EQ(margin_from_spread(two).factor, kMinMargin);
  EXPECT_EQ(margin_from_spread(two).bound, 0);
  const std::vector<double> zeros = {0, 0, 4e-6, 0};  // a zero need carries no spread
  EXPECT_EQ(margin_from_spread(zeros).samples, 1);
  const std::vector<double> spread = {1e-6, 2e-6, 1.5e-6, 3e-6, 1.2e-6, 2.5e-6, 1.8e-6, 2.2e-6};
  const Margin m = margin_from_spread(spread);
  EXPECT_GT(m.factor, kMinMargin);
  EXPECT_NEAR(m.factor * 3e-6, m.bound, 1e-18);
  std::vector<double> scaled;  // the rule reads ratios: scaling every need scales nothing else
  for (const double need : spread) scaled.push_back(1e4 * need);
  EXPECT_NEAR(margin_from_spread(scaled).factor, m.factor, 1e-12);
}

// With nothing covered by other features, the proposal is the margin of the repeats'
// largest deviations times the largest: the rule above, unchanged.
TEST(ProposeScale, WithNothingCoveredIsTheMarginTimesTheLargest) {
  const std::vector<double> largest = {1.0, 2.0, 1.5, 3.0, 1.2, 2.5, 1.8, 2.2};
  std::vector<std::vector<NeedSample>> repeats;
  for (const double d : largest) repeats.push_back({{d / 4, 0, 0.5}, {d, 0, 0.5}});  // unit 0.5: in units, 2d
  const ScaleProposal p = propose_scale(repeats);
  EXPECT_NEAR(p.margin.factor, margin_from_spread(std::vector<double>{2, 4, 3, 6, 2.4, 5, 3.6, 4.4}).factor, 1e-12);
  EXPECT_NEAR(p.needed, 6.0, 1e-12);
  EXPECT_NEAR(p.scale, p.margin.factor * 6.0, 1e-12);
}

// moe-tiny's fp8 over bf16 (2026-11-29): the lane's deviations cluster within 10% of each
// other, and the other features' shares cover all but a sliver of most of them (two
// repeats peak where the shares are smaller). The needs beyond the shares spread over
// decades, so a margin taken from them explodes (it proposed 2,910 there); taken from the
// deviations, it is that of a tight cluster, and the proposal is its reach less the shares:
// the largest deviation keeps a third of the whole window, as kMinMargin intends.
TEST(ProposeScale, AMarginFromTheDeviationsDoesNotExplodeWhereOtherSharesCoverMost) {
  const std::vector<double> deviations = {4.00, 4.05, 3.98, 4.10, 4.02, 4.21, 3.95, 4.07,
                                          4.01, 4.12, 3.99, 4.03, 4.06, 3.97, 4.09, 4.04};
  std::vector<std::vector<NeedSample>> repeats;
  std::vector<double> needs;
  for (std::size_t i = 0; i < deviations.size(); ++i) {
    const double covered = i == 5 || i == 9 ? 3.0 : deviations[i] - 1e-6;
    repeats.push_back({{deviations[i], covered, 1.0}});
    needs.push_back(deviations[i] - covered);
  }
  EXPECT_GT(margin_from_spread(needs).factor, 30);  // the old reading of the same samples: 63
  const ScaleProposal p = propose_scale(repeats);
  EXPECT_LT(p.margin.factor, 2);
  EXPECT_NEAR(p.needed, 1.21, 1e-12);
  EXPECT_NEAR(p.scale, p.margin.factor * 4.21 - 3.0, 1e-12);
  for (const auto& repeat : repeats) {
    for (const NeedSample& s : repeat) {
      EXPECT_LE(s.deviation, s.covered + p.scale * s.unit);                  // every one fits
      EXPECT_LE(s.deviation, (s.covered + p.scale * s.unit) / kMinMargin + 1e-12);  // with a third to spare
    }
  }
}

// A window from the decisions' part (moe-tiny's mesh lanes, 2026-11-29): some perturbed runs
// part and move far (a token takes another expert), others part and stay inside the entry's
// first windows. Those are the first windows' population: counted, their deviations of a
// few ulps beside the flips' 1e-3 spread the logarithms over decades.
TEST(ProposeScale, ARepeatTheSharesCoverWholeIsLeftOutOfTheSpread) {
  std::vector<std::vector<NeedSample>> flips;
  for (const double d : {2.9e-3, 2.1e-3, 2.6e-3, 3.1e-3, 2.4e-3, 2.8e-3, 2.2e-3, 2.7e-3}) flips.push_back({{d, 2e-6, 1e-6}});
  std::vector<std::vector<NeedSample>> with_quiet = flips;
  for (const double d : {1.2e-6, 1.7e-6, 0.9e-6}) with_quiet.push_back({{d, 2e-6, 1e-6}});  // inside the first windows
  const ScaleProposal p = propose_scale(flips), q = propose_scale(with_quiet);
  EXPECT_EQ(q.margin.samples, 8);
  EXPECT_DOUBLE_EQ(q.margin.factor, p.margin.factor);
  EXPECT_DOUBLE_EQ(q.scale, p.scale);
  EXPECT_LT(q.margin.factor, 2);
}

// Flips of moe-tiny's mesh lanes (2026-11-29): three flips among 16 perturbed runs, parting at
// steps 10 to 86, their largest deviations 1.7e-4 to 2.9e-3 as long as each ran after its
// flip. Read as one log-normal the margin was 375 on grad_norm; as discrete events the window
// is the largest times kMinMargin, every flip fits with a third to spare.
TEST(ProposeScale, FlipsAreFittedAsDiscreteEvents) {
  std::vector<std::vector<NeedSample>> repeats;
  for (const double d : {2.9e-3, 1.66e-4, 1.66e-4, 1.19e-3, 1.66e-4, 2.9e-3}) repeats.push_back({{d, 2e-6, 1e-6}});
  EXPECT_GT(propose_scale(repeats).margin.factor, 10);
  const ScaleProposal p = propose_scale(repeats, MarginFrom::kLargestEvent);
  EXPECT_EQ(p.margin.factor, kMinMargin);
  EXPECT_EQ(p.margin.samples, 6);
  EXPECT_NEAR(p.scale, (kMinMargin * 2.9e-3 - 2e-6) / 1e-6, 1e-6);
}

// Wilks: the largest of n samples covers a share p of any continuous population with
// confidence 1 - p^n; checked by simulation on a heavy-tailed one.
TEST(ProposeScale, TheLargestOfNCoversWhatWilksSays) {
  EXPECT_NEAR(distribution_free_coverage(16), 0.829, 0.001);  // 0.05^(1/16)
  EXPECT_NEAR(distribution_free_coverage(59), 0.950, 0.001);
  std::mt19937_64 bits(7);
  std::cauchy_distribution<double> heavy(0, 1);  // a simulation's draws, not a proposal's
  const double p = distribution_free_coverage(16);
  const double quantile = std::tan(3.141592653589793 * (p - 0.5));  // Cauchy's p-quantile
  int covering = 0;
  const int trials = 4000;
  for (int t = 0; t < trials; ++t) {
    double largest = -1e300;
    for (int i = 0; i < 16; ++i) largest = std::max(largest, heavy(bits));
    covering += largest >= quantile ? 1 : 0;
  }
  EXPECT_NEAR(static_cast<double>(covering) / trials, kMarginConfidence, 0.015);
}

// A window the shares cover whole, with room to spare after the margin, needs nothing.
TEST(ProposeScale, SharesThatCoverTheMarginsReachNeedNothing) {
  std::vector<std::vector<NeedSample>> repeats;
  for (const double d : {1.0, 1.1, 0.9, 1.05}) repeats.push_back({{d, 10.0, 1.0}});
  const ScaleProposal p = propose_scale(repeats);
  EXPECT_EQ(p.needed, 0);
  EXPECT_EQ(p.scale, 0);
}

}  // namespace
}  // namespace harness::check
