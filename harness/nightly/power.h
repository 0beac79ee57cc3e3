// `harness power`: what a lane's check catches (docs/budgets.md, "Detection power"). A
// budget wide enough to pass every host may be wide enough to miss a real regression; the
// ladder injects regressions of growing size into the lane (canaries/fault.h: a linear
// layer's weight scaled by 1 + E, one initial weight moved N ulps, the learning rate times
// 1 + E, AdamW's eps times F) and reports, per kind, the smallest that fails the lane's
// check and at which step. A check that misses a 1e-4 scale of a layer within its run is
// too loose.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "matrix.h"

namespace harness::nightly {

// The scale of a layer every budgeted check must catch within its run (issue 47).
inline constexpr double kLooseScale = 1e-4;

struct PowerOptions {
  std::string matrix_path, budgets_path;
  std::string lane;    // id or lane name in the matrix; a lane of the harness's engines
  int step = -1;       // where weight-scale and lr-scale start (-1: a quarter of the matrix's steps)
  std::string tensor;  // the parameter the weight faults move ("": the canary's first linear layer's weight)
  int threads = 0;
  std::vector<std::string> kinds;  // the ladders to climb (fault kinds); empty: every one
  // Check the lane against its golden in `goldens_path` (the nightly's golden check: bitwise
  // on the golden's platform, its across_platforms entry on another) instead of against the
  // matrix's reference lane.
  bool against_golden = false;
  std::string goldens_path;
};

// One regression tried: its size, the --inject-fault text, and what the check made of it.
struct PowerRung {
  double size = 0;     // E (weight-scale, lr-scale), N (weight-ulps) or F (eps-scale)
  std::string fault;   // the --inject-fault value
  bool caught = false;
  std::string metric;  // the check's first failing metric ("" : it passed)
  int step = -1;       // and its first failing step
};

// One kind of regression, tried from the smallest size up to the first the check catches.
struct PowerLadder {
  std::string kind;  // fault kind: weight-scale, weight-ulps, lr-scale, eps-scale
  std::string what;  // "blocks.0.attn.qkv.weight times 1 + E from step 25"
  std::vector<double> sizes;  // the ladder's sizes, smallest first
  std::vector<PowerRung> rungs;  // those tried, up to the first caught
  const PowerRung* smallest_caught() const;
};

struct PowerReport {
  std::string lane, against;  // the lane, and what its check compares it with
  bool against_golden = false;  // its golden check (--against-golden), not the reference lane's
  bool bitwise = false;       // the check is bitwise (the reference lane against its own clean run)
  std::vector<std::string> budget;  // the composed entries the check is judged by
  int steps = 0, step = 0;
  std::string tensor;
  std::vector<PowerLadder> ladders;
  // Why the clean lane already fails its check ("" when it passes): its power is then not
  // defined, and no ladder is climbed.
  std::string clean_failure;
  // Misses a kLooseScale scale of the layer within its run; nullopt when the weight-scale
  // ladder was not climbed (--kinds) or the clean lane failed.
  std::optional<bool> too_loose() const;
};

// Throws run::UsageError naming `flag` where the lane's command takes no regressions
// (LaneSpec::takes_regressions): a command lane of the team's own.
void require_regressions(const LaneSpec& spec, std::string_view flag);

// Runs the lane clean (and the reference lane, unless it is the one measured or the lane is
// checked against its golden), checks the clean run passes (else the report says why, with
// no ladder), then climbs each ladder.
// Throws MatrixError / run::UsageError / check::BudgetError on bad input.
PowerReport measure_power(const PowerOptions& options, const std::function<void(const std::string&)>& progress = {});

std::string power_text(const PowerReport& report);
nlohmann::json power_json(const PowerReport& report);

}  // namespace harness::nightly
