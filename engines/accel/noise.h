// Nondeterminism on purpose: the reductions GPUs leave unordered, with their order taken
// from a named, recorded source.
//
// On a GPU, split-K GEMM partial sums, weight-gradient sums over tokens, attention-backward
// accumulation, loss means and gradient-norm sums are added in whatever order thread
// blocks finish (atomics) or in an order the library picks per launch. fp32 addition is
// not associative, so the last bits move from run to run. The accel engine reproduces
// that with three modes:
//   seeded  each reduction's order is a permutation drawn from Philox(noise_seed, step,
//           reduction index, output segment): different per run, replayable bit for bit
//           with the recorded seed;
//   racy    each partial result is added as soon as its task completes, under a lock per
//           output segment: the real completion order of parallel tasks, not replayable;
//   off     fixed order: the deterministic mode, bitwise reproducible.
// Every mode adds the same partial results; only the order of the additions differs.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace harness::accel {

enum class NoiseMode : std::uint8_t { Seeded, Racy, Off };
std::string_view to_string(NoiseMode mode);

// A fresh noise seed from the operating system's entropy (std::random_device).
std::uint64_t entropy_seed();

class NoiseSource {
 public:
  NoiseSource(NoiseMode mode, std::uint64_t seed) : mode_(mode), seed_(seed) {}
  NoiseMode mode() const { return mode_; }
  std::uint64_t seed() const { return seed_; }

  // Reductions are numbered in program order within a step; the model's op order is
  // fixed, so a replay numbers them the same way.
  void begin_step(int step) {
    step_ = step;
    next_reduction_ = 0;
  }
  std::uint64_t take_reduction_index() { return next_reduction_++; }

  // Writes the order in which `parts` partials are added for output segment `segment` of
  // reduction `reduction` (identity when off).
  void order(std::uint64_t reduction, std::uint64_t segment, int parts, int* order) const;

 private:
  NoiseMode mode_;
  std::uint64_t seed_;
  int step_ = 0;
  std::uint64_t next_reduction_ = 0;
};

// Which orders a reduction draws: its index in the step, and the number of its first
// output segment (an op that runs many small reductions in parallel tasks takes one index
// up front and gives each task its own segments, so no order depends on scheduling).
struct Reduction {
  std::uint64_t index;
  std::uint64_t first_segment = 0;
};

// Produces partial result `part` into `partial` (n floats, overwritten).
using PartFn = std::function<void(int part, float* partial)>;

// out[i] += sum over parts of partial_part[i], the additions ordered by the noise source
// per segment of output elements. `workspace` holds parts*n floats in seeded/off mode:
// pass a buffer that no concurrent call uses. Parts are produced in parallel tasks unless
// `serial_parts` (for small reductions inside a task that is already parallel); racy
// mode always uses tasks, since their completion order is its noise.
void reduce_parts(const NoiseSource& noise, Reduction reduction, int parts, std::int64_t n, float* out,
                  std::vector<float>& workspace, const PartFn& produce, bool serial_parts = false);

// Produces rows [row_begin, row_end) of partial result `part` into `partial`
// ((row_end - row_begin) * row_length floats, overwritten).
using RowPartFn = std::function<void(int part, int row_begin, int row_end, float* partial)>;

// reduce_parts for an output of `rows` rows of `row_length` whose parts can be produced a
// few rows at a time (a split-K GEMM): the rows are cut into tiles of whole noise segments,
// and each tile, a parallel task, produces its rows of every part and adds them in each
// segment's order while they are in cache. The same additions in the same order as
// reduce_parts; racy mode, and an output with fewer tiles than cores, go through
// reduce_parts (produce is then called with all rows).
// `workspace` is reduce_parts's, for those whole parts.
// `before` and `after` (optional) see each tile's rows [row_begin, row_end) of `out` before
// its parts are added and after, while the tile is in cache (an output's initial value, its
// rounding to a storage format); with whole parts they see all rows, in parallel blocks.
using RowsFn = std::function<void(int row_begin, int row_end)>;
void reduce_row_tiles(const NoiseSource& noise, Reduction reduction, int parts, int rows, int row_length, float* out,
                      std::vector<float>& workspace, const RowPartFn& produce, const RowsFn& before = {},
                      const RowsFn& after = {});
// Whether reduce_row_tiles produces row tiles for this output (else whole parts, each
// produced with all rows): what a caller preparing for the tiles needs to know.
bool row_tiles_apply(const NoiseSource& noise, int rows, int row_length);

// Outputs are permuted per segment of this many elements: a GPU's atomics and split-K
// reductions order each output tile on its own, not the whole tensor at once.
inline constexpr std::int64_t kNoiseSegment = 1024;

// How many parts of `chunk` elements cover `length` (at least 1).
inline int part_count(std::int64_t length, std::int64_t chunk) {
  return static_cast<int>(length <= chunk ? 1 : (length + chunk - 1) / chunk);
}

}  // namespace harness::accel
