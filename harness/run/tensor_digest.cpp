#include "tensor_digest.h"

#include <bit>

#include <tbb/parallel_for.h>
#include <xxhash.h>

#include "numerics/philox.h"

namespace harness::run {

std::uint64_t tensor_hash(std::span<const float> values) {
  static_assert(std::endian::native == std::endian::little, "hashes assume a little-endian host");
  return XXH3_64bits(values.data(), values.size_bytes());
}

receipt::TensorSketch tensor_sketch(std::span<const float> values, std::uint64_t salt) {
  using receipt::kSketchBlock;
  using receipt::kSketchWidth;
  receipt::TensorSketch sketch;
  double sum_squares = 0.0;
  const std::size_t n = values.size();
  for (std::size_t start = 0, block = 0; start < n; start += kSketchBlock, ++block) {
    const std::size_t end = start + kSketchBlock < n ? start + kSketchBlock : n;
    double block_sum = 0.0;
    for (std::size_t i = start; i < end; ++i) {
      const double x = values[i];
      block_sum += x;
      sum_squares += x * x;
    }
    const auto draw = numerics::philox_at(salt, 0, block)[0];
    const double sign = (draw >> 31) ? -1.0 : 1.0;
    sketch.projection[draw % kSketchWidth] += sign * block_sum;
  }
  sketch.l2 = __builtin_sqrt(sum_squares);
  return sketch;
}

// Hashes of params, grads, m, v and sketches of params and grads, for every parameter;
// tensors are digested in parallel, each by one task (the digest itself is sequential).
void digest_step(Engine& engine, const canary::Gpt2Canary& model, receipt::StepRecord& record) {
  const TensorTable& table = model.tensors();
  const auto& params = model.parameters();
  const TensorKind families[4] = {TensorKind::Parameter, TensorKind::Gradient, TensorKind::AdamM, TensorKind::AdamV};
  std::vector<std::span<const float>> views;  // read() is a host sync: do it before going parallel
  for (TensorKind kind : families) {
    for (TensorId p : params) views.push_back(engine.read(kind == TensorKind::Parameter ? p : table.shadow(p, kind)));
  }
  const std::size_t K = params.size();
  for (auto& h : record.hashes) h.assign(K, 0);
  for (auto& s : record.sketches) s.assign(K, {});
  tbb::parallel_for(std::size_t{0}, 4 * K, [&](std::size_t i) {
    const std::size_t family = i / K, k = i % K;
    record.hashes[family][k] = tensor_hash(views[i]);
    if (family < 2) {
      record.sketches[family][k] = tensor_sketch(views[i], numerics::stream_id(table[params[k]].name.c_str()));
    }
  });
}

}  // namespace harness::run
