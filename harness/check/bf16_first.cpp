#include "bf16_first.h"

#include <fmt/format.h>

namespace harness::check {

std::vector<TriagedFeature> triaged_features(const std::set<std::string>& budget_features, const Budgets& budgets) {
  std::vector<TriagedFeature> out;
  for (const std::string& name : budget_features) {
    const auto entry = budgets.features.find(name);
    if (entry != budgets.features.end() && !entry->second.triage_twin.empty()) {
      out.push_back({name, entry->second.triage_twin});
    }
  }
  return out;
}

std::optional<TriagedFeature> feature_the_twin_lacks(const std::vector<TriagedFeature>& features,
                                                     const std::set<std::string>& twin_features) {
  for (const TriagedFeature& f : features) {
    if (!twin_features.count(f.name)) return f;
  }
  return std::nullopt;
}

std::string bf16_first_advice(const TriagedFeature& feature, const std::string& twin_lane, bool twin_passes,
                              const std::string& twin_failure) {
  if (twin_passes) {
    return fmt::format("quantisation drift: only the {} lane moves; the {} lane {} passes", feature.name, feature.twin,
                       twin_lane);
  }
  return fmt::format("shared math or plumbing: the {} lane {} fails too ({})", feature.twin, twin_lane, twin_failure);
}

}  // namespace harness::check
