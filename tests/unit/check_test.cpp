// Budgets and verdicts: the shipped budgets file parses and names every feature; a bad
// entry is an error naming its key; allowances compose by adding; the verdict of two
// receipts is exact for lanes that make the same roundings, budgeted otherwise, names the
// first failing step of an injected fault and the headroom of a perturbed budget; and
// receipts that cannot be compared are distinct errors, never a pass.
#include <cmath>
#include <limits>
#include <cstring>
#include <fstream>
#include <regex>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "budgets.h"
#include "receipt_bits.h"
#include "verdict.h"

namespace harness::check {
namespace {

using harness::testing::lane;
using harness::testing::scratch;

const std::string kShippedBudgets = std::string(HARNESS_SOURCE_DIR) + "/canaries/budgets.toml";

std::string shipped_text() {
  std::ifstream in(kShippedBudgets);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string write_budgets(const std::string& tag, const std::string& text) {
  const std::string path = scratch().path(tag + ".toml");
  std::ofstream(path) << text;
  return path;
}

// The shipped file with one line replaced (the first line matching `pattern`).
std::string shipped_with(const std::string& pattern, const std::string& replacement) {
  return std::regex_replace(shipped_text(), std::regex(pattern), replacement, std::regex_constants::format_first_only);
}

std::string load_error(const std::string& text) {
  try {
    load_budgets(write_budgets("bad", text));
  } catch (const BudgetError& e) {
    return e.what();
  }
  return "";
}

ReceiptData run(const std::string& tag, run::RunOptions options) {
  options.out = scratch().path(tag + ".h5");
  options.force = true;
  run::run_canary(options);
  return load_receipt(options.out);
}

TEST(Budgets, ShippedFileDescribesEveryFeatureWithItsProvenance) {
  const Budgets b = load_budgets(kShippedBudgets);
  for (const char* name : {"reference", "bf16", "fp8", "fp8-limited", "noise", "mesh-fp32", "mesh-bf16"}) {
    const FeatureBudget& f = b.feature(name);
    EXPECT_FALSE(f.rationale.empty()) << name;
    if (f.bitwise) continue;
    EXPECT_FALSE(f.provenance.calibrated.empty()) << name;
    EXPECT_GE(f.provenance.repeats, 1) << name;
    for (const char* metric : kBudgetMetrics) EXPECT_TRUE(f.metrics.count(metric)) << name << " " << metric;
  }
  EXPECT_TRUE(b.feature("reference").bitwise);
  EXPECT_EQ(b.compile_stability.max_uncached_compiles, 0);
  EXPECT_EQ(b.compile_stability.max_host_syncs, 0);
}

TEST(Budgets, EveryBadEntryIsAnErrorNamingTheFileAndKey) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {shipped_with(R"(atol = 1e-3 \})", "atol = -1e-3 }"), "[bf16].loss[0].atol: must be a non-negative number"},
      {shipped_with(R"(steps = "10-", atol = 2.2e-3)", R"(steps = "ten", atol = 2.2e-3)"),
       "[bf16].loss[1].steps: 'ten' is not a step window"},
      {shipped_with(R"(\{ steps = "0-9", atol = 1e-3 \})", R"({ steps = "0-19", atol = 1e-3 })"),
       "[bf16].loss[1].steps: overlaps an earlier window"},
      {shipped_with(R"(rtol = 0.035)", "rtool = 0.035"), "[bf16].params_sketch[0].rtool: unknown key"},
      {shipped_with(R"(\[mesh-bf16\])", "[mesh-bfloat16]"), "[mesh-bf16]: missing"},
      {shipped_with(R"(form = "bitwise"\nrationale = "Batch)", "form = \"tolerance\"\nrationale = \"Batch"),
       "[data].form: must be bitwise"},
      {shipped_with(R"(schema_version = 1)", "schema_version = 7"), "schema_version: 7 is not 1"},
      {shipped_with(R"(calibrated = "2026-11-21")", ""), "[noise].calibrated: missing"},
      {shipped_text() + "\n[tpu]\nform = \"bitwise\"\n", "[tpu]: not a feature of this harness"},
      {"schema_version = 1\n[reference\n", "line 2"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string error = load_error(text);
    EXPECT_NE(error.find(expected), std::string::npos) << "want '" << expected << "', got '" << error << "'";
    EXPECT_NE(error.find(".toml: "), std::string::npos) << error;  // the file comes first
  }
  EXPECT_NE(load_error("").find("schema_version: missing"), std::string::npos);
}

TEST(Budgets, AllowancesOfSeveralFeaturesAddUpPerStepWindow) {
  FeatureBudget a{"a", false, {{"loss", {{0, 9, 1.0, 0.0, 0.0}, {10, 99, 2.0, 0.0, 0.0}}}}, 0.0, "", {}};
  FeatureBudget b{"b", false, {{"loss", {{0, 99, 0.5, 0.1, 0.0}}}, {"grad_norm", {{0, 99, 0.0, 0.0, 2.0}}}}, 0.02, "", {}};
  const ComposedBudget both({&a, &b});
  EXPECT_DOUBLE_EQ(both.allowed("loss", 3, 10.0), 1.0 + 0.5 + 0.1 * 10.0);
  EXPECT_DOUBLE_EQ(both.allowed("loss", 10, -10.0), 2.0 + 0.5 + 0.1 * 10.0);
  EXPECT_DOUBLE_EQ(both.allowed("loss", 100, 1.0), 0.0);  // past every window: exact
  EXPECT_DOUBLE_EQ(both.allowed("grad_norm", 0, 1.0), 2.0 * fp32_ulp(1.0));
  EXPECT_DOUBLE_EQ(both.outlier_fraction(), 0.02);
  EXPECT_FALSE(both.bitwise());
  EXPECT_TRUE(ComposedBudget().bitwise());
  EXPECT_EQ(ComposedBudget().names(), std::vector<std::string>{"reference"});
}

// fp32_ulp is the gap to the next fp32 up, from the bits: checked against stepping the
// bits of every exponent and a sweep of mantissas.
TEST(Budgets, Fp32UlpIsTheGapToTheNextFloatForEveryExponent) {
  for (std::uint32_t exponent = 0; exponent < 255; ++exponent) {
    for (std::uint32_t mantissa : {0u, 1u, 0x3FFFFFu, 0x7FFFFEu, 0x7FFFFFu}) {
      const std::uint32_t bits = exponent << 23 | mantissa;
      float x = 0, next = 0;
      std::memcpy(&x, &bits, 4);
      const std::uint32_t up = bits + 1;
      std::memcpy(&next, &up, 4);
      if (!std::isfinite(next)) continue;
      EXPECT_EQ(fp32_ulp(x), double(next) - double(x)) << exponent << " " << mantissa;
      EXPECT_EQ(fp32_ulp(-x), fp32_ulp(x));
    }
  }
  EXPECT_EQ(fp32_ulp(1.0), std::ldexp(1.0, -23));
}

TEST(Verdict, LanesThatMakeTheSameRoundingsAreComparedBitwise) {
  const Budgets budgets = load_budgets(kShippedBudgets);
  const ReceiptData a = run("ref_a", lane("micro", 6, 2));
  const ReceiptData b = run("ref_b", lane("micro", 6, 1));
  const Verdict v = compare_receipts(a, b, budgets, "golden");
  EXPECT_TRUE(v.bitwise);
  EXPECT_TRUE(v.pass());
  EXPECT_FALSE(v.first_moved.has_value());
  EXPECT_EQ(v.stack.size(), 1u);  // threads: 2 -> 1, nothing else
  EXPECT_EQ(v.stack.at(0).key, "threads");
  // A seeded accel lane replayed with its seed: the same roundings, bitwise too.
  const ReceiptData s1 = run("seeded_a", lane("micro", 6, 2, "accel", "bf16", {{"noise-seed", "42"}}));
  const ReceiptData s2 = run("seeded_b", lane("micro", 6, 1, "accel", "bf16", {{"noise-seed", "42"}}));
  EXPECT_TRUE(replays_of_each_other(s1, s2));
  EXPECT_TRUE(compare_receipts(s1, s2, budgets, "golden").bitwise);
}

TEST(Verdict, CompositionTakesTheSeparatingFeaturesOrAllOfThemForIndependentRuns) {
  const Budgets budgets = load_budgets(kShippedBudgets);
  const ReceiptData ref = run("comp_ref", lane("micro", 3, 2));
  const ReceiptData mesh = run("comp_mesh", lane("micro", 3, 2, "tpu-mesh", "", {{"mesh", "2x1"}}));
  const ReceiptData fp8 = run("comp_fp8", lane("micro", 3, 2, "accel", "bf16,fp8=all"));
  const ReceiptData bf16 = run("comp_bf16", lane("micro", 3, 2, "accel", "bf16", {{"noise", "off"}}));
  const ReceiptData bf16_off = run("comp_bf16_off", lane("micro", 3, 1, "accel", "bf16", {{"noise", "off"}}));
  EXPECT_EQ(budget_between(budgets, mesh, ref).names(), std::vector<std::string>{"mesh-fp32"});
  EXPECT_EQ(budget_between(budgets, fp8, ref).names(), (std::vector<std::string>{"bf16", "fp8", "noise"}));
  // Deterministic accel lanes: only what separates them.
  EXPECT_EQ(budget_between(budgets, bf16, ref).names(), (std::vector<std::string>{"bf16", "noise"}));
  EXPECT_TRUE(budget_between(budgets, bf16, bf16_off).bitwise());
  // A seeded fp8 lane against a fixed-order bf16 lane: independent roundings, every feature.
  EXPECT_EQ(budget_between(budgets, fp8, bf16).names(), (std::vector<std::string>{"bf16", "fp8", "noise"}));
}

TEST(Verdict, InjectedFaultFailsTheExactCheckAtItsStep) {
  const Budgets budgets = load_budgets(kShippedBudgets);
  const ReceiptData clean = run("fault_clean", lane("micro", 8, 2));
  run::RunOptions faulty = lane("micro", 8, 2);
  faulty.inject_fault = "step=5,op=blocks.0.attn.proj";
  const ReceiptData moved = run("fault_moved", faulty);
  const Verdict v = compare_receipts(moved, clean, budgets, "golden");
  EXPECT_FALSE(v.pass());
  ASSERT_NE(v.first_failure(), nullptr);
  EXPECT_EQ(v.first_failure()->first_failing_step, 5);
  ASSERT_TRUE(v.first_moved.has_value());
  EXPECT_EQ(v.first_moved->step, 5);
  EXPECT_EQ(v.first_failure()->metric, "hashes");
}

// The headroom is the share of the budget left at the worst step: measured here against a
// budget set to exactly twice, then half, the largest loss deviation.
TEST(Verdict, HeadroomIsTheShareOfThePerturbedBudgetLeft) {
  const ReceiptData ref = run("headroom_ref", lane("tiny", 12, 2));
  const ReceiptData mesh = run("headroom_mesh", lane("tiny", 12, 2, "tpu-mesh", "", {{"mesh", "2x2"}, {"shard-plan", "tp"}}));
  double worst = 0;
  int worst_step = 0;
  for (int s = 0; s < ref.steps(); ++s) {
    const double d = std::fabs(mesh.loss[std::size_t(s)] - ref.loss[std::size_t(s)]);
    if (d > worst) worst = d, worst_step = s;
  }
  ASSERT_GT(worst, 0) << "tp on 2x2 should move the loss's last bits";
  for (const double scale : {2.0, 0.5}) {
    const std::string text = shipped_with(R"(loss = \[ \{ steps = "0-9", atol = 1e-6 \}, \{ steps = "10-", atol = 1.5e-6 \} \])",
                                          fmt::format("loss = [ {{ steps = \"0-\", atol = {:.17g} }} ]", worst * scale));
    const Budgets budgets = load_budgets(write_budgets("perturbed", text));
    const Verdict v = compare_receipts(mesh, ref, budgets, "compare");
    const MetricVerdict& loss = v.metrics.at(0);
    ASSERT_EQ(loss.metric, "loss");
    EXPECT_EQ(loss.worst_step, worst_step);
    EXPECT_NEAR(loss.headroom_pct, (1 - 1 / scale) * 100, 1e-9);
    EXPECT_EQ(loss.pass, scale > 1);
    EXPECT_EQ(loss.first_failing_step >= 0, scale < 1);
  }
}

// A NaN never passes, and a broken exact budget is never an allowed outlier.
TEST(Verdict, NanIsNeverExcusedByTheOutlierAllowance) {
  const std::string lenient = shipped_with(R"(rationale = "tpu-mesh in fp32)", "outlier_fraction = 0.5\nrationale = \"tpu-mesh in fp32");
  const Budgets budgets = load_budgets(write_budgets("lenient", lenient));
  ASSERT_EQ(budgets.feature("mesh-fp32").outlier_fraction, 0.5);
  const ReceiptData ref = run("nan_ref", lane("micro", 6, 2));
  ReceiptData mesh = run("nan_mesh", lane("micro", 6, 2, "tpu-mesh", "", {{"mesh", "2x1"}}));
  EXPECT_TRUE(compare_receipts(mesh, ref, budgets, "compare").pass());
  mesh.loss[2] = std::numeric_limits<double>::quiet_NaN();
  mesh.params_sketch[5] = std::numeric_limits<double>::quiet_NaN();
  const Verdict v = compare_receipts(mesh, ref, budgets, "compare");
  EXPECT_FALSE(v.pass());
  for (const MetricVerdict& m : v.metrics) {
    if (m.metric == "loss" || m.metric == "params_sketch") {
      EXPECT_FALSE(m.pass) << m.metric;
      EXPECT_EQ(m.first_failing_step, m.metric == "loss" ? 2 : 0) << m.metric;
      EXPECT_TRUE(std::isinf(m.headroom_pct)) << m.metric;
    }
  }
}

TEST(Verdict, TwoConfigurationsOfOneEngineGetTheirFeaturesBudget) {
  const Budgets budgets = load_budgets(kShippedBudgets);
  const ReceiptData tp = run("config_tp", lane("micro", 3, 2, "tpu-mesh", "", {{"mesh", "2x2"}, {"shard-plan", "tp"}}));
  const ReceiptData dp = run("config_dp", lane("micro", 3, 2, "tpu-mesh", "", {{"mesh", "2x1"}}));
  EXPECT_EQ(budget_between(budgets, tp, dp).names(), std::vector<std::string>{"mesh-fp32"});
  EXPECT_TRUE(compare_receipts(tp, dp, budgets, "compare").pass());
}

ContractError contract_error(const ReceiptData& a, const ReceiptData& b) {
  try {
    check_contracts(a, b);
  } catch (const ContractError& e) {
    return e;
  }
  return ContractError("none", "");
}

TEST(Verdict, ReceiptsThatCannotBeComparedAreDistinctErrors) {
  const ReceiptData micro = run("contract_micro", lane("micro", 4, 2));
  EXPECT_EQ(contract_error(micro, run("contract_short", lane("micro", 3, 2))).kind, "step_range");
  EXPECT_EQ(contract_error(micro, run("contract_tiny", lane("tiny", 4, 2))).kind, "another_canary");
  ReceiptData shifted = micro;
  shifted.batch_hashes[2] ^= 1;
  const ContractError data = contract_error(shifted, micro);
  EXPECT_EQ(data.kind, "different_data");
  EXPECT_NE(std::string(data.what()).find("the batch of step 2 differs"), std::string::npos);
  run::RunOptions reseeded = lane("micro", 4, 2);
  reseeded.seed = 7;
  EXPECT_EQ(contract_error(micro, run("contract_seed", reseeded)).kind, "another_seed");
  ReceiptData killed = micro;
  killed.complete = false;
  EXPECT_EQ(contract_error(killed, micro).kind, "incomplete");
  EXPECT_EQ(contract_error(micro, micro).kind, "none");
}

}  // namespace
}  // namespace harness::check
