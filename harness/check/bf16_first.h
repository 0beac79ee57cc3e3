// BF16-first triage (docs/budgets.md, "The verdict"): a lane whose budget features hold fp8
// and that fails against its reference is explained by its bf16-only twin, the same lane
// without fp8, judged against the same reference. The twin fails too: the cause is shared
// (math or plumbing both lanes run); it passes: the cause is fp8's quantisation. `check
// --triage-with` and the nightly both give this advice, from here.
#pragma once

#include <set>
#include <string>

namespace harness::check {

// The budget feature BF16-first triage explains: a lane that declares it is triaged, and
// its twin is the lane without it.
inline constexpr const char* kTriagedFeature = "fp8";

bool declares_triaged_feature(const std::set<std::string>& budget_features);

// The advice, from the twin's verdict against the reference: `twin_failure` says how it
// failed (shown when it did).
std::string bf16_first_advice(const std::string& twin_lane, bool twin_passes, const std::string& twin_failure);

}  // namespace harness::check
