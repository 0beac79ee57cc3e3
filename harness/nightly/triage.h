// `harness triage A B`: a precision lane A that fails against its reference B is run again
// with units of its reduced precision switched to a wider format (FP8 to bf16 first, then
// bf16 to fp32), and the smallest set of units that brings it back inside its budget is
// found: a group whole (an FP8 zone, a layer across blocks) when that suffices, then one
// unit at a time (docs/triage.md). The units come from the engine
// (Engine::precision_switches) or, for a Python canary, from its modules under autocast;
// the judge is A's own comparison against B.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/engine_settings.h"

namespace harness::nightly {

struct TriageOptions {
  std::string lane_receipt;  // A: the failing precision lane
  std::string reference;     // B: its reference (a receipt or a golden)
  std::string budgets_path;
  int threads = 0;  // per rerun (0: all cores)
};

// One rerun of A's recipe with units switched off, as B judged it.
struct TriageTrial {
  std::string what;  // "fp8 off: every unit (16)", "fp8 off: group mlp_fc (4 units)", "fp8 off: all but mlp_fc@0"
  std::vector<std::string> switched;  // the flags as the rerun took them: "--fp8-off", "mlp_fc@1", ...
  bool pass = false;
  double least_headroom = 0;  // % of the budget, negative where it fails
  std::string verdict;        // one line (check::one_line)
};

struct Triage {
  std::string lane, reference, lane_path, reference_path;
  std::vector<std::string> budget;  // the composed features
  std::string before;               // A against B, one line
  double headroom_before = 0;
  bool already_passes = false;      // A passes: nothing to triage
  // The switch whose units bring A back (empty: none does, every format off included),
  // the 1-minimal set of its units, the formats switched off whole before it.
  std::string format, wider, flag;
  std::vector<PrecisionUnit> culprits;
  std::size_t units_of_format = 0;
  std::vector<std::string> whole_formats_off;
  std::optional<double> headroom_after;  // with the culprits (and the whole formats) off
  std::vector<TriageTrial> trials;
  std::vector<std::string> rerun;  // `harness run ...` words that run A with the culprits off

  bool found() const { return !culprits.empty(); }
};

// Throws run::UsageError, check::BudgetError, check::ContractError or receipt::ReceiptError
// on bad input (a lane with no recipe or no reduced precision, receipts that cannot be
// compared, a recipe that no longer reproduces A).
Triage triage(const TriageOptions& options, const std::function<void(const std::string&)>& progress = {});

std::string triage_report(const Triage& triage);
nlohmann::json to_json(const Triage& triage);

}  // namespace harness::nightly
