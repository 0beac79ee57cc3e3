// Host memory for every tensor of a TensorTable: one fp32 arena per tensor kind and one
// int32 arena for inputs, laid out by the table. The storage of the eager engines
// (cpu-ref, accel); they differ in kernels and numerics, not in where tensors live.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "api/tensor_table.h"

namespace harness {

class HostTensors {
 public:
  void bind(const TensorTable& table);
  const TensorDesc& desc(TensorId id) const { return (*table_)[id]; }

  float* f32(TensorId id);
  const std::int32_t* i32(TensorId id) const;
  std::int64_t numel(TensorId id) const { return desc(id).numel(); }
  std::int64_t rows(TensorId id) const;  // product of all but the last dimension
  int last_dim(TensorId id) const { return static_cast<int>(desc(id).shape.back()); }

  void upload(TensorId id, std::span<const float> values);
  void upload_tokens(TensorId id, std::span<const std::int32_t> tokens);
  std::span<const float> view(TensorId id) { return {f32(id), static_cast<std::size_t>(numel(id))}; }
  void zero(TensorId id);

  // Room for the largest tensor of the table (GEMM packing, transposes).
  float* scratch() { return scratch_.data(); }

 private:
  const TensorTable* table_ = nullptr;
  std::vector<std::vector<float>> arenas_;  // indexed by TensorKind
  std::vector<std::int32_t> tokens_;        // the Input arena
  std::vector<float> scratch_;
};

}  // namespace harness
