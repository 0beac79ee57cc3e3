#include "headroom.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "canary_run.h"
#include "json_text.h"

namespace harness::nightly {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A metric that used up some tolerance: its budget allows something at a step, or it
// moved where the budget allowed nothing (a broken exact budget, a NaN: no headroom left).
// An exact metric that did not move had nothing to use up.
bool judged_against_tolerance(const json& metric) {
  if (!metric.is_object() || !metric.value("judged", true)) return false;
  const json allowed = metric.value("step_allowed", json::array());
  const bool tolerance =
      std::any_of(allowed.begin(), allowed.end(), [](const json& a) { return a.is_number() && a.get<double>() > 0; });
  const json deviation = metric.value("max_deviation", json(nullptr));  // null: a NaN
  return tolerance || !(deviation.is_number() && deviation.get<double>() == 0);
}

// Headroom in order: none (null) is below every number.
double ordered(const json& headroom_pct) {
  return headroom_pct.is_number() ? headroom_pct.get<double>() : -std::numeric_limits<double>::infinity();
}

// The first key a history point needs that `s` lacks ("" when it has them all).
std::string missing_key(const json& s) {
  if (!s.is_object() || s.value("kind", json()) != "nightly") return "\"kind\": \"nightly\"";
  if (!s.contains("shards") || !s["shards"].is_array() || s["shards"].empty()) return "shards[]";
  for (std::size_t i = 0; i < s["shards"].size(); ++i) {
    const json& shard = s["shards"][i];
    if (!shard.is_object() || !shard.contains("started_utc") || !shard["started_utc"].is_string()) {
      return fmt::format("shards[{}].started_utc", i);
    }
  }
  if (!s.contains("lanes") || !s["lanes"].is_array()) return "lanes[]";
  for (std::size_t i = 0; i < s["lanes"].size(); ++i) {
    const json& lane = s["lanes"][i];
    if (!lane.is_object() || !lane.contains("id") || !lane["id"].is_string()) return fmt::format("lanes[{}].id", i);
    if (!lane.contains("checks") || !lane["checks"].is_array()) return fmt::format("lanes[{}].checks", i);
  }
  return "";
}

PastNightly read_past(const fs::path& file, const std::string& dir) {
  const std::string advice = fmt::format("move it out of {} or give --history the directory that holds the nightlies' "
                                         "--out directories",
                                         dir);
  std::ifstream in(file);
  if (!in) throw run::UsageError(fmt::format("--history: cannot read {}; {}", file.string(), advice));
  json s;
  try {
    s = json::parse(in);
  } catch (const json::exception& e) {
    throw run::UsageError(fmt::format("--history: {} is not JSON ({}); {}", file.string(), run::json_error_text(e), advice));
  }
  if (const std::string missing = missing_key(s); !missing.empty()) {
    throw run::UsageError(
        fmt::format("--history: {} is not a nightly summary (it lacks {}); {}", file.string(), missing, advice));
  }
  PastNightly past{file.string(), summary_started_utc(s), {}};
  try {
    for (const json& lane : s["lanes"]) {
      const json h = least_headroom(lane);
      past.headroom_pct[lane["id"].get<std::string>()] = h.is_object() ? h["headroom_pct"] : json(nullptr);
    }
  } catch (const json::exception& e) {  // a verdict of the wrong shape
    throw run::UsageError(fmt::format("--history: {} is damaged ({}); {}", file.string(), run::json_error_text(e), advice));
  }
  return past;
}

}  // namespace

json least_headroom(const json& lane) {
  json least = nullptr;
  for (const json& check : lane.value("checks", json::array())) {
    if (!check.is_object() || !check.contains("verdict") || !check["verdict"].is_object()) continue;  // an error judged nothing
    const json& verdict = check["verdict"];
    const json features = verdict.contains("budget") && verdict["budget"].is_object()
                              ? verdict["budget"].value("features", json::array())
                              : json::array();
    for (const json& metric : verdict.value("metrics", json::array())) {
      if (!judged_against_tolerance(metric)) continue;
      const json headroom = metric.value("headroom_pct", json(nullptr));
      if (!least.is_null() && ordered(least["headroom_pct"]) <= ordered(headroom)) continue;
      least = {{"headroom_pct", headroom},
               {"check", check.value("check", "")},
               {"metric", metric.value("metric", "")},
               {"step", metric.value("worst_step", json(nullptr))},
               {"features", features}};
    }
  }
  return least;
}

void mark_fragile_lanes(json& summary) {
  json fragile_lanes = json::array();
  for (json& lane : summary["lanes"]) {
    lane["headroom"] = least_headroom(lane);
    const json& h = lane["headroom"];
    const bool fragile = lane.value("status", "") == "pass" && h.is_object() && h["headroom_pct"].is_number() &&
                         h["headroom_pct"].get<double>() < kFragileHeadroomPct;
    lane["fragile"] = fragile;
    if (fragile) fragile_lanes.push_back(lane["id"]);
  }
  summary["fragile_lanes"] = fragile_lanes;
}

std::string summary_started_utc(const json& summary) {
  std::string earliest;
  for (const json& shard : summary.value("shards", json::array())) {
    const json started = shard.is_object() ? shard.value("started_utc", json()) : json();
    if (started.is_string() && (earliest.empty() || started.get<std::string>() < earliest)) earliest = started.get<std::string>();
  }
  return earliest;
}

std::vector<PastNightly> read_history(const std::string& dir, const std::string& out_dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw run::UsageError(fmt::format("--history: '{}' is not a directory; give the directory that holds the previous "
                                      "nightlies' --out directories (each with its summary.json)",
                                      dir));
  }
  std::vector<fs::path> files;
  if (fs::is_regular_file(fs::path(dir) / "summary.json", ec)) files.push_back(fs::path(dir) / "summary.json");
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path file = it->path() / "summary.json";
    std::error_code ignored;
    if (it->is_directory(ignored) && fs::exists(file, ignored)) files.push_back(file);
  }
  if (ec) throw run::UsageError(fmt::format("--history: cannot list '{}' ({}); make it readable", dir, ec.message()));
  std::sort(files.begin(), files.end());  // ties in start time keep the order of the names
  // This job's own report directory (under DIR, or DIR itself) is the last point, not a past one.
  std::error_code ignored;
  const fs::path own = out_dir.empty() ? fs::path() : fs::weakly_canonical(out_dir, ignored);
  std::vector<PastNightly> past;
  for (const fs::path& file : files) {
    if (!own.empty() && fs::weakly_canonical(file.parent_path(), ignored) == own) continue;
    past.push_back(read_past(file, dir));
  }
  std::stable_sort(past.begin(), past.end(),
                   [](const PastNightly& a, const PastNightly& b) { return a.started_utc < b.started_utc; });
  return past;
}

json headroom_history(const std::vector<PastNightly>& past, const json& summary) {
  json history = json::object();
  const std::string now = summary_started_utc(summary);
  for (const json& lane : summary["lanes"]) {
    const std::string id = lane["id"];
    json series = json::array();
    for (const PastNightly& p : past) {
      const auto it = p.headroom_pct.find(id);
      if (it != p.headroom_pct.end()) series.push_back({{"started_utc", p.started_utc}, {"headroom_pct", it->second}});
    }
    const json headroom = lane.value("headroom", json(nullptr));
    series.push_back({{"started_utc", now}, {"headroom_pct", headroom.is_object() ? headroom["headroom_pct"] : json(nullptr)}});
    history[id] = series;
  }
  return history;
}

json merge_histories(const std::vector<json>& shards) {
  json merged = nullptr;
  for (const json& shard : shards) {
    const json history = shard.value("history", json(nullptr));
    if (!history.is_object()) continue;
    if (merged.is_null()) merged = json::object();
    for (const json& lane : shard["lanes"]) {
      const std::string id = lane["id"];
      if (history.contains(id)) merged[id] = history[id];
    }
  }
  return merged;
}

}  // namespace harness::nightly
