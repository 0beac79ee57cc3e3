// The accel engine's run-level properties: deterministic mode is bitwise reproducible,
// seeded noise replays bit for bit from the recorded seed and is real without one, and
// the numerics features drift from cpu-ref by the amounts docs/engines/accel.md records.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <tbb/task_arena.h>

#include "accel_kernels.h"
#include "limited_accumulator_gemm.h"
#include "numerics/formats.h"
#include "numerics/philox.h"
#include "receipt_bits.h"
#include "registry.h"

namespace harness::accel {
namespace {

using harness::testing::lane;
using harness::testing::ReceiptBits;
using harness::testing::run_and_read;

const char* kAllFeatures = "bf16,fp8=all";

// tiny, not micro: micro's 32 tokens and 32 channels fit one chunk of most reductions,
// which leaves the order nothing to change. tiny has 2-8 parts per reduction.
TEST(AccelNoise, OffIsBitwiseIdenticalAcrossThreadCountsAndRepeats) {
  const std::map<std::string, std::string> off{{"noise", "off"}};
  const ReceiptBits one = run_and_read(lane("tiny", 3, 1, "accel", kAllFeatures, off), "off1");
  EXPECT_TRUE(one.same_numbers(run_and_read(lane("tiny", 3, 3, "accel", kAllFeatures, off), "off3")));
  EXPECT_TRUE(one.same_numbers(run_and_read(lane("tiny", 3, 8, "accel", kAllFeatures, off), "off8")));
  EXPECT_TRUE(one.same_numbers(run_and_read(lane("tiny", 3, 2, "accel", kAllFeatures, off), "off2")));
  EXPECT_EQ(one.noise_seed, "");  // no seed: nothing to replay
}

// The same contract on micro, small enough for ThreadSanitizer (scripts/tsan.sh): every
// noise mode's tasks on 3 threads against 1, with bf16 and every FP8 zone. micro leaves
// the orders little to change; what this run checks is the threads' access to shared state.
TEST(AccelNoise, MicroRunsEveryNoiseModeOnOneAndThreeThreads) {
  for (const char* mode : {"off", "seeded"}) {
    std::map<std::string, std::string> flags{{"noise", mode}};
    if (std::string(mode) == "seeded") flags["noise-seed"] = "11";
    const ReceiptBits one = run_and_read(lane("micro", 3, 1, "accel", kAllFeatures, flags), std::string("micro1_") + mode);
    const ReceiptBits three = run_and_read(lane("micro", 3, 3, "accel", kAllFeatures, flags), std::string("micro3_") + mode);
    EXPECT_TRUE(one.same_numbers(three)) << mode;
  }
  const ReceiptBits off = run_and_read(lane("micro", 3, 1, "accel", kAllFeatures, {{"noise", "off"}}), "micro_off");
  const ReceiptBits racy = run_and_read(lane("micro", 3, 3, "accel", kAllFeatures, {{"noise", "racy"}}), "micro_racy");
  for (std::size_t s = 0; s < off.loss.size(); ++s) EXPECT_NEAR(racy.loss[s], off.loss[s], 1e-5) << s;
}

TEST(AccelNoise, SeededRunReplaysBitForBitFromItsRecordedSeed) {
  const ReceiptBits first = run_and_read(lane("tiny", 3, 2, "accel", kAllFeatures), "seeded");
  ASSERT_FALSE(first.noise_seed.empty());
  const std::map<std::string, std::string> replay{{"noise-seed", first.noise_seed}};
  const ReceiptBits again = run_and_read(lane("tiny", 3, 1, "accel", kAllFeatures, replay), "replay1");
  EXPECT_TRUE(first.same_numbers(again));
  EXPECT_EQ(again.noise_seed, first.noise_seed);
  EXPECT_TRUE(first.same_numbers(run_and_read(lane("tiny", 3, 3, "accel", kAllFeatures, replay), "replay3")));
}

TEST(AccelNoise, TwoRunsWithoutASeedDiffer) {
  const ReceiptBits a = run_and_read(lane("tiny", 2, 2, "accel", "bf16"), "free_a");
  const ReceiptBits b = run_and_read(lane("tiny", 2, 2, "accel", "bf16"), "free_b");
  EXPECT_NE(a.noise_seed, b.noise_seed);
  EXPECT_EQ(a.batches, b.batches);   // same data
  EXPECT_NE(a.grads, b.grads);       // different reduction orders
}

TEST(AccelNoise, EveryModeAddsTheSamePartialsOnlyInAnotherOrder) {
  // Racy and seeded runs land within fp32 reordering noise of the deterministic run.
  const auto off = run_and_read(lane("tiny", 3, 2, "accel", "", {{"noise", "off"}}), "fp32_off");
  for (const char* mode : {"racy", "seeded"}) {
    const auto noisy = run_and_read(lane("tiny", 3, 2, "accel", "", {{"noise", mode}}), std::string("fp32_") + mode);
    // (Only seeded must differ: racy equals off whenever one thread happens to run every part.)
    if (std::string(mode) == "seeded") {
      EXPECT_NE(noisy.grads, off.grads) << "the order changed nothing";
    }
    for (std::size_t s = 0; s < off.loss.size(); ++s) {
      EXPECT_NEAR(noisy.loss[s], off.loss[s], 1e-5 * off.loss[s]) << mode << " step " << s;
    }
  }
}

// Largest |loss - reference loss| over the run.
double max_loss_drift(const ReceiptBits& run, const ReceiptBits& reference) {
  double worst = 0;
  for (std::size_t s = 0; s < reference.loss.size(); ++s) worst = std::max(worst, std::fabs(run.loss[s] - reference.loss[s]));
  return worst;
}

TEST(AccelDrift, Bf16StaysWithinItsToleranceAndFp8MovesFurther) {
  // 30 steps of tiny with deterministic reductions: the drift is the numerics, not noise.
  // Over 100 steps docs/engines/accel.md measures bf16 max 1.3e-3, fp8=all max 2.1e-2.
  const std::map<std::string, std::string> off{{"noise", "off"}};
  const ReceiptBits reference = run_and_read(lane("tiny", 30, 2), "drift_ref");
  const ReceiptBits bf16 = run_and_read(lane("tiny", 30, 2, "accel", "bf16", off), "drift_bf16");
  const ReceiptBits fp8 = run_and_read(lane("tiny", 30, 2, "accel", kAllFeatures, off), "drift_fp8");
  EXPECT_NE(bf16.loss, reference.loss);  // bf16 is really on
  const double bf16_drift = max_loss_drift(bf16, reference), fp8_drift = max_loss_drift(fp8, reference);
  EXPECT_LT(bf16_drift, 1e-2);
  EXPECT_GT(fp8_drift, bf16_drift);
  EXPECT_LT(fp8_drift, 5e-2);
  EXPECT_EQ(bf16.batches, reference.batches);
}

// ---- the limited FP8 accumulator ------------------------------------------------------------

std::vector<float> random_matrix(int rows, int cols, std::uint64_t stream, bool positive) {
  std::vector<float> m(static_cast<std::size_t>(rows) * cols);
  for (std::size_t i = 0; i < m.size(); ++i) {
    const double z = numerics::normal_at(9, stream, i);
    m[i] = static_cast<float>(positive ? std::fabs(z) : z);
  }
  return m;
}

// ---- split_k_gemm's output: started and stored on each row tile ---------------------------

// The output's start (zero, a bias row, the current values) and its bf16 rounding, done on
// each row tile inside the reduction, give what a fill before it and a rounding pass after
// it give, bit for bit: with row tiles (M = 512) and whole parts (M = 5 on 2 threads: too few
// tiles), deterministic and seeded orders, the fp32 and the limited accumulator, FP8's
// descale, on 1 and 2 threads.
TEST(SplitKOutput, TileStartAndRoundingAreThePassesBeforeAndAfterBitForBit) {
  using Start = SplitKOutput::Start;
  const int N = 96, K = 200;  // 4 split-K parts of 64, the last one short
  const auto B = random_matrix(K, N, 6, false), bias = random_matrix(1, N, 7, false);
  for (const int threads : {1, 2}) {
    tbb::task_arena arena(threads);  // what row_tiles_apply reads: the arena's concurrency
    arena.execute([&] {
      for (const int M : {5, 512}) {
        const auto A = random_matrix(M, K, 5, false), initial = random_matrix(M, N, 8, false);
        const bool whole_parts = M == 5 && threads == 2;
        ASSERT_EQ(row_tiles_apply(NoiseSource(NoiseMode::Off, 0), M, N), !whole_parts) << threads << " threads, M " << M;
        for (const NoiseMode mode : {NoiseMode::Off, NoiseMode::Seeded}) {
          for (const Start start : {Start::Accumulate, Start::Zero, Start::Row}) {
            for (const bool round : {false, true}) {
              for (const GemmNumerics gemm_numerics : {GemmNumerics{1.0f, 0}, GemmNumerics{0.25f, 0}, GemmNumerics{0.25f, 16}}) {
                NoiseSource noise(mode, 99);
                std::vector<float> workspace;
                ReduceContext ctx{noise, workspace};
                std::vector<float> fused = initial, passes = initial;
                noise.begin_step(3);
                split_k_gemm(ctx, M, N, K, A.data(), K, B.data(), N, fused.data(), kSplitKChunk, gemm_numerics,
                             {start, start == Start::Row ? bias.data() : nullptr, round});
                for (int m = 0; m < M && start != Start::Accumulate; ++m) {
                  for (int n = 0; n < N; ++n) passes[m * N + n] = start == Start::Row ? bias[n] : 0.0f;
                }
                noise.begin_step(3);
                split_k_gemm(ctx, M, N, K, A.data(), K, B.data(), N, passes.data(), kSplitKChunk, gemm_numerics);
                if (round) numerics::round_to_bf16_inplace(passes.data(), static_cast<std::int64_t>(passes.size()));
                ASSERT_EQ(fused, passes) << threads << " threads, M " << M << ", start " << static_cast<int>(start)
                                         << ", round " << round << ", descale " << gemm_numerics.output_scale
                                         << ", limited " << gemm_numerics.limited_interval;
              }
            }
          }
        }
      }
    });
  }
}

// Current FP8 scaling quantises each operand after its amax (two passes), delayed scaling in
// one: both are deterministic across thread counts, and they are different recipes.
TEST(AccelFp8, CurrentScalingRunsAndReplaysAcrossThreadCounts) {
  const std::map<std::string, std::string> current{{"noise", "off"}, {"fp8-recipe", "current"}};
  const ReceiptBits one = run_and_read(lane("tiny", 3, 1, "accel", kAllFeatures, current), "current1");
  EXPECT_TRUE(one.same_numbers(run_and_read(lane("tiny", 3, 2, "accel", kAllFeatures, current), "current2")));
  const ReceiptBits delayed = run_and_read(lane("tiny", 3, 2, "accel", kAllFeatures, {{"noise", "off"}}), "delayed");
  EXPECT_NE(one.grads, delayed.grads);
}

// --fp8-off keeps units (zone@block) in bf16: every unit off is the bf16 lane bit for bit;
// one unit off, or one unit in E5M2 (--fp8-e5m2), moves the bits of fp8=all, and each
// replays itself across thread counts.
TEST(AccelFp8, UnitsOffAreBf16AndCoarseUnitsMoveBits) {
  const std::map<std::string, std::string> off = {{"noise", "off"}};
  const ReceiptBits bf16 = run_and_read(lane("micro", 4, 2, "accel", "bf16", off), "units-bf16");
  const ReceiptBits fp8 = run_and_read(lane("micro", 4, 2, "accel", "bf16,fp8=all", off), "units-fp8");
  std::map<std::string, std::string> all_off = off, one_off = off, coarse = off;
  all_off["fp8-off"] = "qkv@0,qkv@1,attn_proj@0,attn_proj@1,mlp_fc@0,mlp_fc@1,mlp_proj@0,mlp_proj@1";
  one_off["fp8-off"] = "mlp_fc@1";
  coarse["fp8-e5m2"] = "mlp_fc@1";
  EXPECT_TRUE(run_and_read(lane("micro", 4, 2, "accel", "bf16,fp8=all", all_off), "units-all-off").same_numbers(bf16));
  const ReceiptBits one = run_and_read(lane("micro", 4, 2, "accel", "bf16,fp8=all", one_off), "units-one-off");
  EXPECT_FALSE(one.same_numbers(fp8));
  EXPECT_FALSE(one.same_numbers(bf16));
  EXPECT_TRUE(run_and_read(lane("micro", 4, 3, "accel", "bf16,fp8=all", one_off), "units-one-off-3").same_numbers(one));
  const ReceiptBits e5m2 = run_and_read(lane("micro", 4, 2, "accel", "bf16,fp8=all", coarse), "units-e5m2");
  EXPECT_FALSE(e5m2.same_numbers(fp8));
  EXPECT_TRUE(run_and_read(lane("micro", 4, 1, "accel", "bf16,fp8=all", coarse), "units-e5m2-1").same_numbers(e5m2));
}

TEST(AccelFp8, UnitsMustBeZonesOfTheLane) {
  for (const auto& [flag, value] : std::map<std::string, std::string>{{"fp8-off", "mlp_fc"},
                                                                       {"fp8-off", "all@0"},
                                                                       {"fp8-e5m2", "qkv@-1"},
                                                                       {"fp8-e5m2", "qkv@x"}}) {
    EXPECT_THROW(run_and_read(lane("micro", 1, 1, "accel", "bf16,fp8=all", {{flag, value}}), "units-bad"),
                 run::UsageError)
        << flag << "=" << value;
  }
  EXPECT_THROW(run_and_read(lane("micro", 1, 1, "accel", "bf16,fp8=qkv", {{"fp8-off", "mlp_fc@0"}}), "units-zone"),
               run::UsageError);
  EXPECT_THROW(run_and_read(lane("micro", 1, 1, "accel", "bf16", {{"fp8-off", "qkv@0"}}), "units-no-fp8"),
               run::UsageError);
  EXPECT_THROW(run_and_read(lane("micro", 1, 1, "accel", "", {{"bf16-off", "qkv@0"}}), "units-no-bf16"),
               run::UsageError);
}

// A unit switched off takes no FP8 fault: --fp8-off or --bf16-off wins over --fp8-e5m2 and
// --fp8-saturate on the same unit (triage switches a faulty unit off and must see it gone).
TEST(AccelFp8, UnitsSwitchedOffTakeNoFault) {
  const std::map<std::string, std::string> off{{"noise", "off"}, {"fp8-off", "qkv@0"}};
  const ReceiptBits kept = run_and_read(lane("micro", 3, 2, "accel", "bf16,fp8=all", off), "units-kept");
  for (const char* fault : {"fp8-e5m2", "fp8-saturate"}) {
    std::map<std::string, std::string> faulty = off;
    faulty[fault] = "qkv@0";
    EXPECT_TRUE(run_and_read(lane("micro", 3, 2, "accel", "bf16,fp8=all", faulty), "units-faulty").same_numbers(kept))
        << fault;
  }
}

// --bf16-off computes units in fp32, their FP8 included: with every FP8 unit off, an fp8
// lane's bf16-off units are the bf16 lane's bit for bit; a unit in fp32 moves the bits of
// bf16 and replays itself across thread counts. --fp8-saturate (scale 2^10 too large) moves
// the bits of fp8 and replays.
TEST(AccelFp8, Bf16OffUnitsAreFp32AndSaturatedUnitsMoveBits) {
  const std::string every_unit = "qkv@0,qkv@1,attn_proj@0,attn_proj@1,mlp_fc@0,mlp_fc@1,mlp_proj@0,mlp_proj@1";
  const std::map<std::string, std::string> off{{"noise", "off"}};
  std::map<std::string, std::string> fp32_unit = off, fp8_lane = off, saturated = off;
  fp32_unit["bf16-off"] = "attn_proj@1";
  fp8_lane["bf16-off"] = "attn_proj@1";
  fp8_lane["fp8-off"] = every_unit;
  saturated["fp8-saturate"] = "mlp_fc@0";
  const ReceiptBits bf16 = run_and_read(lane("micro", 4, 2, "accel", "bf16", off), "bf16-lane");
  const ReceiptBits one = run_and_read(lane("micro", 4, 2, "accel", "bf16", fp32_unit), "bf16-one-off");
  EXPECT_FALSE(one.same_numbers(bf16));
  EXPECT_TRUE(run_and_read(lane("micro", 4, 3, "accel", "bf16", fp32_unit), "bf16-one-off-3").same_numbers(one));
  EXPECT_TRUE(run_and_read(lane("micro", 4, 2, "accel", "bf16,fp8=all", fp8_lane), "fp8-bf16-off").same_numbers(one));
  const ReceiptBits fp8 = run_and_read(lane("micro", 4, 2, "accel", "bf16,fp8=all", off), "sat-fp8");
  const ReceiptBits sat = run_and_read(lane("micro", 4, 2, "accel", "bf16,fp8=all", saturated), "sat");
  EXPECT_FALSE(sat.same_numbers(fp8));
  EXPECT_TRUE(run_and_read(lane("micro", 4, 1, "accel", "bf16,fp8=all", saturated), "sat-1").same_numbers(sat));
}

// The units triage switches: the FP8 zones' units, then every zone's in bf16, one per
// block, less those already off; none for an engine without reduced precision.
TEST(AccelFp8, PrecisionSwitchesListTheLanesUnitsNarrowestFirst) {
  const auto units_of = [](const PrecisionSwitch& s) {
    std::vector<std::string> values;
    for (const PrecisionUnit& u : s.units) values.push_back(u.value);
    return values;
  };
  const auto switches =
      make_engine("accel", {"bf16,fp8=qkv,mlp_fc", {{"fp8-off", "qkv@1"}, {"bf16-off", "mlp_proj@0"}}})
          ->precision_switches(2);
  ASSERT_EQ(switches.size(), 2u);
  EXPECT_EQ(switches[0].format, "fp8");
  EXPECT_EQ(switches[0].flag, "fp8-off");
  EXPECT_EQ(units_of(switches[0]), (std::vector<std::string>{"qkv@0", "mlp_fc@0", "mlp_fc@1"}));
  EXPECT_EQ(switches[0].units[2].group, "mlp_fc");
  EXPECT_EQ(switches[0].units[2].layer, 1);
  EXPECT_EQ(switches[1].format, "bf16");
  EXPECT_EQ(switches[1].wider, "fp32");
  EXPECT_EQ(units_of(switches[1]).size(), 7u);
  EXPECT_EQ(make_engine("accel", {"bf16", {}})->precision_switches(2).size(), 1u);
  EXPECT_TRUE(make_engine("accel", {})->precision_switches(2).empty());
  EXPECT_TRUE(make_engine("cpu-ref", {})->precision_switches(2).empty());
}

TEST(LimitedAccumulator, VectorAndPortableKernelsAgreeBitForBit) {
  const int M = 13, N = 37, K = 300;
  const auto A = random_matrix(M, K, 1, false), B = random_matrix(K, N, 2, false);
  std::vector<float> fast(static_cast<std::size_t>(M) * N), portable(fast.size());
  for (int interval : {1, 7, 128, 1000}) {
    gemm_limited_accumulator(M, N, K, A.data(), K, B.data(), N, fast.data(), N, interval);
    gemm_limited_accumulator_generic(M, N, K, A.data(), K, B.data(), N, portable.data(), N, interval);
    EXPECT_EQ(fast, portable) << "interval " << interval;
  }
}

TEST(LimitedAccumulator, PromotingMoreOftenLosesLess) {
  // Long positive sums: a 14-bit accumulator swamps small addends as the sum grows, and
  // promotion to fp32 every N products bounds the loss.
  const int M = 4, N = 16, K = 4096;
  const auto A = random_matrix(M, K, 3, true), B = random_matrix(K, N, 4, true);
  const auto error_with = [&](int interval) {
    std::vector<float> C(static_cast<std::size_t>(M) * N);
    gemm_limited_accumulator(M, N, K, A.data(), K, B.data(), N, C.data(), N, interval);
    double err = 0;
    for (int m = 0; m < M; ++m) {
      for (int n = 0; n < N; ++n) {
        double exact = 0;
        for (int k = 0; k < K; ++k) exact += static_cast<double>(A[m * K + k]) * B[k * N + n];
        err = std::max(err, std::fabs(C[m * N + n] - exact) / exact);
      }
    }
    return err;
  };
  const double every_32 = error_with(32), every_128 = error_with(128), never = error_with(K);
  std::cout << "relative error: every 32 " << every_32 << ", every 128 " << every_128 << ", never " << never << "\n";
  EXPECT_LT(every_32, every_128);
  EXPECT_LT(3 * every_128, never);
}

}  // namespace
}  // namespace harness::accel
