// `harness precision RECEIPT --step K`: replays step K of a recorded run and judges every
// op of it by the float64 op oracle (harness/run/op_oracle.h, docs/oracle.md): each
// result against the rounding bound of the precision its engine declares. No second run
// and no golden. Exit 0 every judged op within its bound, 1 one or more over (each named),
// 2 the receipt cannot be replayed there (an engine that compiles its steps, a step the
// replay does not reproduce bit for bit). A Python canary's receipt: its package replays the
// step with every aten op captured, and each is judged here (harness/run/python_oracle.h).
#include <limits>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "json_text.h"
#include "python_oracle.h"
#include "receipt/receipt_paths.h"
#include "receipt/receipt_reader.h"
#include "replay.h"
#include "thread_flag.h"

namespace harness::cli {
namespace {

struct PrecisionFlags {
  std::string receipt;
  int step = 0;
  int threads = 0;
  std::string against;
  std::string pack;  // a PyTorch lane's receipt: the canary pack it was run from
  std::string level;  // a Python run's: aten or modules (the package's default where empty)
  bool json = false;
};

// What --against takes: the formats whose bounds need no scale (an FP8 format's do).
constexpr numerics::Precision kPrecisions[] = {numerics::Precision::Fp32, numerics::Precision::Bf16};

// --against NAME: one of kPrecisions by its name; none when not given.
std::optional<numerics::Precision> against(const std::string& name) {
  if (name.empty()) return std::nullopt;
  std::vector<std::string_view> names;
  for (const numerics::Precision p : kPrecisions) {
    if (numerics::to_string(p) == name) return p;
    names.push_back(numerics::to_string(p));
  }
  throw run::UsageError(fmt::format("--against: '{}' is not a precision ({})", name, fmt::join(names, ", ")));
}

// What one step's audit found, whoever judged it (the engine's replay or a Python canary's capture).
struct Audit {
  const run::OracleReport& report;
  std::string receipt, lane;
  int step = 0;
  double seconds = 0;
};

nlohmann::json judgement_json(const run::OpJudgement& j) {
  return {{"site", j.site},           {"op", j.op},
          {"source", j.source},       {"below", j.below},
          {"phase", j.phase},         {"result", j.result},
          {"stored", j.stored},       {"operands", j.operands},
          {"elements", j.elements},   {"over", j.over}, {"unbounded", j.unbounded},
          {"within", j.within()},     {"worst_ratio", j.worst_ratio},
          {"worst_index", j.worst_index}, {"value", j.value},
          {"exact", j.exact},         {"error_ulps", j.error_ulps},
          {"bound_ulps", j.bound_ulps}};
}

nlohmann::json not_bounded_json(const run::OracleReport& o) {
  nlohmann::json out = nlohmann::json::array();
  for (const run::OracleReport::Unbounded& call : o.not_bounded) out.push_back(call.text());
  return out;
}

nlohmann::json to_json(const Audit& a) {
  const run::OracleReport& o = a.report;
  nlohmann::json judged = nlohmann::json::array(), over = nlohmann::json::array();
  for (const run::OpJudgement& j : o.judged) {
    judged.push_back(judgement_json(j));
    if (!j.within()) over.push_back(judgement_json(j));
  }
  return {{"version", 1},
          {"verdict", o.ops_over() == 0 ? "within" : "over"},
          {"receipt", a.receipt},
          {"lane", a.lane},
          {"step", a.step},
          {"judged", judged},
          {"over", over},
          {"not_judged", o.not_judged},
          {"not_bounded", not_bounded_json(o)},
          {"seconds", a.seconds}};
}

// "blocks.1.mlp.fc linear_forward out: 3.1e4 x its bound (error 1.0e6 ulps of fp32, bound 33 ulps; operands fp32)";
// a Python canary's with its file:line and, for a result below the declared precision, why.
std::string over_line(const run::OpJudgement& j) {
  const std::string source = j.source.empty() ? "" : fmt::format(" ({})", j.source);
  const std::string below = j.below.empty() ? "" : fmt::format(": {}", j.below);
  return fmt::format("{} {} {}{}: {:.3g} x its {} bound at element {} (error {:.3g} ulps of {}, bound {:.3g}; {} of "
                     "{} elements over; operands {}){}",
                     j.site, j.op, j.result, source, j.worst_ratio, j.stored, j.worst_index, j.error_ulps, j.stored,
                     j.bound_ulps, j.over, j.elements, j.operands, below);
}

std::string to_text(const Audit& a) {
  const run::OracleReport& o = a.report;
  std::string out = fmt::format("{:<12}{} ({}), step {}\n", "precision", a.lane, a.receipt, a.step);
  double worst = 0;
  for (const run::OpJudgement& j : o.judged) worst = std::max(worst, j.within() ? j.worst_ratio : 0.0);
  out += fmt::format("{:<12}{} op results against float64; {} over their bounds\n", "judged", o.judged.size(), o.ops_over());
  for (const run::OpJudgement& j : o.judged) {
    if (!j.within()) out += fmt::format("{:<12}{}\n", "over", over_line(j));
  }
  if (o.ops_over() == 0) out += fmt::format("{:<12}every judged result within its bound (the closest at {:.4g} of it)\n", "within", worst);
  std::string skipped;
  for (const auto& [op, calls] : o.not_judged) skipped += fmt::format("{}{} x{}", skipped.empty() ? "" : ", ", op, calls);
  if (!skipped.empty()) out += fmt::format("{:<12}{} (no bound yet: docs/oracle.md)\n", "not judged", skipped);
  for (const run::OracleReport::Unbounded& call : o.not_bounded) out += fmt::format("{:<12}{}\n", "not bounded", call.text());
  return out;
}

int print_audit(const PrecisionFlags& f, const Audit& audit) {
  if (audit.report.judged.empty()) {  // nothing judged is no verdict: never "within"
    std::string skipped;
    for (const auto& [op, calls] : audit.report.not_judged) skipped += fmt::format("{}{} x{}", skipped.empty() ? "" : ", ", op, calls);
    throw run::UsageError(fmt::format("{}: no result of step {} could be judged ({}); nothing is within or over",
                                      f.receipt, f.step, skipped.empty() ? "it ran no op the oracle sees" : skipped));
  }
  fmt::print("{}", f.json ? run::json_text(to_json(audit)) + "\n" : to_text(audit));
  return audit.report.ops_over() == 0 ? kExitPass : kExitCheckFailed;
}

// A Python canary's step, or a PyTorch lane's: the package replays it with its aten ops captured (capture-ops,
// the canary's prints sent to stderr), and each captured result is judged here against
// the precision the run declared, or --against's.
int run_python_precision(const PrecisionFlags& f, const PackageReceipt& replayed_by) {
  const std::optional<numerics::Precision> chosen = against(f.against);
  std::vector<std::string> flags = replayed_by.flags;
  if (!f.level.empty()) flags.insert(flags.end(), {"--level", f.level});
  try {
    const run::PythonStepJudgement j =
        run::judge_python_step(f.receipt, replayed_by.manifest, f.step, chosen, run::ChildOutput::kInherit, flags);
    return print_audit(f, {j.report, f.receipt, j.lane, f.step, j.seconds});
  } catch (const run::PythonCaptureError& e) {
    if (std::string(e.what()).empty()) return e.exit_code;  // the package's own error is on stderr
    throw run::UsageError(e.what());
  }
}

// The steps the receipt records; none where it cannot be read (run::replay says why).
std::optional<int> recorded_steps(const std::string& path) {
  try {
    return static_cast<int>(receipt::ReceiptReader(path).f64(receipt::paths::kLoss).size());
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

int run_precision(const PrecisionFlags& f) {
  if (const std::optional<int> recorded = recorded_steps(f.receipt); recorded && f.step >= *recorded) {
    throw run::UsageError(fmt::format("--step: step {} is not recorded in {} (steps 0-{})", f.step, f.receipt, *recorded - 1));
  }
  if (const auto replayed_by = package_receipt(f.receipt, f.pack)) return run_python_precision(f, *replayed_by);
  if (!f.level.empty()) {
    throw run::UsageError(fmt::format("--level: {} is a harness engine's run, whose ops the oracle judges as each is "
                                      "called; --level is for a Python canary's or a PyTorch lane's",
                                      f.receipt));
  }
  run::ReplayOptions options;
  options.receipt = f.receipt;
  options.from = f.step;
  options.to = f.step;
  options.threads = f.threads;
  options.oracle_step = f.step;
  options.oracle_against = against(f.against);
  const run::ReplayResult r = run::replay(options);
  if (!r.reproduced()) {
    throw run::UsageError(fmt::format("{}: a replay does not reproduce step {} ({}); its ops cannot be judged as they ran",
                                      f.receipt, r.first_mismatch->step, r.first_mismatch->what));
  }
  return print_audit(f, {*r.oracle, r.receipt, r.lane, f.step, r.seconds});
}

}  // namespace

void add_precision_command(CLI::App& app, CommandRegistry& commands) {
  auto f = std::make_shared<PrecisionFlags>();
  CLI::App* precision =
      app.add_subcommand("precision", "Judge every op of a recorded step against float64 and its precision's rounding bound");
  precision->add_option("receipt", f->receipt, "Receipt of the run (.h5): a harness engine's that runs each op as it is called, a Python canary's, "
                                           "or a PyTorch lane's (with --pack)")
      ->required();
  precision->add_option("--step", f->step, "The step to replay and judge")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()))
      ->required();
  add_threads_flag(*precision, f->threads, "Worker threads (0 = all cores; any count gives the same bits)");
  precision->add_option("--against", f->against,
                        "Judge every op as if computed and stored in this precision (fp32 or bf16), whatever "
                        "its engine declares: is the lane fp32 at all?");
  add_pack_flag(*precision, f->pack);
  precision->add_option("--level", f->level,
                        "A Python run's: aten (every aten op; the default) or modules (the op modules' outputs; the "
                        "default, and the only level, on XLA and under --compile)")
      ->check(CLI::IsMember({"aten", "modules"}));
  precision->add_flag("--json", f->json, "Print the result as JSON (keys in docs/oracle.md)");
  commands.add(precision, [f] { return run_precision(*f); });
}

}  // namespace harness::cli
