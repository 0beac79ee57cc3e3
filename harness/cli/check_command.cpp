// `harness check RECEIPT`: a receipt against its lane's golden. `harness compare A B`: two
// lanes under the composed budget of the features that separate them. `harness bisect A B`:
// where two runs part. Exit 0 pass (or equivalent), 1 a metric failed (or the runs part),
// 2 the two cannot be compared (or a file or flag is bad).
#include <filesystem>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "bf16_first.h"
#include "bisect.h"
#include "budgets.h"
#include "commands.h"
#include "matrix.h"
#include "defaults.h"
#include "golden_store.h"
#include "receipt/receipt_reader.h"
#include "verdict.h"
#include "verdict_report.h"
#include "json_text.h"

namespace harness::cli {
namespace {

struct ComparisonFlags {
  std::string a, b;  // check: the receipt and its golden (empty: found by lane)
  std::string goldens_dir = default_goldens();
  std::string budgets = default_budgets();
  std::string triage_with;
  bool json = false;
  bool verbose = false;  // every stack line, the settings only one side has included
  bool no_replay = false;  // bisect: never replay a side without /trace
  std::string pack;        // bisect: the canary pack PyTorch lanes' receipts were run from
  bool git_bisect = false;  // check: exit as `git bisect run` expects (125 when it cannot judge)
};

// `git bisect run` reads 0 good, 1..124 bad, 125 skip: a commit whose receipt cannot be
// compared (its run failed, another schema) is skipped, not called bad.
constexpr int kExitGitBisectSkip = 125;

// One line on stderr (and the error as JSON on stdout with --json); exit 2.
int report_error(const ComparisonFlags& flags, const std::string& kind, const std::string& message) {
  if (flags.json) fmt::print("{}\n", run::json_text(check::error_json(kind, message)));
  fmt::print(stderr, "harness: error: {}\n", message);
  return kExitBadInput;
}

int print_verdict(const ComparisonFlags& flags, const check::Verdict& verdict) {
  if (flags.json) {
    fmt::print("{}\n", run::json_text(check::to_json(verdict)));
  } else {
    fmt::print("{}", check::to_text(verdict, flags.verbose));
  }
  return verdict.pass() ? kExitPass : kExitCheckFailed;
}

// BF16-first triage: an fp8 lane that fails against the reference is explained by its
// bf16-only twin. If the twin fails too the cause is shared; if not, it is fp8's own.
std::string triage(const check::Verdict& failed, const std::vector<check::TriagedFeature>& features,
                   const check::ReceiptData& bf16_twin, const check::ReceiptData& reference, const check::Budgets& budgets) {
  const auto lacked = check::feature_the_twin_lacks(features, check::budget_features(bf16_twin));
  if (!lacked) {
    throw std::invalid_argument(fmt::format("--triage-with: {} declares {} itself; give the {} lane", bf16_twin.path,
                                            features.front().name, features.front().twin));
  }
  const check::TriagedFeature& feature = *lacked;
  const check::Verdict twin = check::compare_receipts(bf16_twin, reference, budgets, failed.kind);
  return check::bf16_first_advice(
      feature, bf16_twin.lane, twin.pass(),
      twin.pass() ? "" : fmt::format("first at step {}", twin.first_failure()->first_failing_step));
}

// Runs `action`; every way two receipts cannot be compared is one line and exit 2.
template <typename Action>
int guarded(const ComparisonFlags& flags, Action action) {
  try {
    return action();
  } catch (const check::ContractError& e) {
    return report_error(flags, e.kind, e.what());
  } catch (const check::BudgetError& e) {
    return report_error(flags, "budgets", e.what());
  } catch (const receipt::ReceiptError& e) {
    return report_error(flags, "receipt", e.what());
  } catch (const nightly::GoldenError& e) {
    return report_error(flags, "golden_integrity", e.what());
  } catch (const std::invalid_argument& e) {
    return report_error(flags, "usage", e.what());
  } catch (const std::exception& e) {  // an HDF5 failure reading a dataset, ...
    return report_error(flags, "receipt", e.what());
  }
}

// Advice that leads somewhere: only a lane of the matrix can be refreshed into a golden.
std::string how_to_get_a_golden(const std::string& lane) {
  const std::string matrix_path = default_matrix();
  try {
    const nightly::Matrix matrix = nightly::load_matrix(matrix_path);
    for (const nightly::LaneSpec& spec : matrix.lanes) {
      if (spec.lane == lane) {
        return fmt::format("create one with `harness golden refresh --lanes {} --reason TEXT`, then approve it", spec.id);
      }
    }
  } catch (const std::exception&) {
    // An unreadable matrix: the advice below still holds.
  }
  return fmt::format("lane {} is not in the nightly matrix {}: make a golden of one of its receipts with `harness golden "
                     "refresh --receipt R.h5 --reason TEXT`, then approve it; or name a receipt to check against with "
                     "--golden FILE",
                     lane, matrix_path);
}

int run_comparison(const ComparisonFlags& flags, const std::string& kind) {
  return guarded(flags, [&] {
    const check::Budgets budgets = check::load_budgets(flags.budgets);
    const check::ReceiptData run = check::load_receipt(flags.a);
    std::string reference_path = flags.b;
    const nightly::GoldenStore store(flags.goldens_dir);
    if (reference_path.empty()) {
      reference_path = store.golden_path(run.lane);
      if (!std::filesystem::exists(reference_path)) {
        return report_error(flags, "missing_golden",
                            fmt::format("no golden for lane {} at {}; {}", run.lane, reference_path,
                                        how_to_get_a_golden(run.lane)));
      }
    }
    if (kind == "golden" && flags.b.empty()) {  // a golden changed outside approve is not used
      nightly::verify_golden_integrity(reference_path, store);
    } else if (kind == "golden") {
      nightly::verify_golden_integrity(reference_path);
    }
    const check::ReceiptData reference = check::load_receipt(reference_path);
    if (kind == "golden" && reference.lane != run.lane) {
      return report_error(flags, "another_lane",
                          fmt::format("{} is the golden of lane {}, not {}; use `harness compare` across lanes",
                                      reference_path, reference.lane, run.lane));
    }
    check::Verdict verdict = check::compare_receipts(run, reference, budgets, kind);
    const auto triaged = check::triaged_features(check::budget_features(run), budgets);
    if (!flags.triage_with.empty() && triaged.empty()) {
      throw std::invalid_argument(fmt::format("--triage-with: {} declares no budget feature triage explains (one "
                                              "whose entry in {} has triage_twin, as [fp8])",
                                              run.lane, budgets.path));
    }
    if (!verdict.pass() && !flags.triage_with.empty()) {
      verdict.triage = triage(verdict, triaged, check::load_receipt(flags.triage_with), reference, budgets);
    }
    return print_verdict(flags, verdict);
  });
}

// Exit 0 when the runs are equivalent, 1 when they part (the step and tensor named).
int run_bisect(const ComparisonFlags& flags) {
  return guarded(flags, [&] {
    const auto traced = [&](const check::ReceiptData& run, int step) { return replayed_trace(run, step, flags.pack); };
    const auto judged = [&](const check::ReceiptData& run, int step, const check::DivergentOp& op) {
      return judged_op(run, step, op, flags.pack);
    };
    const check::TraceProvider replay = flags.no_replay ? check::TraceProvider{} : check::TraceProvider{traced};
    const check::OracleProvider oracle = flags.no_replay ? check::OracleProvider{} : check::OracleProvider{judged};
    nightly::verify_golden_integrity(flags.a);  // either side may be a golden
    nightly::verify_golden_integrity(flags.b);
    const check::Bisection b = check::bisect(check::load_receipt(flags.a), check::load_receipt(flags.b),
                                             check::load_budgets(flags.budgets), replay, oracle);
    fmt::print("{}", flags.json ? run::json_text(check::to_json(b)) + "\n" : check::to_text(b));
    return b.diverged() ? kExitCheckFailed : kExitPass;
  });
}

void add_common_flags(CLI::App& command, ComparisonFlags& flags) {
  command.add_option("--budgets", flags.budgets, "Budgets file (TOML)")->capture_default_str();
  command.add_flag("--json", flags.json, "Print the verdict as JSON (keys in docs/cli.md)");
}

// check and compare: the stack lines of settings only one side has, too.
void add_verbose_flag(CLI::App& command, ComparisonFlags& flags) {
  command.add_flag("--verbose", flags.verbose, "List every stack line that differs, settings only one side has included");
}

}  // namespace

void add_check_command(CLI::App& app, CommandRegistry& commands) {
  auto flags = std::make_shared<ComparisonFlags>();  // check's: the receipt, and --golden or --goldens
  CLI::App* check = app.add_subcommand("check", "Check a receipt against its lane's golden under the lane's budget");
  check->add_option("receipt", flags->a, "Receipt to check (.h5)")->required();
  check->add_option("--golden", flags->b, "Golden receipt (default: GOLDENS/<lane>.h5)");
  check->add_option("--goldens", flags->goldens_dir, "Goldens directory")->capture_default_str();
  add_common_flags(*check, *flags);
  add_verbose_flag(*check, *flags);
  check->add_flag("--git-bisect", flags->git_bisect,
                  "Exit as `git bisect run` expects: 0 good, 1 bad, 125 skip when the receipt cannot be judged");
  commands.add(check, [flags] {
    const int code = run_comparison(*flags, "golden");
    return flags->git_bisect && code == kExitBadInput ? kExitGitBisectSkip : code;
  });

  flags = std::make_shared<ComparisonFlags>();  // compare's own: A and B
  CLI::App* compare = app.add_subcommand("compare", "Compare two lanes under the composed budget of their features");
  compare->add_option("a", flags->a, "Receipt of the lane under test (.h5)")->required();
  compare->add_option("b", flags->b, "Receipt of the reference lane (.h5)")->required();
  compare->add_option("--triage-with", flags->triage_with,
                      "When A runs fp8 and fails: the receipt of A's lane without fp8, for BF16-first triage");
  add_common_flags(*compare, *flags);
  add_verbose_flag(*compare, *flags);
  commands.add(compare, [flags] { return run_comparison(*flags, "compare"); });

  flags = std::make_shared<ComparisonFlags>();  // bisect's own: A and B
  CLI::App* bisect = app.add_subcommand("bisect", "Find the first step and tensor where two runs part");
  bisect->add_option("a", flags->a, "Receipt of one run (.h5)")->required();
  bisect->add_option("b", flags->b, "Receipt of the other (.h5)")->required();
  bisect->add_flag("--no-replay", flags->no_replay,
                   "Do not replay a run whose receipt has no op trace (the first op is then unknown)");
  add_pack_flag(*bisect, flags->pack);
  add_common_flags(*bisect, *flags);
  commands.add(bisect, [flags] { return run_bisect(*flags); });
}

}  // namespace harness::cli
