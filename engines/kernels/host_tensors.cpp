#include "kernels/host_tensors.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

namespace harness {

void HostTensors::bind(const TensorTable& table) {
  table_ = &table;
  arenas_.assign(8, {});
  for (TensorKind kind : {TensorKind::Parameter, TensorKind::Gradient, TensorKind::AdamM, TensorKind::AdamV,
                          TensorKind::Activation, TensorKind::ActivationGrad, TensorKind::Scalar}) {
    arenas_[static_cast<std::size_t>(kind)].assign(static_cast<std::size_t>(table.arena_numel(kind)), 0.0f);
  }
  tokens_.assign(static_cast<std::size_t>(table.arena_numel(TensorKind::Input)), 0);
  std::size_t largest = 0;
  for (const TensorDesc& d : table.all()) largest = std::max(largest, static_cast<std::size_t>(d.numel()));
  scratch_.assign(largest, 0.0f);
}

float* HostTensors::f32(TensorId id) {
  const TensorDesc& d = desc(id);
  if (d.dtype != DType::F32) throw std::logic_error("tensor '" + d.name + "' is not fp32");
  return arenas_[static_cast<std::size_t>(d.kind)].data() + table_->arena_offset(id);
}

const std::int32_t* HostTensors::i32(TensorId id) const {
  if (desc(id).dtype != DType::I32) throw std::logic_error("tensor '" + desc(id).name + "' is not int32");
  return tokens_.data() + table_->arena_offset(id);
}

std::int64_t HostTensors::rows(TensorId id) const { return numel(id) / desc(id).shape.back(); }

void HostTensors::upload(TensorId id, std::span<const float> values) {
  if (static_cast<std::int64_t>(values.size()) != numel(id)) {
    throw std::invalid_argument("upload: size mismatch for '" + desc(id).name + "'");
  }
  std::copy(values.begin(), values.end(), f32(id));
}

void HostTensors::upload_tokens(TensorId id, std::span<const std::int32_t> tokens) {
  if (static_cast<std::int64_t>(tokens.size()) != numel(id)) {
    throw std::invalid_argument("upload_tokens: size mismatch for '" + desc(id).name + "'");
  }
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + table_->arena_offset(id));
}

void HostTensors::zero(TensorId id) {
  // Every gradient and activation gradient is zeroed at each step's start (tens of MB for
  // tiny, once 5% of a step on one core): large ones in parallel blocks, which moves no value.
  float* data = f32(id);
  const std::int64_t n = numel(id);
  constexpr std::int64_t kBlock = std::int64_t{1} << 16;
  if (n <= kBlock) {
    std::fill_n(data, n, 0.0f);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, kBlock), [data](const tbb::blocked_range<std::int64_t>& r) {
    std::fill(data + r.begin(), data + r.end(), 0.0f);
  });
}

}  // namespace harness
