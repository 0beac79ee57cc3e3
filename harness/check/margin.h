// How far past the largest of N samples a proposed window reaches (docs/budgets.md, "The
// margin"): the samples' own spread decides. Each sample is one independent run's largest
// need in the window (in units of the window's shape); their logarithms are taken as normal,
// and the window is the one-sided upper tolerance bound that covers kMarginCoverage of the
// lane's runs with kMarginConfidence: exp(mean + k(N) * sd) of the logs, k from N. Wide
// spread or few samples give a large margin, a tight cluster a small one; never below
// kMinMargin, the factor calibrate used alone before: the largest sample keeps a third of its
// window, well clear of the fifth under which the nightly calls a lane fragile
// (nightly/headroom.h), and no entry calibrated by the rule is narrower than it was.
#pragma once

#include <span>
#include <vector>

namespace harness::check {

inline constexpr double kMarginCoverage = 0.99;    // of the lane's runs, a window covers this many
inline constexpr double kMarginConfidence = 0.95;  // with this confidence
// The largest sample keeps a third of its window.
inline constexpr double kMinMargin = 1.5;

// The one-sided normal tolerance factor k for n samples, coverage p and confidence gamma
// (Natrella's approximation: within 2% of the exact noncentral-t value from n = 4 on; it has
// no value below 3 samples). Throws std::invalid_argument for n < 3 or p, gamma outside (0.5, 1).
double tolerance_factor(int n, double coverage = kMarginCoverage, double confidence = kMarginConfidence);

struct Margin {
  double factor = kMinMargin;  // the window over the largest sample
  double bound = 0;            // the tolerance bound itself (0: the spread could not be measured)
  int samples = 0;             // the positive samples it was measured from
};

// The margin over max(needs) from the needs' spread (each >= 0; a zero need, a sample the
// other features cover whole, carries no spread and is left out). Fewer than
// kMinSpreadSamples positive needs: kMinMargin (an entry from so few is provisional anyway).
inline constexpr int kMinSpreadSamples = 3;
Margin margin_from_spread(std::span<const double> needs);

// One deviation of a window as calibration sees it.
struct NeedSample {
  double deviation = 0;  // |lane - reference| at one step
  double covered = 0;    // what the other features (and the entry's other windows) allow there
  double unit = 1;       // the window's shape at this reference: atol + rtol |ref| + ulp spacing (1: unshaped)
};

// How the margin is read from the samples: their spread (a log-normal tolerance bound), or,
// for samples of discrete events that are no one population (the flips of a window from the
// decisions' part: each flip its own consequence), distribution-free: kMinMargin over the
// largest, which covers a share p of such events with confidence 1 - p^N (Wilks).
enum class MarginFrom { kSpread, kLargestEvent };

struct ScaleProposal {
  double scale = 0;   // the window's shape times this fits every deviation times the margin
  double needed = 0;  // the scale that fits every deviation as it is (no margin)
  Margin margin;
};

// The scale a window's shape is proposed at, from each repeat's deviations in the window.
// The margin is the spread of the *deviations* (each repeat's largest, in units of the
// shape, of those the shares do not cover whole): the lane's deviation is what the runs
// sample, and what the other features cover is a fixed amount taken off afterwards. Taken
// from each deviation's need beyond those shares instead, most needs are a few ulps where
// the shares nearly cover them and one or two are large, their logarithms spread over
// decades and the margin explodes (docs/budgets.md, "Where the rule proposed nonsense"). A
// repeat the shares cover whole is left out: it samples the others' population (a run whose
// decisions parted without moving past the entry's first windows), not this window's.
// Where nothing is covered, both readings are the same rule.
ScaleProposal propose_scale(const std::vector<std::vector<NeedSample>>& repeats,
                            MarginFrom from = MarginFrom::kSpread);

// The share of a population the largest of n independent samples covers with `confidence`,
// whatever the distribution (Wilks: p with 1 - p^n = confidence).
double distribution_free_coverage(int n, double confidence = kMarginConfidence);

}  // namespace harness::check
