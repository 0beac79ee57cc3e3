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

#include "bf16_first.h"
#include "bias_check.h"
#include "resume_gate.h"
#include "controls.h"
#include "environment_drift.h"
#include "golden_store.h"
#include "false_alarms.h"
#include "headroom.h"
#include "interrupt.h"
#include "json_text.h"
#include "lane_run.h"
#include "receipt/receipt_reader.h"
#include "registry.h"
#include "stack_info.h"
#include "verdict_report.h"

namespace harness::nightly {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

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

// The divergence of `run` from `against` per step, and what the budget allows there, as the
// verdict judged it (its metrics' step_deviation and step_allowed; docs/nightly.md,
// summary.json): per metric judged against a tolerance, tightest first, with its headroom
// and first failing step; and what the reports need to reproduce, bisect and replay the
// run (its receipt and its recipe).
json envelope(const check::ReceiptData& run, const check::ReceiptData& against, const json& verdict) {
  std::vector<json> metrics;
  json loss_deviation = json::array(), loss_allowed = json::array();
  const auto judged = [&](const char* name) {
    std::vector<json> found;
    for (const json& v : verdict.at("metrics")) {
      if (v.value("metric", "") == name && v.value("judged", true)) found.push_back(v);
    }
    return found;
  };
  const auto verdict_of = [](const json& v, json m) {
    for (const char* key : {"headroom_pct", "pass", "first_failing_step", "worst_step", "worst_tensor"}) {
      m[key] = v.at(key);
    }
    return m;
  };
  for (const char* name : check::kBudgetMetrics) {
    for (const json& v : judged(name)) {
      json m = verdict_of(v, {{"metric", name}, {"deviation", v.at("step_deviation")},
                              {"allowed", v.at("step_allowed")}});
      if (m["metric"] == "loss") loss_deviation = m["deviation"], loss_allowed = m["allowed"];
      metrics.push_back(m);
    }
  }
  // The held-out logit metrics a budget judged, at the evaluations both runs made (the
  // verdict's per-step series hold 0 between them): `steps` places each point.
  const std::vector<int> evaluated = check::compared_eval_steps(run.eval, against.eval);
  for (const char* name : check::kEvalMetrics) {
    for (const json& v : judged(name)) {
      json deviation = json::array(), allowed = json::array();
      for (const int step : evaluated) {
        deviation.push_back(v.at("step_deviation").at(step));
        allowed.push_back(v.at("step_allowed").at(step));
      }
      metrics.push_back(
          verdict_of(v, {{"metric", name}, {"steps", evaluated}, {"deviation", deviation}, {"allowed", allowed}}));
    }
  }
  // Tightest first: the least headroom (null: a broken exact budget or a NaN, the tightest).
  std::stable_sort(metrics.begin(), metrics.end(), [](const json& a, const json& b) {
    const double ha = a["headroom_pct"].is_number() ? a["headroom_pct"].get<double>() : -1e300;
    const double hb = b["headroom_pct"].is_number() ? b["headroom_pct"].get<double>() : -1e300;
    return ha < hb;
  });
  json recipe = nullptr;
  if (const auto it = run.manifest.find("run_options"); it != run.manifest.end()) {
    recipe = json::parse(it->second, nullptr, false);
    if (recipe.is_discarded()) recipe = nullptr;
  }
  const json& budget = verdict.at("budget");
  return {{"against", against.lane},  {"against_receipt", against.path},
          {"receipt", run.path},      {"run_options", recipe},
          {"budget", budget.at("features")}, {"bitwise", budget.at("bitwise")},
          {"loss_deviation", loss_deviation}, {"loss_allowed", loss_allowed},
          {"metrics", json(metrics)}};
}

// The interpreter a Python canary's lane runs under, as the matrix or the lane names it (the
// reports' commands run it again with it); null for the other lanes.
json lane_python(const LaneSpec& spec) {
  return spec.python_canary && !spec.command.empty() ? json(spec.command.front()) : json(nullptr);
}

json stack_of(const check::ReceiptData& r) {
  json stack = json::object();
  for (const char* key : kStackKeys) {
    const auto it = r.manifest.find(key);
    if (it != r.manifest.end()) stack[key] = it->second;
  }
  return stack;
}

// A check that could not be made: the summary says why, the job goes on.
json error_check(json check, const std::string& kind, const std::string& message, const std::string& summary) {
  check["status"] = "error";
  check["summary"] = summary;
  check["error"] = {{"kind", kind}, {"message", message}};
  return check;
}

// Any error makes the verdict "error", else any failure "fail" (of a job's lanes, or of
// one lane's checks).
std::string worst_status(const json& items) {
  std::string verdict = "pass";
  for (const json& item : items) {
    if (item.at("status") == "error") return "error";
    if (item.at("status") == "fail") verdict = "fail";
  }
  return verdict;
}

// The job's verdict: its lanes' worst, unless a negative control is blind or could not run
// (then the job cannot vouch for its lanes: an infrastructure error).
std::string job_verdict(const json& lanes, const json& controls) {
  return controls_fail_the_job(controls) ? "error" : worst_status(lanes);
}

// A lane's run: its summary record, and its receipt once it ran.
struct LaneRun {
  json record;
  std::unique_ptr<check::ReceiptData> receipt;
  std::string error;
  std::string error_kind = "run";  // "interrupted" when a signal cut the lane's run
};

}  // namespace

class NightlyJob::Impl {
 public:
  explicit Impl(const NightlyOptions& options)
      : options_(options),
        matrix_(load_matrix(options.matrix_path)),
        budgets_(check::load_budgets(options.budgets_path)),
        budgets_hash_(run::file_content_hash(options.budgets_path)),
        store_(options.goldens_dir),
        selected_(select_lanes(matrix_, options.lanes, "--lanes")) {
    check_triage_pairs(matrix_, budgets_);
  }

  json run(const std::function<void(const NightlyProgress&)>& progress) {
    progress_ = progress;
    const auto start = std::chrono::steady_clock::now();
    const std::string started = run::utc_timestamp();
    std::vector<const LaneSpec*> lanes = shard_lanes(matrix_, options_.shard);
    std::erase_if(lanes, [&](const LaneSpec* l) { return std::find(selected_.begin(), selected_.end(), l) == selected_.end(); });
    planned_ = static_cast<int>(lanes.size());
    const bool needs_reference = std::any_of(lanes.begin(), lanes.end(), [&](auto* l) { return l->id != matrix_.reference; });
    const bool owns_reference = std::any_of(lanes.begin(), lanes.end(), [&](auto* l) { return l->id == matrix_.reference; });
    if (needs_reference && !owns_reference) ++planned_;
    fs::create_directories(fs::path(options_.out_dir) / "receipts");

    // SIGINT/SIGTERM cut the lane under way at its next step boundary: its receipt holds
    // the steps it finished, the reports name it, and no further lane starts.
    const run::InterruptGuard interrupts;
    json records = json::array();
    std::string last_finished;  // a signal that lands between two lanes cut neither
    for (const LaneSpec* spec : lanes) {
      if (interrupted_signal_ == 0 && (interrupted_signal_ = run::pending_interrupt()) != 0) {
        interrupted_after_ = last_finished;
      }
      records.push_back(interrupted_signal_ == 0 ? check_lane(*spec) : not_started(*spec));
      if (interrupted_signal_ == 0) last_finished = spec->id;
    }
    // The negative controls: the fault control where the shard holds the reference lane
    // (whatever --lanes selects), the others in every shard on its own lanes.
    const std::vector<const LaneSpec*> shard = shard_lanes(matrix_, options_.shard);
    const bool holds_reference =
        std::any_of(shard.begin(), shard.end(), [&](auto* l) { return l->id == matrix_.reference; });
    const json control_records = interrupted_signal_ == 0 ? controls(lanes, holds_reference) : json::array();
    json auxiliary = json::array();
    for (const auto& run : runs_) {  // (no structured binding: clang 14 cannot capture one)
      const std::string& id = run.first;
      if (std::none_of(lanes.begin(), lanes.end(), [&](auto* l) { return l->id == id; })) auxiliary.push_back(run.second.record);
    }
    json summary = {{"schema_version", kSummarySchemaVersion},
                    {"kind", "nightly"},
                    {"matrix", {{"path", matrix_.path}, {"content_hash", matrix_.content_hash}, {"canary", matrix_.canary},
                                {"steps", matrix_.steps}, {"seed", matrix_.seed}, {"reference", matrix_.reference},
                                {"lanes", lane_ids()}, {"selected", selected_ids()}}},
                    {"budgets", {{"path", budgets_.path}, {"content_hash", budgets_hash_}}},
                    {"goldens", options_.goldens_dir},
                    {"shards", json::array({{{"index", options_.shard.index}, {"count", options_.shard.count},
                                             {"started_utc", started}, {"finished_utc", run::utc_timestamp()},
                                             {"seconds", seconds_since(start)}}})},
                    {"lanes", records},
                    {"auxiliary_runs", auxiliary}};
    summary["controls"] = control_records;
    mark_fragile_lanes(summary);
    summary["false_alarm"] = matrix_false_alarm(summary);
    summary["history"] = nullptr;  // the CLI's --history fills it in
    summary["environment_drift"] = environment_drift(summary);
    summary["verdict"] = job_verdict(summary["lanes"], summary["controls"]);
    // lane: the lane the signal cut, or null when it landed between lanes (after_lane: the
    // last lane that finished, null before the first).
    const auto or_null = [](const std::string& id) { return id.empty() ? json(nullptr) : json(id); };
    summary["interrupted"] = interrupted_signal_ == 0
                                 ? json(nullptr)
                                 : json{{"signal", interrupted_signal_}, {"lane", or_null(interrupted_lane_)},
                                        {"after_lane", or_null(interrupted_after_)}};
    return summary;
  }

 private:
  json lane_ids() const {
    json ids = json::array();
    for (const LaneSpec& l : matrix_.lanes) ids.push_back(l.id);
    return ids;
  }

  // The lanes --lanes chose, in the matrix's order (every lane without it): what the job's
  // shards hold between them, and so what a merge of them must find.
  json selected_ids() const {
    json ids = json::array();
    for (const LaneSpec& l : matrix_.lanes) {
      if (std::find(selected_.begin(), selected_.end(), &l) != selected_.end()) ids.push_back(l.id);
    }
    return ids;
  }

  // The negative controls (controls.h), beside the reference lane's run; none when it did
  // not run. A signal during them is the job's interruption, after its last lane.
  json controls(const std::vector<const LaneSpec*>& lanes, bool fault) {
    const auto ref = runs_.find(matrix_.reference);
    if (ref == runs_.end() || !ref->second.receipt) return json::array();
    ControlInputs in{matrix_, budgets_, *ref->second.receipt, {}, (fs::path(options_.out_dir) / "controls").string(),
                     options_.threads, fault};
    for (const LaneSpec* spec : lanes) {
      const auto run = runs_.find(spec->id);
      if (run != runs_.end() && run->second.receipt) in.lanes.emplace_back(spec, run->second.receipt.get());
    }
    fs::create_directories(in.work_dir);
    try {
      return run_controls(in);
    } catch (const run::Interrupted& e) {
      interrupted_signal_ = e.signal;
      interrupted_after_ = lanes.empty() ? "" : lanes.back()->id;
      return json::array();
    }
  }

  // Runs a lane once per job (the reference and triage twins are shared by several lanes).
  LaneRun& ensure_run(const LaneSpec& spec) {
    const auto found = runs_.find(spec.id);
    if (found != runs_.end()) return found->second;
    LaneRun& r = runs_[spec.id];
    const std::string relative = (fs::path("receipts") / (spec.id + ".h5")).string();
    const std::string path = (fs::path(options_.out_dir) / relative).string();
    r.record = {{"id", spec.id}, {"lane", spec.lane}, {"engine", spec.engine}, {"features", spec.settings.features},
                {"why", spec.why}, {"receipt", relative}, {"python", lane_python(spec)}};
    const int index = ++started_;
    const auto start = std::chrono::steady_clock::now();
    try {
      const run::RunSummary s = run_lane(matrix_, spec, path, [&](const run::StepProgress& p) {
        step_progress(index, spec.id, p);
      }, options_.threads, spec.uses_pack() ? job_pack() : std::string());
      r.record["seconds"] = seconds_since(start);
      r.record["ms_per_step"] = 1000.0 * s.seconds / s.steps;
      r.receipt = std::make_unique<check::ReceiptData>(check::load_receipt(path));
      r.record["stack"] = stack_of(*r.receipt);
    } catch (const run::Interrupted& e) {
      r.record["seconds"] = seconds_since(start);
      r.error = e.what();
      r.error_kind = "interrupted";
      interrupted_signal_ = e.signal;
      interrupted_lane_ = spec.id;
    } catch (const std::exception& e) {
      r.record["seconds"] = seconds_since(start);
      r.error = e.what();
    }
    steps_done_ += matrix_.steps;
    return r;
  }

  // The canary pack of the job's external lanes: exported once into the output directory.
  // A failed export is every external lane's run error.
  const std::string& job_pack() {
    if (pack_.empty() && pack_error_.empty()) {
      try {
        pack_ = export_matrix_pack(matrix_, (fs::path(options_.out_dir) / "canary-pack.h5").string());
      } catch (const std::exception& e) {
        pack_error_ = fmt::format("exporting the canary pack for the external lanes: {}", e.what());
      }
    }
    if (!pack_error_.empty()) throw LaneCommandError(pack_error_);
    return pack_;
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
    const json check = {{"check", "golden"}, {"against", path}};
    if (!fs::exists(path)) {
      return error_check(check, "missing_golden",
                         fmt::format("no golden for lane {} at {}; create one with `harness golden refresh --matrix {} "
                                     "--lanes {} --reason TEXT` and approve it",
                                     spec.lane, path, options_.matrix_path, spec.id),
                         "no golden");
    }
    std::unique_ptr<check::ReceiptData> golden;
    try {
      verify_golden_integrity(path, store_);
    } catch (const GoldenError& e) {
      return error_check(check, "golden_integrity", e.what(), "golden changed outside approve");
    }
    try {
      golden = std::make_unique<check::ReceiptData>(check::load_receipt(path));
    } catch (const std::exception& e) {  // not a receipt, truncated, another schema
      return error_check(check, "receipt", e.what(), "golden unreadable");
    }
    series["golden_loss"] = golden->loss;
    json result = judge("golden", run, *golden, budgets_);
    if (spec.id == matrix_.reference && result["status"] != "error") {
      series["envelope"] = envelope(run, *golden, result.at("verdict"));
    }
    return result;
  }

  json reference_check(const check::ReceiptData& run, json& series) {
    LaneRun& ref = ensure_run(matrix_.lane(matrix_.reference));
    if (!ref.receipt) {
      return error_check({{"check", "reference"}, {"against", ref.record["receipt"]}}, "reference_failed", ref.error,
                         "the reference lane did not run");
    }
    series["reference_loss"] = ref.receipt->loss;
    json result = judge("reference", run, *ref.receipt, budgets_);
    if (result["status"] != "error") series["envelope"] = envelope(run, *ref.receipt, result.at("verdict"));
    return result;
  }

  // One-sided drift over the lane's repeats (bias_check.h); the reference lane has run.
  json bias(const LaneSpec& spec, const check::ReceiptData& run) {
    const LaneRun& ref = ensure_run(matrix_.lane(matrix_.reference));
    const BiasInputs in{matrix_,         spec, run, *ref.receipt, budgets_, options_.out_dir,
                        (fs::path(options_.out_dir) / "bias").string(), options_.threads};
    return bias_check(in);
  }

  // BF16-first triage of a lane that fails against the reference and declares `features`
  // (one of them, with a twin that lacks it).
  std::string triage(const LaneSpec& spec, const std::vector<check::TriagedFeature>& features) {
    const LaneSpec* twin = nullptr;
    check::TriagedFeature feature = features.front();
    for (const check::TriagedFeature& f : features) {
      twin = twin_of(spec, f.name);
      if (twin && !twin->declares(f.name)) {
        feature = f;
        break;
      }
      twin = nullptr;
    }
    if (!twin) return fmt::format("no {} twin of this lane in the matrix: add one, or set triage-with", feature.twin);
    LaneRun& twin_run = ensure_run(*twin);
    LaneRun& ref = ensure_run(matrix_.lane(matrix_.reference));
    if (!twin_run.receipt) return fmt::format("the {} twin {} did not run: {}", feature.twin, twin->id, twin_run.error);
    const json twin_check = judge("reference", *twin_run.receipt, *ref.receipt, budgets_);
    const std::string status = twin_check["status"];
    if (status == "fail" || status == "pass") {
      return check::bf16_first_advice(feature, twin->id, status == "pass", twin_check["summary"].get<std::string>());
    }
    return fmt::format("inconclusive: the {} lane {} could not be compared ({})", feature.twin, twin->id,
                       twin_check["summary"].get<std::string>());
  }

  // The lane named by triage-with, or the lane with the same engine and settings but for
  // budget feature `name`: its `NAME=...` item of --features and the flags the engine tags
  // with it (EngineFlag::feature).
  const LaneSpec* twin_of(const LaneSpec& spec, const std::string& name) const {
    if (!spec.triage_with.empty()) return &matrix_.lane(spec.triage_with);
    const EngineSettings wanted = without_feature(spec.settings, name);
    for (const LaneSpec& l : matrix_.lanes) {
      if (l.engine != spec.engine || l.declares(name)) continue;
      const EngineSettings other = without_feature(l.settings, name);
      if (other.features == wanted.features && other.options == wanted.options) return &l;
    }
    return nullptr;
  }

  // `settings` without feature `name`: the --features items named so (`fp8=all`: the
  // name before '=') and the engine flags that tune it (EngineFlag::feature).
  static EngineSettings without_feature(EngineSettings settings, std::string_view name) {
    std::vector<std::string> kept = split_list(settings.features);
    std::erase_if(kept, [&](const std::string& item) { return item.substr(0, item.find('=')) == name; });
    settings.features = fmt::format("{}", fmt::join(kept, ","));
    std::erase_if(settings.options, [&](const auto& option) {
      const DescribedFlag* flag = find_engine_flag(option.first);
      return flag && flag->flag.feature == name;
    });
    return settings;
  }

  json check_lane(const LaneSpec& spec) {
    LaneRun& r = ensure_run(spec);
    json record = r.record;
    json checks = json::array();
    json series = json::object();
    if (!r.receipt) {
      checks.push_back(error_check({{"check", "run"}, {"against", ""}}, r.error_kind, r.error,
                                   r.error_kind == "interrupted" ? "the lane was cut by a signal" : "the lane did not run"));
    } else {
      series["loss"] = r.receipt->loss;
      checks.push_back(golden_check(*r.receipt, spec, series));
      if (spec.id != matrix_.reference) checks.push_back(reference_check(*r.receipt, series));
      if (spec.bias_repeats > 0 && checks.back()["status"] != "error") checks.push_back(bias(spec, *r.receipt));
      if (spec.resume_at >= 0) {
        checks.push_back(resume_check({matrix_, spec, *r.receipt, (fs::path(options_.out_dir) / "resume").string(),
                                       options_.threads}));
      }
    }
    record["checks"] = checks;
    record["series"] = series;
    const std::string status = worst_status(checks);
    record["status"] = status;
    record["triage"] = nullptr;
    // A judged receipt declared its features: triage explains the lanes that declare one
    // whose budget entry has triage_twin, where the reference check fails.
    const auto reference_failed = [](const json& c) { return c["check"] == "reference" && c["status"] == "fail"; };
    if (std::any_of(checks.begin(), checks.end(), reference_failed)) {  // judged, so its receipt was read
      const auto triaged = check::triaged_features(check::budget_features(*r.receipt), budgets_);
      if (!triaged.empty()) record["triage"] = triage(spec, triaged);
    }
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

  // A lane the job never started because a signal stopped it first.
  json not_started(const LaneSpec& spec) const {
    const json check = error_check({{"check", "run"}, {"against", ""}}, "interrupted",
                                   fmt::format("not started: the job was interrupted (signal {})", interrupted_signal_),
                                   "not started: the job was interrupted");
    return {{"id", spec.id}, {"lane", spec.lane}, {"engine", spec.engine}, {"features", spec.settings.features},
            {"why", spec.why}, {"receipt", nullptr}, {"python", lane_python(spec)}, {"seconds", 0.0},
            {"checks", json::array({check})},
            {"series", json::object()}, {"status", "error"}, {"triage", nullptr}};
  }

  int interrupted_signal_ = 0;
  std::string interrupted_lane_;   // the lane the signal cut, if it landed inside one
  std::string interrupted_after_;  // the last finished lane, if it landed between two
  NightlyOptions options_;
  Matrix matrix_;
  check::Budgets budgets_;
  std::string budgets_hash_;  // taken when the budgets were read
  GoldenStore store_;
  std::function<void(const NightlyProgress&)> progress_;
  std::map<std::string, LaneRun> runs_;
  std::string pack_, pack_error_;  // job_pack()
  std::vector<const LaneSpec*> selected_;  // --lanes (every lane when not given)
  int planned_ = 0, started_ = 0;
  double steps_done_ = 0, elapsed_before_ = 0;
};

NightlyJob::NightlyJob(const NightlyOptions& options) : impl_(std::make_unique<Impl>(options)) {}
NightlyJob::~NightlyJob() = default;
json NightlyJob::run(const std::function<void(const NightlyProgress&)>& progress) { return impl_->run(progress); }

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
    return error_check(result, e.kind, e.what(), fmt::format("cannot be compared: {}", e.kind));
  } catch (const check::BudgetError& e) {
    return error_check(result, "budgets", e.what(), "no budget for this comparison");
  } catch (const std::exception& e) {  // a receipt that reads wrong half-way
    return error_check(result, "receipt", e.what(), "a receipt could not be read");
  }
  return result;
}

int summary_exit_code(const json& summary) {
  const json interrupted = summary.value("interrupted", json(nullptr));
  if (!interrupted.is_null()) return 128 + interrupted.at("signal").get<int>();
  const std::string verdict = summary.at("verdict");
  return verdict == "pass" ? 0 : verdict == "fail" ? 1 : 2;
}

namespace {

// What the reports and the merge read of a shard's summary; throws json exceptions.
void check_summary_shape(const json& s) {
  for (const char* key : {"matrix", "budgets"}) s.at(key).at("content_hash").get<std::string>();
  s.at("goldens").get<std::string>();
  s.at("matrix").at("lanes").get<std::vector<std::string>>();
  s.at("matrix").at("steps").get<int>();
  for (const json& shard : s.at("shards")) shard.at("seconds").get<double>();
  for (const char* list : {"lanes", "auxiliary_runs"}) {
    for (const json& lane : s.at(list)) {
      for (const char* key : {"id", "lane", "receipt"}) lane.at(key).get<std::string>();
      lane.at("seconds").get<double>();
    }
  }
  for (const json& control : s.value("controls", json::array())) {
    for (const char* key : {"control", "status", "summary"}) control.at(key).get<std::string>();
    control.at("seconds").get<double>();
  }
  for (const json& lane : s.at("lanes")) {
    lane.at("status").get<std::string>();
    lane.at("series").get<json::object_t>();
    for (const json& check : lane.at("checks")) {
      for (const char* key : {"check", "status", "summary"}) check.at(key).get<std::string>();
    }
  }
}

// The lanes a shard's job selected (--lanes); a summary written before it recorded them
// selected every lane of the matrix.
const json& job_lanes(const json& summary) {
  const json& matrix = summary["matrix"];
  return matrix.contains("selected") ? matrix["selected"] : matrix["lanes"];
}

// A receipt path of a shard's summary, relative to the merged report directory.
json rebase(const std::string& receipt, const std::string& shard_dir, const std::string& out_dir) {
  return fs::relative(fs::absolute(fs::path(shard_dir) / receipt), fs::absolute(out_dir)).string();
}

}  // namespace

json merge_summaries(const std::vector<json>& shards, const std::vector<std::string>& shard_dirs, const std::string& out_dir) {
  if (shards.empty()) throw MatrixError("merge: give the output directories of the shards");
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const json& s = shards[i];
    if (s.value("kind", "") != "nightly" || s.value("schema_version", 0) != kSummarySchemaVersion) {
      throw MatrixError(fmt::format("merge: {}/summary.json is not a nightly summary of schema_version {}", shard_dirs[i],
                                    kSummarySchemaVersion));
    }
    try {
      check_summary_shape(s);
    } catch (const json::exception& e) {
      throw MatrixError(fmt::format("merge: {}/summary.json is damaged ({}); run the shard again", shard_dirs[i],
                                    run::json_error_text(e)));
    }
    for (const char* same : {"matrix", "budgets"}) {
      if (s[same]["content_hash"] != shards.front()[same]["content_hash"]) {
        throw MatrixError(fmt::format("merge: {} ran another {} file than {}; merge the shards of one job", shard_dirs[i], same,
                                      shard_dirs.front()));
      }
    }
    if (job_lanes(s) != job_lanes(shards.front())) {
      throw MatrixError(fmt::format("merge: {} ran other lanes (--lanes {}) than {} (--lanes {}); merge the shards of one job",
                                    shard_dirs[i], job_lanes(s).dump(), shard_dirs.front(), job_lanes(shards.front()).dump()));
    }
    if (s["goldens"] != shards.front()["goldens"]) {
      throw MatrixError(fmt::format("merge: {} checked against other goldens ({}) than {}", shard_dirs[i],
                                    s["goldens"].get<std::string>(), shard_dirs.front()));
    }
  }
  json merged = shards.front();
  merged["shards"] = json::array();
  merged["auxiliary_runs"] = json::array();
  std::map<std::string, json> lanes_by_id;
  std::set<std::string> auxiliary_ids;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const std::string& dir = shard_dirs[i];
    for (const json& shard : shards[i]["shards"]) merged["shards"].push_back(shard);
    for (json lane : shards[i]["lanes"]) {
      const std::string id = lane["id"];
      if (lanes_by_id.count(id)) throw MatrixError(fmt::format("merge: lane {} appears in two shards (again in {})", id, dir));
      lane["receipt"] = rebase(lane["receipt"], dir, out_dir);
      for (json& check : lane["checks"]) {  // a bias check's repeats
        if (!check.contains("receipts")) continue;
        for (json& receipt : check["receipts"]) receipt = rebase(receipt, dir, out_dir);
      }
      lanes_by_id[id] = lane;
    }
    for (json run : shards[i]["auxiliary_runs"]) {  // the reference, run by several shards: once
      if (!auxiliary_ids.insert(run["id"].get<std::string>()).second) continue;
      run["receipt"] = rebase(run["receipt"], dir, out_dir);
      merged["auxiliary_runs"].push_back(run);
    }
  }
  json lanes = json::array();
  for (const json& id : job_lanes(shards.front())) {
    const auto it = lanes_by_id.find(id.get<std::string>());
    if (it == lanes_by_id.end()) {
      throw MatrixError(fmt::format("merge: lane {} is in no shard; give every shard's directory", id.get<std::string>()));
    }
    lanes.push_back(it->second);
  }
  merged["lanes"] = lanes;
  mark_fragile_lanes(merged);
  merged["false_alarm"] = matrix_false_alarm(merged);  // over every shard's checks
  merged["history"] = merge_histories(shards);
  std::vector<json> shard_controls;
  for (const json& s : shards) shard_controls.push_back(s.value("controls", json::array()));
  merged["controls"] = merge_controls(shard_controls);
  merged["environment_drift"] = environment_drift(merged);  // over every shard's lanes
  merged["verdict"] = job_verdict(lanes, merged["controls"]);
  for (const json& s : shards) {  // a signal cut the job: the first shard it cut says where
    if (!s.value("interrupted", json(nullptr)).is_null()) {
      merged["interrupted"] = s["interrupted"];
      break;
    }
  }
  return merged;
}

}  // namespace harness::nightly
