// Reductions whose result does not depend on the thread count or the scheduler.
//
// The range is cut into fixed-size blocks (the size is a constant, never derived from
// the number of threads); each block is summed sequentially by whichever thread gets it,
// into its own slot; the slots are then combined by a fixed pairwise tree. Only the slot
// a block writes depends on the block's index, so any schedule gives the same bits.
// (oneTBB's parallel_deterministic_reduce gives the same guarantee only with a
// simple_partitioner and a fixed grain; this makes the structure explicit and lets
// vector-valued partial sums use the same tree.)
#pragma once

#include <cstdint>
#include <vector>

#include <tbb/parallel_for.h>

namespace harness::kernels {

// Combines `count` partial vectors of `width` elements in place by a fixed pairwise tree:
// partial[i] += partial[i + stride] for stride = 1, 2, 4, ...; the result is partial 0.
template <typename T>
void combine_pairwise(std::vector<T>& partials, std::int64_t count, std::int64_t width) {
  for (std::int64_t stride = 1; stride < count; stride *= 2) {
    for (std::int64_t i = 0; i + stride < count; i += 2 * stride) {
      T* dst = partials.data() + i * width;
      const T* src = partials.data() + (i + stride) * width;
      for (std::int64_t j = 0; j < width; ++j) dst[j] += src[j];
    }
  }
}

// Sum of a scalar function over [0, n): blocks of `block` indices, block sums in
// Accumulator, a pairwise tree over the blocks.
template <typename Accumulator, typename TermFn>
Accumulator blocked_sum(std::int64_t n, std::int64_t block, TermFn term) {
  const std::int64_t blocks = (n + block - 1) / block;
  if (blocks == 0) return Accumulator{0};
  std::vector<Accumulator> partials(static_cast<std::size_t>(blocks), Accumulator{0});
  tbb::parallel_for(std::int64_t{0}, blocks, [&](std::int64_t b) {
    Accumulator s{0};
    const std::int64_t end = (b + 1) * block < n ? (b + 1) * block : n;
    for (std::int64_t i = b * block; i < end; ++i) s += term(i);
    partials[static_cast<std::size_t>(b)] = s;
  });
  combine_pairwise(partials, blocks, 1);
  return partials[0];
}

// Rows [0, rows) in blocks of `block`; `visit(row_begin, row_end, partial)` handles a block
// and adds its contribution into `partial` (width floats, zeroed). Returns the
// tree-combined vector sum of all partials (width floats).
template <typename VisitFn>
std::vector<float> blocked_row_sum(std::int64_t rows, std::int64_t block, std::int64_t width, VisitFn visit) {
  const std::int64_t blocks = (rows + block - 1) / block;
  std::vector<float> partials(static_cast<std::size_t>(blocks * width), 0.0f);
  tbb::parallel_for(std::int64_t{0}, blocks, [&](std::int64_t b) {
    const std::int64_t end = (b + 1) * block < rows ? (b + 1) * block : rows;
    visit(b * block, end, partials.data() + b * width);
  });
  combine_pairwise(partials, blocks, width);
  partials.resize(static_cast<std::size_t>(width));
  return partials;
}

// Fixed block sizes: constants of the numerics, part of what makes a golden portable.
inline constexpr std::int64_t kTokenBlock = 64;     // token reductions (bias, LayerNorm grads, loss)
inline constexpr std::int64_t kElementBlock = 4096; // element reductions (gradient norm)

}  // namespace harness::kernels
