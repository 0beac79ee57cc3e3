#include <algorithm>
#include <memory>
#include <set>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "receipt/receipt_reader.h"

namespace harness::cli {
namespace {

struct InspectFlags {
  std::string path;
  bool json = false;
  bool allow_incomplete = false;
};

// max_digits10 for doubles: a value printed by --json reads back to the same bits.
std::string exact(double v) { return fmt::format("{:.17g}", v); }

nlohmann::json describe(const receipt::ReceiptReader& r) {
  const auto manifest = r.manifest_text();
  const std::vector<double> loss = r.steps_f64("loss");
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
    fmt::print("{}\n", j.dump(2));
  } else {
    print_human(j);
  }
  return kExitPass;
}

}  // namespace

void add_inspect_command(CLI::App& app, CommandRegistry& commands) {
  auto flags = std::make_shared<InspectFlags>();
  CLI::App* inspect = app.add_subcommand("inspect", "Summarise a receipt: lane, steps, losses, stack line, datasets");
  inspect->add_option("receipt", flags->path, "Receipt (.h5)")->required();
  inspect->add_flag("--json", flags->json, "Machine-readable output (keys in docs/cli.md)");
  inspect->add_flag("--allow-incomplete", flags->allow_incomplete, "Inspect a receipt of an interrupted run");
  commands.add(inspect, [flags] { return inspect_action(*flags); });
}

}  // namespace harness::cli
