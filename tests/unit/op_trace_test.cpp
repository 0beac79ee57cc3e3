// Op traces (`--trace ops`): every engine traces the same op identities in the same order;
// tpu-mesh assembles global values, so on one device (every plan) and across its compile
// modes its traces are cpu-ref's bit for bit; tracing never changes a run's numbers; the
// trace digest is the receipt's digest (the optimizer's output is /hashes/params); traces
// are identical on any thread count.
#include <bit>
#include <string>

#include <gtest/gtest.h>

#include "receipt/hdf5_file.h"
#include "receipt_bits.h"
#include "tensor_digest.h"
#include "verdict.h"

namespace harness::run {
namespace {

using harness::testing::lane;
using harness::testing::run_and_read;
using harness::testing::scratch;

RunOptions traced(RunOptions o) {
  o.trace = TraceLevel::kOps;
  return o;
}

check::OpTrace trace_of(const RunOptions& options, const std::string& tag) {
  run_and_read(options, tag);
  const check::ReceiptData data = check::load_receipt(scratch().path(tag + ".h5"));
  EXPECT_TRUE(data.trace.has_value()) << tag;
  return data.trace.value_or(check::OpTrace{});
}

TEST(OpTrace, EveryEngineTracesTheSameOpsInTheSameOrder) {
  const check::OpTrace reference = trace_of(traced(lane("micro", 2, 2)), "trace_cpu");
  ASSERT_FALSE(reference.columns.empty());
  EXPECT_EQ(reference.rows(), 2);
  // forward (one output per op), backward (input then parameter gradients), optimizer
  EXPECT_EQ(reference.columns.front().op, "embedding");
  EXPECT_EQ(reference.columns.front().phase, "forward");
  EXPECT_EQ(reference.columns.back().phase, "optimizer");
  EXPECT_EQ(reference.columns.back().tensor, "lnf.bias");
  for (std::size_t c = 1; c < reference.columns.size(); ++c) {
    const int step = reference.columns[c].op_index - reference.columns[c - 1].op_index;
    EXPECT_TRUE(step == 0 || step == 1) << c;  // ops are numbered densely, outputs share their op's
  }
  const std::vector<RunOptions> others = {
      traced(lane("micro", 2, 2, "accel", "bf16,fp8=all", {{"noise-seed", "5"}})),
      traced(lane("micro", 2, 2, "tpu-mesh", "", {{"mesh", "2x2"}, {"shard-plan", "tp"}})),
      traced(lane("micro", 2, 2, "tpu-mesh", "", {{"mesh", "1x1"}, {"grad-accum", "2"}, {"compile-mode", "microstep"}}))};
  for (std::size_t i = 0; i < others.size(); ++i) {
    EXPECT_EQ(trace_of(others[i], "trace_other_" + std::to_string(i)).columns, reference.columns) << others[i].engine;
  }
}

TEST(OpTrace, OneMeshDeviceTracesCpuRefBitForBitOnEveryPlan) {
  const check::OpTrace reference = trace_of(traced(lane("micro", 3, 2)), "trace_cpu_ref");
  for (const char* plan : {"dp", "tp", "zero3"}) {
    const check::OpTrace mesh =
        trace_of(traced(lane("micro", 3, 2, "tpu-mesh", "", {{"shard-plan", plan}})), std::string("trace_mesh_") + plan);
    EXPECT_EQ(mesh.hashes, reference.hashes) << plan;
    EXPECT_EQ(mesh.projection, reference.projection) << plan;
  }
}

TEST(OpTrace, MicroBatchedStepsAssembleTheSameTraceInBothCompileModes) {
  const auto accum = [](const char* mode) {
    return traced(lane("micro", 3, 2, "tpu-mesh", "", {{"mesh", "2x1"}, {"grad-accum", "1"}, {"compile-mode", mode}}));
  };
  EXPECT_EQ(trace_of(accum("step"), "trace_step").hashes, trace_of(accum("microstep"), "trace_microstep").hashes);
  const auto k2 = [](const char* mode) {
    return traced(lane("micro", 3, 2, "tpu-mesh", "", {{"grad-accum", "2"}, {"compile-mode", mode}}));
  };
  const check::OpTrace step = trace_of(k2("step"), "trace_k2_step");
  EXPECT_EQ(step.hashes, trace_of(k2("microstep"), "trace_k2_microstep").hashes);
  // Rows of an activation do not depend on how the batch is split: at step 0 (the same
  // parameters) every forward output before the loss, which sums over micro-batches, is
  // cpu-ref's, assembled in row order.
  const check::OpTrace reference = trace_of(traced(lane("micro", 1, 2)), "trace_k2_reference");
  int forward = 0;
  while (step.columns[static_cast<std::size_t>(forward)].op != "loss") ++forward;
  ASSERT_GT(forward, 10);
  EXPECT_TRUE(std::equal(step.hashes.begin(), step.hashes.begin() + forward, reference.hashes.begin()));
  EXPECT_NE(step.hashes[static_cast<std::size_t>(forward)], reference.hashes[static_cast<std::size_t>(forward)]);
}

// Data-parallel shards with micro-batches: each device's micro-batch k is its own k-th
// slice of rows; assembled, every forward output before the loss is cpu-ref's at step 0.
TEST(OpTrace, DataShardedMicroBatchesAssembleRowsInBatchOrder) {
  const check::OpTrace reference = trace_of(traced(lane("tiny", 1, 2)), "trace_tiny_reference");
  const check::OpTrace sharded = trace_of(
      traced(lane("tiny", 1, 2, "tpu-mesh", "", {{"mesh", "2x1"}, {"grad-accum", "2"}, {"compile-mode", "microstep"}})),
      "trace_tiny_2x1_k2");
  std::size_t forward = 0;
  while (sharded.columns[forward].op != "loss") ++forward;
  EXPECT_TRUE(std::equal(sharded.hashes.begin(), sharded.hashes.begin() + static_cast<std::ptrdiff_t>(forward),
                         reference.hashes.begin()));
}

// A traced program (its scalar traces have no dimensions) is stored in and loaded from the
// persistent compile cache like any other: a warm run compiles nothing.
TEST(OpTrace, TracedProgramsLoadFromThePersistentCache) {
  const std::string cache = scratch().path("trace_cache");
  const RunOptions o = traced(lane("micro", 2, 2, "tpu-mesh", "", {{"mesh", "2x2"}, {"shard-plan", "tp"}, {"compile-cache", cache}}));
  run_and_read(o, "trace_cold");
  run_and_read(o, "trace_warm");
  const receipt::ReceiptReader warm(scratch().path("trace_warm.h5"));
  for (double v : h5::read_f64(warm.file(), "/compile/UncachedCompile")) EXPECT_EQ(v, 0.0);
  for (double v : h5::read_f64(warm.file(), "/compile/PersistentCacheDeserializeFailure")) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(h5::read_f64(warm.file(), "/compile/PersistentCacheHit").at(0), 1.0);
}

TEST(OpTrace, TracingNeverChangesTheNumbers) {
  for (const RunOptions& o : {lane("micro", 3, 2), lane("micro", 3, 2, "accel", "bf16", {{"noise-seed", "9"}}),
                              lane("micro", 3, 2, "tpu-mesh", "", {{"mesh", "2x2"}, {"shard-plan", "zero3"}})}) {
    EXPECT_TRUE(run_and_read(o, "untraced").same_numbers(run_and_read(traced(o), "traced"))) << o.engine;
  }
}

TEST(OpTrace, TheOptimizerOutputsAreTheRecordedParameters) {
  const RunOptions o = traced(lane("micro", 3, 2, "tpu-mesh", "", {{"mesh", "2x2"}, {"shard-plan", "zero3"}}));
  const check::OpTrace trace = trace_of(o, "trace_vs_hashes");
  const check::ReceiptData data = check::load_receipt(scratch().path("trace_vs_hashes.h5"));
  const std::size_t K = data.tensors.size(), R = trace.columns.size();
  int checked = 0;
  for (std::size_t c = 0; c < R; ++c) {
    const receipt::TraceColumn& col = trace.columns[c];
    for (int s = 0; s < trace.rows(); ++s) {
      const std::size_t at = static_cast<std::size_t>(s) * R + c;
      if (col.phase == "optimizer" && col.kind == "parameter") {
        const auto k = static_cast<std::size_t>(
            std::find(data.tensors.begin(), data.tensors.end(), col.tensor) - data.tensors.begin());
        ASSERT_LT(k, K) << col.tensor;
        EXPECT_EQ(trace.hashes[at], data.hashes.at("params")[static_cast<std::size_t>(s) * K + k]) << col.tensor;
        ++checked;
      } else if (col.tensor == "grad_norm") {
        const float norm = static_cast<float>(data.grad_norm[static_cast<std::size_t>(s)]);
        EXPECT_EQ(trace.hashes[at], tensor_hash(std::span<const float>(&norm, 1)));
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, static_cast<int>(K + 1) * trace.rows());
}

TEST(OpTrace, TracesAreIdenticalOnAnyThreadCount) {
  const check::OpTrace one = trace_of(traced(lane("micro", 2, 1, "accel", "bf16", {{"noise-seed", "4"}})), "trace_1t");
  const check::OpTrace two = trace_of(traced(lane("micro", 2, 2, "accel", "bf16", {{"noise-seed", "4"}})), "trace_2t");
  EXPECT_EQ(one.hashes, two.hashes);
  EXPECT_EQ(one.l2, two.l2);
  EXPECT_EQ(one.projection, two.projection);
}

}  // namespace
}  // namespace harness::run
