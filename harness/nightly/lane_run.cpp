#include "lane_run.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "canary_pack.h"
#include "child_process.h"
#include "python_canary.h"
#include "registry.h"
#include "receipt/budget_features.h"
#include "receipt/hdf5_file.h"
#include "verdict.h"

namespace harness::nightly {
namespace {

namespace fs = std::filesystem;

// Whether the receipt at `path` (validated already) holds the group or dataset `group`.
bool receipt_holds(const std::string& path, const std::string& group) {
  const h5::Handle file = h5::open_file(path, false);
  return h5::exists(file, group);
}

run::RunSummary run_external(const Matrix& matrix, const LaneSpec& spec, const std::string& out, const std::string& partial,
                             const std::string& pack, int threads) {
  std::vector<std::string> argv = expand_command(spec, pack, partial, matrix.steps, matrix.seed);
  if (!spec.threads_flag.empty() && threads > 0) {  // where its stack takes the job's count (lane_stacks.cpp)
    argv.push_back(spec.threads_flag);
    argv.push_back(std::to_string(threads));
  }
  const auto start = std::chrono::steady_clock::now();
  run::ChildResult child;
  try {
    child = run::run_child(argv, spec.environment, run::ChildOutput::kDiscard, run::ChildOutput::kCapture);
  } catch (const run::ChildProcessError& e) {
    throw LaneCommandError(e.what());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string where = fmt::format("lane {}: `{}`", spec.id, command_line(argv));
  if (!child.exited_zero()) {
    const std::string line = run::last_line(child.stderr_tail);
    throw LaneCommandError(fmt::format("{} {}: {}", where, child.how(), line.empty() ? "(nothing on stderr)" : line));
  }
  if (!fs::exists(partial)) throw LaneCommandError(fmt::format("{} exited 0 but wrote no receipt at {{out}}", where));
  const check::ReceiptData receipt = check::load_receipt(partial);  // validates
  if (!receipt.complete) throw LaneCommandError(fmt::format("{} wrote an incomplete receipt (complete = 0)", where));
  if (receipt.steps() != matrix.steps) {
    throw LaneCommandError(fmt::format("{} wrote {} steps; the matrix runs {}", where, receipt.steps(), matrix.steps));
  }
  if (receipt.lane != spec.lane) {
    throw LaneCommandError(fmt::format("{} wrote lane {}; the matrix names it {}", where, receipt.lane, spec.lane));
  }
  const receipt::BudgetFeatures wanted(spec.budget_features);
  if (check::budget_features(receipt) != wanted.as_set()) {
    throw LaneCommandError(fmt::format("{} wrote a receipt that declares budget features '{}'; the matrix declares '{}'",
                                       where, receipt.manifest.at("budget_features"), wanted.to_string()));
  }
  for (const std::string& group : spec.records) {
    if (!receipt_holds(partial, group)) {
      throw LaneCommandError(fmt::format("{} wrote a receipt without {}, which its lane stack records "
                                         "(harness/nightly/lane_stacks.cpp, docs/lane-stacks.md)",
                                         where, group));
    }
  }
  run::RunSummary summary;
  summary.lane = receipt.lane;
  summary.steps = receipt.steps();
  summary.first_loss = receipt.loss.front();
  summary.last_loss = receipt.loss.back();
  summary.seconds = seconds;
  if (const auto it = receipt.manifest.find("threads"); it != receipt.manifest.end()) {
    summary.threads = std::atoi(it->second.c_str());
  }
  (void)out;
  return summary;
}

}  // namespace

std::string export_matrix_pack(const Matrix& matrix, const std::string& path) {
  run::PackOptions o;
  o.canary = matrix.canary;
  o.steps = matrix.steps;
  o.seed = matrix.seed;
  o.out = path;
  o.force = true;
  run::export_pack(o);
  return path;
}

run::RunSummary run_lane(const Matrix& matrix, const LaneSpec& spec, const std::string& out,
                         const std::function<void(const run::StepProgress&)>& on_step, int threads,
                         const std::string& pack) {
  const std::string partial = out + ".partial";
  std::string own_pack;
  try {
    if (spec.external()) {
      std::error_code ignored;
      fs::remove(partial, ignored);  // the command may refuse to overwrite
      std::string use = pack;
      if (use.empty() && spec.uses_pack()) {  // in a temporary directory (never beside a golden), named as a job's pack
        std::string pattern = (fs::temp_directory_path() / "harness-lane-pack-XXXXXX").string();
        if (!mkdtemp(pattern.data())) {
          throw LaneCommandError(fmt::format("cannot create a temporary directory for the canary pack: {}", std::strerror(errno)));
        }
        own_pack = pattern;
        use = export_matrix_pack(matrix, (fs::path(own_pack) / "canary-pack.h5").string());
      }
      run::RunSummary summary = run_external(matrix, spec, out, partial, use, threads);
      if (!own_pack.empty()) fs::remove_all(own_pack, ignored);
      std::filesystem::rename(partial, out);
      summary.receipt_path = out;
      if (on_step) on_step(run::StepProgress{summary.steps - 1, summary.steps, summary.last_loss, summary.seconds});
      return summary;
    }
    run::RunOptions options = matrix.run_options(spec, partial);
    options.force = true;
    options.threads = threads;
    run::RunSummary summary = run::run_canary(options, on_step);
    std::filesystem::rename(partial, out);
    summary.receipt_path = out;
    return summary;
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    if (!own_pack.empty()) std::filesystem::remove_all(own_pack, ignored);
    throw;
  }
}

run::RunOptions recipe_options(const check::ReceiptData& receipt, std::string_view flag) {
  const auto recipe_text = receipt.manifest.find("run_options");
  const nlohmann::json recipe = recipe_text == receipt.manifest.end()
                                    ? nlohmann::json(nullptr)
                                    : nlohmann::json::parse(recipe_text->second, nullptr, /*allow_exceptions=*/false);
  const std::vector<std::string> ours = engine_names();  // another stack's run_options are its own
  if (!recipe.is_object() || std::find(ours.begin(), ours.end(), receipt.engine) == ours.end()) {
    throw run::UsageError(fmt::format("{}: {} has no recipe the harness can run again (a harness engine's or a "
                                      "Python canary's run_options); use the lane that wrote it",
                                      flag, receipt.path));
  }
  return run::options_from_recipe(recipe);
}

std::optional<Unreproduced> first_unreproduced(const check::ReceiptData& recorded, const check::ReceiptData& again) {
  std::optional<Unreproduced> first;
  const auto earlier = [&](int step, const std::string& what) {
    if (!first || step < first->step) first = Unreproduced{step, what};
  };
  for (const check::Deviation& d : check::metric_deviations(again, recorded)) {
    if (d.deviation != 0) earlier(d.step, d.metric);
  }
  const std::size_t tensors = std::max<std::size_t>(recorded.tensors.size(), 1);
  for (const auto& [family, hashes] : recorded.hashes) {
    const auto other = again.hashes.find(family);
    if (other == again.hashes.end() || other->second.size() != hashes.size()) {
      earlier(0, family + " hash");
      continue;
    }
    const auto differs = std::mismatch(hashes.begin(), hashes.end(), other->second.begin()).first;
    if (differs != hashes.end()) earlier(static_cast<int>((differs - hashes.begin()) / tensors), family + " hash");
  }
  return first;
}

void require_reproduced(const check::ReceiptData& recorded, const check::ReceiptData& again, std::string_view prefix,
                        std::string_view advice) {
  const std::optional<Unreproduced> differs = first_unreproduced(recorded, again);
  if (!differs) return;
  throw run::UsageError(fmt::format("{}: its recipe no longer reproduces {} ({} differs at step {}): the code, the "
                                    "host or the stack changed since the run; {}",
                                    prefix, recorded.path, differs->what, differs->step, advice));
}

void rerun_recipe(const check::ReceiptData& receipt, const std::string& out, std::string_view flag,
                  const std::function<void(run::RunOptions&)>& adjust, const std::vector<std::string>& python_flags) {
  if (run::is_python_canary(receipt.manifest)) {
    std::vector<std::string> flags{"--out", out, "--force"};
    flags.insert(flags.end(), python_flags.begin(), python_flags.end());
    const run::PythonCommand command = run::python_canary_command("rerun", receipt.path, receipt.manifest, flags);
    const run::ChildResult child =
        run::run_child(command.argv, command.environment, run::ChildOutput::kDiscard, run::ChildOutput::kCapture);
    if (!child.exited_zero()) {
      const std::string line = run::last_line(child.stderr_tail);
      throw LaneCommandError(fmt::format("{}: the rerun of {} {}: {}", flag, receipt.path, child.how(),
                                         line.empty() ? "(nothing on stderr)" : line));
    }
    return;
  }
  run::RunOptions options = recipe_options(receipt, flag);
  options.out = out;
  options.force = true;
  options.trace = run::TraceLevel::kNone;  // metrics and hashes only
  options.checkpoint_every = 0;
  if (adjust) adjust(options);
  run::run_canary(options);
}

}  // namespace harness::nightly
