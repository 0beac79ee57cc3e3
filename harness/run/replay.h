// `harness replay RECEIPT --from K [--to M]`: runs a recorded lane again from the
// checkpoint at or before K (or from its initial state) and verifies every replayed step
// bit for bit against the receipt: losses, gradient norms, batch hashes, the four hash
// families and, when the receipt has them, the op traces. The recipe is the manifest's
// run_options; a seeded accel run replays its recorded noise seed. docs/bisect.md, "Replay".
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "op_oracle.h"
#include "receipt/receipt_writer.h"

namespace harness::run {

struct ReplayOptions {
  std::string receipt;
  int from = 0;
  std::optional<int> to;  // default: the last recorded step
  int threads = 0;        // 0: all cores (any count gives the same bits)
  bool trace_ops = false;  // trace every replayed step (their rows land in ReplayResult::trace)
  // Judge every op of this step by the float64 op oracle (op_oracle.h; `harness precision`):
  // a step in from..to, on an engine that runs each op as it is called. -1: none.
  int oracle_step = -1;
  std::optional<numerics::Precision> oracle_against;  // OpOracle's `against`
  // With oracle_step: keep the judged op at this site in this phase (OpOracle::capture).
  std::string capture_site;
  Phase capture_phase = Phase::Forward;
};

// The first thing a replayed step did not reproduce.
struct ReplayMismatch {
  int step = -1;
  std::string what;    // loss, grad_norm, batch_hash, params, grads, adam_m, adam_v or trace
  std::string tensor;  // the tensor (hash families) or traced output (trace)
};

struct ReplayResult {
  std::string receipt, lane;
  int resumed_from = 0;         // the checkpoint's step; 0 with no checkpoint (the initial state)
  std::string checkpoint;       // its path; "" for the initial state
  int from = 0, to = 0;         // the steps asked for
  int steps_run = 0;            // resumed_from .. to
  std::optional<ReplayMismatch> first_mismatch;
  std::vector<int> mismatched_steps;
  // Mismatches followed by agreement at the last step: the replayed state is the recorded
  // one, so the receipt's record of those steps was altered (a divergence never heals).
  bool record_altered = false;
  std::vector<std::string> notes;  // e.g. the compiled programs differ from the checkpoint's
  double seconds = 0;
  std::vector<receipt::TraceColumn> trace_columns;  // with trace_ops
  std::vector<receipt::TraceStep> trace;            // per replayed step, resumed_from first
  std::optional<OracleReport> oracle;               // with oracle_step
  std::optional<CapturedOp> captured;               // with capture_site, where that op was judged

  bool reproduced() const { return !first_mismatch.has_value(); }
};

// Throws UsageError (one line naming the file or flag) when the receipt cannot be replayed
// or its checkpoint is not trusted: no recipe, racy noise, a step out of range, a
// checkpoint whose content or tensor hashes are not the ones the receipt recorded.
ReplayResult replay(const ReplayOptions& options);

}  // namespace harness::run
