#include "power.h"

#include <algorithm>
#include <filesystem>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "canary.h"
#include "canary_run.h"
#include "fault.h"
#include "file_io.h"
#include "golden_store.h"
#include "lane_run.h"
#include "matrix.h"
#include "verdict.h"
#include "verdict_report.h"

namespace harness::nightly {
namespace {

using canary::FaultKind;
using canary::FaultSpec;

// Each kind's sizes, smallest first: a decade apart (ulps: a factor 16), from below what any
// budget should notice to what every one must.
struct Ladder {
  FaultKind kind;
  std::vector<double> sizes;
};
const std::vector<Ladder>& ladders() {
  static const std::vector<Ladder> all = {
      {FaultKind::kWeightScale, {1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2}},
      {FaultKind::kWeightUlps, {1, 16, 256, 4096, 65536, 1048576}},
      {FaultKind::kLrScale, {1e-5, 1e-4, 1e-3, 1e-2}},
      {FaultKind::kEpsScale, {10, 100, 1000}},
  };
  return all;
}

// The regression of `kind` and `size` that a ladder's rung injects.
FaultSpec regression(FaultKind kind, double size, int step, const std::string& tensor) {
  FaultSpec f;
  f.kind = kind;
  if (kind == FaultKind::kWeightScale || kind == FaultKind::kLrScale) f.step = step;
  if (kind == FaultKind::kWeightScale || kind == FaultKind::kWeightUlps) f.tensor = tensor;
  if (kind == FaultKind::kWeightUlps) f.ulps = static_cast<std::int32_t>(size);
  if (kind != FaultKind::kWeightUlps) f.by = size;
  return f;
}

std::string ladder_what(FaultKind kind, int step, const std::string& tensor) {
  switch (kind) {
    case FaultKind::kWeightScale: return fmt::format("{} times 1 + E from step {}", tensor, step);
    case FaultKind::kWeightUlps: return fmt::format("{}'s first initial value N ulps up", tensor);
    case FaultKind::kLrScale: return fmt::format("the learning rate times 1 + E from step {}", step);
    case FaultKind::kEpsScale: return "AdamW's eps times F";
    case FaultKind::kNudge: break;
  }
  return "";
}

// The parameter the weight faults move: the one named (one of `parameters`), or the
// canary's first linear layer's weight (`first_linear`, "" when it has none).
std::string weight_to_move(const std::vector<std::string>& parameters, const std::string& first_linear,
                           const std::string& canary, const std::string& wanted) {
  if (!wanted.empty()) {
    if (std::find(parameters.begin(), parameters.end(), wanted) == parameters.end()) {
      throw run::UsageError(fmt::format("--tensor: {} is not a parameter of {} (e.g. {}, {})", wanted, canary,
                                        parameters.front(), parameters.back()));
    }
    return wanted;
  }
  if (first_linear.empty()) {
    throw run::UsageError(fmt::format("--tensor: {} has no linear layer's weight; name the parameter to move", canary));
  }
  return first_linear;
}

// The matrix canary's weight to move: a built-in or canary file's from its tensors' roles (the
// layer a scaled output comes from), a Python canary's from what `describe` found.
std::string weight_to_move(const Matrix& matrix, const std::string& wanted) {
  if (matrix.python_canary) {
    const std::vector<std::string>& linear = matrix.python_linear_weights;
    return weight_to_move(matrix.python_parameters, linear.empty() ? "" : linear.front(), matrix.canary_name, wanted);
  }
  const std::unique_ptr<canary::Canary> model = canary::make_canary(run::load_run_canary(matrix.canary));
  std::string first_linear;
  for (TensorId p : model->parameters()) {
    const TensorDesc& d = model->tensors()[p];
    if (d.role.linear != LinearRole::None && d.rank() >= 2) {
      first_linear = d.name;
      break;
    }
  }
  return weight_to_move(model->parameter_names(), first_linear, matrix.canary_name, wanted);
}

// The noise seed of a seeded lane whose matrix pins none (calibrate's default seed base).
inline constexpr const char* kUnpinnedNoiseSeed = "1000";

// The lane's runs, here, without trace or checkpoints: clean or with `fault`. A seeded lane
// replays one noise seed, so that the fault is all that differs from its clean run.
class LaneRunner {
 public:
  LaneRunner(const Matrix& matrix, const LaneSpec& spec, int threads) : matrix_(matrix), spec_(spec), threads_(threads) {
    if (const std::string flag = spec.reduction_seed_flag(); !flag.empty() && !spec_.settings.options.count(flag)) {
      spec_.settings.options[flag] = kUnpinnedNoiseSeed;
    }
  }

  check::ReceiptData run(const LaneSpec& spec, const std::string& name, const std::optional<FaultSpec>& fault) const {
    if (spec.external()) {  // its command with its stack's fault flag and TEXT (python/canary_harness/runs/regressions.py)
      LaneSpec faulted = spec;
      if (fault) faulted.command.insert(faulted.command.end(), {spec.fault_flag, fault->to_string()});
      nightly::run_lane(matrix_, faulted, work_.file(name), {}, threads_);
      return check::load_receipt(work_.file(name));
    }
    run::RunOptions options = matrix_.run_options(spec, work_.file(name));
    options.force = true;
    options.threads = threads_;
    options.trace = run::TraceLevel::kNone;
    if (fault) options.inject_fault = fault->to_string();
    run::run_canary(options);
    return check::load_receipt(work_.file(name));
  }
  check::ReceiptData run_lane(const std::string& name, const std::optional<FaultSpec>& fault) const {
    return run(spec_, name, fault);
  }

 private:
  const Matrix& matrix_;
  LaneSpec spec_;
  int threads_;
  run::TempDir work_{"power", "the power ladder's runs"};
};

// What the lane's runs are checked against, and how.
struct Against {
  check::ReceiptData receipt;
  std::string what;            // "the reference lane tiny/cpu-ref", "its golden PATH", "its own clean run"
  std::string kind;            // compare_receipts's: "compare" (lane against lane) or "golden"
  bool own_clean_run = false;  // the reference lane against itself: bitwise, no clean check
  check::Budgets budgets;
};

// The lane's golden in `goldens` (verified against the store's log): what a nightly's golden
// check compares the lane with, under the entry its platform difference names.
check::ReceiptData golden_of(const LaneSpec& spec, const std::string& goldens) {
  const GoldenStore store(goldens);
  const std::string path = store.golden_path(spec.lane);
  if (!std::filesystem::exists(path)) {
    throw run::UsageError(fmt::format("--against-golden: {} has no golden ({}); refresh and approve one first "
                                      "(docs/goldens.md)", spec.lane, path));
  }
  verify_golden_integrity(path, store);
  return check::load_receipt(path);
}

Against against_of(const PowerOptions& o, const Matrix& matrix, const LaneSpec& spec, const LaneRunner& runner,
                   const std::function<void(const std::string&)>& progress) {
  Against a;
  a.budgets = check::load_budgets(o.budgets_path);
  if (o.against_golden) {
    a.receipt = golden_of(spec, o.goldens_path);
    a.what = fmt::format("its golden {}", a.receipt.path);
    a.kind = "golden";
    return a;
  }
  a.kind = "compare";
  a.own_clean_run = spec.id == matrix.reference;
  if (progress) progress(a.own_clean_run ? fmt::format("{} clean", spec.id) : fmt::format("reference {}", matrix.reference));
  a.receipt = a.own_clean_run ? runner.run_lane("clean.h5", std::nullopt)
                              : runner.run(matrix.lane(matrix.reference), "reference.h5", std::nullopt);
  a.what = a.own_clean_run ? "its own clean run" : fmt::format("the reference lane {}", a.receipt.lane);
  return a;
}

// A run of the lane checked against `against`; a pair that cannot be compared (a golden of
// other steps) is bad input, named.
check::Verdict compared(const check::ReceiptData& run, const Against& against) {
  try {
    return check::compare_receipts(run, against.receipt, against.budgets, against.kind);
  } catch (const check::ContractError& e) {
    throw run::UsageError(fmt::format("the lane's run cannot be checked against {}: {}", against.what, e.what()));
  }
}

// The check's first failure as a rung's outcome.
void judge(const check::Verdict& v, PowerRung& rung) {
  rung.caught = !v.pass();
  if (const check::MetricVerdict* first = v.first_failure()) {
    rung.metric = first->metric;
    rung.step = first->first_failing_step;
  }
}

}  // namespace

const PowerRung* PowerLadder::smallest_caught() const {
  const auto caught = std::find_if(rungs.begin(), rungs.end(), [](const PowerRung& r) { return r.caught; });
  return caught == rungs.end() ? nullptr : &*caught;
}

std::optional<bool> PowerReport::too_loose() const {
  for (const PowerLadder& l : ladders) {
    if (l.kind != canary::fault_kind_name(FaultKind::kWeightScale)) continue;
    const PowerRung* caught = l.smallest_caught();
    return !caught || caught->size > kLooseScale;
  }
  return std::nullopt;
}

namespace {

// The ladders --kinds names (all when empty), in the table's order; UsageError for a name
// that is none.
std::vector<Ladder> chosen_ladders(const std::vector<std::string>& kinds) {
  std::vector<std::string> names;
  for (const Ladder& l : ladders()) names.emplace_back(canary::fault_kind_name(l.kind));
  for (const std::string& kind : kinds) {
    if (std::find(names.begin(), names.end(), kind) == names.end()) {
      throw run::UsageError(fmt::format("--kinds: '{}' is not a ladder ({})", kind, fmt::join(names, ", ")));
    }
  }
  std::vector<Ladder> chosen;
  for (const Ladder& l : ladders()) {
    if (kinds.empty() || std::count(kinds.begin(), kinds.end(), canary::fault_kind_name(l.kind)) > 0) chosen.push_back(l);
  }
  return chosen;
}

}  // namespace

void require_regressions(const LaneSpec& spec, std::string_view flag) {
  if (spec.external() && !spec.takes_regressions()) {
    throw run::UsageError(fmt::format("{}: {} runs a command of its own ({}); the ladder injects its regressions "
                                      "into the harness's engines and the package's PyTorch and JAX lanes, so "
                                      "measure one of those",
                                      flag, spec.id, command_line(spec.command)));
  }
}

PowerReport measure_power(const PowerOptions& o, const std::function<void(const std::string&)>& progress) {
  const Matrix matrix = load_matrix(o.matrix_path);
  const auto chosen = select_lanes(matrix, o.lane, "--lane");
  if (o.lane.empty() || chosen.size() != 1) throw run::UsageError("--lane: name one lane of the matrix (its id or name)");
  const LaneSpec& spec = *chosen.front();
  require_regressions(spec, "--lane");
  const std::vector<Ladder> climbed = chosen_ladders(o.kinds);
  PowerReport r;
  r.lane = spec.lane;
  r.steps = matrix.steps;
  r.step = o.step < 0 ? matrix.steps / 4 : o.step;
  if (r.step >= matrix.steps) {
    throw run::UsageError(fmt::format("--step: {} is past the matrix's last step ({})", r.step, matrix.steps - 1));
  }
  r.tensor = weight_to_move(matrix, o.tensor);

  const LaneRunner runner(matrix, spec, o.threads);
  const Against against = against_of(o, matrix, spec, runner, progress);
  r.against = against.what;
  r.against_golden = o.against_golden;
  if (!against.own_clean_run) {
    if (progress) progress(fmt::format("{} clean", spec.id));
    const check::Verdict clean = compared(runner.run_lane("clean.h5", std::nullopt), against);
    r.budget = clean.budget;
    r.bitwise = clean.bitwise;
    if (!clean.pass()) {
      r.clean_failure = check::one_line(clean);
      return r;
    }
  } else {
    r.bitwise = true;
    r.budget = {"reference"};
  }
  for (const Ladder& ladder : climbed) {
    PowerLadder& l = r.ladders.emplace_back();
    l.kind = canary::fault_kind_name(ladder.kind);
    l.what = ladder_what(ladder.kind, r.step, r.tensor);
    l.sizes = ladder.sizes;
    for (const double size : ladder.sizes) {
      PowerRung& rung = l.rungs.emplace_back();
      rung.size = size;
      const FaultSpec fault = regression(ladder.kind, size, r.step, r.tensor);
      rung.fault = fault.to_string();
      if (progress) progress(fmt::format("{} {}", spec.id, rung.fault));
      judge(compared(runner.run_lane("faulted.h5", fault), against), rung);
      if (rung.caught) break;
    }
  }
  return r;
}

std::string power_text(const PowerReport& r) {
  std::string text = fmt::format("{:<12}{} against {}, {} steps\n", "power", r.lane, r.against, r.steps);
  text += fmt::format("{:<12}{}\n", "budget",
                      r.bitwise ? "bitwise (every loss and every hash equal)" : fmt::format("{}", fmt::join(r.budget, " + ")));
  if (!r.clean_failure.empty()) {
    return text + fmt::format("{:<12}the clean lane already fails its check ({}); its power is not defined\n", "FAIL",
                              r.clean_failure);
  }
  for (const PowerLadder& l : r.ladders) {
    const PowerRung* caught = l.smallest_caught();
    const std::string sizes = fmt::format("{}", fmt::join(l.sizes, ", "));
    const std::string symbol = l.kind == "weight-ulps" ? "N" : l.kind == "eps-scale" ? "F" : "E";
    text += caught ? fmt::format("{:<12}{}: {} = {} caught, {} at step {} ({}; tried {})\n", "ladder", l.kind, symbol,
                                 caught->size, caught->metric, caught->step, l.what, sizes)
                   : fmt::format("{:<12}{}: none caught up to {} = {} ({}; tried {})\n", "ladder", l.kind, symbol,
                                 l.sizes.back(), l.what, sizes);
  }
  const std::optional<bool> loose = r.too_loose();
  if (!loose) return text + fmt::format("{:<12}the weight-scale ladder was not climbed (--kinds)\n", "verdict");
  return text + (*loose ? fmt::format("{:<12}TOO LOOSE: misses a {} scale of {} within its {} steps\n", "verdict",
                                      kLooseScale, r.tensor, r.steps)
                        : fmt::format("{:<12}catches a {} scale of {} within its run\n", "verdict", kLooseScale, r.tensor));
}

nlohmann::json power_json(const PowerReport& r) {
  nlohmann::json ladders = nlohmann::json::array();
  for (const PowerLadder& l : r.ladders) {
    nlohmann::json rungs = nlohmann::json::array();
    for (const PowerRung& rung : l.rungs) {
      rungs.push_back({{"size", rung.size},
                       {"fault", rung.fault},
                       {"caught", rung.caught},
                       {"metric", rung.metric.empty() ? nlohmann::json(nullptr) : nlohmann::json(rung.metric)},
                       {"step", rung.step < 0 ? nlohmann::json(nullptr) : nlohmann::json(rung.step)}});
    }
    const PowerRung* caught = l.smallest_caught();
    ladders.push_back({{"kind", l.kind},
                       {"what", l.what},
                       {"sizes", l.sizes},
                       {"smallest_caught", caught ? nlohmann::json(caught->size) : nlohmann::json(nullptr)},
                       {"step", caught ? nlohmann::json(caught->step) : nlohmann::json(nullptr)},
                       {"rungs", rungs}});
  }
  return {{"lane", r.lane},
          {"against", r.against},
          {"bitwise", r.bitwise},
          {"budget", r.budget},
          {"steps", r.steps},
          {"step", r.step},
          {"tensor", r.tensor},
          {"clean_failure", r.clean_failure.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.clean_failure)},
          {"ladders", ladders},
          {"too_loose", r.too_loose() ? nlohmann::json(*r.too_loose()) : nlohmann::json(nullptr)},
          {"loose_scale", kLooseScale}};
}

}  // namespace harness::nightly
