#include "op_trace.h"

#include <stdexcept>

#include <fmt/format.h>
#include <tbb/parallel_invoke.h>

#include "numerics/philox.h"

namespace harness::run {

void OpTraceRecorder::on_trace(const OpSite& site, TensorId tensor, std::span<const float> value) {
  const TensorDesc& desc = table_[tensor];
  receipt::TraceColumn column{0, std::string(site.name), site.layer, std::string(to_string(site.phase)), desc.name,
                              std::string(to_string(desc.kind))};
  if (!step_columns_.empty()) {
    const receipt::TraceColumn& last = step_columns_.back();
    const bool same_op = last.op == column.op && last.layer == column.layer && last.phase == column.phase;
    column.op_index = same_op ? last.op_index : last.op_index + 1;
  }
  // Digested now, while the op's output is in cache and with no copy (a copy of every
  // output cost more than the digest): the sketch on this core, the hash (about half the
  // sketch's time) on the other.
  const TensorSketcher& sketcher = sketcher_for(tensor);
  std::uint64_t hash = 0;
  receipt::TensorSketch sketch;
  tbb::parallel_invoke([&] { sketch = sketcher(value); }, [&] { hash = tensor_hash(value); });
  step_columns_.push_back(std::move(column));  // after the digest: a throw leaves the step's rows aligned
  step_.hashes.push_back(hash);
  step_.sketches.push_back(sketch);
}

const TensorSketcher& OpTraceRecorder::sketcher_for(TensorId tensor) {
  auto it = sketchers_.find(tensor);
  if (it == sketchers_.end()) {
    const TensorDesc& d = table_[tensor];
    it = sketchers_.emplace(tensor, TensorSketcher(static_cast<std::size_t>(d.numel()), numerics::stream_id(d.name.c_str())))
             .first;
  }
  return it->second;
}

receipt::TraceStep OpTraceRecorder::finish_step() {
  if (columns_.empty()) {
    columns_ = step_columns_;
  } else if (step_columns_ != columns_) {
    throw std::logic_error(fmt::format("op trace: this step traced {} outputs, the first step {}; the model's op "
                                       "sequence must not change from step to step",
                                       step_columns_.size(), columns_.size()));
  }
  receipt::TraceStep step = std::move(step_);
  step_ = {};
  step_columns_.clear();
  return step;
}

}  // namespace harness::run
