// The float64 op oracle (harness/run/op_oracle.h) on real runs: a clean step of every engine
// that runs each op as it is called is within its bounds op by op, an injected fault is
// named and nothing else is, bf16 computing is over the fp32 bounds, the oracle's verdict
// does not depend on the thread count, and an engine that compiles its steps is refused.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <span>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "canary.h"
#include "canary_file.h"
#include "canary_run.h"
#include "data_source.h"
#include "registry.h"
#include "exact_gelu_canary.h"
#include "receipt_bits.h"
#include "replay.h"

namespace harness::run {
namespace {

using harness::testing::lane;
using harness::testing::scratch;

// Steps 0..2 of `options` recorded, then step `step` replayed under the oracle.
ReplayResult judged(RunOptions options, const std::string& tag, int step = 1,
                    std::optional<numerics::Precision> against = std::nullopt, int threads = 0) {
  options.out = scratch().path("oracle_" + tag + ".h5");
  options.force = true;
  options.steps = 3;
  run_canary(options);
  ReplayOptions replay_options;
  replay_options.receipt = options.out;
  replay_options.from = step;
  replay_options.to = step;
  replay_options.threads = threads;
  replay_options.oracle_step = step;
  replay_options.oracle_against = against;
  ReplayResult r = replay(replay_options);
  EXPECT_TRUE(r.reproduced()) << tag;
  EXPECT_TRUE(r.oracle.has_value()) << tag;
  return r;
}

std::vector<std::string> over(const OracleReport& report) {
  std::vector<std::string> names;
  for (const OpJudgement& j : report.judged) {
    if (!j.within()) names.push_back(j.site + " " + j.op + " " + j.result);
  }
  return names;
}

std::set<std::string> judged_ops(const OracleReport& report) {
  std::set<std::string> ops;
  for (const OpJudgement& j : report.judged) ops.insert(j.op);
  return ops;
}

TEST(OpOracle, CleanStepsOfEveryEagerEngineAreWithinTheirBounds) {
  const std::vector<std::pair<std::string, RunOptions>> lanes{
      {"cpu-ref", lane("micro", 3, 0)},
      {"accel", lane("micro", 3, 0, "accel")},
      {"accel-bf16", lane("micro", 3, 0, "accel", "bf16")},
      {"cpu-ref-erf", lane(harness::testing::micro_with_exact_gelu(), 3, 0)},
  };
  for (const auto& [tag, options] : lanes) {
    const ReplayResult r = judged(options, tag);
    const OracleReport& report = *r.oracle;
    EXPECT_EQ(over(report), std::vector<std::string>{}) << tag;
    EXPECT_TRUE(report.not_bounded.empty()) << tag;
    const std::set<std::string> ops = judged_ops(report);
    for (const char* op : {"linear_forward", "linear_backward", "residual_forward", "residual_backward", "layernorm_forward",
                           "attention_forward", "crossentropy_forward", "layernorm_backward"}) {
      EXPECT_TRUE(ops.count(op)) << tag << " judged no " << op;
    }
    EXPECT_EQ(ops.count("gelu_erf_forward"), tag == "cpu-ref-erf" ? 1u : 0u) << tag;
    EXPECT_GT(report.not_judged.count("adamw"), 0u) << "an op without a bound is listed, not counted within";
    EXPECT_EQ(report.not_judged.count("crossentropy_forward loss"), 1u) << "a result not judged is listed too";
    // The bounds are not vacuous: some result comes within a factor 10 of its bound (a
    // residual's single rounding reaches nearly all of it).
    const auto worst = std::max_element(report.judged.begin(), report.judged.end(),
                                        [](const OpJudgement& a, const OpJudgement& b) { return a.worst_ratio < b.worst_ratio; });
    EXPECT_GT(worst->worst_ratio, 0.1) << tag;
    // Nor are the dot products' (0.1-0.4 here), attention's (its softmax 0.05-0.1) or the
    // layer norm backward's (0.3-0.4 on tiny).
    for (const char* op : {"linear_forward", "linear_backward", "attention_forward", "layernorm_backward"}) {
      double closest = 0;
      for (const OpJudgement& j : report.judged) closest = j.op == op ? std::max(closest, j.worst_ratio) : closest;
      EXPECT_GT(closest, 0.02) << tag << " " << op;
    }
  }
}

// A 2^20-ulp nudge of one forward op's output (accel bf16: 2^13 bf16 ulps) is named at
// that op, its result and element 0, and no other op is over: each op is judged on the
// operands it was given, so the ops after it are clean. A linear's and a layer norm's.
TEST(OpOracle, AnInjectedFaultIsNamedAndNothingElse) {
  for (const auto& [op, features] : std::vector<std::pair<std::string, std::string>>{
           {"blocks.1.mlp.fc linear_forward", ""}, {"blocks.1.mlp.fc linear_forward", "bf16"},
           {"blocks.0.ln2 layernorm_forward", ""}, {"blocks.0.ln2 layernorm_forward", "bf16"}}) {
    RunOptions o = lane("micro", 3, 0, features.empty() ? "cpu-ref" : "accel", features);
    const std::string site = op.substr(0, op.find(' '));
    o.inject_fault = "step=1,op=" + site + ",ulps=1048576";
    const ReplayResult r = judged(o, "fault" + site + features);
    EXPECT_EQ(over(*r.oracle), std::vector<std::string>{op + " out"}) << features;
    for (const OpJudgement& j : r.oracle->judged) {
      if (!j.within()) {
        EXPECT_EQ(j.worst_index, 0) << "the nudge moves element 0";
      }
    }
    // The same run's step 2, which the fault did not touch, is clean.
    EXPECT_EQ(over(*judged(o, "fault-after" + site + features, 2).oracle), std::vector<std::string>{}) << features;
  }
}

// cpu-ref with one block's softmax computed by a fast-math-like exp (--fast-exp, about
// 1.5e-4 relative): that block's attention probabilities are named, its output (judged on
// those probabilities) and every other op are not; the other blocks' softmax are within.
TEST(OpOracle, AFastMathExpIsNamedAndNothingElse) {
  RunOptions o = lane("micro", 3, 0);
  o.engine_settings.options["fast-exp"] = "1";
  const ReplayResult r = judged(o, "fast-exp");
  EXPECT_EQ(over(*r.oracle), std::vector<std::string>{"blocks.1.attn attention_forward att"});
  for (const OpJudgement& j : r.oracle->judged) {
    if (!j.within()) {
      EXPECT_GT(j.worst_ratio, 5) << "a fault well past rounding, not at the bound's edge";
    }
  }
}

// accel's bf16 step judged as if declared fp32 (`--against fp32`): its linears, whose weights
// it rounds to bf16, and its bf16-stored results are far over the fp32 bounds; the same
// step by its own declaration is within (above).
TEST(OpOracle, Bf16ComputingIsOverTheFp32Bounds) {
  const ReplayResult r = judged(lane("micro", 3, 0, "accel", "bf16"), "bf16-as-fp32", 1, numerics::Precision::Fp32);
  std::set<std::string> over_ops;
  for (const OpJudgement& j : r.oracle->judged) {
    if (!j.within()) over_ops.insert(j.op);
    if (j.op == "linear_forward") {
      EXPECT_FALSE(j.within()) << j.site;
      EXPECT_GT(j.worst_ratio, 100) << j.site;
    }
  }
  EXPECT_TRUE(over_ops.count("residual_forward"));
  // cpu-ref's step against fp32: within, as by its own declaration.
  EXPECT_EQ(over(*judged(lane("micro", 3, 0), "fp32-as-fp32", 1, numerics::Precision::Fp32).oracle),
            std::vector<std::string>{});
}

// The oracle recomputes each element in one order whatever the threads: one receipt's
// step judged on one thread and on three gives the same report, number for number.
TEST(OpOracle, ItsReportIsTheSameOnAnyThreadCount) {
  const ReplayResult first = judged(lane("micro", 3, 0, "accel", "bf16"), "threads", 1, std::nullopt, 1);
  ReplayOptions again;
  again.receipt = first.receipt;
  again.from = 1;
  again.to = 1;
  again.threads = 3;
  again.oracle_step = 1;
  const ReplayResult second = replay(again);
  const OracleReport &one = *first.oracle, &three = *second.oracle;
  ASSERT_EQ(one.judged.size(), three.judged.size());
  for (std::size_t i = 0; i < one.judged.size(); ++i) {
    EXPECT_EQ(one.judged[i].site + one.judged[i].result, three.judged[i].site + three.judged[i].result);
    EXPECT_EQ(one.judged[i].worst_ratio, three.judged[i].worst_ratio) << one.judged[i].site;
    EXPECT_EQ(one.judged[i].worst_index, three.judged[i].worst_index) << one.judged[i].site;
  }
}

// Stands between the canary and the oracle and puts a NaN into element 0 of one op's first
// result after the op ran: what the oracle then reads, as a kernel that produced it.
class NanAfter final : public canary::OpObserver {
 public:
  NanAfter(OpOracle& oracle, Engine& engine, std::string site) : oracle_(oracle), engine_(engine), site_(std::move(site)) {}
  void before_op(OpKind op, const OpSite& site, std::span<const TensorId> operands,
                 std::span<const double> attributes) override {
    oracle_.before_op(op, site, operands, attributes);
  }
  void after_op(OpKind op, const OpSite& site, std::span<const TensorId> operands) override {
    if (site.name == site_ && site.phase == Phase::Forward) {
      const std::span<const float> out = engine_.read(operands[0]);
      std::vector<float> poisoned(out.begin(), out.end());
      poisoned[0] = std::numeric_limits<float>::quiet_NaN();
      engine_.upload(operands[0], poisoned);
    }
    oracle_.after_op(op, site, operands);
  }

 private:
  OpOracle& oracle_;
  Engine& engine_;
  std::string site_;
};

// A NaN where float64 has a finite value is over its bound (error NaN > bound is false: it
// was counted within before), and named as its op's alone.
TEST(OpOracle, ANanResultIsOverItsBound) {
  const canary::CanaryConfig config = canary::load_canary("micro");
  const std::unique_ptr<canary::Canary> model = canary::make_canary(config);
  const std::unique_ptr<canary::DataSource> data = canary::make_data_source(config);
  const std::unique_ptr<Engine> engine = make_engine("cpu-ref");
  engine->bind(model->tensors());
  model->upload_initial_parameters(*engine, 1);
  OpOracle oracle(*engine, model->tensors());
  NanAfter nan(oracle, *engine, "blocks.0.attn.proj");
  model->set_op_observer(&nan);
  model->train_step(*engine, 0, data->batch(0));
  model->set_op_observer(nullptr);
  EXPECT_EQ(over(oracle.report()), std::vector<std::string>{"blocks.0.attn.proj linear_forward out"});
  for (const OpJudgement& j : oracle.report().judged) {
    if (!j.within()) {
      EXPECT_EQ(j.over, 1) << j.site;
    }
  }
}

TEST(OpOracle, AnEngineThatCompilesItsStepsIsRefusedNamingTheReceipt) {
  RunOptions o = lane("micro", 2, 0, "tpu-mesh");
  o.out = scratch().path("oracle_mesh.h5");
  o.force = true;
  run_canary(o);
  ReplayOptions r;
  r.receipt = o.out;
  r.from = 1;
  r.to = 1;
  r.oracle_step = 1;
  try {
    replay(r);
    ADD_FAILURE() << "tpu-mesh's step was judged";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(o.out + ": engine tpu-mesh compiles its steps"), std::string::npos) << e.what();
  }
  r.oracle_step = 0;  // a step the replay does not run
  EXPECT_THROW(replay(r), UsageError);
}

}  // namespace
}  // namespace harness::run
