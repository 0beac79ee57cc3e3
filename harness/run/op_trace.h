// Op traces (`--trace ops`): the engine hands over every traced op output (TraceSink);
// this recorder numbers the ops, keeps the values of the step and digests them at its
// end into one /trace row: per output its XXH3-64 hash and value sketch, the same digest
// the receipt's /hashes and /sketches use (docs/receipt-schema.md, "/trace").
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "api/engine.h"
#include "receipt/receipt_writer.h"
#include "tensor_digest.h"

namespace harness::run {

class OpTraceRecorder final : public TraceSink {
 public:
  explicit OpTraceRecorder(const TensorTable& table) : table_(table) {}

  // Copies the value; consecutive calls with one site are the outputs of one op.
  void on_trace(const OpSite& site, TensorId tensor, std::span<const float> value) override;

  // Digests the step's values (in parallel, deterministic) and starts the next step.
  // Throws std::logic_error when a step traced other ops than the first step did.
  receipt::TraceStep finish_step();
  // The traced outputs in execution order, as the first step saw them.
  const std::vector<receipt::TraceColumn>& columns() const { return columns_; }

 private:
  const TensorSketcher& sketcher_for(TensorId tensor);

  const TensorTable& table_;
  std::vector<receipt::TraceColumn> columns_;
  std::vector<receipt::TraceColumn> step_columns_;  // this step's, checked against columns_
  std::vector<std::vector<float>> values_;          // this step's, by column (reused)
  std::vector<TensorId> tensors_;
  std::map<TensorId, TensorSketcher> sketchers_;
};

}  // namespace harness::run
