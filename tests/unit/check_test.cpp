// Budgets and verdicts: the shipped budgets file parses and names every feature; a bad
// entry is an error naming its key; allowances compose by adding; the verdict of two
// receipts is exact for lanes that make the same roundings, budgeted otherwise, names the
// first failing step of an injected fault and the headroom of a perturbed budget; and
// receipts that cannot be compared are distinct errors, never a pass.
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bf16_first.h"
#include "budgets.h"
#include "false_alarm.h"
#include "receipt/budget_features.h"
#include "receipt/hdf5_file.h"
#include "receipt/receipt_validator.h"
#include "receipt_bits.h"
#include "registry.h"
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

// The shipped file with the first match of `pattern` inside its [section] replaced: an edit
// that does not depend on the numbers a calibration wrote there.
std::string shipped_in(const std::string& section, const std::string& pattern, const std::string& replacement) {
  const std::string text = shipped_text();
  const std::size_t head = text.find("\n[" + section + "]\n") + 1;
  const std::size_t end = std::min(text.find("\n[", head), text.size());
  return text.substr(0, head) +
         std::regex_replace(text.substr(head, end - head), std::regex(pattern), replacement,
                            std::regex_constants::format_first_only) +
         text.substr(end);
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
    EXPECT_GE(f.provenance.samples, 1) << name;
    for (const char* metric : kBudgetMetrics) EXPECT_TRUE(f.metrics.count(metric)) << name << " " << metric;
  }
  EXPECT_TRUE(b.feature("reference").bitwise);
  EXPECT_EQ(b.compile_stability.max_uncached_compiles, 0);
  EXPECT_EQ(b.compile_stability.max_host_syncs, 0);
}

TEST(Budgets, EveryBadEntryIsAnErrorNamingTheFileAndKey) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {shipped_in("bf16", R"(loss = \[.*\])", R"(loss = [ { steps = "0-9", atol = -1e-3 }, { steps = "10-", atol = 2e-3 } ])"),
       "[bf16].loss[0].atol: must be a non-negative number"},
      {shipped_in("bf16", R"(loss = \[.*\])", R"(loss = [ { steps = "0-9", atol = 1e-3 }, { steps = "ten", atol = 2e-3 } ])"),
       "[bf16].loss[1].steps: 'ten' is not a step window"},
      {shipped_in("bf16", R"(loss = \[.*\])", R"(loss = [ { steps = "0-19", atol = 1e-3 }, { steps = "10-", atol = 2e-3 } ])"),
       "[bf16].loss[1].steps: overlaps an earlier window"},
      {shipped_in("bf16", R"(params_sketch = \[.*\])", R"(params_sketch = [ { steps = "0-", atol = 0.4, rtool = 0.035 } ])"),
       "[bf16].params_sketch[0].rtool: unknown key"},
      {shipped_with(R"(\[reference\])", "[referense]"), "[reference]: missing"},
      {shipped_with(R"(form = "bitwise"\nrationale = "Batch)", "form = \"tolerance\"\nrationale = \"Batch"),
       "[data].form: must be bitwise"},
      {shipped_with(R"(schema_version = 1)", "schema_version = 7"), "schema_version: 7 is not 1"},
      {shipped_in("noise", R"(calibrated = "[0-9-]+")", ""), "[noise].calibrated: missing"},
      {shipped_in("noise", R"(calibrated = "[0-9-]+")", "calibrated = \"yesterday\""),
       "[noise].calibrated: 'yesterday' is not a date YYYY-MM-DD"},
      {shipped_in("noise", R"(calibrated = "[0-9-]+")", "calibrated = \"2026-02-30\""),
       "[noise].calibrated: '2026-02-30' is not a date YYYY-MM-DD"},
      {shipped_in("noise", R"(calibrated = "[0-9-]+")", "calibrated = \"2026-+1-01\""),
       "[noise].calibrated: '2026-+1-01' is not a date YYYY-MM-DD"},
      {shipped_text() + "\n[tiny.bf16]\nform = \"tolerance\"\nrationale = \"r\"\ncalibrated = \"2026-11-21\"\n"
                        "observed = \"x\"\nloss = [ { steps = \"0-\", atol = 1 } ]\n",
       "[tiny.bf16].observed: must be a table"},
      {shipped_with(R"(canaries = \["tiny", "micro"\])", "canaries = \"tiny\""), "[default-entries].canaries: must be an array"},
      {shipped_with(R"(canaries = \["tiny", "micro"\])", "canaries = [\"tiny\", 3]"), "[default-entries].canaries: every item"},
      {shipped_with(R"(canaries = \["tiny", "micro"\])", "canaries = []\ncanary = 1"), "[default-entries].canary: unknown key"},
      {shipped_in("noise", R"(calibrated = "[0-9-]+")", "calibrated = \"2026-11-21\"\nbias = \"loud\""),
       "[noise].bias: 'loud' is not warn or fail"},
      {shipped_in("noise", R"(samples = \d+)", "samples = -8"),
       "[noise].samples: must be a non-negative integer"},
      {shipped_in("noise", R"(held_out = \d+\nheld_out_outside = \d+)", "held_out = 4\nheld_out_outside = 5"),
       "[noise].held_out_outside: 5 of 4 held-out samples"},
      {shipped_in("noise", R"(held_out = \d+)", "held_out = 2.5"),
       "[noise].held_out: must be a non-negative integer"},
      {shipped_in("noise", R"(power = \{.*\})", "power = { weight_scale = \"lots\" }"),
       "[noise].power.weight_scale: the smallest size caught, or \"none up to X\""},
      {shipped_in("noise", R"(power = \{.*\})", "power = { speed = 1 }"),
       "[noise].power.speed: unknown key"},
      {shipped_text() + "\n[tpu]\nform = \"bitwise\"\n", "[tpu].rationale: must be a string"},
      {shipped_text() + "\n[torch-tpu]\nrationale = \"r\"\n", "[torch-tpu].form: must be a string"},
      {shipped_text() + "\n[\"bf 16\"]\nform = \"bitwise\"\nrationale = \"r\"\n",
       "[bf 16]: a feature name is letters, digits, '-' and '_'"},
      {"tolerance = 3\n" + shipped_text(), "tolerance: not a table"},
      // per-canary entries: checked as the defaults are, named by their table
      {shipped_text() + "\n[tiny.bf16]\nform = \"tolerance\"\nrationale = \"r\"\ncalibrated = \"2026-11-21\"\n"
                        "loss = [ { steps = \"0-\", atol = -1 } ]\n",
       "[tiny.bf16].loss[0].atol: must be a non-negative number"},
      {shipped_text() + "\n[tiny.bf16]\nform = \"tolerance\"\nrationale = \"r\"\nloss = [ { steps = \"0-\", atol = 1 } ]\n",
       "[tiny.bf16].calibrated: missing"},
      {shipped_text() + "\n[tiny.bf16]\nform = \"tolerance\"\nrationale = \"r\"\ncalibrated = \"2026-11-21\"\n"
                        "loss = [ { steps = \"0-\", atl = 1 } ]\n",
       "[tiny.bf16].loss[0].atl: unknown key"},
      {shipped_text() + "\n[tiny.memory]\nrationale = \"r\"\nrtol = 0\n",
       "[tiny.memory]: only feature entries and compile-stability are keyed per canary"},
      {shipped_text() + "\n[\"my canary\".bf16]\nform = \"bitwise\"\nrationale = \"r\"\n",
       "[my canary]: a canary name is letters, digits, '-' and '_'"},
      {"schema_version = 1\n[reference\n", "line 2"},
      // windows from the decisions' part: one anchor, and they overlap only each other
      {shipped_text() + "\n[tiny.bf16]\nform = \"tolerance\"\nrationale = \"r\"\ncalibrated = \"2026-11-21\"\n"
                        "loss = [ { steps = \"0-\", atol = 1 }, { steps = \"0-\", from = \"routing\", atol = 1 } ]\n",
       "[tiny.bf16].loss[1].from: 'routing' is not an anchor; the one anchor is \"decisions-part\""},
      {shipped_text() + "\n[tiny.bf16]\nform = \"tolerance\"\nrationale = \"r\"\ncalibrated = \"2026-11-21\"\n"
                        "loss = [ { steps = \"0-\", atol = 1 }, "
                        "{ steps = \"0-9\", from = \"decisions-part\", atol = 1 }, "
                        "{ steps = \"5-\", from = \"decisions-part\", atol = 1 } ]\n",
       "[tiny.bf16].loss[2].steps: overlaps an earlier window"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string error = load_error(text);
    EXPECT_NE(error.find(expected), std::string::npos) << "want '" << expected << "', got '" << error << "'";
    EXPECT_NE(error.find(".toml: "), std::string::npos) << error;  // the file comes first
  }
  EXPECT_NE(load_error("").find("schema_version: missing"), std::string::npos);
  try {
    load_budgets(scratch().path("absent.toml"));
    ADD_FAILURE() << "a missing budgets file loaded";
  } catch (const BudgetError& e) {
    EXPECT_NE(std::string(e.what()).find("absent.toml: cannot read the budgets file"), std::string::npos) << e.what();
  }
}

// A tolerance entry [name] with one loss window and `keys` (its provenance) in between.
std::string entry(const std::string& name, const std::string& keys) {
  return "\n[" + name + "]\nform = \"tolerance\"\nrationale = \"r\"\ncalibrated = \"2026-11-28\"\n" + keys +
         "\nloss = [ { steps = \"0-\", atol = 1 } ]\n";
}

// An entry from fewer than kMinCalibrationSamples samples is provisional: `samples` when the
// entry has it, else (files written before it) `repeats`; the bitwise rule never is.
TEST(Budgets, AnEntryFromFewerThanEightSamplesIsProvisional) {
  const Budgets b = load_budgets(write_budgets(
      "samples", shipped_text() + entry("eight", "samples = 8") + entry("three", "repeats = 3") +
                     entry("both", "repeats = 1\nsamples = 8") + entry("none", "")));
  EXPECT_EQ(kMinCalibrationSamples, 8);
  EXPECT_EQ(b.feature("eight").samples(), 8);
  EXPECT_FALSE(b.feature("eight").provisional());
  EXPECT_EQ(b.feature("three").samples(), 3);
  EXPECT_TRUE(b.feature("three").provisional());
  EXPECT_FALSE(b.feature("both").provisional());  // samples over repeats
  EXPECT_TRUE(b.feature("none").provisional());   // no count: nothing says it was measured
  EXPECT_FALSE(b.feature("reference").provisional());
  const ComposedBudget composed({&b.feature("eight"), &b.feature("three"), &b.feature("reference")});
  ASSERT_EQ(composed.provisional_parts().size(), 1u);
  EXPECT_EQ(composed.provisional_parts().front()->key(), "three");
}

// An entry's false-alarm bound comes from its held-out samples (k of n outside: the one-sided
// Clopper-Pearson bound); none held out, none; the bitwise rule's is 0.
TEST(Budgets, AnEntryBoundsItsFalseAlarmsFromItsHeldOutSamples) {
  const Budgets b = load_budgets(write_budgets(
      "held_out", shipped_text() + entry("none", "samples = 8") +
                      entry("clean", "samples = 8\nheld_out = 16\nheld_out_outside = 0") +
                      entry("one", "samples = 8\nheld_out = 16\nheld_out_outside = 1")));
  EXPECT_FALSE(b.feature("none").false_alarm_bound().has_value());
  ASSERT_TRUE(b.feature("clean").false_alarm_bound().has_value());
  EXPECT_NEAR(*b.feature("clean").false_alarm_bound(), 1 - std::pow(0.05, 1.0 / 16), 1e-12);
  EXPECT_NEAR(*b.feature("one").false_alarm_bound(), false_alarm_upper_bound(1, 16), 1e-15);
  EXPECT_GT(*b.feature("one").false_alarm_bound(), *b.feature("clean").false_alarm_bound());
  EXPECT_EQ(b.feature("reference").false_alarm_bound(), 0.0);
}

TEST(Budgets, AllowancesOfSeveralFeaturesAddUpPerStepWindow) {
  FeatureBudget a{"a", false, {{"loss", {{0, 9, 1.0, 0.0, 0.0}, {10, 99, 2.0, 0.0, 0.0}}}}, 0.0, "", {}, "a"};
  FeatureBudget b{"b", false, {{"loss", {{0, 99, 0.5, 0.1, 0.0}}}, {"grad_norm", {{0, 99, 0.0, 0.0, 2.0}}}}, 0.02, "", {}, "tiny.b"};
  const ComposedBudget both({&a, &b});
  EXPECT_DOUBLE_EQ(both.allowed("loss", 3, 10.0), 1.0 + 0.5 + 0.1 * 10.0);
  EXPECT_DOUBLE_EQ(both.allowed("loss", 10, -10.0), 2.0 + 0.5 + 0.1 * 10.0);
  EXPECT_DOUBLE_EQ(both.allowed("loss", 100, 1.0), 0.0);  // past every window: exact
  EXPECT_DOUBLE_EQ(both.allowed("grad_norm", 0, 1.0), 2.0 * fp32_ulp(1.0));
  EXPECT_DOUBLE_EQ(both.outlier_fraction(), 0.02);
  EXPECT_FALSE(both.bitwise());
  EXPECT_TRUE(ComposedBudget().bitwise());
  EXPECT_EQ(ComposedBudget().names(), std::vector<std::string>{"reference"});
  EXPECT_EQ(both.names(), (std::vector<std::string>{"a", "tiny.b"}));  // the entries' tables
}

// A window from the decisions' part adds its allowance from the step where the runs'
// decisions part, counting its steps from there; before, and for runs that never part,
// only the entry's other windows apply.
TEST(Budgets, WindowsFromTheDecisionsPartApplyOnlyOnceTheDecisionsPart) {
  Window base{0, std::numeric_limits<int>::max(), 1.0, 0.0, 0.0};
  Window first_ten{0, 9, 5.0, 0.0, 0.0, true}, later{10, std::numeric_limits<int>::max(), 7.0, 0.0, 0.0, true};
  FeatureBudget entry{"noise", false, {{"loss", {base, first_ten, later}}}, 0.0, "", {}, "moe.noise"};
  ComposedBudget budget({&entry});
  for (int step : {0, 39, 40, 99}) EXPECT_DOUBLE_EQ(budget.allowed("loss", step, 2.0), 1.0) << "never parted";
  budget.set_decisions_part(40);
  EXPECT_DOUBLE_EQ(budget.allowed("loss", 39, 2.0), 1.0);
  EXPECT_DOUBLE_EQ(budget.allowed("loss", 40, 2.0), 1.0 + 5.0);
  EXPECT_DOUBLE_EQ(budget.allowed("loss", 49, 2.0), 1.0 + 5.0);
  EXPECT_DOUBLE_EQ(budget.allowed("loss", 50, 2.0), 1.0 + 7.0);
  EXPECT_DOUBLE_EQ(budget.allowed("loss", 50, 2.0, 3), 1.0 + 5.0);  // a run that parted 3 steps before
  EXPECT_DOUBLE_EQ(budget.allowed("loss", 50, 2.0, kDecisionsNeverPart), 1.0);
}

// moe-tiny's accel-noise lane (the nightly's seed) moves one routing choice at step 40: the
// shipped [moe-tiny.noise] passes it, and the same numbers with cpu-ref's decisions (a run
// whose routing never moved) fail from step 40, where only the noise of sums is allowed.
TEST(Verdict, TheDecisionsPartBringsInTheirAllowanceFromThatStep) {
  const Budgets shipped = load_budgets(kShippedBudgets);
  const std::string goldens = std::string(HARNESS_SOURCE_DIR) + "/goldens/moe-tiny/";
  const ReceiptData ref = load_receipt(goldens + "cpu-ref.h5");
  const ReceiptData flipped = load_receipt(goldens + "accel.h5");
  const std::optional<DecisionsPart> part = decisions_part(flipped, ref);
  ASSERT_TRUE(part.has_value());
  EXPECT_EQ(part->step, 40);
  EXPECT_EQ(part->column, "blocks.1.moe.route");
  const Verdict passed = compare_receipts(flipped, ref, shipped, "compare");
  EXPECT_TRUE(passed.pass());
  ASSERT_TRUE(passed.decisions_part.has_value());
  EXPECT_EQ(passed.decisions_part->step, 40);
  ReceiptData unflipped = flipped;
  unflipped.decisions = ref.decisions;
  EXPECT_FALSE(decisions_part(unflipped, ref).has_value());
  const Verdict v = compare_receipts(unflipped, ref, shipped, "compare");
  ASSERT_FALSE(v.pass());
  EXPECT_EQ(v.first_failure()->first_failing_step, 40);
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

// The envelope the reports draw is the verdict's own: per step, the deviation and allowance
// of the place (the tensor, for sketches) that came closest to its budget.
TEST(Verdict, EachStepKeepsWhereItCameClosestToItsBudget) {
  const Budgets budgets = load_budgets(kShippedBudgets);
  const ReceiptData ref = run("series_ref", lane("micro", 6, 2));
  const ReceiptData bf16 = run("series_bf16", lane("micro", 6, 2, "accel", "bf16", {{"noise", "off"}}));
  const Verdict v = compare_receipts(bf16, ref, budgets, "compare");
  const ComposedBudget budget = budget_between(budgets, bf16, ref);
  ASSERT_FALSE(budget.bitwise());
  int checked = 0;
  for (const MetricVerdict& m : v.metrics) {
    ASSERT_EQ(m.step_deviation.size(), 6u) << m.metric;
    for (int s = 0; s < 6; ++s) {
      const auto at = static_cast<std::size_t>(s);
      if (m.metric == "loss") {
        EXPECT_EQ(m.step_deviation[at], std::fabs(bf16.loss[at] - ref.loss[at]));
        EXPECT_EQ(m.step_allowed[at], budget.allowed("loss", s, ref.loss[at]));
        ++checked;
      } else if (m.metric == "params_sketch") {
        double worst = -1, deviation = 0, allowed = 0;
        for (std::size_t t = 0; t < ref.tensors.size(); ++t) {
          const std::size_t w = receipt::kSketchWidth, first = (at * ref.tensors.size() + t) * w;
          const SketchDistance d = sketch_distance(std::span(bf16.params_sketch).subspan(first, w),
                                                   std::span(ref.params_sketch).subspan(first, w));
          const double a = budget.allowed("params_sketch", s, d.reference_norm);
          if (d.distance / a > worst) worst = d.distance / a, deviation = d.distance, allowed = a;
        }
        EXPECT_EQ(m.step_deviation[at], deviation) << s;
        EXPECT_EQ(m.step_allowed[at], allowed) << s;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 12);
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
    const std::string text = shipped_in("mesh-fp32", R"(loss = \[.*\])",
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

// ---- Declared budget features (docs/budgets.md, "Composition") --------------------------

// What the verdict inferred from engine names before receipts declared their features:
// kept here as the oracle the engines' declarations must reproduce (no verdict changes).
std::set<std::string> inferred_from_engine_name(const std::string& engine, const std::string& features,
                                                const std::map<std::string, AttributeValue>& attributes) {
  auto attr = [&](const char* key) {
    const auto it = attributes.find(key);
    return it == attributes.end() ? std::string() : std::get<std::string>(it->second);
  };
  std::set<std::string> f;
  if (engine == "accel") {
    f.insert("noise");
    if (features.find("bf16") != std::string::npos) f.insert("bf16");
    if (!attr("fp8_zones").empty() && attr("fp8_zones") != "none") {
      f.insert("fp8");
      if (attr("fp8_accumulate").starts_with("limited")) f.insert("fp8-limited");
    }
  } else if (engine == "tpu-mesh") {
    f.insert(attr("precision") == "bf16" ? "mesh-bf16" : "mesh-fp32");
  }
  return f;
}

TEST(DeclaredFeatures, EnginesDeclareWhatTheVerdictUsedToInfer) {
  const std::vector<std::tuple<std::string, EngineSettings, std::string>> cases{
      {"cpu-ref", {}, ""},
      {"accel", {}, "noise"},
      {"accel", {"", {{"noise", "off"}}}, "noise"},
      {"accel", {"bf16", {{"noise", "racy"}}}, "noise+bf16"},
      {"accel", {"bf16,fp8=all", {}}, "noise+bf16+fp8"},
      {"accel", {"bf16,fp8=qkv,mlp_fc", {{"fp8-recipe", "current"}}}, "noise+bf16+fp8"},
      {"accel", {"bf16,fp8=mlp_proj", {{"fp8-accumulate", "limited:64"}}}, "noise+bf16+fp8+fp8-limited"},
      {"accel", {"bf16,fp8=all", {{"fp8-accumulate", "full"}}}, "noise+bf16+fp8"},
      {"tpu-mesh", {"", {{"mesh", "2x2"}, {"shard-plan", "tp"}}}, "mesh-fp32"},
      {"tpu-mesh", {"", {{"mesh", "2x1"}, {"precision", "bf16"}, {"shard-plan", "zero3"}}}, "mesh-bf16"},
  };
  for (const auto& [engine_name, settings, declared] : cases) {
    const auto engine = make_engine(engine_name, settings);
    const std::vector<std::string> features = engine->budget_features();
    EXPECT_EQ(fmt::format("{}", fmt::join(features, "+")), declared) << engine_name << " " << settings.features;
    EXPECT_EQ(std::set<std::string>(features.begin(), features.end()),
              inferred_from_engine_name(engine_name, engine->features(), engine->manifest_attributes()))
        << engine_name << " " << settings.features;
  }
  // ... and the run writes the declaration into the manifest, where the verdict reads it.
  const ReceiptData fp8 = run("declared_fp8", lane("micro", 2, 2, "accel", "bf16,fp8=all", {{"fp8-accumulate", "limited"}}));
  EXPECT_EQ(fp8.manifest.at("budget_features"), "noise+bf16+fp8+fp8-limited");
  EXPECT_EQ(budget_features(fp8), (std::set<std::string>{"bf16", "fp8", "fp8-limited", "noise"}));
  const ReceiptData ref = run("declared_ref", lane("micro", 2, 2));
  EXPECT_EQ(ref.manifest.at("budget_features"), "");
  EXPECT_TRUE(budget_features(ref).empty());
}

// Only the declaration counts: the same receipts with another declaration get another budget.
TEST(DeclaredFeatures, TheBudgetIsComposedFromTheDeclaredNamesOnly) {
  const Budgets budgets = load_budgets(kShippedBudgets);
  const ReceiptData ref = run("only_ref", lane("micro", 3, 2));
  ReceiptData accel = run("only_accel", lane("micro", 3, 2, "accel", "bf16", {{"noise", "off"}}));
  EXPECT_EQ(budget_between(budgets, accel, ref).names(), (std::vector<std::string>{"bf16", "noise"}));
  accel.manifest["budget_features"] = "mesh-bf16";  // an accel receipt declaring another feature
  EXPECT_EQ(budget_between(budgets, accel, ref).names(), std::vector<std::string>{"mesh-bf16"});
  accel.manifest["budget_features"] = "";  // declaring none: judged bitwise, whatever its engine
  EXPECT_TRUE(budget_between(budgets, accel, ref).bitwise());
  EXPECT_FALSE(compare_receipts(accel, ref, budgets, "compare").pass());  // bf16 moved it: exact fails
}

ContractError verdict_error(const ReceiptData& a, const ReceiptData& b, const Budgets& budgets,
                            const std::string& kind = "compare") {
  try {
    compare_receipts(a, b, budgets, kind);
  } catch (const ContractError& e) {
    return e;
  }
  return ContractError("none", "");
}

TEST(DeclaredFeatures, AReceiptThatDeclaresNothingIsAContractError) {
  const Budgets budgets = load_budgets(kShippedBudgets);
  const ReceiptData ref = run("undeclared_ref", lane("micro", 3, 2));
  ReceiptData old = ref;  // bitwise equal to ref: only the missing declaration can stop it
  old.manifest.erase("budget_features");
  const ContractError run_side = verdict_error(old, ref, budgets, "golden");
  EXPECT_EQ(run_side.kind, "no_budget_features");
  EXPECT_EQ(std::string(run_side.what()),
            ref.path + ": the receipt declares no budget_features in /manifest (docs/budgets.md); re-record it with a "
                       "writer that declares them");
  // A golden of before the declarations: the message says how to re-record it.
  const ContractError golden = verdict_error(ref, old, budgets, "golden");
  EXPECT_EQ(golden.kind, "no_budget_features");
  EXPECT_NE(std::string(golden.what()).find(ref.path + ": the golden of lane micro/cpu-ref declares no budget_features"),
            std::string::npos) << golden.what();
  EXPECT_NE(std::string(golden.what()).find("`harness golden refresh --lanes micro/cpu-ref --reason TEXT`, then approve it"),
            std::string::npos) << golden.what();
  EXPECT_EQ(std::string(golden.what()).find('\n'), std::string::npos);  // one line
  EXPECT_EQ(verdict_error(ref, old, budgets, "compare").kind, "no_budget_features");
  EXPECT_EQ(verdict_error(ref, ref, budgets).kind, "none");
}

TEST(DeclaredFeatures, ADeclaredFeatureWithoutABudgetIsAContractErrorNeverBitwise) {
  const Budgets budgets = load_budgets(kShippedBudgets);
  const ReceiptData ref = run("nobudget_ref", lane("micro", 3, 2));
  ReceiptData torch = ref;  // bitwise equal: a silent bitwise comparison would pass
  torch.manifest["budget_features"] = "torch-fp64";
  const ContractError e = verdict_error(torch, ref, budgets);
  EXPECT_EQ(e.kind, "no_budget");
  EXPECT_EQ(std::string(e.what()), fmt::format("no budget for feature 'torch-fp64' in {}: calibrate one", kShippedBudgets));
  // On either side, and among features that have one.
  torch.manifest["budget_features"] = "bf16+torch-fp64";
  EXPECT_EQ(verdict_error(ref, torch, budgets).kind, "no_budget");
}

// Budgets keyed per canary: [micro.bf16] over [bf16] for micro receipts only.
TEST(DeclaredFeatures, APerCanaryEntryOverridesTheDefaultForItsCanaryOnly) {
  const std::string text = shipped_text() +
                           "\n[micro.bf16]\nform = \"tolerance\"\nrationale = \"micro moves less\"\ncalibrated = \"2026-11-22\"\n"
                           "repeats = 1\nloss = [ { steps = \"0-\", atol = 0.25 } ]\n";
  const Budgets budgets = load_budgets(write_budgets("per_canary", text));
  ASSERT_NE(budgets.find("bf16", "micro"), nullptr);
  EXPECT_EQ(budgets.find("bf16", "micro")->key(), "micro.bf16");
  EXPECT_EQ(budgets.find("bf16", "tiny")->key(), "bf16");
  EXPECT_EQ(budgets.find("noise", "micro")->key(), "noise");  // no override: the default
  EXPECT_EQ(budgets.find("torch-tpu", "micro"), nullptr);  // a feature with no entry
  EXPECT_TRUE(budgets.describes("bf16"));
  EXPECT_FALSE(budgets.describes("torch-tpu"));

  const ReceiptData ref = run("canary_ref", lane("micro", 3, 2));
  const ReceiptData bf16 = run("canary_bf16", lane("micro", 3, 2, "accel", "bf16", {{"noise", "off"}}));
  EXPECT_EQ(canary_name(bf16), "micro");
  const ComposedBudget micro = budget_between(budgets, bf16, ref);
  EXPECT_EQ(micro.names(), (std::vector<std::string>{"micro.bf16", "noise"}));
  const ComposedBudget noise({budgets.find("noise", "micro")}), default_bf16({budgets.find("bf16", "tiny")});
  EXPECT_DOUBLE_EQ(micro.allowed("loss", 0, 5.0), 0.25 + noise.allowed("loss", 0, 5.0));  // [micro.bf16] + [noise]
  EXPECT_DOUBLE_EQ(micro.allowed("grad_norm", 0, 5.0), noise.allowed("grad_norm", 0, 5.0));  // [micro.bf16] bounds none
  // The same receipts as another canary's: the defaults.
  ReceiptData tiny_ref = ref, tiny_bf16 = bf16;
  for (ReceiptData* r : {&tiny_ref, &tiny_bf16}) {
    nlohmann::json canary = nlohmann::json::parse(r->manifest.at("canary"));
    canary["preset"] = "tiny";
    r->manifest["canary"] = canary.dump();
  }
  EXPECT_EQ(canary_name(tiny_bf16), "tiny");
  const ComposedBudget tiny = budget_between(budgets, tiny_bf16, tiny_ref);
  EXPECT_EQ(tiny.names(), (std::vector<std::string>{"bf16", "noise"}));
  EXPECT_DOUBLE_EQ(tiny.allowed("loss", 0, 5.0), default_bf16.allowed("loss", 0, 5.0) + noise.allowed("loss", 0, 5.0));
  EXPECT_GT(default_bf16.allowed("loss", 0, 5.0), 0.0);
  // A canary JSON with a name names the canary; the lane's prefix is the last resort.
  ReceiptData named = bf16;
  named.manifest["canary"] = R"({"name": "small", "preset": "micro"})";
  EXPECT_EQ(canary_name(named), "small");
  named.manifest["canary"] = "{}";
  EXPECT_EQ(canary_name(named), "micro");  // from the lane micro/accel+bf16+noise=off
}

// [NAME.compile-stability]: a canary whose loop compiles twice before it is stable (torch's
// optimizers make their state inside the first step) declares its own warm-up; the others
// keep [compile-stability]'s.
TEST(Budgets, ACanaryDeclaresItsOwnCompileWarmUp) {
  const std::string text = shipped_text() +
                           "\n[micro.compile-stability]\nrationale = \"optimizer state made in step 0\"\n"
                           "warmup_steps = 2\nmax_uncached_compiles = 0\nmax_host_syncs = 0\n";
  const Budgets budgets = load_budgets(write_budgets("canary_warmup", text));
  EXPECT_EQ(budgets.compile_stability_of("micro").warmup_steps, 2);
  EXPECT_EQ(budgets.compile_stability_of("tiny").warmup_steps, budgets.compile_stability.warmup_steps);
  EXPECT_EQ(budgets.compile_stability.warmup_steps, 1);

  ReceiptData mesh = run("warmup_mesh", lane("micro", 4, 2, "tpu-mesh", "", {{"mesh", "2x1"}}));
  ASSERT_EQ(mesh.counters.at("/compile/UncachedCompile").values.size(), 4u);
  ASSERT_GT(mesh.counters.at("/compile/UncachedCompile").values[0], 0);
  mesh.counters.at("/compile/UncachedCompile").values[1] = 1;  // a second graph at step 1, as torch.optim's makes
  const auto gate = [&](const Budgets& b) {
    const Verdict v = compare_receipts(mesh, mesh, b, "golden");
    return *std::find_if(v.metrics.begin(), v.metrics.end(),
                         [](const MetricVerdict& m) { return m.metric == "compile_stability.uncached_compiles"; });
  };
  EXPECT_TRUE(gate(budgets).pass);
  const MetricVerdict shipped = gate(load_budgets(kShippedBudgets));
  EXPECT_FALSE(shipped.pass);
  EXPECT_EQ(shipped.first_failing_step, 1);
  mesh.counters.at("/compile/UncachedCompile").values[2] = 1;  // past the canary's warm-up: fails there
  const MetricVerdict late = gate(budgets);
  EXPECT_FALSE(late.pass);
  EXPECT_EQ(late.first_failing_step, 2);

  const std::string entry = "\n[micro.compile-stability]\nrationale = \"r\"\nmax_uncached_compiles = 0\nmax_host_syncs = 0\n";
  EXPECT_NE(load_error(shipped_text() + entry + "warmup_steps = -1\n").find("[micro.compile-stability].warmup_steps: must be"),
            std::string::npos);
  EXPECT_NE(load_error(shipped_text() + entry + "warmup = 2\n").find("[micro.compile-stability].warmup: unknown key"),
            std::string::npos);
  EXPECT_NE(load_error(shipped_text() + "\n[micro.compile-stability]\nwarmup_steps = 2\n")
                .find("[micro.compile-stability].rationale: must be"),
            std::string::npos);
}

// The default entries budget only the canaries [default-entries] lists: another canary's
// calibration is never reused silently (docs/budgets.md).
TEST(DeclaredFeatures, ACanaryOutsideTheDefaultEntriesNeedsItsOwn) {
  const Budgets budgets = load_budgets(kShippedBudgets);
  EXPECT_EQ(budgets.default_entry_canaries, (std::set<std::string>{"micro", "tiny"}));
  EXPECT_NE(budgets.find("bf16", "tiny"), nullptr);
  EXPECT_EQ(budgets.find("bf16", "mine"), nullptr);
  ASSERT_NE(budgets.find("reference", "mine"), nullptr);  // bitwise holds for every canary

  const ReceiptData ref = run("own_ref", lane("micro", 3, 2));
  const ReceiptData bf16 = run("own_bf16", lane("micro", 3, 2, "accel", "bf16", {{"noise", "off"}}));
  ReceiptData mine_ref = ref, mine_bf16 = bf16;
  for (ReceiptData* r : {&mine_ref, &mine_bf16}) {
    nlohmann::json canary = nlohmann::json::parse(r->manifest.at("canary"));
    canary["preset"] = "mine";
    r->manifest["canary"] = canary.dump();
  }
  const ContractError e = verdict_error(mine_bf16, mine_ref, budgets);
  EXPECT_EQ(e.kind, "no_budget");
  EXPECT_EQ(std::string(e.what()),
            fmt::format("no budget for canary 'mine' in {}: [mine.bf16], [mine.noise] missing; the default entries are for "
                        "micro, tiny ([default-entries]); calibrate the canary's own (harness calibrate) or list it there",
                        kShippedBudgets));
  // Two runs that make the same roundings need no tolerance: bitwise, for any canary.
  EXPECT_TRUE(budget_between(budgets, mine_ref, mine_ref).bitwise());
  // Its own entries, or a listing by choice, make it comparable.
  const std::string own = shipped_text() +
                          "\n[mine.bf16]\nform = \"tolerance\"\nrationale = \"mine\"\ncalibrated = \"2026-11-23\"\n"
                          "repeats = 1\nloss = [ { steps = \"0-\", atol = 0.25 } ]\n"
                          "\n[mine.noise]\nform = \"tolerance\"\nrationale = \"mine\"\ncalibrated = \"2026-11-23\"\n"
                          "repeats = 1\nloss = [ { steps = \"0-\", atol = 0.5 } ]\n";
  EXPECT_EQ(budget_between(load_budgets(write_budgets("own_entries", own)), mine_bf16, mine_ref).names(),
            (std::vector<std::string>{"mine.bf16", "mine.noise"}));
  std::string listed = shipped_text();
  listed.replace(listed.find("canaries = [\"tiny\", \"micro\"]"), 28, "canaries = [\"tiny\", \"micro\", \"mine\"]");
  EXPECT_EQ(budget_between(load_budgets(write_budgets("listed", listed)), mine_bf16, mine_ref).names(),
            (std::vector<std::string>{"bf16", "noise"}));
}

// A stack the harness has never heard of gets the budget of what it declares.
TEST(DeclaredFeatures, AForeignEngineIsBudgetedByItsDeclarationWithNoSpecialCase) {
  const Budgets budgets = load_budgets(kShippedBudgets);
  const ReceiptData ref = run("foreign_ref", lane("micro", 4, 2));
  const ReceiptData bf16 = run("foreign_bf16", lane("micro", 4, 2, "accel", "bf16", {{"noise", "off"}}));
  ReceiptData torch = bf16;  // bf16 numbers, written by "torch"
  torch.engine = torch.manifest["engine"] = "torch";
  torch.lane = torch.manifest["lane"] = "micro/torch+bf16";
  torch.manifest["budget_features"] = "bf16";
  const Verdict v = compare_receipts(torch, ref, budgets, "compare");
  EXPECT_FALSE(v.bitwise);
  EXPECT_EQ(v.budget, std::vector<std::string>{"bf16"});
  const ComposedBudget bf16_alone({budgets.find("bf16", "micro")});
  EXPECT_GT(bf16_alone.allowed("loss", 12, 5.0), 0.0);
  EXPECT_DOUBLE_EQ(budget_between(budgets, torch, ref).allowed("loss", 12, 5.0), bf16_alone.allowed("loss", 12, 5.0));
  EXPECT_TRUE(v.pass());
  torch.manifest["budget_features"] = "";  // declaring nothing: exact, and bf16 moved it
  EXPECT_FALSE(compare_receipts(torch, ref, budgets, "compare").pass());
}

// Which feature BF16-first triage explains is its entry's declaration (triage_twin), never
// its name: the shipped [fp8] declares it; without the key nothing is triaged, and a
// [bf16] that declared it would be triaged by its "fp32" twin.
TEST(Triage, TheTriagedFeatureIsTheOneWhoseEntryDeclaresATwin) {
  const Budgets shipped = load_budgets(kShippedBudgets);
  const auto fp8 = triaged_features({"bf16", "fp8"}, shipped);
  ASSERT_EQ(fp8.size(), 1u);
  EXPECT_EQ(fp8[0].name, "fp8");
  EXPECT_EQ(fp8[0].twin, "bf16-only");
  EXPECT_TRUE(triaged_features({"bf16"}, shipped).empty());
  EXPECT_EQ(bf16_first_advice(fp8[0], "micro/accel+bf16", true, ""),
            "quantisation drift: only the fp8 lane moves; the bf16-only lane micro/accel+bf16 passes");

  const Budgets undeclared = load_budgets(write_budgets("no_twin", shipped_in("fp8", R"(triage_twin = "bf16-only"  #[^\n]*\n)", "")));
  EXPECT_TRUE(triaged_features({"bf16", "fp8"}, undeclared).empty());
  const Budgets both = load_budgets(write_budgets("bf16_twin", shipped_in("bf16", R"(form = "tolerance"\n)",
                                                                        "form = \"tolerance\"\ntriage_twin = \"fp32\"\n")));
  const auto bf16 = triaged_features({"bf16"}, both);
  ASSERT_EQ(bf16.size(), 1u);
  EXPECT_EQ(bf16_first_advice(bf16[0], "m/accel", false, "first at step 3"),
            "shared math or plumbing: the fp32 lane m/accel fails too (first at step 3)");
  // Both declared: a bf16+fp8 lane against its bf16 twin is told apart by fp8, against an
  // fp32 twin by bf16 (the first its twin lacks); a twin with both explains nothing.
  const auto lane = triaged_features({"bf16", "fp8"}, both);
  ASSERT_EQ(lane.size(), 2u);
  EXPECT_EQ(feature_the_twin_lacks(lane, {"bf16"})->name, "fp8");
  EXPECT_EQ(feature_the_twin_lacks(lane, {})->name, "bf16");
  EXPECT_FALSE(feature_the_twin_lacks(lane, {"bf16", "fp8"}).has_value());
  // A canary's own entry cannot declare it: triage is the feature's, for every canary.
  EXPECT_NE(load_error(shipped_text() + "\n[tiny.fp8]\nform = \"bitwise\"\nrationale = \"x\"\ntriage_twin = \"bf16-only\"\n")
                .find("[tiny.fp8].triage_twin: triage is declared on the feature's own entry [fp8]"),
            std::string::npos);
}

// A machine-dependent feature (across_platforms) declared by both receipts brings its
// cross-platform entry when their platforms differ, and only then; one side alone does not.
TEST(DeclaredFeatures, AMachineDependentFeatureIsBudgetedAcrossPlatformsOnlyWhenThePlatformsDiffer) {
  const Budgets budgets = load_budgets(kShippedBudgets);
  ASSERT_EQ(budgets.find("torch-cpu", "micro")->across_platforms, "torch-host");
  const ReceiptData ref = run("platform_ref", lane("micro", 3, 2));
  ReceiptData here = ref;
  here.manifest["budget_features"] = "torch-cpu";
  ReceiptData there = here;
  EXPECT_TRUE(budget_between(budgets, here, there, true).bitwise());  // one platform: its golden is exact
  for (const char* key : {"cpu", "toolchain", "libraries", "kernels"}) {
    there = here;
    there.manifest[key] = "another " + there.manifest[key];
    const ComposedBudget across = budget_between(budgets, here, there, true);
    EXPECT_EQ(across.names(), std::vector<std::string>{"torch-host"}) << key;
    EXPECT_NE(across.reason().find(key), std::string::npos) << across.reason();
  }
  // Against cpu-ref (portable bits, no such feature) on another CPU: torch-cpu alone,
  // whose entry covers every host.
  ReceiptData ref_there = ref;
  ref_there.manifest["cpu"] = "another CPU";
  EXPECT_EQ(budget_between(budgets, here, ref_there).names(), std::vector<std::string>{"torch-cpu"});
}

// bias = "fail" marks an entry whose one-sided drift over repeats fails a calibration; the
// default (no key, or "warn") warns.
TEST(Budgets, BiasFailsOnlyWhereTheEntrySaysSo) {
  const std::string text = shipped_in("noise", R"(calibrated = "[0-9-]+")", "calibrated = \"2026-11-21\"\nbias = \"fail\"");
  const Budgets budgets = load_budgets(write_budgets("bias-fail", text));
  EXPECT_TRUE(budgets.feature("noise").bias_fails);
  EXPECT_FALSE(budgets.feature("bf16").bias_fails);
  EXPECT_FALSE(load_budgets(kShippedBudgets).feature("noise").bias_fails);
}

TEST(Budgets, AcrossPlatformsNamesAnEntryOfTheFile) {
  const std::string text = shipped_with(R"(across_platforms = "torch-host"\n)", "across_platforms = \"torch-elsewhere\"\n");
  EXPECT_NE(load_error(text).find("[torch-cpu].across_platforms: no entry [torch-elsewhere] in this file"), std::string::npos)
      << load_error(text);
}

// Property: receipt::BudgetFeatures is the one parse and the one format of budget_features:
// every list of distinct feature names survives format then parse, in order; every text
// that parses is formatted back to itself.
TEST(DeclaredFeatures, BudgetFeaturesRoundTripEveryWellFormedList) {
  const std::vector<std::string> pool{"bf16", "noise", "fp8", "torch-cpu", "mesh_fp32", "X9"};
  for (unsigned mask = 0; mask < (1u << pool.size()); ++mask) {
    std::vector<std::string> names;
    for (std::size_t i = 0; i < pool.size(); ++i) {
      if (mask & (1u << i)) names.push_back(pool[(i + mask) % pool.size()]);  // varied orders
    }
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    if (mask % 3 == 0) std::reverse(names.begin(), names.end());
    const receipt::BudgetFeatures features(names);
    EXPECT_EQ(features.names(), names);
    const std::string text = features.to_string();
    EXPECT_EQ(receipt::BudgetFeatures::parse(text).names(), names) << text;
    EXPECT_EQ(receipt::BudgetFeatures::parse(text).to_string(), text);
    EXPECT_EQ(features.empty(), names.empty());
    for (const std::string& name : pool) {
      EXPECT_EQ(features.contains(name), std::count(names.begin(), names.end(), name) == 1) << text << " " << name;
    }
  }
  EXPECT_THROW(receipt::BudgetFeatures({"bf16", "bf16"}), std::invalid_argument);
  EXPECT_THROW(receipt::BudgetFeatures({"bf16", ""}), std::invalid_argument);
  EXPECT_THROW(receipt::BudgetFeatures::parse("bf16+fp8=all"), std::invalid_argument);
}

// The schema gate: budget_features, where present, is names joined with '+', each once.
TEST(DeclaredFeatures, AMalformedDeclarationIsASchemaProblem) {
  const std::string good = scratch().path("malformed_good.h5");
  run::RunOptions o = lane("micro", 2, 2);
  o.out = good;
  o.force = true;
  run::run_canary(o);
  const std::vector<std::pair<std::string, std::string>> cases{
      {"noise++bf16", "/manifest/budget_features: 'noise++bf16' has an empty feature name (item 2); give names joined with '+', or \"\" for none"},
      {"+bf16", "/manifest/budget_features: '+bf16' has an empty feature name (item 1); give names joined with '+', or \"\" for none"},
      {"bf16+", "/manifest/budget_features: 'bf16+' has an empty feature name (item 2); give names joined with '+', or \"\" for none"},
      {"bf16+noise+bf16", "/manifest/budget_features: 'bf16+noise+bf16' names feature 'bf16' twice"},
      {"bf16+torch cpu", "/manifest/budget_features: 'bf16+torch cpu': feature name 'torch cpu' is not letters, digits, '-' and '_'"},
  };
  for (const auto& [declared, expected] : cases) {
    const std::string path = scratch().path("malformed.h5");
    std::filesystem::copy_file(good, path, std::filesystem::copy_options::overwrite_existing);
    {
      const h5::Handle f = h5::open_file(path, true);
      const h5::Handle m = h5::open_group(f, "manifest");
      h5::write_attr(m, "budget_features", declared);
    }
    const receipt::ValidationReport report = receipt::validate_receipt(path);
    EXPECT_EQ(report.problems, std::vector<std::string>{expected}) << declared;
    try {
      load_receipt(path);
      ADD_FAILURE() << declared << " was accepted";
    } catch (const receipt::ReceiptError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
  for (const std::string declared : {"", "bf16", "noise+bf16+fp8", "torch-cpu"}) {
    const std::string path = scratch().path("wellformed.h5");
    std::filesystem::copy_file(good, path, std::filesystem::copy_options::overwrite_existing);
    {
      const h5::Handle f = h5::open_file(path, true);
      h5::write_attr(h5::open_group(f, "manifest"), "budget_features", declared);
    }
    EXPECT_TRUE(receipt::validate_receipt(path).valid()) << declared;
  }
}

}  // namespace
}  // namespace harness::check
