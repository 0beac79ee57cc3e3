#include "noise.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <numeric>
#include <random>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "api/receipt_description.h"
#include "numerics/isa_dispatch.h"
#include "numerics/philox.h"

namespace harness::accel {
namespace {

void add_in_order(const float* partials, std::int64_t n, float* out, const int* order, int parts, std::int64_t begin,
                  std::int64_t end) {
  // Element by element, parts in `order`: the same additions at every vector width.
  numerics::run_widest([&]() __attribute__((always_inline)) {
    for (int j = 0; j < parts; ++j) {
      const float* p = partials + static_cast<std::int64_t>(order[j]) * n;
      for (std::int64_t i = begin; i < end; ++i) out[i] += p[i];
    }
  });
}

// Each part, as soon as it is done, adds itself into the output segment by segment under
// a per-segment lock (atomic accumulation at tile granularity, as a split-K kernel's
// atomic epilogue): which part adds first to a segment is whichever finished first.
void reduce_racy(int parts, std::int64_t n, float* out, const PartFn& produce) {
  const std::int64_t segments = (n + kNoiseSegment - 1) / kNoiseSegment;
  std::unique_ptr<std::atomic_flag[]> locks(new std::atomic_flag[static_cast<std::size_t>(segments)]);
  for (std::int64_t s = 0; s < segments; ++s) locks[s].clear();
  tbb::parallel_for(0, parts, [&](int part) {
    std::unique_ptr<float[]> partial(new float[static_cast<std::size_t>(n)]);  // produce() overwrites it
    produce(part, partial.get());
    for (std::int64_t s = 0; s < segments; ++s) {
      while (locks[s].test_and_set(std::memory_order_acquire)) {
        locks[s].wait(true, std::memory_order_relaxed);
      }
      const std::int64_t end = (s + 1) * kNoiseSegment < n ? (s + 1) * kNoiseSegment : n;
      for (std::int64_t i = s * kNoiseSegment; i < end; ++i) out[i] += partial[i];
      locks[s].clear(std::memory_order_release);
      locks[s].notify_one();
    }
  });
}

}  // namespace

std::string_view to_string(NoiseMode mode) {
  switch (mode) {
    case NoiseMode::Seeded: return kSeededOrder;  // the receipt's words for a reduction order
    case NoiseMode::Racy: return kRacyOrder;
    case NoiseMode::Off: return "off";
  }
  return "off";
}

std::uint64_t entropy_seed() {
  std::random_device device;
  return (static_cast<std::uint64_t>(device()) << 32) | device();
}

void NoiseSource::order(std::uint64_t reduction, std::uint64_t segment, int parts, int* order) const {
  std::iota(order, order + parts, 0);
  if (mode_ != NoiseMode::Seeded || parts < 2) return;
  // Fisher-Yates with Philox words; the stream names the step and the reduction.
  const std::uint64_t stream = (static_cast<std::uint64_t>(step_) << 32) ^ reduction;
  numerics::PhiloxBlock words{};
  for (int i = parts - 1, used = 4; i > 0; --i, ++used) {
    if (used == 4) {
      words = numerics::philox_at(seed_, stream, (segment << 20) + static_cast<std::uint64_t>(i / 4));
      used = 0;
    }
    const auto j = static_cast<int>((static_cast<std::uint64_t>(words[used]) * static_cast<std::uint64_t>(i + 1)) >> 32);
    std::swap(order[i], order[j]);
  }
}

void reduce_parts(const NoiseSource& noise, Reduction reduction, int parts, std::int64_t n, float* out,
                  std::vector<float>& workspace, const PartFn& produce, bool serial_parts) {
  if (noise.mode() == NoiseMode::Racy) {
    reduce_racy(parts, n, out, produce);
    return;
  }
  workspace.resize(static_cast<std::size_t>(parts) * static_cast<std::size_t>(n));
  const auto produce_part = [&](int part) { produce(part, workspace.data() + static_cast<std::int64_t>(part) * n); };
  const auto add_segment = [&](std::int64_t segment) {
    std::vector<int> order(static_cast<std::size_t>(parts));
    noise.order(reduction.index, reduction.first_segment + static_cast<std::uint64_t>(segment), parts, order.data());
    const std::int64_t end = (segment + 1) * kNoiseSegment < n ? (segment + 1) * kNoiseSegment : n;
    add_in_order(workspace.data(), n, out, order.data(), parts, segment * kNoiseSegment, end);
  };
  const std::int64_t segments = (n + kNoiseSegment - 1) / kNoiseSegment;
  if (serial_parts) {
    for (int part = 0; part < parts; ++part) produce_part(part);
    for (std::int64_t segment = 0; segment < segments; ++segment) add_segment(segment);
    return;
  }
  tbb::parallel_for(0, parts, produce_part);
  tbb::parallel_for(std::int64_t{0}, segments, add_segment);
}

// About this many rows a tile: its parts stay in cache, and a GEMM has tiles for every core.
constexpr std::int64_t kTileRowsTarget = 32;

namespace {

// A tile starts on a segment boundary: its row count is a multiple of the rows that make
// whole segments.
int tile_rows_for(int row_length) {
  const std::int64_t aligned = kNoiseSegment / std::gcd(static_cast<std::int64_t>(row_length), kNoiseSegment);
  return static_cast<int>(aligned * std::max<std::int64_t>(1, kTileRowsTarget / aligned));
}

}  // namespace

bool row_tiles_apply(const NoiseSource& noise, int rows, int row_length) {
  const int tile_rows = tile_rows_for(row_length);
  const int tiles = (rows + tile_rows - 1) / tile_rows;
  // Racy mode's noise is the parts' completion order; and too few tiles to keep every
  // core busy (a row length with few factors of 2 makes tiles of up to 1024 rows) would
  // serialise the GEMM: both take whole parts, each produced by a parallel GEMM.
  return noise.mode() != NoiseMode::Racy && tiles >= tbb::this_task_arena::max_concurrency();
}

void reduce_row_tiles(const NoiseSource& noise, Reduction reduction, int parts, int rows, int row_length, float* out,
                      std::vector<float>& workspace, const RowPartFn& produce, const RowsFn& before,
                      const RowsFn& after) {
  const std::int64_t n = static_cast<std::int64_t>(rows) * row_length;
  const int tile_rows = tile_rows_for(row_length);
  const int tiles = (rows + tile_rows - 1) / tile_rows;
  if (!row_tiles_apply(noise, rows, row_length)) {
    const auto all_rows = [&](const RowsFn& fn) {
      if (fn) tbb::parallel_for(tbb::blocked_range<int>(0, rows, tile_rows), [&](const auto& r) { fn(r.begin(), r.end()); });
    };
    all_rows(before);
    reduce_parts(noise, reduction, parts, n, out, workspace,
                 [&](int part, float* partial) { produce(part, 0, rows, partial); });
    all_rows(after);
    return;
  }
  tbb::parallel_for(0, tiles, [&](int tile) {
    const int first = tile * tile_rows, last = std::min(rows, first + tile_rows);
    const std::int64_t begin = static_cast<std::int64_t>(first) * row_length;
    const std::int64_t length = static_cast<std::int64_t>(last - first) * row_length;
    // Uninitialised: produce() overwrites every element (zeroing it cost 5% of a step).
    const std::unique_ptr<float[]> partials(new float[static_cast<std::size_t>(parts) * static_cast<std::size_t>(length)]);
    for (int part = 0; part < parts; ++part) produce(part, first, last, partials.get() + part * length);
    if (before) before(first, last);
    std::vector<int> order(static_cast<std::size_t>(parts));
    for (std::int64_t at = 0; at < length; at += kNoiseSegment) {
      noise.order(reduction.index, reduction.first_segment + static_cast<std::uint64_t>((begin + at) / kNoiseSegment),
                  parts, order.data());
      add_in_order(partials.get(), length, out + begin, order.data(), parts, at, std::min(length, at + kNoiseSegment));
    }
    if (after) after(first, last);
  });
}

}  // namespace harness::accel
