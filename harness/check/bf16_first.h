// BF16-first triage (docs/budgets.md, "The verdict"): a lane whose budget features hold one
// that triage explains (its budget entry declares triage_twin: [fp8]) and that fails against
// its reference is explained by its twin, the same lane without that feature, judged against
// the same reference. The twin fails too: the cause is shared (math or plumbing both lanes
// run); it passes: the cause is the feature's quantisation. `check --triage-with` and the
// nightly both give this advice, from here.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "budgets.h"

namespace harness::check {

// A budget feature triage explains, and the words that name its twin ("bf16-only").
struct TriagedFeature {
  std::string name, twin;
};

// Those of `budget_features` whose entry in `budgets` declares triage_twin; none: the lane
// is not triaged.
std::vector<TriagedFeature> triaged_features(const std::set<std::string>& budget_features, const Budgets& budgets);

// The one of `features` that the twin's `twin_features` lack: what tells the lane from its
// twin (a bf16+fp8 lane's fp8 where both entries declared a twin, against a bf16 twin).
// nullopt when the twin declares every one.
std::optional<TriagedFeature> feature_the_twin_lacks(const std::vector<TriagedFeature>& features,
                                                     const std::set<std::string>& twin_features);

// The advice, from the twin's verdict against the reference: `twin_failure` says how it
// failed (shown when it did).
std::string bf16_first_advice(const TriagedFeature& feature, const std::string& twin_lane, bool twin_passes,
                              const std::string& twin_failure);

}  // namespace harness::check
