// One way to set a canary run up and take its steps: run, replay, audit, invariance and
// export all make the canary, bind its engine and upload its first parameters here, so a
// change to how a run starts (or what a step records) is made once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "api/engine.h"
#include "canary.h"
#include "data_source.h"
#include "fault.h"
#include "receipt/receipt_writer.h"

namespace harness::run {

class StepDigester;

// What the canary is made with beyond its file: a fault to inject, and whether its ops
// deliver traces (--trace ops, replay's tracing, invariance's rows).
struct CanaryChoices {
  std::optional<canary::FaultSpec> fault;
  bool trace_ops = false;
};

// A canary bound to the engine that runs it, and the lane name they make.
struct RunSetup {
  std::unique_ptr<canary::Canary> model;
  std::unique_ptr<Engine> engine;
  std::string lane;
};

// The canary of `config` on `engine`, bound to its tensors; no parameter uploaded yet.
RunSetup set_up_run(const canary::CanaryConfig& config, std::unique_ptr<Engine> engine,
                    const CanaryChoices& choices = {});

// Its parameters at the start of step 0, from the initialisation seed (perturbed in their
// last bits when `perturbation` is given: --perturb-init).
void upload_initial_parameters(const RunSetup& setup, std::uint64_t seed,
                               std::optional<std::uint64_t> perturbation = std::nullopt);

// One training step on its batch, and what a receipt's row records of it (loss, grad norm,
// learning rate, batch hash, every tensor's digests) into `record`.
struct TakenStep {
  canary::Batch batch;
  canary::StepResult result;
};
TakenStep take_step(const RunSetup& setup, const canary::DataSource& data, int step, const StepDigester& digester,
                    receipt::StepRecord& record);

}  // namespace harness::run
