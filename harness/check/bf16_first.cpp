#include "bf16_first.h"

#include <fmt/format.h>

namespace harness::check {

std::optional<TriagedFeature> triaged_feature(const std::set<std::string>& budget_features, const Budgets& budgets) {
  for (const std::string& name : budget_features) {
    const auto entry = budgets.features.find(name);
    if (entry != budgets.features.end() && !entry->second.triage_twin.empty()) {
      return TriagedFeature{name, entry->second.triage_twin};
    }
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
