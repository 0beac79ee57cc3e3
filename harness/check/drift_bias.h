// One-sided drift: a lane inside its budget whose runs all err in one direction (docs/budgets.md,
// "One-sided drift"). A magnitude budget cannot see it; a sign test and a mean-residual test
// over independent repeats can.
//
// The tests run across repeats, never across the steps of one run: within a run, the steps'
// residuals share one trajectory (a run that drifted to a slightly worse model has a higher
// loss on every later batch), so a one-ulp perturbation of the initial weights alone looks
// biased to a per-step test (12 of 16 perturbed tiny runs at p < 0.0025, measured once:
// docs/budgets.md, "One-sided drift"). Each repeat (another noise seed, another perturbation) contributes
// one number per metric and window: its mean signed residual (run - reference) there.
#pragma once

#include <string>
#include <vector>

#include "budgets.h"
#include "verdict.h"

namespace harness::check {

// The scalar metrics the tests run on (a sketch has no sign to speak of).
inline constexpr const char* kSignedMetrics[] = {"loss"};
// The family-wise level of the sign and mean-residual tests over repeats (calibrate's and
// the nightly's `bias-repeats`).
inline constexpr double kBiasAlpha = 0.01;

struct DriftBias {
  std::string metric;
  Window window;            // the steps whose residuals each repeat averages
  int repeats = 0;          // with a residual there (a bitwise repeat counts as neither side)
  int above = 0, below = 0;  // repeats whose mean residual is > 0, < 0
  double mean = 0;          // over the repeats' mean residuals
  double allowed = 0;       // the window's allowance at the reference's mean value there
  double t = 0;             // mean / (sd / sqrt(repeats)), repeats - 1 degrees of freedom
  double p_sign = 1, p_mean = 1;  // two-sided: exact binomial sign test, Student's t
  bool biased = false;      // min(p_sign, p_mean) below alpha / (2 x the tests made)
};

// Two-sided p-value of `above` successes in `above + below` fair coin flips (exact).
double sign_test_p(int above, int below);
// Two-sided p-value of Student's t with `dof` degrees of freedom.
double student_t_p(double t, int dof);

// Per signed metric and window of `windows` (metric -> windows, the entry's), the tests of
// `repeats` against `reference` at family-wise level `alpha` (Bonferroni over the metrics,
// windows and both tests). Windows anchored to the decisions' part are skipped.
std::vector<DriftBias> one_sided_drift(const std::vector<ReceiptData>& repeats, const ReceiptData& reference,
                                       const std::map<std::string, std::vector<Window>>& windows, double alpha);
// The same, each repeat against its own reference (references[i] for repeats[i]: pairs made
// side by side, e.g. a layout and the one-process run of the same weights); the first
// reference's values size the budget share.
std::vector<DriftBias> one_sided_drift(const std::vector<const ReceiptData*>& repeats,
                                       const std::vector<const ReceiptData*>& references,
                                       const std::map<std::string, std::vector<Window>>& windows, double alpha);

// "loss steps 10-: 8 of 8 repeats above the reference, mean +3.1e-07 (8% of the budget);
// sign p 0.0078, t 9.1 p 1.6e-05: biased".
std::string drift_bias_line(const DriftBias& bias);

}  // namespace harness::check
