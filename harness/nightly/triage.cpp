#include "triage.h"

#include <algorithm>
#include <map>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "budgets.h"
#include "canary_run.h"
#include "file_io.h"
#include "child_process.h"
#include "lane_run.h"
#include "python_canary.h"
#include "registry.h"
#include "run_option_fields.h"
#include "verdict.h"
#include "verdict_report.h"

namespace harness::nightly {
namespace {

using Units = std::vector<PrecisionUnit>;
using Switched = std::map<std::string, Units>;  // flag -> its units switched off

std::string values_of(const Units& units) {
  std::vector<std::string> values;
  for (const PrecisionUnit& u : units) values.push_back(u.value);
  return fmt::format("{}", fmt::join(values, ","));
}

// "mlp_fc@0,mlp_fc@1 (2 units)", or the count alone past a few.
std::string units_label(const Units& units) {
  if (units.size() == 1) return units.front().value;
  if (units.size() <= 4) return fmt::format("{} ({} units)", values_of(units), units.size());
  return fmt::format("{} units", units.size());
}

// "--fp8-off", "mlp_fc@1,qkv@0", ...: the switched units as command-line words.
std::vector<std::string> flag_words(const Switched& switched) {
  std::vector<std::string> words;
  for (const auto& [flag, units] : switched) words.insert(words.end(), {"--" + flag, values_of(units)});
  return words;
}

Switched with_units(Switched switched, const std::string& flag, const Units& units) {
  Units& into = switched[flag];
  into.insert(into.end(), units.begin(), units.end());
  return switched;
}

double least_headroom(const check::Verdict& v) {
  const check::MetricVerdict* tightest = check::tightest_metric(v);
  return tightest ? tightest->headroom_pct : 100.0;
}

// A Python canary's switches, as `python3 -m canary_harness units A --json-out PATH` writes
// them (its stdout is the canary's own).
std::vector<PrecisionSwitch> python_switches(const check::ReceiptData& lane) {
  const run::PythonCommand command = run::python_canary_command("units", lane.path, lane.manifest, {});
  const run::PythonJsonResult listed = run::run_python_for_json(command.argv, command.environment);
  const run::ChildResult& child = listed.child;
  if (!child.exited_zero()) {
    const std::string line = run::last_line(child.stderr_tail);
    throw LaneCommandError(fmt::format("triage: the units of {} could not be listed: {} {}: {}", lane.path,
                                       run::command_line(command.argv), child.how(),
                                       line.empty() ? "(nothing on stderr)" : line));
  }
  const nlohmann::json& found = listed.result;
  std::vector<PrecisionSwitch> switches;
  if (!found.is_array()) throw LaneCommandError(fmt::format("triage: the units of {} are not JSON", lane.path));
  for (const nlohmann::json& s : found) {
    PrecisionSwitch into{s.at("format"), s.at("flag"), s.at("wider"), {}};
    for (const nlohmann::json& u : s.at("units")) into.units.push_back({u.at("group"), u.at("layer"), u.at("value")});
    switches.push_back(std::move(into));
  }
  return switches;
}

// A's switches: its engine's for the canary's blocks, or its Python canary's modules.
std::vector<PrecisionSwitch> switches_of(const check::ReceiptData& lane) {
  std::vector<PrecisionSwitch> switches;
  std::string runs;  // what A runs, for the message
  if (run::is_python_canary(lane.manifest)) {
    switches = python_switches(lane);
    runs = "a Python canary in fp32";
  } else {
    const run::RunOptions recipe = recipe_options(lane, "triage");
    const canary::CanaryConfig canary = run::load_run_canary(recipe.canary);
    switches = make_engine(recipe.engine, recipe.engine_settings)->precision_switches(canary.layers);
    runs = fmt::format("engine {}, features '{}'", recipe.engine, recipe.engine_settings.features);
  }
  std::erase_if(switches, [](const PrecisionSwitch& s) { return s.units.empty(); });
  if (switches.empty()) {
    throw run::UsageError(fmt::format("{}: lane {} runs in no reduced precision that can be switched per unit ({}); "
                                      "triage explains bf16 and fp8 lanes",
                                      lane.path, lane.lane, runs));
  }
  return switches;
}

// A's recipe run with units switched off, each judged against B once.
class Trials {
 public:
  Trials(const TriageOptions& o, const check::ReceiptData& lane, const check::ReceiptData& reference,
         const std::function<void(const std::string&)>& progress, Triage& t)
      : o_(o), lane_(lane), reference_(reference), budgets_(check::load_budgets(o.budgets_path)),
        progress_(progress), t_(t), work_("triage", "the triage runs") {}

  const check::Budgets& budgets() const { return budgets_; }

  // The command that runs A's recipe with `switched` into triaged.h5: `harness run` with
  // the switched engine flags, or a Python canary's rerun with them (by the interpreter
  // its run recorded).
  std::vector<std::string> rerun_words(const Switched& switched) const {
    std::vector<std::string> words;
    if (run::is_python_canary(lane_.manifest)) {
      words = run::python_canary_command("rerun", lane_.path, lane_.manifest, flag_words(switched)).argv;
    } else {
      run::RunOptions options = recipe_options(lane_, "triage");
      add_switched(switched, options.engine_settings);
      words = run::run_command_words(options);
    }
    words.insert(words.end(), {"--out", "triaged.h5"});
    return words;
  }

  // The recipe unchanged must make A again, bit for bit: else the reruns explain another run.
  void check_reproduces() {
    const std::string out = work_.file("unchanged.h5");
    if (progress_) progress_(fmt::format("rerun of {} (must reproduce it)", lane_.path));
    rerun(out, {});
    require_reproduced(lane_, check::load_receipt(out), "triage", "triage a fresh run of the lane");
  }

  const TriageTrial& run(const std::string& what, const Switched& switched) {
    const std::string key = key_of(switched);
    if (const auto it = done_.find(key); it != done_.end()) return t_.trials[it->second];
    if (progress_) progress_(what);
    const std::string out = work_.file(fmt::format("trial-{}.h5", t_.trials.size()));
    rerun(out, switched);
    const check::Verdict v = check::compare_receipts(check::load_receipt(out), reference_, budgets_, "compare");
    TriageTrial trial{what, {}, v.pass(), least_headroom(v), check::one_line(v)};
    trial.switched = flag_words(switched);
    done_[key] = t_.trials.size();
    t_.trials.push_back(std::move(trial));
    return t_.trials.back();
  }

 private:
  static std::string key_of(const Switched& switched) {
    std::string key;
    for (const auto& [flag, units] : switched) {
      std::vector<std::string> values;
      for (const PrecisionUnit& u : units) values.push_back(u.value);
      std::sort(values.begin(), values.end());
      key += fmt::format("{}={};", flag, fmt::join(values, ","));
    }
    return key;
  }

  // A flag the recipe sets already keeps its units: the switched ones are added to them.
  static void add_switched(const Switched& switched, EngineSettings& settings) {
    for (const auto& [flag, units] : switched) {
      std::string& value = settings.options[flag];
      value = value.empty() ? values_of(units) : value + "," + values_of(units);
    }
  }

  void rerun(const std::string& out, const Switched& switched) {
    rerun_recipe(lane_, out, "triage",
                 [&](run::RunOptions& options) {
                   add_switched(switched, options.engine_settings);
                   options.threads = o_.threads;
                 },
                 flag_words(switched));
  }

  const TriageOptions& o_;
  const check::ReceiptData& lane_;
  const check::ReceiptData& reference_;
  const check::Budgets budgets_;
  const std::function<void(const std::string&)>& progress_;
  Triage& t_;
  run::TempDir work_;
  std::map<std::string, std::size_t> done_;  // switched -> its trial
};

// The units of `s.units` in group `group`, in order.
Units group_units(const Units& units, const std::string& group) {
  Units out;
  std::copy_if(units.begin(), units.end(), std::back_inserter(out),
               [&](const PrecisionUnit& u) { return u.group == group; });
  return out;
}

std::vector<std::string> groups_of(const Units& units) {
  std::vector<std::string> groups;
  for (const PrecisionUnit& u : units) {
    if (std::find(groups.begin(), groups.end(), u.group) == groups.end()) groups.push_back(u.group);
  }
  return groups;
}

// The smallest set of `s`'s units whose switching brings A back, given that all of them do:
// one group whole when that suffices, then each unit dropped whose absence keeps A inside
// its budget (1-minimal: no single unit of the result can go).
Units smallest_set(Trials& trials, const PrecisionSwitch& s, const Switched& before) {
  Units set = s.units;
  const auto label = [&](const Units& units) { return fmt::format("{} off: {}", s.format, units_label(units)); };
  const std::vector<std::string> groups = groups_of(s.units);
  for (const std::string& group : groups) {
    if (groups.size() == 1) break;  // the one group is every unit
    const Units units = group_units(s.units, group);
    if (trials.run(fmt::format("{} off: group {} ({} units)", s.format, group, units.size()),
                   with_units(before, s.flag, units))
            .pass) {
      set = units;
      break;
    }
  }
  for (std::size_t i = 0; i < set.size() && set.size() > 1;) {
    Units fewer = set;
    fewer.erase(fewer.begin() + static_cast<std::ptrdiff_t>(i));
    if (trials.run(label(fewer), with_units(before, s.flag, fewer)).pass) {
      set = std::move(fewer);
    } else {
      ++i;
    }
  }
  return set;
}

}  // namespace

Triage triage(const TriageOptions& o, const std::function<void(const std::string&)>& progress) {
  Triage t;
  const check::ReceiptData lane = check::load_receipt(o.lane_receipt);
  const check::ReceiptData reference = check::load_receipt(o.reference);
  t.lane = lane.lane;
  t.reference = reference.lane;
  t.lane_path = lane.path;
  t.reference_path = reference.path;
  Trials trials(o, lane, reference, progress, t);
  const check::Verdict before = check::compare_receipts(lane, reference, trials.budgets(), "compare");
  t.budget = before.budget;
  t.before = check::one_line(before);
  t.headroom_before = least_headroom(before);
  if (before.pass()) {
    t.already_passes = true;
    return t;
  }
  const std::vector<PrecisionSwitch> switches = switches_of(lane);
  trials.check_reproduces();
  Switched off;  // formats switched off whole, before the one that brings A back
  for (const PrecisionSwitch& s : switches) {
    const Switched every = with_units(off, s.flag, s.units);
    if (!trials.run(fmt::format("{} off: every unit ({})", s.format, s.units.size()), every).pass) {
      off = every;
      t.whole_formats_off.push_back(s.format);
      continue;
    }
    t.format = s.format;
    t.wider = s.wider;
    t.flag = s.flag;
    t.units_of_format = s.units.size();
    t.culprits = smallest_set(trials, s, off);
    const Switched found = with_units(off, s.flag, t.culprits);
    t.headroom_after = trials.run(fmt::format("{} off: {}", s.format, units_label(t.culprits)), found).least_headroom;
    t.rerun = trials.rerun_words(found);
    return t;
  }
  t.headroom_after = t.trials.back().least_headroom;
  return t;
}

std::string triage_report(const Triage& t) {
  std::string text;
  const auto line = [&](const std::string& label, const std::string& value) {
    text += fmt::format("{:<12}{}\n", label, value);
  };
  line("triage", fmt::format("{} ({})", t.lane, t.lane_path));
  line("against", fmt::format("{} ({})", t.reference, t.reference_path));
  line("budget", fmt::format("{}", fmt::join(t.budget, " + ")));
  line("before", t.before);
  if (t.already_passes) {
    line("verdict", "PASS: the lane is inside its budget; nothing to triage");
    return text;
  }
  for (const TriageTrial& trial : t.trials) {
    line("trial", fmt::format("{:<46} {}", trial.what, trial.verdict));
  }
  for (const std::string& format : t.whole_formats_off) {
    line("off", fmt::format("{} off in every unit is not enough: the lane still fails", format));
  }
  if (!t.found()) {
    line("verdict", fmt::format("NOT FOUND: the lane fails with every switchable unit off (least headroom {:.0f}%): "
                                "the drift is outside the units (elementwise storage, reduction order) or in the "
                                "reference",
                                t.headroom_after.value_or(t.headroom_before)));
    return text;
  }
  line("culprits", fmt::format("{} at {} ({} of {} units): in {}, the lane passes", t.format, values_of(t.culprits),
                               t.culprits.size(), t.units_of_format, t.wider));
  line("headroom", fmt::format("{:.0f}% -> {:.0f}% of the budget (least, over the metrics)", t.headroom_before,
                               *t.headroom_after));
  std::vector<std::string> words;
  for (const std::string& w : t.rerun) words.push_back(run::shell_word(w));
  line("rerun", fmt::format("{}", fmt::join(words, " ")));
  line("verdict", "FOUND");
  return text;
}

nlohmann::json to_json(const Triage& t) {
  nlohmann::json trials = nlohmann::json::array();
  for (const TriageTrial& trial : t.trials) {
    trials.push_back({{"what", trial.what}, {"switched", trial.switched}, {"pass", trial.pass},
                      {"least_headroom_pct", trial.least_headroom}, {"verdict", trial.verdict}});
  }
  nlohmann::json culprits = nlohmann::json::array();
  for (const PrecisionUnit& u : t.culprits) {
    culprits.push_back({{"unit", u.value}, {"group", u.group}, {"layer", u.layer}});
  }
  return {{"lane", t.lane},
          {"reference", t.reference},
          {"lane_path", t.lane_path},
          {"reference_path", t.reference_path},
          {"budget", t.budget},
          {"before", t.before},
          {"headroom_before_pct", t.headroom_before},
          {"status", t.already_passes ? "pass" : t.found() ? "found" : "not_found"},
          {"format", t.format.empty() ? nlohmann::json(nullptr) : nlohmann::json(t.format)},
          {"wider", t.wider.empty() ? nlohmann::json(nullptr) : nlohmann::json(t.wider)},
          {"flag", t.flag.empty() ? nlohmann::json(nullptr) : nlohmann::json(t.flag)},
          {"culprits", culprits},
          {"units_of_format", t.units_of_format},
          {"whole_formats_off", t.whole_formats_off},
          {"headroom_after_pct", t.headroom_after ? nlohmann::json(*t.headroom_after) : nlohmann::json(nullptr)},
          {"trials", trials},
          {"rerun", t.rerun}};
}

}  // namespace harness::nightly
