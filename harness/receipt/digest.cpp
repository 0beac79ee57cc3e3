#include "receipt/digest.h"

#include <bit>
#include <cstring>

#include "numerics/isa_dispatch.h"
#include "numerics/philox.h"
#include "receipt/xxh3_dispatch.h"

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

namespace {

// Four doubles (GCC/Clang vector extension): lane l is accumulator l of the loop below, so
// a vector add is the four lanes' own additions, in the same order as one at a time.
using Doubles4 = double __attribute__((vector_size(32)));
using Floats4 = float __attribute__((vector_size(16)));

__attribute__((always_inline)) inline Doubles4 load4(const float* at) {
  Floats4 x4;
  std::memcpy(&x4, at, sizeof x4);
  return __builtin_convertvector(x4, Doubles4);  // exact
}

__attribute__((always_inline)) inline double combine(const Doubles4& lanes) {
  return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
}

// How far ahead of the block it sums the sketch asks for the data (4 KB). A traced op's
// output was just written by the op's threads, part of it into the other core's cache, and
// the sketch, bound by its addition chain, reads it too slowly for the hardware prefetcher
// to run ahead on its own: asking early took a traced tiny run from +30% to +25% over the
// untraced one (docs/performance.md, "Op traces"). A prefetch changes no value.
constexpr std::size_t kPrefetchAhead = 1024;

// Four interleaved accumulators (element i goes to lane i % 4), combined as
// (0 + 1) + (2 + 3): a fixed order, four times the throughput of one serial chain. Whole
// blocks run as vectors of four (elements i..i+3 are lanes 0..3, since blocks start at
// multiples of 4): the same additions, in the same order, as the element loop of the last,
// partial block. (python/canary_harness/receipts/digest.py follows the same order.)
__attribute__((always_inline)) inline void sketch_pass(std::span<const float> values, const std::uint8_t* codes,
                                                       TensorSketch& sketch) {
  Doubles4 squares = {0, 0, 0, 0};
  const std::size_t n = values.size(), whole = n - n % kSketchBlock;
  for (std::size_t start = 0; start < whole; start += kSketchBlock) {
    if (start + kPrefetchAhead + kSketchBlock <= n) {  // the block kPrefetchAhead elements on: two lines
      __builtin_prefetch(values.data() + start + kPrefetchAhead);
      __builtin_prefetch(values.data() + start + kPrefetchAhead + kSketchBlock / 2);
    }
    Doubles4 sums = {0, 0, 0, 0};
    for (std::size_t i = start; i < start + kSketchBlock; i += 4) {
      const Doubles4 x = load4(values.data() + i);
      sums += x;
      squares += x * x;  // exact: 24-bit significands
    }
    const double block_sum = combine(sums);
    const std::uint8_t code = codes[start / kSketchBlock];
    sketch.projection[code & 0x7F] += (code & 0x80) ? -block_sum : block_sum;
  }
  if (whole < n) {  // the last block, shorter than kSketchBlock
    double sums[4] = {0, 0, 0, 0};
    for (std::size_t i = whole; i < n; ++i) {
      const double x = values[i];
      sums[i % 4] += x;
      squares[i % 4] += x * x;
    }
    const double block_sum = (sums[0] + sums[1]) + (sums[2] + sums[3]);
    const std::uint8_t code = codes[whole / kSketchBlock];
    sketch.projection[code & 0x7F] += (code & 0x80) ? -block_sum : block_sum;
  }
  sketch.l2 = __builtin_sqrt(combine(squares));
}

}  // namespace

TensorSketch TensorSketcher::operator()(std::span<const float> values) const {
  TensorSketch sketch;
  // Built for the widest ISA (numerics/isa_dispatch.h): each vector operation is four
  // independent IEEE double operations, so every build gives the baseline's bits.
  numerics::run_widest([&]() __attribute__((always_inline)) { sketch_pass(values, block_codes_.data(), sketch); });
  return sketch;
}

}  // namespace harness::receipt
