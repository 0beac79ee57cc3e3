#include "bf16_first.h"

#include <fmt/format.h>

namespace harness::check {

bool declares_triaged_feature(const std::set<std::string>& budget_features) {
  return budget_features.count(kTriagedFeature) > 0;
}

std::string bf16_first_advice(const std::string& twin_lane, bool twin_passes, const std::string& twin_failure) {
  if (twin_passes) {
    return fmt::format("quantisation drift: only the {} lane moves; the bf16-only lane {} passes", kTriagedFeature,
                       twin_lane);
  }
  return fmt::format("shared math or plumbing: the bf16-only lane {} fails too ({})", twin_lane, twin_failure);
}

}  // namespace harness::check
