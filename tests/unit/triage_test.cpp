// harness triage (harness/nightly/triage.h): a precision lane with FP8 units made bad on
// purpose (--fp8-saturate) is traced to exactly those units, and the set it names is
// 1-minimal: with any one of its units back in FP8 the lane fails again.
#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "budgets.h"
#include "receipt_bits.h"
#include "triage.h"
#include "verdict.h"

namespace harness::nightly {
namespace {

using testing::lane;
using testing::scratch;

const std::string kBudgets = std::string(HARNESS_SOURCE_DIR) + "/canaries/budgets.toml";

// Runs `options` into the scratch receipt `tag`.h5 and returns its path.
std::string run_into(run::RunOptions options, const std::string& tag) {
  options.out = scratch().path(tag + ".h5");
  options.force = true;
  run::run_canary(options);
  return options.out;
}

const std::string& reference() {
  static const std::string path = run_into(lane("micro", 20, 2), "triage-ref");
  return path;
}

run::RunOptions fp8_lane(std::map<std::string, std::string> flags) {
  return lane("micro", 20, 2, "accel", "bf16,fp8=all", std::move(flags));
}

bool passes(const run::RunOptions& options, const std::string& tag) {
  const check::Verdict v = check::compare_receipts(check::load_receipt(run_into(options, tag)),
                                                   check::load_receipt(reference()), check::load_budgets(kBudgets),
                                                   "compare");
  return v.pass();
}

std::vector<std::string> values_of(const std::vector<PrecisionUnit>& units) {
  std::vector<std::string> values;
  for (const PrecisionUnit& u : units) values.push_back(u.value);
  std::sort(values.begin(), values.end());
  return values;
}

TEST(Triage, NamesTheSaturatedUnitsAndNoOther) {
  // Each of the two units alone takes micro out of the fp8 budget; no zone whole holds both.
  const run::RunOptions bad = fp8_lane({{"fp8-saturate", "mlp_fc@1,mlp_proj@0"}});
  ASSERT_FALSE(passes(bad, "triage-bad"));
  const Triage t = triage({scratch().path("triage-bad.h5"), reference(), kBudgets, 2});
  ASSERT_TRUE(t.found()) << triage_report(t);
  EXPECT_EQ(t.format, "fp8");
  EXPECT_EQ(t.flag, "fp8-off");
  EXPECT_EQ(values_of(t.culprits), (std::vector<std::string>{"mlp_fc@1", "mlp_proj@0"})) << triage_report(t);
  EXPECT_EQ(t.units_of_format, 8u);
  EXPECT_LT(t.headroom_before, 0);
  EXPECT_GT(*t.headroom_after, 0);
  EXPECT_TRUE(t.whole_formats_off.empty());
  // 1-minimal, checked apart from triage's own trials: each culprit back in FP8 fails.
  for (const std::string& kept : values_of(t.culprits)) {
    run::RunOptions fewer = bad;
    fewer.engine_settings.options["fp8-off"] = kept == "mlp_fc@1" ? "mlp_proj@0" : "mlp_fc@1";
    EXPECT_FALSE(passes(fewer, "triage-fewer")) << "without " << kept;
  }
  // The rerun it prints switches exactly the culprits.
  const auto off = std::find(t.rerun.begin(), t.rerun.end(), "--fp8-off");
  ASSERT_NE(off, t.rerun.end());
  EXPECT_TRUE(off[1] == "mlp_fc@1,mlp_proj@0" || off[1] == "mlp_proj@0,mlp_fc@1") << off[1];
}

TEST(Triage, AZoneWholeIsTriedBeforeItsBlocks) {
  run_into(fp8_lane({{"fp8-saturate", "mlp_fc@0"}}), "triage-zone");
  const Triage t = triage({scratch().path("triage-zone.h5"), reference(), kBudgets, 1});
  ASSERT_TRUE(t.found()) << triage_report(t);
  EXPECT_EQ(values_of(t.culprits), std::vector<std::string>{"mlp_fc@0"});
  const auto zone = std::find_if(t.trials.begin(), t.trials.end(), [](const TriageTrial& trial) {
    return trial.what.find("group mlp_fc") != std::string::npos;
  });
  ASSERT_NE(zone, t.trials.end()) << triage_report(t);
  EXPECT_TRUE(zone->pass);
  // No trial switched a unit of another zone after the zone was found.
  for (auto it = zone + 1; it != t.trials.end(); ++it) EXPECT_EQ(it->what.find("qkv"), std::string::npos) << it->what;
}

TEST(Triage, ALaneInsideItsBudgetHasNothingToTriage) {
  run_into(fp8_lane({}), "triage-good");
  const Triage t = triage({scratch().path("triage-good.h5"), reference(), kBudgets, 2});
  EXPECT_TRUE(t.already_passes);
  EXPECT_TRUE(t.trials.empty());
  EXPECT_FALSE(t.found());
}

TEST(Triage, ALaneWithoutReducedPrecisionIsRefusedNamingIt) {
  const std::string noisy = run_into(lane("micro", 20, 2, "accel", ""), "triage-fp32");
  // The shipped budgets with [noise] made bitwise: the fp32 accel lane fails them.
  std::stringstream shipped;
  shipped << std::ifstream(kBudgets).rdbuf();
  std::string text = shipped.str();
  const std::size_t noise = text.find("\n[noise]\n"), next = text.find("\n[", noise + 1);
  ASSERT_NE(noise, std::string::npos);
  text.replace(noise, next - noise, "\n[noise]\nform = \"bitwise\"\nrationale = \"this test's\"\n");
  const std::string budgets = scratch().path("bitwise-noise.toml");
  std::ofstream(budgets) << text;
  try {
    triage({noisy, reference(), budgets, 2});
    FAIL() << "an fp32 lane was triaged";
  } catch (const run::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("runs in no reduced precision"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace harness::nightly
