#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>
#include <set>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "canary_run.h"
#include "commands.h"
#include "json_text.h"
#include "output_lock.h"
#include "receipt/receipt_reader.h"

namespace harness::cli {
namespace {

struct InspectFlags {
  std::string path;
  bool json = false;
  bool allow_incomplete = false;
  bool follow = false;
  double interval_seconds = 0.5;
};

// max_digits10 for doubles: a value printed by --json reads back to the same bits.
std::string exact(double v) { return fmt::format("{:.17g}", v); }

nlohmann::json describe(const receipt::ReceiptReader& r) {
  const auto manifest = r.manifest_text();
  const std::vector<double> loss = r.f64(receipt::paths::kLoss);
  nlohmann::json j;
  j["schema_version"] = r.schema_version();
  j["path"] = r.path();
  j["lane"] = manifest.at("lane");
  j["engine"] = manifest.at("engine");
  j["features"] = manifest.at("features");
  j["steps_planned"] = r.steps_planned();
  j["steps_recorded"] = r.steps_recorded();
  j["complete"] = r.complete();
  j["first_loss"] = loss.empty() ? nlohmann::json(nullptr) : nlohmann::json(loss.front());
  j["last_loss"] = loss.empty() ? nlohmann::json(nullptr) : nlohmann::json(loss.back());
  j["manifest"] = manifest;
  nlohmann::json datasets = nlohmann::json::array();
  for (const auto& d : h5::list_datasets(r.file())) {
    datasets.push_back({{"path", d.path}, {"shape", d.shape}, {"dtype", d.dtype}});
  }
  j["datasets"] = datasets;
  return j;
}

void print_human(const nlohmann::json& j) {
  const auto& m = j["manifest"];
  fmt::print("receipt     {}\n", j["path"].get<std::string>());
  fmt::print("lane        {}  (engine {}, schema {})\n", j["lane"].get<std::string>(), j["engine"].get<std::string>(),
             j["schema_version"].get<int>());
  fmt::print("steps       {} of {} recorded, {}\n", j["steps_recorded"].get<int>(), j["steps_planned"].get<int>(),
             j["complete"].get<bool>() ? "complete" : "INCOMPLETE");
  if (!j["first_loss"].is_null()) {
    fmt::print("loss        {} (first) -> {} (last)\n", exact(j["first_loss"]), exact(j["last_loss"]));
  }
  const std::vector<std::string> stack_keys{"seed", "threads", "created_utc", "git_commit", "toolchain", "libraries",
                                            "kernels", "host", "cpu", "fault_injection"};
  for (const auto& key : stack_keys) {
    if (m.contains(key)) fmt::print("{:<11} {}\n", key, m[key].get<std::string>());
  }
  // Engine settings (noise mode and seed, FP8 recipe, ...): whatever else the manifest holds,
  // but the fields above and the canary's JSON.
  const std::set<std::string> shown{"schema_version", "lane", "engine", "features", "canary", "steps_planned",
                                    "complete", "data_seed"};
  for (const auto& [key, value] : m.items()) {
    const bool stack_key = std::find(stack_keys.begin(), stack_keys.end(), key) != stack_keys.end();
    if (!stack_key && !shown.count(key)) fmt::print("{:<11} {}\n", key, value.get<std::string>());
  }
  fmt::print("datasets\n");
  for (const auto& d : j["datasets"]) {
    fmt::print("  {:<40} {:<8} ({})\n", d["path"].get<std::string>(), d["dtype"].get<std::string>(),
               fmt::join(d["shape"].get<std::vector<unsigned long long>>(), ", "));
  }
}

int inspect_action(const InspectFlags& f) {
  const receipt::ReceiptReader reader(f.path);
  if (!reader.complete() && !f.allow_incomplete) {
    throw receipt::ReceiptError(fmt::format(
        "{}: incomplete receipt (complete=0, {} of {} steps recorded): the run was interrupted; rerun it, or pass "
        "--allow-incomplete to inspect what it recorded",
        f.path, reader.steps_recorded(), reader.steps_planned()));
  }
  const nlohmann::json j = describe(reader);
  if (f.json) {
    fmt::print("{}\n", run::json_text(j));
  } else {
    print_human(j);
  }
  return kExitPass;
}

// What a reader of a live receipt sees: nullopt while the file is not readable yet (it
// is created, or its first step is under way: the writer enters SWMR mode after it), with
// the reason in `why`.
std::optional<receipt::ReceiptReader> try_open(const std::string& path, std::string& why) {
  try {
    return std::optional<receipt::ReceiptReader>(std::in_place, path);
  } catch (const receipt::ReceiptError& e) {
    why = e.what();
  } catch (const h5::Hdf5Error& e) {
    why = e.what();
  }
  return std::nullopt;
}

// `inspect --follow`: a running job's steps as its writer flushes them, read through HDF5's
// single-writer/multiple-reader mode; ends when the run completes, or stops without
// completing (its writer's lock is gone: interrupted or killed).
int follow_action(const InspectFlags& f) {
  if (!(f.interval_seconds >= 0.01 && f.interval_seconds <= 60)) {  // CLI::Range lets NaN through
    throw run::UsageError(fmt::format("--interval: {} is not a number of seconds in 0.01..60", f.interval_seconds));
  }
  int shown = 0;
  for (int waited = 0;; ++waited) {
    const bool writing = run::OutputLock::held(f.path);
    std::string why;
    if (auto reader = try_open(f.path, why)) {
      namespace paths = receipt::paths;
      const std::vector<double> loss = reader->f64(paths::kLoss), grad_norm = reader->f64(paths::kGradNorm),
                                lr = reader->f64(paths::kLr);
      const int recorded = static_cast<int>(std::min({loss.size(), grad_norm.size(), lr.size()}));
      if (shown == 0 && recorded > 0) fmt::print("following   {} ({})\n", f.path, reader->manifest_string("lane"));
      for (; shown < recorded; ++shown) {
        fmt::print("step {:>5}   loss {}   grad_norm {}   lr {}\n", shown, exact(loss[shown]), exact(grad_norm[shown]),
                   exact(lr[shown]));
      }
      std::fflush(stdout);
      if (reader->complete()) {
        fmt::print("complete    {} steps\n", recorded);
        return kExitPass;
      }
      if (!writing) {
        fmt::print(stderr, "harness: {}: the run stopped after {} of {} steps (complete = 0; no writer holds it)\n",
                   f.path, recorded, reader->steps_planned());
        return kExitCheckFailed;
      }
    } else if (!writing && std::filesystem::exists(f.path)) {
      // A run takes its output's lock before it creates the file: a file that no run
      // writes will not become readable by waiting.
      throw receipt::ReceiptError(fmt::format("{} (and no run writes it)", why));
    } else if (!writing && waited * f.interval_seconds > 30) {
      throw receipt::ReceiptError(fmt::format("{}: no run writes it and it cannot be read after 30 s", f.path));
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(f.interval_seconds));
  }
}

}  // namespace

void add_inspect_command(CLI::App& app, CommandRegistry& commands) {
  auto flags = std::make_shared<InspectFlags>();
  CLI::App* inspect = app.add_subcommand("inspect", "Summarise a receipt: lane, steps, losses, stack line, datasets");
  inspect->add_option("receipt", flags->path, "Receipt (.h5)")->required();
  inspect->add_flag("--json", flags->json, "Machine-readable output (keys in docs/cli.md)");
  inspect->add_flag("--allow-incomplete", flags->allow_incomplete, "Inspect a receipt of an interrupted run");
  inspect->add_flag("--follow", flags->follow,
                    "Show a running job's steps as they are written, until it completes (exit 0) or stops (exit 1)");
  inspect->add_option("--interval", flags->interval_seconds, "--follow: seconds between reads")
      ->check(CLI::Range(0.01, 60.0))
      ->capture_default_str();
  commands.add(inspect, [flags] { return flags->follow ? follow_action(*flags) : inspect_action(*flags); });
}

}  // namespace harness::cli
