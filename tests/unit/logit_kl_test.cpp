// The held-out evaluation and its logit comparison (docs/logit-kl.md): the pass changes no
// trained bit on any engine; it records the held-out batch's logits every K steps; the
// distances are exact properties of the distributions (KL 0 for equal logits, invariant
// under a per-token shift, against an independent computation); a bitwise budget fails on
// any differing logit bit; tolerance entries judge only the metrics they bound.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <hdf5.h>

#include "budgets.h"
#include "calibrate.h"
#include "canary.h"
#include "canary_file.h"
#include "data_source.h"
#include "logit_compare.h"
#include "receipt/hdf5_file.h"
#include "receipt_bits.h"
#include "verdict.h"

namespace harness::check {
namespace {

using harness::testing::lane;
using harness::testing::run_and_read;
using harness::testing::scratch;

const std::string kShippedBudgets = std::string(HARNESS_SOURCE_DIR) + "/canaries/budgets.toml";

// micro with [eval] every = `every` (0: the shipped file's own [eval], whatever it says).
std::string micro_with_eval(int every) {
  std::ifstream in(canary::shipped_canary_dir() / "micro.toml");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t eval = text.find("\n[eval]");
  if (eval != std::string::npos) text.resize(eval + 1);
  const std::string path = scratch().path(fmt::format("micro-eval-{}.toml", every));
  std::ofstream(path) << text << (every > 0 ? fmt::format("\n[eval]\nevery = {}\n", every) : "");
  return path;
}

std::string run_receipt(run::RunOptions o, const std::string& tag) {
  o.out = scratch().path(tag + ".h5");
  o.force = true;
  run::run_canary(o);
  return o.out;
}

// Random logits (tokens, vocab) of a seeded generator: test data, not a recorded bit.
std::vector<float> random_logits(std::size_t tokens, int vocab, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> out(tokens * static_cast<std::size_t>(vocab));
  for (float& x : out) x = normal(gen);
  return out;
}

TEST(LogitDistance, EqualLogitsAreExactlyZero) {
  const std::vector<float> a = random_logits(12, 50, 1);
  const std::vector<std::int32_t> targets(12, 7);
  const LogitDistance d = logit_distance(a, a, targets, 50);
  EXPECT_TRUE(d.identical);
  EXPECT_EQ(d.kl, 0.0);
  EXPECT_EQ(d.max_logprob_delta, 0.0);
  EXPECT_EQ(d.top1_mismatch, 0.0);
}

// Against a direct long-double computation of the same definitions, over random pairs.
TEST(LogitDistance, AgreesWithAnIndependentComputation) {
  constexpr int V = 37;
  constexpr std::size_t T = 20;
  for (unsigned seed = 0; seed < 20; ++seed) {
    const std::vector<float> run = random_logits(T, V, 100 + seed), ref = random_logits(T, V, 200 + seed);
    std::vector<std::int32_t> targets(T);
    for (std::size_t t = 0; t < T; ++t) targets[t] = static_cast<std::int32_t>((t * 7 + seed) % V);
    long double kl = 0, delta = 0;
    int mismatches = 0;
    for (std::size_t t = 0; t < T; ++t) {
      long double za = 0, zb = 0;
      for (int v = 0; v < V; ++v) {
        za += std::exp(static_cast<long double>(run[t * V + v]));
        zb += std::exp(static_cast<long double>(ref[t * V + v]));
      }
      std::size_t top_a = 0, top_b = 0;
      for (int v = 0; v < V; ++v) {
        const long double la = run[t * V + v] - std::log(za), lb = ref[t * V + v] - std::log(zb);
        kl += std::exp(lb) * (lb - la);
        if (run[t * V + v] > run[t * V + top_a]) top_a = static_cast<std::size_t>(v);
        if (ref[t * V + v] > ref[t * V + top_b]) top_b = static_cast<std::size_t>(v);
      }
      const std::size_t y = static_cast<std::size_t>(targets[t]);
      delta = std::max(delta, std::fabs((run[t * V + y] - std::log(za)) - (ref[t * V + y] - std::log(zb))));
      mismatches += top_a != top_b ? 1 : 0;
    }
    const LogitDistance d = logit_distance(run, ref, targets, V);
    EXPECT_FALSE(d.identical);
    EXPECT_NEAR(d.kl, static_cast<double>(kl / T), 1e-12 * std::max(1.0, static_cast<double>(kl / T))) << seed;
    EXPECT_GT(d.kl, 0.0);
    EXPECT_NEAR(d.max_logprob_delta, static_cast<double>(delta), 1e-12 * static_cast<double>(delta)) << seed;
    EXPECT_DOUBLE_EQ(d.top1_mismatch, mismatches / static_cast<double>(T)) << seed;
  }
}

// Softmax is blind to a constant added to a token's logits: the distributions, and so the
// metrics, stay (to rounding) where the bits moved.
TEST(LogitDistance, AShiftPerTokenMovesBitsButNotTheDistribution) {
  constexpr int V = 64;
  const std::vector<float> ref = random_logits(8, V, 5);
  std::vector<float> shifted = ref;
  for (std::size_t t = 0; t < 8; ++t) {
    for (int v = 0; v < V; ++v) shifted[t * V + v] += 0.5f * static_cast<float>(t + 1);
  }
  const std::vector<std::int32_t> targets(8, 3);
  const LogitDistance d = logit_distance(shifted, ref, targets, V);
  EXPECT_FALSE(d.identical);
  EXPECT_LT(d.kl, 1e-12);
  EXPECT_LT(d.max_logprob_delta, 1e-5);  // fp32 rounding of the shifted logits
  EXPECT_EQ(d.top1_mismatch, 0.0);
}

TEST(LogitDistance, ASwappedTopOneIsCountedPerToken) {
  constexpr int V = 4;
  const std::vector<float> ref = {4, 1, 0, 0, /**/ 0, 3, 1, 0, /**/ 2, 0, 0, 0, /**/ 0, 0, 0, 5};
  std::vector<float> run = ref;
  std::swap(run[1 * V + 1], run[1 * V + 2]);  // token 1's top-1 moves from 1 to 2
  const LogitDistance d = logit_distance(run, ref, std::vector<std::int32_t>{0, 1, 0, 3}, V);
  EXPECT_DOUBLE_EQ(d.top1_mismatch, 0.25);
  EXPECT_NEAR(d.max_logprob_delta, 2.0, 1e-12);  // token 1's target lost exactly 2 nats
}

// The pass is invisible to training: the engine's state (FP8 scaling) is put back, and a
// compiled engine runs its training programs as before.
TEST(HeldOutEval, ChangesNoTrainedBitOnAnyEngine) {
  const std::string with = micro_with_eval(3), without = micro_with_eval(0);
  const std::vector<run::RunOptions> lanes = {
      lane(with, 10, 2),
      lane(with, 10, 2, "accel", "bf16,fp8=all", {{"noise-seed", "7"}}),
      lane(with, 10, 2, "tpu-mesh", "", {{"mesh", "2x2"}, {"shard-plan", "tp"}}),
  };
  for (std::size_t i = 0; i < lanes.size(); ++i) {
    run::RunOptions plain = lanes[i];
    plain.canary = without;
    const auto a = run_and_read(lanes[i], fmt::format("eval-{}", i));
    const auto b = run_and_read(plain, fmt::format("plain-{}", i));
    EXPECT_TRUE(a.same_numbers(b)) << lanes[i].engine;
  }
}

TEST(HeldOutEval, RecordsTheHeldOutBatchEveryKSteps) {
  const std::string path = run_receipt(lane(micro_with_eval(5), 20, 2), "recorded");
  const receipt::ReceiptReader r(path);
  const std::optional<EvalRecord> e = read_eval(r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->steps, (std::vector<std::int64_t>{5, 10, 15, 20}));  // the last: the final parameters
  EXPECT_EQ(e->compiles, std::vector<double>(4, 0.0));              // cpu-ref compiles nothing
  const canary::CanaryConfig config = canary::load_canary(micro_with_eval(5));
  const auto data = canary::make_data_source(config);
  const canary::Batch held_out = canary::held_out_batch(*data);
  EXPECT_EQ(e->held_out_hash, fmt::format("{:016x}", canary::batch_hash(held_out)));
  ASSERT_EQ(e->rows, 2);  // the default: min(2, batch)
  EXPECT_EQ(e->targets, held_out.targets);
  for (int s = 0; s < canary::kMaxSteps; s += 997) {
    EXPECT_NE(canary::batch_hash(data->batch(s)), canary::batch_hash(held_out)) << s;
  }
  // The recorded loss is the mean cross-entropy of the recorded logits (all rows: micro's batch is 2).
  for (std::size_t i = 0; i < e->steps.size(); ++i) {
    const std::span<const float> logits = e->logits_at(i);
    double total = 0;
    const auto V = static_cast<std::size_t>(e->vocab);
    for (std::size_t t = 0; t < e->targets.size(); ++t) {
      double z = 0;
      for (std::size_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(logits[t * V + v]));
      total += std::log(z) - logits[t * V + static_cast<std::size_t>(e->targets[t])];
    }
    EXPECT_NEAR(e->loss[i], total / static_cast<double>(e->targets.size()), 1e-5) << e->steps[i];
  }
  EXPECT_LT(e->loss.back(), e->loss.front());  // the canary learns: held-out loss falls
}

TEST(HeldOutEval, ACompiledEngineCompilesItsForwardProgramOnce) {
  const std::string path =
      run_receipt(lane(micro_with_eval(4), 12, 2, "tpu-mesh", "", {{"mesh", "2x1"}}), "compiled");
  const std::optional<EvalRecord> e = read_eval(receipt::ReceiptReader(path));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->compiles, (std::vector<double>{1, 0, 0}));
}

TEST(LogitKl, BitwiseLanesShowExactlyZero) {
  const Budgets budgets = load_budgets(kShippedBudgets);
  const std::string eval = micro_with_eval(5);
  const Verdict v = compare_receipts(load_receipt(run_receipt(lane(eval, 10, 1), "one-thread")),
                                     load_receipt(run_receipt(lane(eval, 10, 2), "two-threads")), budgets, "compare");
  ASSERT_TRUE(v.bitwise);
  int logit_metrics = 0;
  for (const MetricVerdict& m : v.metrics) {
    if (std::find(std::begin(kEvalMetrics), std::end(kEvalMetrics), m.metric) == std::end(kEvalMetrics)) continue;
    ++logit_metrics;
    EXPECT_TRUE(m.judged && m.pass) << m.metric;
    EXPECT_EQ(m.max_deviation, 0.0) << m.metric;
  }
  EXPECT_EQ(logit_metrics, 3);
  EXPECT_TRUE(v.logits_not_compared.empty());
}

// One logit one ulp up in the reference's last evaluation: losses and hashes stay exact,
// and every logit metric fails the bitwise budget at that step.
TEST(LogitKl, OneDifferingLogitBitFailsABitwiseBudget) {
  const std::string eval = micro_with_eval(5);
  const std::string a = run_receipt(lane(eval, 10, 2), "ulp-a"), b = run_receipt(lane(eval, 10, 2), "ulp-b");
  {
    const h5::Handle file(H5Fopen(b.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose, "open " + b);
    std::vector<float> logits = h5::read_f32(file, receipt::paths::kEvalLogits);
    logits.back() = std::nextafter(logits.back(), INFINITY);
    const h5::Handle dataset(H5Dopen2(file, receipt::paths::kEvalLogits, H5P_DEFAULT), H5Dclose, "open logits");
    ASSERT_GE(H5Dwrite(dataset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, logits.data()), 0);
  }
  const Verdict v = compare_receipts(load_receipt(a), load_receipt(b), load_budgets(kShippedBudgets), "compare");
  ASSERT_TRUE(v.bitwise);
  for (const MetricVerdict& m : v.metrics) {
    const bool logit = std::find(std::begin(kEvalMetrics), std::end(kEvalMetrics), m.metric) != std::end(kEvalMetrics);
    EXPECT_EQ(m.pass, !logit) << m.metric;
    if (logit) {
      EXPECT_EQ(m.first_failing_step, 10) << m.metric;
    }
  }
}

// accel's noise moves the logits a little: shipped, its entry judges what it bounds; an entry
// without logit windows leaves them reported, and a bound below the movement fails.
TEST(LogitKl, ToleranceEntriesJudgeOnlyWhatTheyBound) {
  const std::string eval = micro_with_eval(5);
  const ReceiptData noisy = load_receipt(run_receipt(lane(eval, 10, 2, "accel", "", {{"noise-seed", "3"}}), "noisy"));
  const ReceiptData ref = load_receipt(run_receipt(lane(eval, 10, 2), "noise-ref"));
  std::ifstream in(kShippedBudgets);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto with_noise_kl = [&](const std::string& windows) {
    const std::size_t at = text.find("[noise]\n");
    std::string edited = text;
    std::string entry = "[noise]\nform = \"tolerance\"\nrationale = \"r\"\ncalibrated = \"2026-11-28\"\n"
                        "loss = [ { steps = \"0-\", atol = 1 } ]\n" + windows + "\n[retired-noise]\n";
    edited.replace(at, 8, entry);
    const std::string path = scratch().path(fmt::format("budgets-{}.toml", windows.size()));
    std::ofstream(path) << edited;
    return load_budgets(path);
  };
  const auto logit_kl = [](const Verdict& v) {
    return *std::find_if(v.metrics.begin(), v.metrics.end(), [](const auto& m) { return m.metric == "logit_kl"; });
  };
  const MetricVerdict unbounded = logit_kl(compare_receipts(noisy, ref, with_noise_kl(""), "compare"));
  EXPECT_FALSE(unbounded.judged);
  EXPECT_TRUE(unbounded.pass);
  EXPECT_GT(unbounded.max_deviation, 0.0);
  const Budgets tight_budget = with_noise_kl("logit_kl = [ { steps = \"0-\", atol = 1e-30 } ]");
  const MetricVerdict tight = logit_kl(compare_receipts(noisy, ref, tight_budget, "compare"));
  EXPECT_TRUE(tight.judged);
  EXPECT_FALSE(tight.pass);
  const Budgets loose_budget = with_noise_kl("logit_kl = [ { steps = \"0-\", atol = 1.0 } ]");
  const MetricVerdict loose = logit_kl(compare_receipts(noisy, ref, loose_budget, "compare"));
  EXPECT_TRUE(loose.judged && loose.pass);
}

// Calibration proposes windows for the logit metrics from repeats that evaluated, and the
// proposal passes every repeat; repeats that did not evaluate propose none.
TEST(LogitKl, CalibrationProposesLogitWindowsFromRepeatsThatEvaluated) {
  for (const int every : {5, 0}) {
    const std::string canary = micro_with_eval(every);
    nightly::CalibrateOptions o;
    o.budgets_path = kShippedBudgets;
    o.feature = "noise";
    o.provisional = true;  // two receipts: fewer than kMinCalibrationSamples
    o.references = {run_receipt(lane(canary, 10, 2), fmt::format("cal-ref-{}", every))};
    for (const int seed : {11, 12}) {
      const run::RunOptions noisy = lane(canary, 10, 2, "accel", "", {{"noise-seed", std::to_string(seed)}});
      o.receipts.push_back(run_receipt(noisy, fmt::format("cal-{}-{}", every, seed)));
    }
    o.out = scratch().path(fmt::format("candidate-{}.toml", every));
    const nightly::Calibration c = nightly::calibrate(o);
    const bool proposes_kl = std::find(c.metrics.begin(), c.metrics.end(), "logit_kl") != c.metrics.end();
    EXPECT_EQ(proposes_kl, every > 0);
    const Budgets candidate = load_budgets(c.candidate_path);
    EXPECT_EQ(candidate.feature("noise").metrics.count("logit_kl") > 0, every > 0);
    if (every > 0) {
      EXPECT_GT(c.observed.at("logit_kl"), 0.0);
      EXPECT_EQ(c.passing_proposed, 2);
    }
  }
}

TEST(LogitKl, ARunWithoutEvalSaysWhyItsLogitsWereNotCompared) {
  const Verdict v = compare_receipts(load_receipt(run_receipt(lane(micro_with_eval(5), 10, 2), "has-eval")),
                                     load_receipt(run_receipt(lane(micro_with_eval(0), 10, 2), "no-eval")),
                                     load_budgets(kShippedBudgets), "golden");
  EXPECT_TRUE(v.pass());
  EXPECT_NE(v.logits_not_compared.find("the reference has no /eval"), std::string::npos) << v.logits_not_compared;
}

}  // namespace
}  // namespace harness::check
