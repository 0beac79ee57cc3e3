#include "op_trace.h"

#include <stdexcept>

#include <fmt/format.h>
#include <tbb/parallel_for.h>

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
  const std::size_t slot = step_columns_.size();
  if (values_.size() <= slot) values_.resize(slot + 1);
  values_[slot].assign(value.begin(), value.end());
  step_columns_.push_back(std::move(column));
  tensors_.push_back(tensor);
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
  std::vector<const TensorSketcher*> sketchers;  // built here, serially; used in parallel
  for (TensorId t : tensors_) sketchers.push_back(&sketcher_for(t));
  receipt::TraceStep step;
  const std::size_t n = step_columns_.size();
  step.hashes.assign(n, 0);
  step.sketches.assign(n, {});
  tbb::parallel_for(std::size_t{0}, n, [&](std::size_t i) {
    step.hashes[i] = tensor_hash(values_[i]);
    step.sketches[i] = (*sketchers[i])(values_[i]);
  });
  step_columns_.clear();
  tensors_.clear();
  return step;
}

}  // namespace harness::run
