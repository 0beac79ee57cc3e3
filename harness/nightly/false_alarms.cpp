#include "false_alarms.h"

#include <set>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "false_alarm.h"

namespace harness::nightly {

using json = nlohmann::json;

namespace {

// "false alarms below 23.4% per nightly at 95% (12 checks)", or why there is no estimate.
std::string summary_line(const json& estimate) {
  const int checks = estimate["checks"].get<int>();
  if (checks == 0) return "false alarms: no check judged";
  if (estimate["bound"].is_number()) {
    return fmt::format("false alarms below {:.3g}% per nightly at {:.0f}% confidence ({} checks)",
                       100 * estimate["bound"].get<double>(), 100 * check::kFalseAlarmConfidence, checks);
  }
  return fmt::format("false alarms not estimated: {} of {} checks are judged by entries without held-out samples ({}); "
                     "calibrate them with --held-out (docs/budgets.md, \"False alarms\")",
                     checks - estimate["measured"].get<int>(), checks,
                     fmt::join(estimate["unmeasured"].get<std::vector<std::string>>(), ", "));
}

}  // namespace

json matrix_false_alarm(const json& summary) {
  std::vector<double> bounds;
  std::set<std::string> unmeasured;
  json entries = json::object();
  int checks = 0;
  for (const json& lane : summary.value("lanes", json::array())) {
    for (const json& c : lane.value("checks", json::array())) {
      const json verdict = c.is_object() ? c.value("verdict", json(nullptr)) : json(nullptr);
      if (!verdict.is_object() || !verdict.contains("budget")) continue;  // an error, or a check of no budget
      const json& budget = verdict["budget"];
      ++checks;
      const json false_alarm = budget.value("false_alarm", json::object());
      const json measured_entries = false_alarm.value("entries", json::object());
      for (const auto& [entry, bound] : measured_entries.items()) entries[entry] = bound;
      if (false_alarm.value("bound", json(nullptr)).is_number()) {
        bounds.push_back(false_alarm["bound"].get<double>());
        continue;
      }
      const json composed = budget.value("samples", json::object());  // every tolerance entry, with its count
      for (const auto& [entry, samples] : composed.items()) {
        if (!entries.contains(entry)) unmeasured.insert(entry);
      }
    }
  }
  const int measured = static_cast<int>(bounds.size());
  json estimate = {{"bound", measured == checks ? json(check::any_false_alarm_bound(bounds)) : json(nullptr)},
                   {"confidence", check::kFalseAlarmConfidence},
                   {"checks", checks},
                   {"measured", measured},
                   {"unmeasured", std::vector<std::string>(unmeasured.begin(), unmeasured.end())},
                   {"entries", entries}};
  estimate["summary"] = summary_line(estimate);
  return estimate;
}

}  // namespace harness::nightly
