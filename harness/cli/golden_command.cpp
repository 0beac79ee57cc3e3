// `harness golden status|refresh|approve|reject`: the only way goldens change. Refresh runs
// lanes into candidates beside the goldens (or, with --receipt, takes receipts made
// elsewhere: a Python canary's runs), stores a Python canary's aten traces in its candidate
// (docs/bisect.md), and writes a review report; approve promotes reviewed candidates
// atomically and records who, why and what changed; reject drops them.
// With CI set, refresh and approve refuse to write unless --allow-ci (docs/goldens.md).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "bisect.h"
#include "budgets.h"
#include "canary_run.h"
#include "commands.h"
#include "file_io.h"
#include "output_lock.h"
#include "python_canary.h"
#include "defaults.h"
#include "golden_store.h"
#include "lane_run.h"
#include "matrix.h"
#include "nightly.h"
#include "receipt/aten_trace.h"
#include "receipt/receipt_reader.h"
#include "receipt/receipt_validator.h"
#include "run/full_receipt_schema.h"
#include "stack_info.h"
#include "verdict.h"
#include "json_text.h"

namespace harness::cli {
namespace {

namespace fs = std::filesystem;

struct GoldenFlags {
  std::string matrix = default_matrix();
  std::string goldens = default_goldens();
  std::string budgets = default_budgets();
  std::string lanes, reason, approver;
  std::vector<std::string> receipts;  // refresh --receipt: receipts made elsewhere, instead of running lanes
  bool allow_ci = false, allow_dirty = false, json = false, no_matrix = false;
};

void refuse_in_ci(const GoldenFlags& f, const char* command) {
  const char* ci = std::getenv("CI");
  if (ci && *ci && !f.allow_ci) {
    throw run::UsageError(fmt::format("CI is set: `harness golden {}` writes no goldens in CI; pass --allow-ci if this "
                                      "job is meant to", command));
  }
}

int status_action(const GoldenFlags& f) {
  const nightly::Matrix matrix = f.no_matrix ? nightly::Matrix{} : nightly::load_matrix(f.matrix);
  const nightly::GoldenStatus status = nightly::GoldenStore(f.goldens).status(matrix);
  if (f.json) {
    fmt::print("{}\n", run::json_text(status.to_json()));
    return status.clean() ? kExitPass : kExitCheckFailed;
  }
  if (f.no_matrix) {
    fmt::print("goldens     {} (lanes approved from receipts)\n", f.goldens);
  } else {
    fmt::print("goldens     {} ({} lanes in {})\n", f.goldens, matrix.lanes.size(), f.matrix);
  }
  for (const nightly::GoldenState& g : status.lanes) {
    fmt::print("{:<11} {:<16} {}{}\n", g.state, g.id, g.lane, g.candidate_pending ? "  (candidate awaiting approval)" : "");
    if (!g.detail.empty()) fmt::print("{:<11} {}\n", "", g.detail);
  }
  for (const std::string& o : status.orphans) fmt::print("orphaned    {}  (no lane of the matrix; delete it or add its lane)\n", o);
  for (const std::string& o : status.orphaned_candidates) {
    fmt::print("orphaned    {}  (a candidate no record knows; delete it)\n", o);
  }
  return status.clean() ? kExitPass : kExitCheckFailed;
}

// The candidate against the golden it would replace, as the review report shows it.
nlohmann::json review(const std::string& candidate, const std::string& golden, const check::Budgets& budgets) {
  if (!fs::exists(golden)) return {{"verdict", "new"}, {"summary", "no golden yet: this candidate creates it"}};
  try {
    const nlohmann::json judged = nightly::judge("golden", check::load_receipt(candidate), check::load_receipt(golden), budgets);
    nlohmann::json out = {{"verdict", judged["status"] == "error" ? "incomparable" : judged["status"]},
                          {"summary", judged["summary"]}};
    if (judged.contains("text")) out["text"] = judged["text"];
    if (judged.contains("error")) out["text"] = judged["error"]["message"].get<std::string>() + "\n";
    return out;
  } catch (const std::exception& e) {  // a golden of an older schema, ...
    return {{"verdict", "incomparable"}, {"summary", e.what()}};
  }
}

// The lane of a receipt made elsewhere, once it has proven it can be a golden: it validates,
// is complete, unperturbed, and its lane is <canary>/<name> naming a path inside the goldens directory.
std::string lane_of_golden_receipt(const std::string& path) {
  receipt::require_valid_receipt(path, run::full_receipt_schema());  // every byte checksummed, every dataset of the schema
  const receipt::ReceiptReader r(path);
  if (!r.complete()) {
    throw run::UsageError(fmt::format("--receipt: {}: an incomplete receipt (complete = 0) cannot become a golden; "
                                      "give a finished run", path));
  }
  if (const auto manifest = r.manifest_text(); manifest.count("init_perturbation_seed")) {
    throw run::UsageError(fmt::format("--receipt: {}: its initial weights were perturbed (init_perturbation_seed {}), "
                                      "a calibration run, not its lane's; give an unperturbed run",
                                      path, manifest.at("init_perturbation_seed")));
  }
  const std::string lane = r.manifest_string("lane");
  const std::size_t slash = lane.find('/');
  // The golden's path is the lane's: it must stay inside the goldens directory and never be
  // another lane's candidate path.
  const bool inside = slash != std::string::npos && slash > 0 && slash + 1 < lane.size() && !lane.starts_with("/") &&
                      !lane.ends_with("/") && !lane.ends_with(".candidate") &&
                      std::ranges::none_of(fs::path(lane), [](const fs::path& part) {
                        return part == ".." || part == "." || part.empty();
                      });
  if (!inside) {
    throw run::UsageError(fmt::format("--receipt: {}: lane '{}' is not <canary>/<name> (no '.', '..' or empty parts, "
                                      "no '.candidate' ending); a golden's path comes from it",
                                      path, lane));
  }
  return lane;
}

// A Python canary's aten traces of every step, replayed while the code that ran it is on
// disk, stored in the staged candidate before its content hash is taken: bisect against the
// golden then replays only the other run, whatever has become of this code (docs/bisect.md).
// Returns what the candidate carries, as refresh prints it and the review shows it; "" for a
// run of no Python canary, or one that holds its op traces already (--trace ops).
std::string store_aten_traces(const std::string& staged) {
  std::map<std::string, std::string> manifest;
  int steps = 0;
  {
    const receipt::ReceiptReader r(staged);  // closed before the file is opened to add to it
    manifest = r.manifest_text();
    if (!run::is_python_canary(manifest) || h5::exists(r.file(), receipt::paths::kTrace) || receipt::has_aten_traces(r)) {
      return "";
    }
    steps = static_cast<int>(r.steps_recorded());
  }
  if (steps < 1) return "";
  const auto start = std::chrono::steady_clock::now();
  std::vector<check::OpTrace> traces;
  try {
    traces = python_aten_traces(staged, manifest, 0, steps - 1);
  } catch (const check::TraceUnavailable& e) {
    return fmt::format("no aten trace: {}; bisect against this golden needs its code on disk", e.what());
  }
  std::vector<receipt::AtenTraceStep> stored;
  std::size_t outputs = 0;
  for (check::OpTrace& t : traces) {
    outputs += t.columns.size();
    stored.push_back({std::move(t.columns), std::move(t.sites), std::move(t.hashes), std::move(t.l2), std::move(t.projection)});
  }
  receipt::write_aten_traces(staged, stored);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  return fmt::format("aten traces of steps 0-{} stored: {} op outputs, replayed in {:.1f} s", steps - 1, outputs,
                     took.count());
}

// The candidate made whole under a staged name (`make` writes the run's receipt there, then
// its aten traces are added) and renamed into place: never a half-written candidate.
// Returns store_aten_traces()'s account.
std::string stage_candidate(const std::string& candidate, const std::function<void(const std::string&)>& make) {
  const std::string staged = candidate + ".partial";
  try {
    make(staged);
    const std::string aten_trace = store_aten_traces(staged);
    fs::rename(staged, candidate);
    return aten_trace;
  } catch (...) {
    std::error_code ignored;
    fs::remove(staged, ignored);
    throw;
  }
}

void print_aten_trace(const std::string& aten_trace) {
  if (!aten_trace.empty()) fmt::print("{:<12}{}\n", "", aten_trace);
}

// refresh --receipt: each receipt, checked, copied beside its golden as the candidate and reviewed.
int refresh_from_receipts(const GoldenFlags& f) {
  const check::Budgets budgets = check::load_budgets(f.budgets);
  std::vector<std::pair<std::string, std::string>> chosen;  // receipt, lane: all checked before any is copied
  for (const std::string& path : f.receipts) {
    const std::string lane = lane_of_golden_receipt(path);
    if (std::ranges::any_of(chosen, [&](const auto& c) { return c.second == lane; })) {
      throw run::UsageError(fmt::format("--receipt: {} and {} are both of lane {}; give one receipt a lane",
                                        std::ranges::find_if(chosen, [&](const auto& c) { return c.second == lane; })->first,
                                        path, lane));
    }
    chosen.emplace_back(path, lane);
  }
  nightly::GoldenStore store(f.goldens);
  (void)store.candidates();  // a damaged candidates record stops refresh before anything is copied
  for (const auto& [path, lane] : chosen) fs::create_directories(fs::path(store.candidate_path(lane)).parent_path());
  for (const auto& [path, lane] : chosen) {
    const std::string candidate = store.candidate_path(lane);
    const std::string& source = path;  // clang 14 cannot capture a structured binding
    const std::string aten_trace =
        stage_candidate(candidate, [&](const std::string& staged) { run::copy_file_atomically(source, staged); });
    const nlohmann::json comparison = review(candidate, store.golden_path(lane), budgets);
    store.add_candidate({lane, lane, run::file_content_hash(candidate), f.reason, run::utc_timestamp(), comparison,
                         nightly::kSourceReceipt, aten_trace});
    fmt::print("candidate   {:<16} {:<12} {}  (from {})\n", lane, comparison["verdict"].get<std::string>(),
               comparison["summary"].get<std::string>(), path);
    print_aten_trace(aten_trace);
  }
  fmt::print("review      {}\nthen        harness golden approve --approved-by NAME   (or: harness golden reject)\n",
             store.review_path());
  return kExitPass;
}

int refresh_action(const GoldenFlags& f) {
  const run::OutputLock lock(f.goldens);  // one writer of the goldens at a time
  refuse_in_ci(f, "refresh");
  if (f.reason.empty()) throw run::UsageError("--reason: say why the goldens change (it goes to the provenance log)");
  if (!f.receipts.empty()) {
    if (!f.lanes.empty()) throw run::UsageError("--lanes and --receipt: give lanes to run, or receipts to take, not both");
    return refresh_from_receipts(f);
  }
  const nightly::Matrix matrix = nightly::load_matrix(f.matrix);
  const check::Budgets budgets = check::load_budgets(f.budgets);
  const auto lanes = nightly::select_lanes(matrix, f.lanes);
  nightly::GoldenStore store(f.goldens);
  for (const nightly::LaneSpec* spec : lanes) {
    const std::string candidate = store.candidate_path(spec->lane);
    fs::create_directories(fs::path(candidate).parent_path());
    const std::string aten_trace =
        stage_candidate(candidate, [&](const std::string& staged) { nightly::run_lane(matrix, *spec, staged); });
    const nlohmann::json comparison = review(candidate, store.golden_path(spec->lane), budgets);
    store.add_candidate({spec->id, spec->lane, run::file_content_hash(candidate), f.reason, run::utc_timestamp(), comparison,
                         nightly::kSourceLane, aten_trace});
    fmt::print("candidate   {:<16} {:<12} {}\n", spec->id, comparison["verdict"].get<std::string>(),
               comparison["summary"].get<std::string>());
    print_aten_trace(aten_trace);
  }
  fmt::print("review      {}\nthen        harness golden approve --approved-by NAME   (or: harness golden reject)\n",
             store.review_path());
  return kExitPass;
}

// The pending candidates --lanes names (ids or lane names); all of them when empty.
std::vector<nightly::Candidate> chosen_candidates(const nightly::GoldenStore& store, const std::string& lanes) {
  const std::vector<nightly::Candidate> pending = store.candidates();
  if (pending.empty()) throw run::UsageError(fmt::format("no candidates in {}; run `harness golden refresh` first", store.directory()));
  if (lanes.empty()) return pending;
  std::vector<nightly::Candidate> chosen;
  for (const std::string& item : nightly::split_list(lanes)) {
    const auto it = std::find_if(pending.begin(), pending.end(), [&](const auto& c) { return c.id == item || c.lane == item; });
    if (it == pending.end()) throw run::UsageError(fmt::format("--lanes: '{}' has no candidate; refresh it first", item));
    const bool listed = std::any_of(chosen.begin(), chosen.end(), [&](const auto& c) { return c.lane == it->lane; });
    if (!listed) chosen.push_back(*it);
  }
  return chosen;
}

int approve_action(const GoldenFlags& f) {
  const run::OutputLock lock(f.goldens);  // one writer of the goldens at a time
  refuse_in_ci(f, "approve");
  if (f.approver.empty()) throw run::UsageError("--approved-by: name who reviewed the candidates");
  nightly::GoldenStore store(f.goldens);
  const std::vector<nightly::Candidate> chosen = chosen_candidates(store, f.lanes);
  for (const nightly::Candidate& c : chosen) {  // all or none: check every one first
    store.verify(c);
    store.verify_clean_build(c, f.allow_dirty);
  }
  for (const nightly::Candidate& c : chosen) {
    store.promote(c, f.approver, f.allow_dirty);
    fmt::print("approved    {:<16} {} -> {}\n", c.id, c.lane, store.golden_path(c.lane));
  }
  fmt::print("logged      {}\n", store.log_path());
  return kExitPass;
}

int reject_action(const GoldenFlags& f) {
  const run::OutputLock lock(f.goldens);  // one writer of the goldens at a time
  nightly::GoldenStore store(f.goldens);
  for (const nightly::Candidate& c : chosen_candidates(store, f.lanes)) {
    store.drop_candidate(c.lane);
    fmt::print("rejected    {:<16} {}\n", c.id, c.lane);
  }
  return kExitPass;
}

}  // namespace

void add_golden_command(CLI::App& app, CommandRegistry& commands) {
  CLI::App* golden = app.add_subcommand("golden", "Goldens: status, refresh into candidates, approve or reject them");
  golden->require_subcommand(1);
  auto flags = std::make_shared<GoldenFlags>();
  auto common = [&flags](CLI::App* sub, bool with_matrix) {
    sub->add_option("--goldens", flags->goldens, "Goldens directory")->capture_default_str();
    if (with_matrix) sub->add_option("--matrix", flags->matrix, "Lane matrix (TOML)")->capture_default_str();
  };
  CLI::App* status = golden->add_subcommand("status", "Lanes with goldens, lanes missing one, orphaned and outdated goldens");
  common(status, true);
  status->add_flag("--json", flags->json, "Print the status as JSON");
  status->add_flag("--no-matrix", flags->no_matrix,
                   "List only the lanes whose goldens were approved from receipts (golden refresh --receipt)");
  commands.add(status, [flags] { return status_action(*flags); });

  CLI::App* refresh = golden->add_subcommand("refresh", "Run lanes into candidates beside the goldens, with a review report");
  common(refresh, true);
  refresh->add_option("--lanes", flags->lanes, "Lane ids or names, comma-separated (default: every lane)");
  refresh->add_option("--receipt", flags->receipts,
                      "Take this receipt made elsewhere (a Python canary's run, another host's) as its lane's candidate "
                      "instead of running lanes; repeatable");
  refresh->add_option("--reason", flags->reason, "Why the goldens change (recorded)")->required();
  refresh->add_option("--budgets", flags->budgets, "Budgets file for the review")->capture_default_str();
  refresh->add_flag("--allow-ci", flags->allow_ci, "Write even though CI is set");
  commands.add(refresh, [flags] { return refresh_action(*flags); });

  CLI::App* approve = golden->add_subcommand("approve", "Promote reviewed candidates to goldens and log the provenance");
  common(approve, false);
  approve->add_option("--lanes", flags->lanes, "Candidates to approve (default: all)");
  approve->add_option("--approved-by", flags->approver, "Who reviewed them (recorded)")->required();
  approve->add_flag("--allow-ci", flags->allow_ci, "Write even though CI is set");
  approve->add_flag("--allow-dirty", flags->allow_dirty,
                    "Approve candidates built from a tree with uncommitted changes (recorded in the log)");
  commands.add(approve, [flags] { return approve_action(*flags); });

  CLI::App* reject = golden->add_subcommand("reject", "Drop candidates");
  common(reject, false);
  reject->add_option("--lanes", flags->lanes, "Candidates to drop (default: all)");
  commands.add(reject, [flags] { return reject_action(*flags); });
}

}  // namespace harness::cli
