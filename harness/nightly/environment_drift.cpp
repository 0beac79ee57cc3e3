#include "environment_drift.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "reports.h"
#include "run_option_fields.h"
#include "stack_info.h"
#include "verdict.h"

namespace harness::nightly {
namespace {

using nlohmann::json;
using Value = std::optional<std::string>;  // nullopt: the side has no such entry

std::vector<std::string_view> split(std::string_view text, std::string_view separator) {
  std::vector<std::string_view> parts;
  for (std::size_t start = 0;;) {
    const std::size_t at = text.find(separator, start);
    parts.push_back(text.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return parts;
    start = at + separator.size();
  }
}

std::vector<std::string_view> words(std::string_view text) {
  std::vector<std::string_view> out;
  for (std::string_view w : split(text, " ")) {
    if (!w.empty()) out.push_back(w);
  }
  return out;
}

// A word that starts NAME=VALUE, NAME an identifier (an environment variable's, a kernel
// setting's): a word without one continues the value before it ("XLA_FLAGS=--a=1 --b=2").
bool is_assignment(std::string_view w) {
  const std::size_t eq = w.find('=');
  if (eq == 0 || eq == std::string_view::npos || std::isdigit(static_cast<unsigned char>(w.front()))) return false;
  return std::all_of(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(eq),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

// Words that start with an assignment: a list of NAME=VALUE entries.
bool all_assignments(const std::vector<std::string_view>& ws) { return !ws.empty() && is_assignment(ws.front()); }

void add_assignments(std::map<std::string, std::string>& out, const std::string& prefix,
                     const std::vector<std::string_view>& ws) {
  std::string* value = nullptr;
  for (std::string_view w : ws) {
    if (is_assignment(w)) {
      const std::size_t eq = w.find('=');
      value = &(out[fmt::format("{}.{}", prefix, w.substr(0, eq))] = std::string(w.substr(eq + 1)));
    } else {
      *value += fmt::format(" {}", w);
    }
  }
}

// One lane's golden check: its stack entries that moved from the golden's, entry ->
// (golden, run).
struct LaneMoves {
  std::string id;
  bool fails = false;
  std::map<std::string, std::pair<Value, Value>> moved;
};

std::map<std::string, std::string> side_entries(const std::string& key, const std::string& line) {
  return line == check::kAbsent ? std::map<std::string, std::string>{} : stack_entries(key, line);
}

bool is_environment_key(const std::string& key) {
  const bool stack = std::any_of(std::begin(kStackKeys), std::end(kStackKeys), [&](const char* k) { return key == k; });
  return stack && key != kCodeKey;
}

std::optional<LaneMoves> lane_moves(const json& lane) {
  for (const json& check : lane.value("checks", json::array())) {
    if (check.value("check", "") != "golden") continue;
    const std::string status = check.value("status", "");
    if ((status != "pass" && status != "fail") || !check.contains("verdict")) return std::nullopt;
    LaneMoves moves{lane.value("id", ""), status == "fail", {}};
    for (const json& d : check["verdict"].value("stack_diff", json::array())) {
      const std::string key = d.value("key", "");
      if (!is_environment_key(key)) continue;
      const auto golden = side_entries(key, d.value("b", "")), run = side_entries(key, d.value("a", ""));
      std::set<std::string> names;
      for (const auto& [name, value] : golden) names.insert(name);
      for (const auto& [name, value] : run) names.insert(name);
      for (const std::string& name : names) {
        const auto g = golden.find(name), r = run.find(name);
        const Value gv = g == golden.end() ? Value() : Value(g->second);
        const Value rv = r == run.end() ? Value() : Value(r->second);
        if (gv != rv) moves.moved[name] = {gv, rv};
      }
    }
    return moves;
  }
  return std::nullopt;
}

std::string shown(const Value& v) { return v ? *v : check::kAbsent; }

// What sets an entry in a rerun: {"variable": NAME} or {"flag": FLAG}; null for none.
json setting_of(const std::string& entry) {
  for (const run::StackSetting& s : run::stack_settings()) {
    if (entry != s.entry) continue;
    return s.variable.empty() ? json{{"flag", s.flag}} : json{{"variable", s.variable}};
  }
  for (const char* key : kStackKeys) {
    const std::string prefix = fmt::format("{}.{}.", key, run::kEnvironmentLabel);
    if (entry.starts_with(prefix)) return {{"variable", entry.substr(prefix.size())}};
  }
  return nullptr;
}

struct EntryStats {
  std::string entry;
  std::vector<std::string> lanes;  // the failing lanes where it moved
  int passing = 0;
  std::map<std::string, int> moves;            // "golden -> run", how many failing lanes
  std::map<std::string, int> golden_values;    // the golden's value (kAbsent: none), how many
};

std::string most_common(const std::map<std::string, int>& counts) {
  const auto fewer = [](const auto& a, const auto& b) { return a.second < b.second; };
  return std::max_element(counts.begin(), counts.end(), fewer)->first;
}

std::vector<EntryStats> ranked_entries(const std::vector<LaneMoves>& lanes) {
  std::map<std::string, EntryStats> by_entry;
  for (const LaneMoves& lane : lanes) {
    if (!lane.fails) continue;
    for (const auto& [entry, values] : lane.moved) {
      EntryStats& s = by_entry[entry];
      s.entry = entry;
      s.lanes.push_back(lane.id);
      s.moves[fmt::format("{} -> {}", shown(values.first), shown(values.second))] += 1;
      s.golden_values[shown(values.first)] += 1;
    }
  }
  for (const LaneMoves& lane : lanes) {
    if (lane.fails) continue;
    for (const auto& [entry, values] : lane.moved) {
      if (by_entry.count(entry)) by_entry[entry].passing += 1;
    }
  }
  std::vector<EntryStats> ranked;
  for (auto& [entry, s] : by_entry) ranked.push_back(std::move(s));
  // Moved with the most failing lanes first, then with the fewest passing ones.
  std::stable_sort(ranked.begin(), ranked.end(), [](const EntryStats& a, const EntryStats& b) {
    if (a.lanes.size() != b.lanes.size()) return a.lanes.size() > b.lanes.size();
    return a.passing < b.passing;
  });
  return ranked;
}

std::string nightly_words(const json& summary, const std::vector<std::string>& lanes, const std::string& out) {
  const json matrix = summary.value("matrix", json::object()), budgets = summary.value("budgets", json::object());
  return fmt::format("harness nightly --matrix {} --budgets {} --goldens {} --lanes {} --out {}",
                     run::shell_word(json_text(matrix, "path")), run::shell_word(json_text(budgets, "path")),
                     run::shell_word(json_text(summary, "goldens")),
                     run::shell_word(fmt::format("{}", fmt::join(lanes, ","))),
                     run::shell_word(out));
}

// The rerun of the failing lanes where `s` moved, with the golden's value set.
json rerun(const json& summary, const EntryStats& s, const json& setting) {
  std::string out = "drift-" + s.entry;
  const auto unsafe = [](char c) { return !std::isalnum(static_cast<unsigned char>(c)) && c != '-'; };
  std::replace_if(out.begin(), out.end(), unsafe, '-');
  const std::string golden = most_common(s.golden_values), command = nightly_words(summary, s.lanes, out);
  std::string line;
  if (setting.contains("flag")) {
    line = golden == check::kAbsent
               ? ""
               : fmt::format("{} {} {}", command, setting["flag"].get<std::string>(), run::shell_word(golden));
  } else {
    const std::string variable = setting["variable"];
    line = golden == check::kAbsent ? fmt::format("env -u {} {}", variable, command)
                                    : fmt::format("{}={} {}", variable, run::shell_word(golden), command);
  }
  return line.empty() ? json(nullptr) : json{{"entry", s.entry}, {"golden", golden}, {"command", line}};
}

json entry_json(const EntryStats& s, std::size_t failing, const json& setting) {
  json moves = json::array();
  for (const auto& [move, count] : s.moves) moves.push_back(move);
  return {{"entry", s.entry},
          {"failing", s.lanes.size()},
          {"passing", s.passing},
          {"lanes", s.lanes},
          {"moves", moves},
          {"explains", s.lanes.size() == failing && s.passing == 0},
          {"set_by", setting}};
}

}  // namespace

std::map<std::string, std::string> stack_entries(std::string_view key, std::string_view line) {
  std::map<std::string, std::string> out;
  const std::string base(key);
  const std::vector<std::string_view> parts = split(line, "; ");
  for (std::string_view part : parts) {
    if (const std::size_t colon = part.find(": "); colon != std::string_view::npos) {
      const std::string label = fmt::format("{}.{}", base, part.substr(0, colon));
      const std::string_view rest = part.substr(colon + 2);
      if (all_assignments(words(rest))) {
        add_assignments(out, label, words(rest));
      } else {
        out[label] = std::string(rest);
      }
      continue;
    }
    const std::vector<std::string_view> ws = words(part);
    if (all_assignments(ws)) {
      add_assignments(out, base, ws);
    } else if (parts.size() == 1 || ws.empty()) {  // one value, or an empty part
      out[base] = std::string(part);
    } else {  // "name version ...": the first word names it, the rest is its value
      std::string_view rest = part.substr(part.find(ws.front()) + ws.front().size());
      while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
      out[fmt::format("{}.{}", base, ws.front())] = std::string(rest);
    }
  }
  return out;
}

json environment_drift(const json& summary) {
  std::vector<LaneMoves> lanes;
  for (const json& lane : summary.value("lanes", json::array())) {
    if (std::optional<LaneMoves> m = lane_moves(lane)) lanes.push_back(std::move(*m));
  }
  std::vector<std::string> failing, passing;
  for (const LaneMoves& l : lanes) (l.fails ? failing : passing).push_back(l.id);
  const std::vector<EntryStats> ranked = ranked_entries(lanes);
  if (failing.size() < 2 || ranked.empty()) return nullptr;
  json entries = json::array(), reruns = json::array();
  for (const EntryStats& s : ranked) {
    const json setting = setting_of(s.entry);
    entries.push_back(entry_json(s, failing.size(), setting));
    if (!setting.is_null()) {
      if (json r = rerun(summary, s, setting); !r.is_null()) reruns.push_back(r);
    }
  }
  const EntryStats& top = ranked.front();
  const std::string top_move = most_common(top.moves);
  const json matrix = summary.value("matrix", json::object()), budgets = summary.value("budgets", json::object());
  const std::string goldens = run::shell_word(json_text(summary, "goldens"));
  const json refresh = {
      fmt::format("harness golden refresh --matrix {} --budgets {} --goldens {} --reason {}",
                  run::shell_word(json_text(matrix, "path")), run::shell_word(json_text(budgets, "path")), goldens,
                  run::shell_word(fmt::format("environment drift: {} {}", top.entry, top_move))),
      fmt::format("harness golden approve --goldens {} --approved-by NAME", goldens)};
  const std::string summary_line =
      fmt::format("environment drift: {} lanes fail their goldens on a moved stack; {} ({}) moved in {} of {} failing "
                  "lanes and {} of {} passing",
                  failing.size(), top.entry, top_move, top.lanes.size(), failing.size(), top.passing, passing.size());
  return {{"summary", summary_line}, {"failing_lanes", failing}, {"passing_lanes", passing}, {"entries", entries},
          {"reruns", reruns}, {"refresh", refresh}};
}

}  // namespace harness::nightly
