#include "run_setup.h"

#include "canary_run.h"
#include "tensor_digest.h"

namespace harness::run {

RunSetup set_up_run(const canary::CanaryConfig& config, std::unique_ptr<Engine> engine, const CanaryChoices& choices) {
  RunSetup setup;
  setup.model = canary::make_canary(config, choices.fault, choices.trace_ops);
  setup.engine = std::move(engine);
  setup.engine->bind(setup.model->tensors());
  setup.lane = lane_name(config.name, setup.engine->lane_engine(), setup.engine->features());
  return setup;
}

void upload_initial_parameters(const RunSetup& setup, std::uint64_t seed, std::optional<std::uint64_t> perturbation) {
  setup.model->upload_initial_parameters(*setup.engine, seed, perturbation);
}

TakenStep take_step(const RunSetup& setup, const canary::DataSource& data, int step, const StepDigester& digester,
                    receipt::StepRecord& record) {
  TakenStep taken{data.batch(step), {}};
  taken.result = setup.model->train_step(*setup.engine, step, taken.batch);
  record.loss = taken.result.loss;
  record.grad_norm = taken.result.grad_norm;
  record.lr = taken.result.lr;
  record.batch_hash = canary::batch_hash(taken.batch);
  digester.digest(*setup.engine, record);
  return taken;
}

}  // namespace harness::run
