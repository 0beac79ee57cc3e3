#include "bias_check.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "drift_bias.h"
#include "interrupt.h"
#include "lane_run.h"

namespace harness::nightly {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The windows of every entry of `budget` for the signed metrics, each once: what the tests
// average each repeat's residuals over.
std::map<std::string, std::vector<check::Window>> tested_windows(const check::ComposedBudget& budget) {
  std::map<std::string, std::vector<check::Window>> windows;
  for (const check::FeatureBudget* part : budget.parts()) {
    for (const char* metric : check::kSignedMetrics) {
      const auto it = part->metrics.find(metric);
      if (it == part->metrics.end()) continue;
      for (const check::Window& w : it->second) {
        std::vector<check::Window>& have = windows[metric];
        const bool seen = std::any_of(have.begin(), have.end(), [&](const check::Window& h) {
          return h.first == w.first && h.last == w.last && h.from_decisions_part == w.from_decisions_part;
        });
        if (!seen) have.push_back(w);
      }
    }
  }
  return windows;
}

json window_record(const check::DriftBias& b) {
  const bool open = b.window.last == std::numeric_limits<int>::max();
  const json last = open ? json(nullptr) : json(b.window.last);
  const json t = std::isfinite(b.t) ? json(b.t) : json(nullptr);  // infinite: every repeat's residual alike
  return {{"metric", b.metric}, {"first_step", b.window.first}, {"last_step", last},
          {"repeats", b.repeats}, {"above", b.above}, {"below", b.below},
          {"mean", b.mean}, {"allowed", b.allowed}, {"t", t},
          {"p_sign", b.p_sign}, {"p_mean", b.p_mean}, {"biased", b.biased},
          {"line", check::drift_bias_line(b)}};
}

// Whether an entry of the budget makes a biased window fail (bias = "fail").
std::string failing_entry(const check::ComposedBudget& budget) {
  for (const check::FeatureBudget* part : budget.parts()) {
    if (part->bias_fails) return part->key();
  }
  return "";
}

// The lane's runs: the job's, then one per seed after its own, each a receipt in work_dir.
struct Repeats {
  std::vector<check::ReceiptData> runs;
  json seeds = json::array(), receipts = json::array();  // receipts relative to the job's directory
};

// Fills `out` as it goes: on a throw, out.runs.size() says which repeat failed.
void run_repeats(const BiasInputs& in, const std::string& flag, std::int64_t seed, Repeats& out) {
  const auto relative = [&](const std::string& path) { return fs::relative(path, in.out_dir).string(); };
  out.runs.push_back(in.run);
  out.seeds.push_back(seed);
  out.receipts.push_back(relative(in.run.path));
  fs::create_directories(in.work_dir);
  for (int k = 1; k < in.spec.bias_repeats; ++k) {
    LaneSpec repeat = in.spec;
    repeat.settings.options[flag] = std::to_string(seed + k);
    const std::string path = (fs::path(in.work_dir) / fmt::format("{}-{}.h5", in.spec.id, k)).string();
    run_lane(in.matrix, repeat, path, {}, in.threads);
    out.runs.push_back(check::load_receipt(path));
    out.seeds.push_back(seed + k);
    out.receipts.push_back(relative(path));
  }
}

// status and summary: pass when no window is biased, else warn, or fail where `fails_by`
// (an entry of the lane's budget) says bias = "fail".
void set_verdict(json& check, const std::vector<check::DriftBias>& tests, const std::string& fails_by) {
  const auto biased = std::find_if(tests.begin(), tests.end(), [](const check::DriftBias& b) { return b.biased; });
  if (tests.empty()) {
    check["status"] = "pass";
    check["summary"] = "no window of the budget to test (it is bitwise)";
  } else if (biased == tests.end()) {
    check["status"] = "pass";
    check["summary"] = fmt::format("no one-sided drift over {} repeats", tests.front().repeats);
  } else {
    check["status"] = fails_by.empty() ? "warn" : "fail";
    const std::string why = fails_by.empty() ? "" : fmt::format(" ([{}] says bias = \"fail\")", fails_by);
    check["summary"] = fmt::format("biased{}: {}", why, check::drift_bias_line(*biased));
  }
}

}  // namespace

json bias_check(const BiasInputs& in) {
  const auto start = std::chrono::steady_clock::now();
  json check = {{"check", "bias"}, {"against", in.reference.path}};
  const auto error = [&](const std::string& kind, const std::string& message) {
    check["status"] = "error";
    check["summary"] = "the one-sided drift test could not be made";
    check["error"] = {{"kind", kind}, {"message", message}};
    return check;
  };
  const std::string flag = in.spec.reduction_seed_flag();  // set, and its value given (load_matrix checked)
  const std::int64_t seed = std::stoll(in.spec.settings.options.at(flag));
  Repeats repeats;
  try {
    run_repeats(in, flag, seed, repeats);
  } catch (const run::Interrupted&) {
    throw;
  } catch (const std::exception& e) {
    const std::int64_t failed = seed + static_cast<std::int64_t>(repeats.runs.size());
    return error("repeat", fmt::format("lane {} under --{} {}: {}", in.spec.id, flag, failed, e.what()));
  }
  check::ComposedBudget budget;
  try {
    budget = check::budget_between(in.budgets, in.run, in.reference);
  } catch (const std::exception& e) {
    return error("budgets", e.what());
  }
  const std::vector<check::DriftBias> tests =
      check::one_sided_drift(repeats.runs, in.reference, tested_windows(budget), check::kBiasAlpha);
  json windows = json::array();
  std::vector<std::string> lines;
  for (const check::DriftBias& b : tests) {
    windows.push_back(window_record(b));
    lines.push_back(check::drift_bias_line(b));
  }
  const std::string fails_by = failing_entry(budget);
  check["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  check["seeds"] = repeats.seeds;
  check["receipts"] = repeats.receipts;
  check["windows"] = windows;
  check["bias_fails"] = fails_by.empty() ? json(nullptr) : json(fails_by);
  check["text"] = fmt::format("{} repeats of lane {} (--{} {}..{}) against {}, family-wise level {}:\n{}\n",
                              repeats.runs.size(), in.spec.id, flag, seed, repeats.seeds.back().get<std::int64_t>(),
                              in.reference.lane, check::kBiasAlpha, fmt::join(lines, "\n"));
  set_verdict(check, tests, fails_by);
  return check;
}

}  // namespace harness::nightly
