// One-sided drift (harness/check/drift_bias.h): the exact sign test and Student's t against
// known values, and the test over repeats on real runs: 80 one-ulp perturbations of micro's
// initial weights (unbiased by construction: each weight moves up or down on a coin) are not
// flagged in groups of 8, and the same runs with a constant bias of 2e-7 added to their loss,
// 5% of the noise budget's 4e-6 there, are.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "drift_bias.h"
#include "receipt_bits.h"
#include "verdict.h"

namespace harness::check {
namespace {

using testing::lane;
using testing::scratch;

TEST(DriftBias, SignTestIsTheExactBinomialTail) {
  EXPECT_DOUBLE_EQ(sign_test_p(8, 0), 2.0 / 256);
  EXPECT_DOUBLE_EQ(sign_test_p(0, 8), 2.0 / 256);
  EXPECT_DOUBLE_EQ(sign_test_p(4, 4), 1.0);
  EXPECT_DOUBLE_EQ(sign_test_p(0, 0), 1.0);
  EXPECT_NEAR(sign_test_p(9, 1), 2.0 * 11 / 1024, 1e-15);  // P(X <= 1), n = 10: (1 + 10) / 1024, both sides
  for (int n = 1; n <= 30; ++n) {  // against the tail summed in integers
    for (int k = 0; k <= n; ++k) {
      long long tail = 0, binomial = 1;  // C(n, i), i = 0..min(k, n - k)
      for (int i = 0; i <= std::min(k, n - k); ++i) {
        tail += binomial;
        binomial = binomial * (n - i) / (i + 1);
      }
      EXPECT_NEAR(sign_test_p(k, n - k), std::min(1.0, 2.0 * static_cast<double>(tail) / std::ldexp(1.0, n)), 1e-12)
          << k << " of " << n;
    }
  }
}

TEST(DriftBias, StudentTMatchesTablesAndTheNormalLimit) {
  EXPECT_NEAR(student_t_p(2.0, 10), 0.07339, 1e-4);   // two-sided, df 10
  EXPECT_NEAR(student_t_p(2.228, 10), 0.05, 2e-4);    // the 97.5% quantile
  EXPECT_NEAR(student_t_p(12.706, 1), 0.05, 2e-4);
  EXPECT_NEAR(student_t_p(1.959964, 1000000), 0.05, 1e-4);
  EXPECT_DOUBLE_EQ(student_t_p(0, 7), 1.0);
  EXPECT_DOUBLE_EQ(student_t_p(INFINITY, 7), 0.0);
  EXPECT_DOUBLE_EQ(student_t_p(-3.0, 5), student_t_p(3.0, 5));
  for (double t = 0; t < 20; t += 0.5) EXPECT_GT(student_t_p(t, 4), student_t_p(t + 0.5, 4)) << t;
}

// micro's loss windows of [noise]: steps 0-9 and 10-.
std::map<std::string, std::vector<Window>> noise_windows() {
  return {{"loss", {Window{0, 9, 1.5e-6}, Window{10, std::numeric_limits<int>::max(), 4e-6}}}};
}

// micro on 2 threads, its initial weights perturbed under `seed` when given, as read back.
ReceiptData micro_run(std::optional<std::int64_t> seed, const std::string& tag) {
  run::RunOptions o = lane("micro", 20, 2);
  o.perturb_init = seed;
  o.out = scratch().path(tag + ".h5");
  o.force = true;
  run::run_canary(o);
  return load_receipt(o.out);
}

// 5% of the noise budget's 4e-6 at steps 10-: a bias no magnitude budget sees.
constexpr double kBias = 2e-7;

TEST(DriftBias, PerturbedRunsAreNotFlaggedAndAConstantBiasInsideTheBudgetIs) {
  const ReceiptData ref = micro_run(std::nullopt, "bias-ref");
  std::vector<ReceiptData> runs;
  for (int seed = 1; seed <= 80; ++seed) runs.push_back(micro_run(seed, fmt::format("bias-p{}", seed)));
  const auto any_biased = [](const std::vector<DriftBias>& tests) {
    return std::any_of(tests.begin(), tests.end(), [](const DriftBias& b) { return b.biased; });
  };
  int flagged = 0, flagged_biased = 0;
  for (std::size_t first = 0; first < runs.size(); first += 8) {
    std::vector<ReceiptData> group(runs.begin() + first, runs.begin() + first + 8);
    flagged += any_biased(one_sided_drift(group, ref, noise_windows(), 0.01)) ? 1 : 0;
    for (ReceiptData& r : group) {
      for (double& loss : r.loss) loss += kBias;
    }
    const auto biased = one_sided_drift(group, ref, noise_windows(), 0.01);
    ASSERT_EQ(biased.size(), 2u);
    flagged_biased += any_biased(biased) ? 1 : 0;
    EXPECT_GT(biased[1].mean, 0);
    EXPECT_LT(biased[1].mean, 0.1 * biased[1].allowed);  // inside the budget by far
  }
  fmt::print("one-sided drift, groups of 8 perturbed micro runs: {} of 10 flagged; +{:g} on the loss: {} of 10\n",
             flagged, kBias, flagged_biased);
  EXPECT_LE(flagged, 1) << "of 10 groups at family-wise level 0.01";
  EXPECT_GE(flagged_biased, 6) << "of 10 groups";
}

TEST(DriftBias, BitwiseRepeatsAreNeitherSideAndTheLineSaysWhy) {
  const ReceiptData same = micro_run(std::nullopt, "bias-same");
  const auto tests = one_sided_drift({same, same, same}, same, noise_windows(), 0.01);
  ASSERT_EQ(tests.size(), 2u);
  EXPECT_EQ(tests[0].above + tests[0].below, 0);
  EXPECT_FALSE(tests[0].biased);
  EXPECT_EQ(drift_bias_line(tests[1]).rfind("loss steps 10-: 0 of 3 repeats above the reference, 0 below", 0), 0u)
      << drift_bias_line(tests[1]);
}

// Pairs (calibrate --receipts R.. --reference per receipt): each repeat is judged against its
// own reference. Repeats equal to their references are neither side, though they differ
// from one another; the same repeats shifted by kBias are all above theirs.
TEST(DriftBias, PairedRepeatsAreJudgedEachAgainstItsOwnReference) {
  std::vector<ReceiptData> references;
  for (int seed = 1; seed <= 8; ++seed) references.push_back(micro_run(seed, fmt::format("bias-pair{}", seed)));
  std::vector<const ReceiptData*> own;
  for (const ReceiptData& r : references) own.push_back(&r);
  const auto equal = one_sided_drift(own, own, noise_windows(), 0.01);
  ASSERT_EQ(equal.size(), 2u);
  EXPECT_EQ(equal[1].above + equal[1].below, 0) << drift_bias_line(equal[1]);
  const auto against_first = one_sided_drift(own, std::vector<const ReceiptData*>(own.size(), own.front()),
                                             noise_windows(), 0.01);
  EXPECT_GT(against_first[1].above + against_first[1].below, 0) << "the perturbed runs differ from one another";

  std::vector<ReceiptData> shifted = references;
  for (ReceiptData& r : shifted) {
    for (double& loss : r.loss) loss += kBias;
  }
  std::vector<const ReceiptData*> repeats;
  for (const ReceiptData& r : shifted) repeats.push_back(&r);
  const auto biased = one_sided_drift(repeats, own, noise_windows(), 0.01);
  EXPECT_EQ(biased[1].above, 8) << drift_bias_line(biased[1]);
  EXPECT_TRUE(biased[1].biased) << drift_bias_line(biased[1]);
  EXPECT_NEAR(biased[1].mean, kBias, 1e-12);
}

}  // namespace
}  // namespace harness::check
