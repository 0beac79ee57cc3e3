// `harness nightly`: run the lane matrix, check every lane against its golden and the
// reference lane, write the reports (`--jobs N`: as N shards at once, merged). `harness
// merge`: the reports of several shards as one.
// Exit 0 every check passed, 1 a regression, 2 an infrastructure error (docs/nightly.md).
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "canary_run.h"
#include "child_process.h"
#include "commands.h"
#include "json_text.h"
#include "output_lock.h"
#include "shard_environment.h"
#include "defaults.h"
#include "controls.h"
#include "headroom.h"
#include "interrupt.h"
#include "nightly.h"
#include "reports.h"
#include "stack_info.h"
#include "thread_flag.h"

namespace harness::cli {
namespace {

namespace fs = std::filesystem;

struct NightlyFlags {
  nightly::NightlyOptions options{default_matrix(), default_budgets(), default_goldens(), "", {}, "", 0};
  std::string shard;
  int jobs = 1;  // --jobs: shards run at once by this process
  std::vector<std::string> merge_dirs;
  std::string history;  // --history: the directory of previous nightlies' --out directories
};

// reports/2026-11-21T09-30-00Z: sortable, and no ':' (artifact stores refuse it).
std::string default_out_dir() {
  std::string stamp = run::utc_timestamp();
  std::replace(stamp.begin(), stamp.end(), ':', '-');
  return (fs::path("reports") / stamp).string();
}

// The output directory must be new or empty: reports of two jobs never mix.
void prepare_out_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec))) {
    throw run::UsageError(fmt::format("--out: '{}' exists and is not an empty directory; choose a new one", dir));
  }
  fs::create_directories(dir, ec);
  if (ec || access(dir.c_str(), W_OK) != 0) {
    throw run::UsageError(fmt::format("--out: cannot create or write '{}'; choose a writable place", dir));
  }
}

// A terminal gets one live line (lane, step, ETA); a log gets one line per finished lane.
class ProgressPrinter {
 public:
  void operator()(const nightly::NightlyProgress& p) {
    if (!p.finished_line.empty()) {
      ++finished_;
      fmt::print(stderr, "{}[{}/{}] {}\n", tty_ ? "\r\033[K" : "", finished_, p.lane_count, p.finished_line);
      return;
    }
    if (tty_) {
      // p.step counts finished steps; the step that just finished is p.step - 1 (steps start at 0).
      fmt::print(stderr, "\r\033[K[{}/{}] {:<16} step {:>4} ({} of {} done)  elapsed {:.0f} s  eta {:.0f} s", p.lane_index,
                 p.lane_count, p.lane_id, p.step - 1, p.step, p.steps, p.elapsed_seconds, p.eta_seconds);
    }
  }

 private:
  bool tty_ = isatty(STDERR_FILENO) != 0;
  int finished_ = 0;
};

// "fragile     tp (9% headroom: reference loss at step 7), ...": the lanes that passed
// with under kFragileHeadroomPct of their budget left, in one line ("" when none did).
std::string fragile_line(const nlohmann::json& summary) {
  std::vector<std::string> lanes;
  for (const auto& lane : summary["lanes"]) {
    if (!lane.value("fragile", false)) continue;
    const nlohmann::json& h = lane["headroom"];
    lanes.push_back(fmt::format("{} ({:.0f}% headroom: {} {} at step {})", lane["id"].get<std::string>(),
                                h["headroom_pct"].get<double>(), h["check"].get<std::string>(),
                                h["metric"].get<std::string>(), h["step"].dump()));
  }
  if (lanes.empty()) return "";
  return fmt::format("fragile     {}: passed with under {:.0f}% of the budget left", fmt::join(lanes, ", "),
                     nightly::kFragileHeadroomPct);
}

int finish(const nlohmann::json& summary, const std::string& out_dir) {
  const std::vector<std::string> written = nightly::write_reports(summary, out_dir);
  fmt::print("nightly     {} ({} lanes)\n", summary["verdict"].get<std::string>(), summary["lanes"].size());
  for (const auto& lane : summary["lanes"]) {
    fmt::print("  {:<6} {:<16} {}\n", lane["status"].get<std::string>(), lane["id"].get<std::string>(),
               lane["lane"].get<std::string>());
    for (const auto& check : lane["checks"]) {  // a finding that passes the lane (a bias check's default)
      if (check["status"] != "warn") continue;
      fmt::print("  {:<6} {:<16} {} check: {}\n", "warn", lane["id"].get<std::string>(), check["check"].get<std::string>(),
                 check["summary"].get<std::string>());
    }
  }
  if (const std::string fragile = fragile_line(summary); !fragile.empty()) fmt::print("{}\n", fragile);
  if (const nlohmann::json estimate = summary.value("false_alarm", nlohmann::json(nullptr)); estimate.is_object()) {
    fmt::print("  {}\n", estimate["summary"].get<std::string>());
  }
  for (const auto& control : summary.value("controls", nlohmann::json::array())) {
    fmt::print("  control {:<7} {:<6} {}\n", control["status"].get<std::string>(),
               control["control"].get<std::string>(), control["summary"].get<std::string>());
  }
  if (const nlohmann::json drift = summary.value("environment_drift", nlohmann::json(nullptr)); drift.is_object()) {
    fmt::print("  {}\n", drift["summary"].get<std::string>());
  }
  for (const std::string& path : written) fmt::print("report      {}\n", path);
  for (const auto& control : summary.value("controls", nlohmann::json::array())) {
    if (!nightly::control_fails_the_job(control)) continue;
    fmt::print(stderr, "harness: negative control {} {}: {}; the lanes' verdicts cannot be vouched for\n",
               control["control"].get<std::string>(), control["status"] == "blind" ? "is blind" : "could not run",
               control["summary"].get<std::string>());
  }
  if (const nlohmann::json cut = summary.value("interrupted", nlohmann::json(nullptr)); !cut.is_null()) {
    if (cut["lane"].is_string()) {
      fmt::print(stderr, "harness: interrupted in lane {} (signal {}): its receipt holds the steps it finished; reports in {}\n",
                 cut["lane"].get<std::string>(), cut["signal"].get<int>(), out_dir);
    } else {
      const std::string after = cut["after_lane"].is_string() ? "after lane " + cut["after_lane"].get<std::string>() : "before the first lane";
      fmt::print(stderr, "harness: interrupted between lanes, {} (signal {}): no lane was cut, the rest did not start; reports in {}\n",
                 after, cut["signal"].get<int>(), out_dir);
    }
  }
  return nightly::summary_exit_code(summary);
}

nlohmann::json read_summary(const std::string& dir) {
  const std::string path = (fs::path(dir) / "summary.json").string();
  std::ifstream in(path);
  if (!in) throw run::UsageError(fmt::format("merge: {} is missing; give the --out directories of the shards", path));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw run::UsageError(fmt::format("merge: {} is not JSON ({})", path, run::json_error_text(e)));
  }
}

// Shard i of `o` in a child process (`harness nightly --shard i/N` with the job's flags),
// its console kept in DIR/console.log. Returns "" or why it left no summary.
std::string run_shard_child(const nightly::NightlyOptions& o, int index, int count, const std::string& dir) {
  std::vector<std::string> argv = {fs::read_symlink("/proc/self/exe").string(), "nightly",
                                   "--shard", fmt::format("{}/{}", index, count), "--out", dir,
                                   "--matrix", o.matrix_path, "--budgets", o.budgets_path, "--goldens", o.goldens_dir,
                                   "--threads", std::to_string(o.threads)};
  if (!o.lanes.empty()) argv.insert(argv.end(), {"--lanes", o.lanes});
  run::ChildResult r;
  try {
    r = run::run_child(argv, {}, run::ChildOutput::kCapture, run::ChildOutput::kCapture);
  } catch (const run::ChildProcessError& e) {
    return e.what();
  }
  std::ofstream(fs::path(dir) / "console.log") << r.stderr_tail << r.stdout_text;
  if (fs::exists(fs::path(dir) / "summary.json")) return "";
  return fmt::format("{} and wrote no summary: {}", r.how(), run::last_line(r.stderr_tail));
}

// --jobs N: the job as N shards at once, each a child process (the engines' kernels and the
// HDF5 library are per process, not shared by threads), its reports in OUT/shards/i, merged
// into OUT as `harness merge` merges them. A shard that leaves no summary is an
// infrastructure error (exit 2). Signals reach the shards (one process group): each cuts its
// lane and reports it, and the merge says so.
nlohmann::json run_shards_at_once(const nightly::NightlyOptions& o, int jobs) {
  const run::InterruptGuard interrupts;  // this process waits for its shards' reports
  const auto count = static_cast<std::size_t>(jobs);
  std::vector<std::string> dirs(count), errors(count);
  std::vector<std::thread> shards;
  std::mutex console;
  for (std::size_t i = 0; i < count; ++i) {
    dirs[i] = (fs::path(o.out_dir) / "shards" / std::to_string(i)).string();
    shards.emplace_back([&, i] {
      const auto start = std::chrono::steady_clock::now();
      errors[i] = run_shard_child(o, static_cast<int>(i), jobs, dirs[i]);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const std::lock_guard<std::mutex> lock(console);
      fmt::print(stderr, "shard {}/{} done in {:.0f} s ({}/console.log)\n", i, jobs, seconds, dirs[i]);
    });
  }
  for (std::thread& t : shards) t.join();
  std::vector<nlohmann::json> summaries;
  for (std::size_t i = 0; i < count; ++i) {
    if (!errors[i].empty()) {
      throw std::runtime_error(
          fmt::format("--jobs: shard {}/{} {} (its console: {}/console.log)", i, jobs, errors[i], dirs[i]));
    }
    summaries.push_back(read_summary(dirs[i]));
  }
  return nightly::merge_summaries(summaries, dirs, o.out_dir);
}

int nightly_action(NightlyFlags& f) {
  nightly::NightlyOptions o = f.options;
  if (f.jobs > 1 && !f.shard.empty()) {
    throw run::UsageError("--jobs: runs the job's shards itself; give either --jobs or --shard");
  }
  if (f.shard == "auto") {
    o.shard = nightly::shard_from_environment(nightly::process_environment());
    fmt::print(stderr, "shard       {}/{} (from the scheduler's environment)\n", o.shard.index, o.shard.count);
  } else if (!f.shard.empty()) {
    o.shard = nightly::parse_shard(f.shard);
  }
  if (o.out_dir.empty()) o.out_dir = default_out_dir();
  nightly::NightlyJob job(o);  // a bad matrix or budgets file exits 2 before any directory is made
  // So does a bad --history: it is read before any lane runs.
  const std::vector<nightly::PastNightly> past =
      f.history.empty() ? std::vector<nightly::PastNightly>{} : nightly::read_history(f.history, o.out_dir);
  // One job per output directory: a second nightly of the same --out is refused, naming
  // the first, before it can touch the directory.
  fs::create_directories(fs::path(o.out_dir).parent_path().empty() ? fs::path(".") : fs::path(o.out_dir).parent_path());
  const run::OutputLock lock(o.out_dir);
  prepare_out_dir(o.out_dir);
  nlohmann::json summary;
  if (f.jobs > 1) {
    summary = run_shards_at_once(o, f.jobs);
  } else {
    ProgressPrinter printer;
    summary = job.run(std::ref(printer));
  }
  if (!f.history.empty()) summary["history"] = nightly::headroom_history(past, summary);
  return finish(summary, o.out_dir);
}

int merge_action(NightlyFlags& f) {
  std::vector<nlohmann::json> shards;
  for (const std::string& dir : f.merge_dirs) shards.push_back(read_summary(dir));
  const std::string out = f.options.out_dir.empty() ? default_out_dir() + "-merged" : f.options.out_dir;
  const nlohmann::json merged = nightly::merge_summaries(shards, f.merge_dirs, out);
  prepare_out_dir(out);
  return finish(merged, out);
}

}  // namespace

void add_nightly_command(CLI::App& app, CommandRegistry& commands) {
  auto flags = std::make_shared<NightlyFlags>();
  CLI::App* nightly = app.add_subcommand("nightly", "Run the lane matrix, check every lane, write HTML/JUnit/Markdown/JSON reports");
  nightly->add_option("--out", flags->options.out_dir, "Report directory, new or empty (default reports/<UTC timestamp>)");
  nightly->add_option("--matrix", flags->options.matrix_path, "Lane matrix (TOML)")->capture_default_str();
  nightly->add_option("--budgets", flags->options.budgets_path, "Budgets file (TOML)")->capture_default_str();
  nightly->add_option("--goldens", flags->options.goldens_dir, "Goldens directory")->capture_default_str();
  nightly->add_option("--shard", flags->shard,
                      "Run shard i of N (i/N, 0 <= i < N): lanes k with k mod N == i; `auto`: i and N from the "
                      "scheduler (HARNESS_SHARD_INDEX/COUNT, a Slurm job array, a Kubernetes Indexed Job)");
  nightly->add_option("--lanes", flags->options.lanes,
                      "Run only these lanes (comma-separated ids or names; the reference runs too when a lane needs it)");
  nightly->add_option("--history", flags->history,
                      "Directory of previous nightlies' --out directories: the report draws each lane's least "
                      "headroom over them and this one");
  nightly->add_option("--jobs", flags->jobs,
                      "Run the job as N shards at once, each a process of its own, merged into one report (the "
                      "shards' own reports in OUT/shards/i); each run still takes --threads")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  add_threads_flag(*nightly, flags->options.threads, "Worker threads per run (0 = all cores)");
  commands.add(nightly, [flags] { return nightly_action(*flags); });

  auto merge_flags = std::make_shared<NightlyFlags>();
  CLI::App* merge = app.add_subcommand("merge", "Merge the report directories of nightly shards into one report");
  merge->add_option("dirs", merge_flags->merge_dirs, "The shards' --out directories")->required();
  merge->add_option("--out", merge_flags->options.out_dir, "Merged report directory, new or empty");
  commands.add(merge, [merge_flags] { return merge_action(*merge_flags); });
}

}  // namespace harness::cli
