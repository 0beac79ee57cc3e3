// How often a budget fails a bitwise-irrelevant change, from held-out samples (issue 47,
// point 3; docs/budgets.md, "False alarms"). A calibration proposes its windows from some
// samples of a lane's deviation and counts how many of the others, held out, fall outside:
// k of n outside bounds the entry's false-alarm rate from above, at a stated confidence,
// without assuming anything about the deviations' distribution (the samples only have to be
// independent draws of the same variation: noise seeds, perturbed weights, host variants).
#pragma once

#include <span>

namespace harness::check {

// The confidence every false-alarm bound of the harness is stated at.
inline constexpr double kFalseAlarmConfidence = 0.95;

// The one-sided Clopper-Pearson upper bound on a rate seen `outside` times in `held_out`
// independent trials: the largest p for which seeing at most `outside` had probability at
// least 1 - confidence. 0 of 16 at 95%: 1 - 0.05^(1/16) = 0.171. `outside` == `held_out`
// gives 1. Throws std::invalid_argument for held_out < 1, outside outside [0, held_out] or a
// confidence outside (0, 1).
double false_alarm_upper_bound(int outside, int held_out, double confidence = kFalseAlarmConfidence);

// The fewest held-out samples, all inside, whose bound is at most `rate`: how many a tighter
// claim needs (5% at 95%: 59). Throws std::invalid_argument for a rate or confidence outside (0, 1).
int held_out_samples_needed(double rate, double confidence = kFalseAlarmConfidence);

// The probability that at least one of several entries fails a bitwise-irrelevant change, from
// each one's bound: their sum (capped at 1), which holds whatever the entries' dependence
// (Boole's inequality). A matrix's combined estimate in the nightly report.
double any_false_alarm_bound(std::span<const double> bounds);

}  // namespace harness::check
