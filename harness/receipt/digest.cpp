#include "receipt/digest.h"

#include <bit>

#include <xxhash.h>

#include "numerics/philox.h"

namespace harness::receipt {

std::uint64_t tensor_hash(std::span<const float> values) {
  static_assert(std::endian::native == std::endian::little, "hashes assume a little-endian host");
  return XXH3_64bits(values.data(), values.size_bytes());
}

std::uint64_t batch_hash(std::span<const std::int32_t> tokens) {
  return XXH3_64bits(tokens.data(), tokens.size_bytes());
}

std::uint64_t sketch_salt(const char* name) { return numerics::stream_id(name); }

TensorSketcher::TensorSketcher(std::size_t numel, std::uint64_t salt) {
  static_assert(kSketchWidth <= 128, "bucket must fit in 7 bits");
  const std::size_t blocks = (numel + kSketchBlock - 1) / kSketchBlock;
  block_codes_.resize(blocks);
  for (std::size_t j = 0; j < blocks; ++j) {
    const std::uint32_t draw = numerics::philox_at(salt, 0, j)[0];
    block_codes_[j] = static_cast<std::uint8_t>((draw % kSketchWidth) | ((draw >> 31) << 7));
  }
}

TensorSketch TensorSketcher::operator()(std::span<const float> values) const {
  TensorSketch sketch;
  // Four interleaved accumulators (element i goes to lane i % 4), combined as
  // (0 + 1) + (2 + 3): a fixed order, four times the throughput of one serial chain.
  double squares[4] = {0, 0, 0, 0};
  const std::size_t n = values.size();
  for (std::size_t start = 0, block = 0; start < n; start += kSketchBlock, ++block) {
    const std::size_t end = start + kSketchBlock < n ? start + kSketchBlock : n;
    double sums[4] = {0, 0, 0, 0};
    for (std::size_t i = start; i < end; ++i) {
      const double x = values[i];
      sums[i % 4] += x;
      squares[i % 4] += x * x;
    }
    const double block_sum = (sums[0] + sums[1]) + (sums[2] + sums[3]);
    const std::uint8_t code = block_codes_[block];
    sketch.projection[code & 0x7F] += (code & 0x80) ? -block_sum : block_sum;
  }
  sketch.l2 = __builtin_sqrt((squares[0] + squares[1]) + (squares[2] + squares[3]));
  return sketch;
}

}  // namespace harness::receipt
