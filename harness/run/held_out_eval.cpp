#include "held_out_eval.h"

#include <stdexcept>

#include <fmt/format.h>

#include "full_receipt_schema.h"

namespace harness::run {
namespace {

// Keeps the first `size` values of the traced logits: the recorded rows, row-major first.
class LogitsSink : public TraceSink {
 public:
  LogitsSink(TensorId logits, std::size_t size) : logits_(logits), size_(size) {}
  void on_trace(const OpSite&, TensorId tensor, std::span<const float> value) override {
    if (tensor != logits_) return;
    if (value.size() < size_) {
      throw std::logic_error("held-out evaluation: the traced logits are smaller than their rows");
    }
    values_.assign(value.begin(), value.begin() + static_cast<std::ptrdiff_t>(size_));
  }
  const std::vector<float>& values() const { return values_; }

 private:
  TensorId logits_;
  std::size_t size_;
  std::vector<float> values_;
};

// The programs the evaluation compiled: the engine's counters of the step that just ended
// (the evaluation's) that the description gates as compiles, found by gate, never by name.
double uncached_compiles(const std::vector<StepState>& states) {
  double total = 0;
  for (const StepState& state : states) {
    for (const auto& [field, values] : state.fields) {
      const ReceiptDataset* described = full_receipt_schema().dataset("/" + state.group + "/" + field);
      if (described == nullptr || described->gate != CounterGate::kCompilesAfterWarmup) continue;
      for (const double v : values) total += v;
    }
  }
  return total;
}

}  // namespace

HeldOutEval::HeldOutEval(const canary::Canary& model, const canary::DataSource& data)
    : model_(model), every_(model.config().eval_every), rows_(model.config().eval_rows) {
  if (enabled()) batch_ = canary::held_out_batch(data);
}

receipt::EvalDeclaration HeldOutEval::declaration() const {
  const canary::CanaryConfig& c = model_.config();
  const auto per_row = static_cast<std::ptrdiff_t>(c.context_length);
  return {every_,
          canary::batch_hash(batch_),
          fmt::format("batch {} of the canary's data", canary::kHeldOutBatch),
          rows_,
          c.context_length,
          c.vocab_size,
          {batch_.targets.begin(), batch_.targets.begin() + rows_ * per_row}};
}

void HeldOutEval::evaluate(Engine& engine, int step, TraceSink* run_sink, receipt::ReceiptWriter& writer) const {
  const canary::CanaryConfig& c = model_.config();
  LogitsSink sink(model_.token_logits(), static_cast<std::size_t>(rows_) * c.context_length * c.vocab_size);
  const EngineState saved = engine.save_state();
  engine.set_trace_sink(&sink);
  const float loss = model_.evaluate_held_out(engine, step, batch_);
  engine.set_trace_sink(run_sink);
  engine.restore_state(saved);
  if (sink.values().empty()) throw std::logic_error("held-out evaluation: the forward traced no logits");
  writer.add_eval(step, loss, sink.values(), uncached_compiles(engine.step_state()));
}

}  // namespace harness::run
