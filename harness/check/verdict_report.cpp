#include "verdict_report.h"

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "false_alarm.h"

namespace harness::check {
namespace {

nlohmann::json move_json(const std::optional<TensorMove>& m) {
  if (!m) return nullptr;
  return {{"family", m->family}, {"tensor", m->tensor}, {"step", m->step}, {"distance", m->distance}};
}

// JSON has no infinity: an exact budget that was broken has no finite headroom.
nlohmann::json finite_or_null(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }
nlohmann::json optional_json(const std::optional<double>& x) { return x ? nlohmann::json(*x) : nlohmann::json(nullptr); }
nlohmann::json finite_or_null(const std::vector<double>& xs) {
  nlohmann::json out = nlohmann::json::array();
  for (double x : xs) out.push_back(finite_or_null(x));
  return out;
}

std::string metric_line(const MetricVerdict& m) {
  if (!m.judged) {
    return fmt::format("INFO  {:<38} {:.3g} at worst step {}: not judged (no budget entry bounds it; harness calibrate "
                       "proposes windows)",
                       m.metric, m.max_deviation, m.worst_step);
  }
  if (m.pass && m.max_deviation == 0) return fmt::format("PASS  {:<38} exact", m.metric);
  const std::string where = m.worst_tensor.empty() ? "" : fmt::format(" ({})", m.worst_tensor);
  if (m.pass) {
    return fmt::format("PASS  {:<38} |d| {:.3g} at worst step {}{}, headroom {:.0f}% of the budget{}", m.metric,
                       m.max_deviation, m.worst_step, where, m.headroom_pct,
                       m.failing_steps ? fmt::format(" ({} outlier steps of {} allowed)", m.failing_steps, m.allowed_outliers)
                                       : "");
  }
  const std::string headroom = std::isfinite(m.headroom_pct) ? fmt::format("{:.0f}%", m.headroom_pct) : "none: exact";
  return fmt::format("FAIL  {:<38} first failing step {}, worst step {}{}: |d| {:.3g} against {:.3g} allowed "
                     "(headroom {}), {} steps over ({} allowed)",
                     m.metric, m.first_failing_step, m.worst_step, where, m.max_deviation, m.allowed, headroom,
                     m.failing_steps, m.allowed_outliers);
}

// " (provisional: [bf16] from 3 samples)": the composed entries calibrated from fewer than
// kMinCalibrationSamples samples, which the verdict is only as good as; "" when none is.
std::string provisional_text(const Verdict& v) {
  if (v.provisional.empty()) return "";
  std::vector<std::string> entries;
  for (const std::string& key : v.provisional) {
    const int samples = v.budget_samples.count(key) ? v.budget_samples.at(key) : 0;
    entries.push_back(fmt::format("[{}] from {} sample{}", key, samples, samples == 1 ? "" : "s"));
  }
  return fmt::format(" (provisional: {})", fmt::join(entries, ", "));
}

// " (false alarms below 17.1% at 95%)" for a tolerance check whose every entry was calibrated
// with held-out samples; "" otherwise.
std::string false_alarm_text(const Verdict& v) {
  const auto bound = v.false_alarm_bound();
  if (v.bitwise || !bound) return "";
  return fmt::format(" (false alarms below {:.3g}% at {:.0f}%)", 100 * *bound, 100 * kFalseAlarmConfidence);
}

}  // namespace

nlohmann::json to_json(const Verdict& v) {
  nlohmann::json metrics = nlohmann::json::array();
  for (const MetricVerdict& m : v.metrics) {
    metrics.push_back({{"metric", m.metric},
                       {"pass", m.pass},
                       {"first_failing_step", m.first_failing_step < 0 ? nlohmann::json(nullptr) : nlohmann::json(m.first_failing_step)},
                       {"worst_step", m.worst_step},
                       {"max_deviation", finite_or_null(m.max_deviation)},
                       {"allowed", finite_or_null(m.allowed)},
                       {"headroom_pct", finite_or_null(m.headroom_pct)},
                       {"failing_steps", m.failing_steps},
                       {"allowed_outliers", m.allowed_outliers},
                       {"worst_tensor", m.worst_tensor},
                       {"judged", m.judged},
                       {"step_deviation", finite_or_null(m.step_deviation)},
                       {"step_allowed", finite_or_null(m.step_allowed)}});
  }
  nlohmann::json stack = nlohmann::json::array();
  for (const StackDifference& d : v.stack) {
    stack.push_back({{"key", d.key}, {"a", d.a}, {"b", d.b}, {"one_sided", d.one_sided}});
  }
  const MetricVerdict* first = v.first_failure();
  return {{"version", kVerdictJsonVersion},
          {"kind", v.kind},
          {"verdict", v.pass() ? "pass" : "fail"},
          {"a", {{"path", v.a_path}, {"lane", v.a_lane}}},
          {"b", {{"path", v.b_path}, {"lane", v.b_lane}}},
          {"steps", v.steps},
          {"data", "equal"},
          {"budget", {{"features", v.budget},
                      {"bitwise", v.bitwise},
                      {"reason", v.budget_reason},
                      {"samples", v.budget_samples},
                      {"provisional", v.provisional},
                      {"false_alarm", {{"entries", v.budget_false_alarm},
                                       {"bound", optional_json(v.false_alarm_bound())},
                                       {"confidence", kFalseAlarmConfidence}}}}},
          {"decisions_part", v.decisions_part ? nlohmann::json{{"step", v.decisions_part->step},
                                                                {"op", v.decisions_part->column},
                                                                {"record", v.decisions_part->hash_dataset}}
                                              : nlohmann::json(nullptr)},
          {"first_failing_step", first ? nlohmann::json(first->first_failing_step) : nlohmann::json(nullptr)},
          {"metrics", metrics},
          {"first_moved", move_json(v.first_moved)},
          {"most_moved", move_json(v.most_moved)},
          {"stack_diff", stack},
          {"triage", v.triage.empty() ? nlohmann::json(nullptr) : nlohmann::json(v.triage)},
          {"logits_not_compared",
           v.logits_not_compared.empty() ? nlohmann::json(nullptr) : nlohmann::json(v.logits_not_compared)}};
}

nlohmann::json error_json(const std::string& kind, const std::string& message) {
  return {{"version", kVerdictJsonVersion}, {"verdict", "error"}, {"error", {{"kind", kind}, {"message", message}}}};
}

std::string to_text(const Verdict& v, bool verbose) {
  std::string out;
  auto line = [&out](const std::string& s) { out += s + "\n"; };
  line(fmt::format("{:<12}{} ({})", v.kind == "golden" ? "check" : "compare", v.a_lane, v.a_path));
  line(fmt::format("{:<12}{} ({})", "against", v.b_lane, v.b_path));
  line(fmt::format("{:<12}{}{}{}{}", "budget", fmt::join(v.budget, " + "),
                   v.bitwise ? " (bitwise: every loss and every hash equal)" : fmt::format(" ({})", v.budget_reason),
                   provisional_text(v), false_alarm_text(v)));
  line(fmt::format("{:<12}equal ({} batch hashes)", "data", v.steps));
  if (v.decisions_part) {
    line(fmt::format("{:<12}part at step {}: {} decided otherwise first ({}); windows from the decisions' part apply "
                     "from there",
                     "decisions", v.decisions_part->step, v.decisions_part->column, v.decisions_part->hash_dataset));
  }
  for (const MetricVerdict& m : v.metrics) line(metric_line(m));
  if (!v.logits_not_compared.empty()) line(fmt::format("{:<12}not compared: {}", "logits", v.logits_not_compared));
  if (v.first_moved) {
    line(fmt::format("{:<12}{} {} at step {} (first hash that differs)", "moved first", v.first_moved->family,
                     v.first_moved->tensor, v.first_moved->step));
  }
  if (v.most_moved) {
    line(fmt::format("{:<12}{} {}: relative sketch distance {:.3g} at step {}", "moved most", v.most_moved->family,
                     v.most_moved->tensor, v.most_moved->distance, v.most_moved->step));
  }
  std::vector<std::string> one_sided;
  for (const StackDifference& d : v.stack) {
    if (d.one_sided && !verbose) {
      one_sided.push_back(d.key);
    } else {
      line(fmt::format("{:<12}{}: {} -> {}", "stack", d.key, d.a, d.b));
    }
  }
  if (!one_sided.empty()) {
    line(fmt::format("{:<12}{} setting{} only one side has ({}); --verbose shows them", "stack", one_sided.size(),
                     one_sided.size() == 1 ? "" : "s", fmt::join(one_sided, ", ")));
  }
  if (!v.triage.empty()) line(fmt::format("{:<12}{}", "triage", v.triage));
  line(fmt::format("{:<12}{}", "verdict", v.pass() ? "PASS" : "FAIL"));
  return out;
}

const MetricVerdict* tightest_metric(const Verdict& v) {
  const MetricVerdict* tightest = nullptr;
  for (const MetricVerdict& m : v.metrics) {
    if (m.judged && m.worst_step >= 0 && (!tightest || m.headroom_pct < tightest->headroom_pct)) tightest = &m;
  }
  return tightest;
}

std::string one_line(const Verdict& v) {
  if (const MetricVerdict* m = v.first_failure()) {
    const std::string where = m->worst_tensor.empty() ? "" : fmt::format(" ({})", m->worst_tensor);
    return fmt::format("FAIL {}: first failing step {}, worst step {}{}: |d| {:.3g} against {:.3g} allowed, {} step(s) "
                       "over ({} allowed)",
                       m->metric, m->first_failing_step, m->worst_step, where, m->max_deviation, m->allowed,
                       m->failing_steps, m->allowed_outliers);
  }
  const MetricVerdict* tightest = tightest_metric(v);
  if (!tightest) return v.bitwise ? "pass (bitwise)" : "pass";
  return fmt::format("pass (least headroom {:.0f}%: {} at step {})", tightest->headroom_pct, tightest->metric,
                     tightest->worst_step);
}

}  // namespace harness::check
