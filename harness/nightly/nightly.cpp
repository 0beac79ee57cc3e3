#include "nightly.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "golden_store.h"
#include "lane_run.h"
#include "receipt/receipt_reader.h"
#include "stack_info.h"
#include "verdict_report.h"

namespace harness::nightly {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Manifest keys that describe the stack a lane ran on (shown in the reports).
inline constexpr const char* kStackKeys[] = {"git_commit", "toolchain", "libraries", "kernels", "host", "cpu", "threads"};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One line a person reads in a table cell.
std::string verdict_line(const check::Verdict& v) {
  if (const check::MetricVerdict* f = v.first_failure()) {
    return fmt::format("{} fails from step {} (|d| {:.3g}, allowed {:.3g})", f->metric, f->first_failing_step,
                       f->max_deviation, f->allowed);
  }
  const auto tightest = std::min_element(v.metrics.begin(), v.metrics.end(), [](const auto& a, const auto& b) {
    return a.headroom_pct < b.headroom_pct;
  });
  const bool exact = std::all_of(v.metrics.begin(), v.metrics.end(), [](const auto& m) { return m.max_deviation == 0; });
  if (exact) return v.bitwise ? "bitwise equal" : "equal, within budget";
  return fmt::format("within budget; tightest {} at {:.0f}% headroom", tightest->metric, tightest->headroom_pct);
}

// The divergence of `run` from `against` per step, and what the budget allows there.
json envelope(const check::ReceiptData& run, const check::ReceiptData& against, const check::Budgets& budgets) {
  const check::ComposedBudget budget = check::budget_between(budgets, run, against);
  json deviation = json::array(), allowed = json::array();
  for (int s = 0; s < run.steps() && s < against.steps(); ++s) {
    const auto i = static_cast<std::size_t>(s);
    deviation.push_back(std::fabs(run.loss[i] - against.loss[i]));  // NaN becomes null
    allowed.push_back(budget.bitwise() ? 0.0 : budget.allowed("loss", s, against.loss[i]));
  }
  return {{"against", against.lane}, {"budget", budget.names()}, {"loss_deviation", deviation}, {"loss_allowed", allowed}};
}

json stack_of(const check::ReceiptData& r) {
  json stack = json::object();
  for (const char* key : kStackKeys) {
    const auto it = r.manifest.find(key);
    if (it != r.manifest.end()) stack[key] = it->second;
  }
  return stack;
}

// Any error makes the job's verdict "error", else any failure "fail".
std::string overall_verdict(const json& lanes) {
  std::string verdict = "pass";
  for (const json& lane : lanes) {
    if (lane["status"] == "error") return "error";
    if (lane["status"] == "fail") verdict = "fail";
  }
  return verdict;
}

// A lane's run: its summary record, and its receipt once it ran.
struct LaneRun {
  json record;
  std::unique_ptr<check::ReceiptData> receipt;
  std::string error;
};

class Job {
 public:
  Job(const NightlyOptions& options, const std::function<void(const NightlyProgress&)>& progress)
      : options_(options),
        matrix_(load_matrix(options.matrix_path)),
        budgets_(check::load_budgets(options.budgets_path)),
        store_(options.goldens_dir),
        progress_(progress) {}

  json run() {
    const auto start = std::chrono::steady_clock::now();
    const std::string started = run::utc_timestamp();
    const std::vector<const LaneSpec*> lanes = shard_lanes(matrix_, options_.shard);
    planned_ = static_cast<int>(lanes.size());
    const bool needs_reference = std::any_of(lanes.begin(), lanes.end(), [&](auto* l) { return l->id != matrix_.reference; });
    const bool owns_reference = std::any_of(lanes.begin(), lanes.end(), [&](auto* l) { return l->id == matrix_.reference; });
    if (needs_reference && !owns_reference) ++planned_;
    fs::create_directories(fs::path(options_.out_dir) / "receipts");

    json records = json::array();
    for (const LaneSpec* spec : lanes) records.push_back(check_lane(*spec));
    json auxiliary = json::array();
    for (const auto& [id, lane_run] : runs_) {
      if (std::none_of(lanes.begin(), lanes.end(), [&](auto* l) { return l->id == id; })) auxiliary.push_back(lane_run.record);
    }
    json summary = {{"schema_version", kSummarySchemaVersion},
                    {"kind", "nightly"},
                    {"matrix", {{"path", matrix_.path}, {"content_hash", matrix_.content_hash}, {"canary", matrix_.canary},
                                {"steps", matrix_.steps}, {"seed", matrix_.seed}, {"reference", matrix_.reference},
                                {"lanes", lane_ids()}}},
                    {"budgets", {{"path", budgets_.path}, {"content_hash", file_content_hash(budgets_.path)}}},
                    {"goldens", options_.goldens_dir},
                    {"shards", json::array({{{"index", options_.shard.index}, {"count", options_.shard.count},
                                             {"started_utc", started}, {"finished_utc", run::utc_timestamp()},
                                             {"seconds", seconds_since(start)}}})},
                    {"lanes", records},
                    {"auxiliary_runs", auxiliary}};
    summary["verdict"] = overall_verdict(summary["lanes"]);
    return summary;
  }

 private:
  json lane_ids() const {
    json ids = json::array();
    for (const LaneSpec& l : matrix_.lanes) ids.push_back(l.id);
    return ids;
  }

  // Runs a lane once per job (the reference and triage twins are shared by several lanes).
  LaneRun& ensure_run(const LaneSpec& spec) {
    const auto found = runs_.find(spec.id);
    if (found != runs_.end()) return found->second;
    LaneRun& r = runs_[spec.id];
    const std::string relative = (fs::path("receipts") / (spec.id + ".h5")).string();
    const std::string path = (fs::path(options_.out_dir) / relative).string();
    r.record = {{"id", spec.id}, {"lane", spec.lane}, {"engine", spec.engine}, {"features", spec.settings.features},
                {"why", spec.why}, {"receipt", relative}};
    const int index = ++started_;
    const auto start = std::chrono::steady_clock::now();
    try {
      const run::RunSummary s = run_lane(matrix_, spec, path, [&](const run::StepProgress& p) {
        step_progress(index, spec.id, p);
      }, options_.threads);
      r.record["seconds"] = seconds_since(start);
      r.record["ms_per_step"] = 1000.0 * s.seconds / s.steps;
      r.receipt = std::make_unique<check::ReceiptData>(check::load_receipt(path));
      r.record["stack"] = stack_of(*r.receipt);
    } catch (const std::exception& e) {
      r.record["seconds"] = seconds_since(start);
      r.error = e.what();
    }
    steps_done_ += matrix_.steps;
    return r;
  }

  void step_progress(int index, const std::string& id, const run::StepProgress& p) {
    if (!progress_) return;
    const double done = steps_done_ + p.step + 1;
    const double total = static_cast<double>(std::max(planned_, started_)) * matrix_.steps;
    const double elapsed = elapsed_before_ + p.elapsed_seconds;
    NightlyProgress np{index, std::max(planned_, started_), id, p.step + 1, p.steps, elapsed,
                       elapsed / done * (total - done), ""};
    if (p.step + 1 == p.steps) elapsed_before_ = elapsed;
    progress_(np);
  }

  json golden_check(const check::ReceiptData& run, const LaneSpec& spec, json& series) {
    const std::string path = store_.golden_path(spec.lane);
    if (!fs::exists(path)) {
      return {{"check", "golden"}, {"status", "error"}, {"against", path},
              {"summary", "no golden"},
              {"error", {{"kind", "missing_golden"},
                         {"message", fmt::format("no golden for lane {} at {}; create one with `harness golden refresh "
                                                 "--lanes {} --reason TEXT` and approve it", spec.lane, path, spec.id)}}}};
    }
    try {
      const check::ReceiptData golden = check::load_receipt(path);
      series["golden_loss"] = golden.loss;
      json result = judge("golden", run, golden, budgets_);
      if (spec.id == matrix_.reference && result["status"] != "error") series["envelope"] = envelope(run, golden, budgets_);
      return result;
    } catch (const receipt::ReceiptError& e) {
      return {{"check", "golden"}, {"status", "error"}, {"against", path}, {"summary", "golden unreadable"},
              {"error", {{"kind", "receipt"}, {"message", e.what()}}}};
    }
  }

  json reference_check(const check::ReceiptData& run, json& series) {
    LaneRun& ref = ensure_run(matrix_.lane(matrix_.reference));
    if (!ref.receipt) {
      return {{"check", "reference"}, {"status", "error"}, {"against", matrix_.reference},
              {"summary", "the reference lane did not run"},
              {"error", {{"kind", "reference_failed"}, {"message", ref.error}}}};
    }
    series["reference_loss"] = ref.receipt->loss;
    json result = judge("reference", run, *ref.receipt, budgets_);
    if (result["status"] != "error") series["envelope"] = envelope(run, *ref.receipt, budgets_);
    return result;
  }

  // BF16-first triage of an fp8 lane that fails against the reference.
  std::string triage(const LaneSpec& spec) {
    const LaneSpec* twin = twin_of(spec);
    if (!twin) return "no bf16-only twin of this lane in the matrix: add one, or set triage-with";
    LaneRun& twin_run = ensure_run(*twin);
    LaneRun& ref = ensure_run(matrix_.lane(matrix_.reference));
    if (!twin_run.receipt) return fmt::format("the bf16-only twin {} did not run: {}", twin->id, twin_run.error);
    const json twin_check = judge("reference", *twin_run.receipt, *ref.receipt, budgets_);
    if (twin_check["status"] == "fail") {
      return fmt::format("shared math or plumbing: the bf16-only lane {} fails too ({})", twin->id,
                         twin_check["summary"].get<std::string>());
    }
    if (twin_check["status"] == "pass") {
      return fmt::format("quantisation drift: only the fp8 lane moves; the bf16-only lane {} passes", twin->id);
    }
    return fmt::format("inconclusive: the bf16-only lane {} could not be compared ({})", twin->id,
                       twin_check["summary"].get<std::string>());
  }

  // The lane named by triage-with, or the lane with the same engine and settings whose
  // features are this lane's without the fp8 parts.
  const LaneSpec* twin_of(const LaneSpec& spec) const {
    if (!spec.triage_with.empty()) return &matrix_.lane(spec.triage_with);
    std::vector<std::string> kept;
    std::size_t start = 0;
    const std::string& f = spec.settings.features;
    while (start <= f.size()) {
      const std::size_t comma = f.find(',', start);
      const std::string item = f.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (!item.starts_with("fp8")) kept.push_back(item);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    const std::string wanted = fmt::format("{}", fmt::join(kept, ","));
    for (const LaneSpec& l : matrix_.lanes) {
      if (l.engine != spec.engine || l.settings.features != wanted || l.runs_fp8()) continue;
      auto without_fp8 = [](std::map<std::string, std::string> options) {
        std::erase_if(options, [](const auto& kv) { return kv.first.starts_with("fp8") || kv.first.starts_with("amax") || kv.first == "margin"; });
        return options;
      };
      if (without_fp8(l.settings.options) == without_fp8(spec.settings.options)) return &l;
    }
    return nullptr;
  }

  json check_lane(const LaneSpec& spec) {
    LaneRun& r = ensure_run(spec);
    json record = r.record;
    json checks = json::array();
    json series = json::object();
    if (!r.receipt) {
      checks.push_back({{"check", "run"}, {"status", "error"}, {"summary", "the lane did not run"},
                        {"error", {{"kind", "run"}, {"message", r.error}}}});
    } else {
      series["loss"] = r.receipt->loss;
      checks.push_back(golden_check(*r.receipt, spec, series));
      if (spec.id != matrix_.reference) checks.push_back(reference_check(*r.receipt, series));
    }
    record["checks"] = checks;
    record["series"] = series;
    std::string status = "pass";
    for (const json& c : checks) {
      if (c["status"] == "error") status = "error";
      if (c["status"] == "fail" && status != "error") status = "fail";
    }
    record["status"] = status;
    record["triage"] = nullptr;
    if (spec.runs_fp8() && checks.size() > 1 && checks[1]["status"] == "fail") record["triage"] = triage(spec);
    if (progress_) {
      NightlyProgress done{0, std::max(planned_, started_), spec.id, 0, 0, elapsed_before_, 0, ""};
      std::vector<std::string> parts;
      for (const json& c : checks) {
        parts.push_back(fmt::format("{} {}: {}", c["check"].get<std::string>(), c["status"].get<std::string>(),
                                    c["summary"].get<std::string>()));
      }
      done.finished_line = fmt::format("{:<16} {:<5} {:>5.1f} s  {}", spec.id, status, record["seconds"].get<double>(),
                                       fmt::join(parts, "; "));
      progress_(done);
    }
    return record;
  }

  const NightlyOptions& options_;
  Matrix matrix_;
  check::Budgets budgets_;
  GoldenStore store_;
  std::function<void(const NightlyProgress&)> progress_;
  std::map<std::string, LaneRun> runs_;
  int planned_ = 0, started_ = 0;
  double steps_done_ = 0, elapsed_before_ = 0;
};

}  // namespace

json judge(const std::string& check_name, const check::ReceiptData& run, const check::ReceiptData& against,
           const check::Budgets& budgets) {
  json result = {{"check", check_name}, {"against", against.path}};
  try {
    const check::Verdict v = check::compare_receipts(run, against, budgets, check_name == "golden" ? "golden" : "compare");
    result["status"] = v.pass() ? "pass" : "fail";
    result["summary"] = verdict_line(v);
    result["verdict"] = check::to_json(v);
    result["text"] = check::to_text(v);
  } catch (const check::ContractError& e) {
    result["status"] = "error";
    result["summary"] = fmt::format("cannot be compared: {}", e.kind);
    result["error"] = {{"kind", e.kind}, {"message", e.what()}};
  }
  return result;
}

json run_nightly(const NightlyOptions& options, const std::function<void(const NightlyProgress&)>& progress) {
  return Job(options, progress).run();
}

int summary_exit_code(const json& summary) {
  const std::string verdict = summary.at("verdict");
  return verdict == "pass" ? 0 : verdict == "fail" ? 1 : 2;
}

json merge_summaries(const std::vector<json>& shards, const std::vector<std::string>& shard_dirs, const std::string& out_dir) {
  if (shards.empty()) throw MatrixError("merge: give the output directories of the shards");
  const json& first = shards.front();
  std::map<std::string, json> lanes_by_id;
  json merged = first;
  merged["shards"] = json::array();
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const json& s = shards[i];
    const std::string& dir = shard_dirs[i];
    if (s.value("kind", "") != "nightly" || s.value("schema_version", 0) != kSummarySchemaVersion) {
      throw MatrixError(fmt::format("merge: {}/summary.json is not a nightly summary of schema_version {}", dir, kSummarySchemaVersion));
    }
    if (s["matrix"]["content_hash"] != first["matrix"]["content_hash"] || s["budgets"]["content_hash"] != first["budgets"]["content_hash"]) {
      throw MatrixError(fmt::format("merge: {} ran another matrix or budgets file than {}; merge shards of one job",
                                    dir, shard_dirs.front()));
    }
    for (const json& shard : s["shards"]) merged["shards"].push_back(shard);
    for (json lane : s["lanes"]) {
      const std::string id = lane["id"];
      if (lanes_by_id.count(id)) throw MatrixError(fmt::format("merge: lane {} appears in two shards (again in {})", id, dir));
      const fs::path receipt = fs::absolute(fs::path(dir) / lane["receipt"].get<std::string>());
      lane["receipt"] = fs::relative(receipt, fs::absolute(out_dir)).string();
      lanes_by_id[id] = lane;
    }
  }
  json lanes = json::array();
  for (const json& id : first["matrix"]["lanes"]) {
    const auto it = lanes_by_id.find(id.get<std::string>());
    if (it == lanes_by_id.end()) {
      throw MatrixError(fmt::format("merge: lane {} is in no shard; give every shard's directory", id.get<std::string>()));
    }
    lanes.push_back(it->second);
  }
  merged["lanes"] = lanes;
  merged["auxiliary_runs"] = json::array();
  for (const json& s : shards) {
    for (const json& run : s["auxiliary_runs"]) merged["auxiliary_runs"].push_back(run);
  }
  merged["verdict"] = overall_verdict(lanes);
  return merged;
}

}  // namespace harness::nightly
