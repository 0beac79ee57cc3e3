// The cpu-ref determinism contract, as far as one process can test it: bitwise
// identical receipts across thread counts and repeated runs. (Compilers, build types
// and ISAs are covered by scripts/determinism-matrix.sh, which CI runs.)
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "canary_file.h"
#include "canary_run.h"
#include "receipt/receipt_reader.h"
#include "receipt_bits.h"

namespace harness::run {
namespace {

namespace fs = std::filesystem;

using harness::testing::lane;
using harness::testing::ReceiptBits;
using harness::testing::scratch;

ReceiptBits run_and_read(const std::string& canary, int steps, int threads, const std::string& tag) {
  return harness::testing::run_and_read(lane(canary, steps, threads), "determinism_" + tag);
}

TEST(Determinism, TinyIsBitwiseIdenticalAcrossThreadCountsAndRepeats) {
  const ReceiptBits reference = run_and_read("tiny", 4, 1, "t1");
  ASSERT_EQ(reference.loss.size(), 4u);
  for (int threads : {2, 3, 8, 16}) {
    std::string tag = "t";  // (not "t" + to_string(): GCC 12 raises a false -Wrestrict on it)
    tag += std::to_string(threads);
    EXPECT_TRUE(run_and_read("tiny", 4, threads, tag).same_numbers(reference)) << threads << " threads";
  }
  EXPECT_TRUE(run_and_read("tiny", 4, 2, "repeat").same_numbers(reference)) << "repeat";
}

TEST(Determinism, MicroFullRunIsIdenticalAtOneAndThreeThreads) {
  EXPECT_TRUE(run_and_read("micro", 20, 1, "m1").same_numbers(run_and_read("micro", 20, 3, "m3")));
}

TEST(Determinism, SeedChangesTheRun) {
  const fs::path path = scratch().path("determinism_seed.h5");
  RunOptions o;
  o.canary = "micro";
  o.steps = 2;
  o.seed = 99;
  o.out = path.string();
  o.force = true;
  run_canary(o);
  const receipt::ReceiptReader r(path.string());
  const auto other = r.hashes("params");
  fs::remove(path);
  EXPECT_NE(other, run_and_read("micro", 2, 1, "seed1337").params);
}

// Every entry point takes threads and steps by one rule (canary_run.h): threads 0..kMaxThreads
// with 0 = every hardware thread, steps 1..canary::kMaxSteps, the trace level none or ops;
// the recipe of a replay too.
TEST(RunRanges, ThreadsStepsAndTraceLevelsHaveOneRuleEverywhere) {
  RunOptions resolved;  // as a run records it: the seed resolved
  resolved.seed = 1337;
  // The options a replay reads from a recipe whose `key` is `value`.
  const auto from_recipe = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json recipe = replay_recipe(resolved, {});
    recipe[key] = value;
    return options_from_recipe(recipe);
  };
  for (const int threads : {-1, 0, 1, 2, kMaxThreads, kMaxThreads + 1}) {
    if (threads >= 0 && threads <= kMaxThreads) {
      EXPECT_EQ(worker_threads(threads), threads == 0 ? worker_threads(0) : threads);
      EXPECT_GE(worker_threads(threads), 1);
      EXPECT_EQ(from_recipe("threads", threads).threads, threads);
    } else {
      EXPECT_THROW(worker_threads(threads), UsageError) << threads;
      EXPECT_THROW(from_recipe("threads", threads), UsageError) << threads;
    }
  }
  for (const int steps : {-1, 0, 1, canary::kMaxSteps, canary::kMaxSteps + 1}) {
    if (steps >= 1 && steps <= canary::kMaxSteps) {
      EXPECT_EQ(checked_steps(steps), steps);
      EXPECT_EQ(from_recipe("steps", steps).steps, steps);
    } else {
      EXPECT_THROW(checked_steps(steps), UsageError) << steps;
      EXPECT_THROW(from_recipe("steps", steps), UsageError) << steps;
    }
  }
  for (const TraceLevel level : {TraceLevel::kNone, TraceLevel::kOps}) {
    EXPECT_EQ(parse_trace_level(to_string(level)), level);
    EXPECT_EQ(from_recipe("trace", to_string(level)).trace, level);
  }
  for (const char* text : {"", "aten", "Ops", "ops "}) {
    try {
      parse_trace_level(text, "trace");
      ADD_FAILURE() << "'" << text << "' was taken as a trace level";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), fmt::format("trace: '{}' is not a trace level; use none or ops", text));
    }
  }
}

}  // namespace
}  // namespace harness::run

namespace harness::run {
namespace {

// A fault at step K leaves steps < K bitwise equal and moves the hashes at step K: the
// property bisect relies on. (A fault can also be absorbed by rounding downstream and
// leave the run identical: docs/canary.md, "Fault injection".)
void expect_fault_moves_hashes_from_step_5(const std::string& spec, const std::string& recorded) {
  const fs::path path = scratch().path("determinism_fault.h5");
  RunOptions o;
  o.canary = "micro";
  o.steps = 8;
  o.out = path.string();
  o.force = true;
  o.inject_fault = spec;
  run_canary(o);
  const receipt::ReceiptReader r(path.string());
  EXPECT_EQ(r.manifest_string("fault_injection"), recorded);
  const auto faulty = r.hashes("params");
  const auto faulty_loss = r.f64(harness::receipt::paths::kLoss);
  fs::remove(path);
  const ReceiptBits clean = run_and_read("micro", 8, 2, "clean");
  const std::size_t K = faulty.size() / 8;
  for (std::size_t step = 0; step < 8; ++step) {
    const bool same = std::equal(faulty.begin() + static_cast<long>(step * K), faulty.begin() + static_cast<long>((step + 1) * K),
                                 clean.params.begin() + static_cast<long>(step * K));
    EXPECT_EQ(same, step < 5) << spec << ": step " << step;
  }
  EXPECT_EQ(std::vector<double>(faulty_loss.begin(), faulty_loss.begin() + 5),
            std::vector<double>(clean.loss.begin(), clean.loss.begin() + 5));
}

TEST(FaultInjection, OneUlpInAMatmulInputMovesHashesFromStepKOn) {
  expect_fault_moves_hashes_from_step_5("step=5,op=blocks.0.ln1", "step=5,op=blocks.0.ln1,ulps=1");
}

TEST(FaultInjection, FourUlpsBeforeGeluMoveHashesFromStepKOn) {
  expect_fault_moves_hashes_from_step_5("step=5,op=blocks.1.mlp.fc,ulps=4", "step=5,op=blocks.1.mlp.fc,ulps=4");
}

}  // namespace
}  // namespace harness::run
