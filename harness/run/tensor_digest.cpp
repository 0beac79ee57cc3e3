#include "tensor_digest.h"

#include <bit>

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

}  // namespace harness::run
