// Batch invariance (harness/run/invariance.h): cpu-ref's per-row kernels give one sequence
// the same bits alone and at any row of any batch, on any thread count; accel's
// row-count split-K (--split-k rows) is caught at its GEMM and its smallest breaking size.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>

#include "accel/accel_kernels.h"
#include "canary.h"
#include "canary_run.h"
#include "invariance.h"

namespace harness::run {
namespace {

InvarianceReport check(const std::string& canary, const std::string& engine, EngineSettings settings, int max_batch,
                       int threads = 2) {
  InvarianceOptions o;
  o.canary = canary;
  o.engine = engine;
  o.engine_settings = std::move(settings);
  o.max_batch = max_batch;
  o.threads = threads;
  return check_batch_invariance(o);
}

TEST(BatchInvariance, CpuRefIsBitwiseForEveryBatchSizeAndThreadCount) {
  for (int threads : {1, 3}) {
    const InvarianceReport r = check("tiny", "cpu-ref", {}, 9, threads);
    ASSERT_EQ(r.checks.size(), 8u);
    for (const InvarianceCheck& c : r.checks) {
      EXPECT_TRUE(c.bitwise) << "batch " << c.batch_size << " at row " << c.position << ": " << c.first_op;
      EXPECT_EQ(c.max_logprob_delta, 0.0);
      EXPECT_GE(c.position, 0);
      EXPECT_LT(c.position, c.batch_size);
    }
    EXPECT_FALSE(r.smallest_breaking().has_value());
  }
}

// A forward op whose rows for the sequence are its own: accel with a fixed reduction order
// and fixed split-K is invariant too, and so is tpu-mesh's model-parallel plan.
TEST(BatchInvariance, FixedOrdersAreInvariantOnEveryEngine) {
  EXPECT_FALSE(check("micro", "accel", {"bf16", {{"noise", "off"}}}, 6).smallest_breaking());
  EXPECT_FALSE(check("micro", "tpu-mesh", {"", {{"mesh", "1x2"}, {"shard-plan", "tp"}}}, 4).smallest_breaking());
}

// The heuristic's chunk: a multiple of 16, never deeper than K rounded up, and never
// shorter for more rows (more tiles need fewer splits).
TEST(BatchInvariance, TheRowCountSplitKChunkGrowsWithTheRows) {
  for (int K : {16, 100, 128, 512, 4096}) {
    for (int N : {64, 384, 3000}) {
      int previous = 0;
      for (int M = 1; M <= 8192; M += 61) {
        const int chunk = accel::row_split_k_chunk(M, N, K);
        EXPECT_EQ(chunk % 16, 0);
        EXPECT_LE(chunk, (K + 15) / 16 * 16);
        EXPECT_GE(chunk, previous) << M << "x" << N << " over " << K;
        previous = chunk;
      }
    }
  }
}

// --split-k rows: the sizes below the first chunk change are bitwise; the first that is
// not is named with the GEMM whose chunk changed first in the forward.
TEST(BatchInvariance, RowCountSplitKBreaksAtItsGemmAndItsSmallestSize) {
  const InvarianceReport r = check("tiny", "accel", {"", {{"noise", "off"}, {"split-k", "rows"}}}, 8);
  const std::optional<int> smallest = r.smallest_breaking();
  ASSERT_TRUE(smallest.has_value());
  const canary::CanaryConfig config = load_run_canary("tiny");
  const int T = config.context_length, C = config.channels;
  // The first forward GEMM whose chunk moves between one sequence and `batch` of them.
  const auto moved = [&](int batch, int N, int K) {
    return accel::row_split_k_chunk(T, N, K) != accel::row_split_k_chunk(batch * T, N, K);
  };
  for (const InvarianceCheck& c : r.checks) {
    const bool gemm_moved = moved(c.batch_size, 3 * C, C) || moved(c.batch_size, C, C) ||
                            moved(c.batch_size, 4 * C, C) || moved(c.batch_size, C, 4 * C) ||
                            moved(c.batch_size, config.vocab_size, C);
    EXPECT_EQ(!c.bitwise, gemm_moved) << "batch " << c.batch_size;
  }
  const InvarianceCheck& first = r.checks.at(static_cast<std::size_t>(*smallest - 2));
  const std::unique_ptr<canary::Canary> model = canary::make_canary(config);  // owns the names below
  const std::vector<std::string>& ops = model->forward_op_names();
  EXPECT_NE(std::find(ops.begin(), ops.end(), first.first_op), ops.end()) << first.first_op;
  EXPECT_GT(first.max_logprob_delta, 0.0);
  EXPECT_EQ(first.first_op, "blocks.0.mlp.fc");  // 4C columns: its tiles grow first
}

// accel's seeded order, pinned for every run, is drawn per output segment: the sequence at
// row 0 sits in the segments it had alone and keeps its bits; at any other row it does not.
TEST(BatchInvariance, SeededOrderKeepsTheBitsOfRowZeroOnly) {
  const InvarianceReport r = check("tiny", "accel", {}, 8);
  ASSERT_TRUE(r.reduction_seed.has_value());
  bool row_zero_seen = false;
  for (const InvarianceCheck& c : r.checks) {
    EXPECT_EQ(c.bitwise, c.position == 0) << "batch " << c.batch_size << " at row " << c.position;
    row_zero_seen = row_zero_seen || c.position == 0;
  }
  EXPECT_TRUE(row_zero_seen);
}

TEST(BatchInvariance, BadInputIsAUsageError) {
  EXPECT_THROW(check("tiny", "cpu-ref", {}, 1), UsageError);
  EXPECT_THROW(check("no-such-canary", "cpu-ref", {}, 4), UsageError);
  EXPECT_THROW(check("micro", "accel", {"", {{"split-k", "sideways"}}}, 4), UsageError);
  EXPECT_THROW(check("micro", "tpu-mesh", {"", {{"mesh", "2x1"}}}, 4), UsageError);  // one sequence on two data shards
}

}  // namespace
}  // namespace harness::run
