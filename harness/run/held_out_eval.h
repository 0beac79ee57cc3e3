// The held-out evaluation of a run (docs/logit-kl.md): every [eval] every steps, a forward
// pass over the canary's held-out batch records the logits of its first rows into /eval,
// so that two runs can be compared by their output distributions (KL, log-probabilities,
// top-1 agreement) beside their losses and hashes.
//
// The pass must not move a trained bit: it runs before the step's training, with the
// engine's own state (FP8 scaling histories) saved before and restored after it, injects
// no fault, and traces only the logits (into its own sink, the run's trace sink put back).
#pragma once

#include <cstdint>
#include <vector>

#include "api/engine.h"
#include "canary.h"
#include "data_source.h"
#include "receipt/receipt_writer.h"

namespace harness::run {

class HeldOutEval {
 public:
  HeldOutEval(const canary::Canary& model, const canary::DataSource& data);

  bool enabled() const { return every_ > 0; }
  // Evaluations run at the start of steps every, 2*every, ... and after the last step
  // (step == steps, the final parameters) when it is a multiple.
  bool due(int step) const { return enabled() && step > 0 && step % every_ == 0; }
  receipt::EvalDeclaration declaration() const;
  // The parameters at the start of `step` on the held-out batch, one /eval row.
  // `run_sink` is the run's trace sink (nullptr for none): it is set again afterwards.
  void evaluate(Engine& engine, int step, TraceSink* run_sink, receipt::ReceiptWriter& writer) const;

 private:
  const canary::Canary& model_;
  int every_ = 0, rows_ = 0;
  canary::Batch batch_;
};

}  // namespace harness::run
