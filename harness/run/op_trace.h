// Op traces (`--trace ops`): the engine hands over every traced op output (TraceSink);
// this recorder numbers the ops and digests each output as it arrives into the step's
// /trace row: per output its XXH3-64 hash and value sketch, the same digest the receipt's
// /hashes and /sketches use (docs/receipt-schema.md, "/trace").
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

  // Digests the value during the call (it is the engine's, valid only until the call
  // returns); consecutive calls with one site are the outputs of one op.
  void on_trace(const OpSite& site, TensorId tensor, std::span<const float> value) override;

  // The step's row; starts the next step.
  // Throws std::logic_error when a step traced other ops than the first step did.
  receipt::TraceStep finish_step();
  // The traced outputs in execution order, as the first step saw them.
  const std::vector<receipt::TraceColumn>& columns() const { return columns_; }

 private:
  const TensorSketcher& sketcher_for(TensorId tensor);

  const TensorTable& table_;
  std::vector<receipt::TraceColumn> columns_;
  std::vector<receipt::TraceColumn> step_columns_;  // this step's, checked against columns_
  receipt::TraceStep step_;                          // this step's digests, by column
  std::map<TensorId, TensorSketcher> sketchers_;
};

}  // namespace harness::run
