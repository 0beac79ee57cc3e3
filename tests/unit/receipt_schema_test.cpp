// The receipt description (harness/receipt/receipt_schema.h with the engines' additions) is
// what the harness writes: every dataset and attribute a run of any engine, with every
// option, leaves in its receipt is described, and every required one is written.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <stdexcept>
#include <string>

#include "accel/noise.h"
#include "canary_run.h"
#include "receipt/hdf5_file.h"
#include "receipt/receipt_paths.h"
#include "receipt/receipt_schema.h"
#include "receipt/receipt_validator.h"
#include "receipt/receipt_writer.h"
#include "run/full_receipt_schema.h"
#include "scratch_dir.h"

namespace harness::receipt {
namespace {

class ReceiptSchemaTest : public ::testing::Test {
 protected:
  void SetUp() override { h5::silence_library_errors(); }

  std::string run(const std::string& name, const std::string& engine, EngineSettings settings) {
    run::RunOptions o;
    o.canary = "micro";
    o.steps = 2;
    o.threads = 2;
    o.engine = engine;
    o.engine_settings = std::move(settings);
    o.out = scratch_.path(name);
    o.dump_steps = {0, 2};
    o.record_batches = true;
    o.trace = run::TraceLevel::kOps;
    o.checkpoint_every = 1;
    run::run_canary(o);
    return o.out;
  }

  harness::testing::ScratchDir scratch_;
};

TEST_F(ReceiptSchemaTest, EveryEngineWritesOnlyDescribedContentAndEveryRequiredPart) {
  const std::string receipts[] = {
      run("cpu-ref.h5", "cpu-ref", {}),
      run("accel.h5", "accel", {"bf16,fp8=all", {{"noise", "seeded"}}}),
      run("mesh.h5", "tpu-mesh", {"", {{"mesh", "2x2"}, {"shard-plan", "tp"}}}),
  };
  for (const std::string& path : receipts) {
    const ValidationReport report = validate_receipt(path, run::full_receipt_schema());
    EXPECT_TRUE(report.valid()) << path << ": " << (report.problems.empty() ? "" : report.problems.front());
    EXPECT_TRUE(report.unknown.empty()) << path << ": " << (report.unknown.empty() ? "" : report.unknown.front());
  }
  // The core alone knows no engine's settings: they are unknown there, never a problem.
  const ValidationReport core_only = validate_receipt(receipts[1], ReceiptSchema::core());
  EXPECT_TRUE(core_only.valid());
  EXPECT_NE(std::find(core_only.unknown.begin(), core_only.unknown.end(), "group /fp8"), core_only.unknown.end());
}

TEST_F(ReceiptSchemaTest, ADescribedDatasetNoWriterWritesIsNamed) {
  const std::string path = run("r.h5", "cpu-ref", {});
  ReceiptEntries entries = run::full_receipt_schema().entries();
  entries.datasets.push_back({"/steps/momentum", ReceiptDtype::kFloat64, {ReceiptDim::kSteps}, false, "",
                              Presence::kRequired, 3, "a test", "not written by anyone"});
  entries.attributes.push_back({"/trace/origin", ReceiptValue::kString, Presence::kRequired, 3, "a test", "nor this"});
  const ValidationReport report = validate_receipt(path, ReceiptSchema(entries));
  ASSERT_EQ(report.problems.size(), 2u);
  EXPECT_EQ(report.problems[0], "/trace: missing attribute 'origin' (a string)");
  EXPECT_EQ(report.problems[1], "/steps/momentum: missing");
}

TEST_F(ReceiptSchemaTest, TheWriterWritesOnlyWhatTheDescriptionAllows) {
  Manifest m;
  m.lane = "x/accel";
  m.engine = "accel";
  m.canary_json = "{}";
  m.extra["noise_seed"] = std::string("7");  // described as an integer (accel's entries)
  const std::string refused = scratch_.path("refused.h5");
  EXPECT_THROW(ReceiptWriter(refused, m, {"w"}, false, false, {}, run::full_receipt_schema()), std::logic_error);
  EXPECT_FALSE(std::filesystem::exists(refused));

  m.extra.clear();
  ReceiptWriter writer(scratch_.path("w.h5"), m, {"w"}, false, false, {}, run::full_receipt_schema());
  EXPECT_NO_THROW(writer.append_state({{"fp8", {"a/input"}, {{"amax", {1.0}}}}}));
  ReceiptWriter other(scratch_.path("o.h5"), m, {"w"}, false, false, {}, run::full_receipt_schema());
  EXPECT_THROW(other.append_state({{"gpu_clock", {}, {{"mhz", {1.0}}}}}), std::logic_error);
}

// Code names paths only through receipt_paths.h: each is a group or dataset of the core
// description, and the families' paths are the datasets the description gives them.
TEST(ReceiptDescription, EveryNamedPathIsDescribed) {
  const ReceiptSchema& core = ReceiptSchema::core();
  std::set<std::string_view> keys;
  for (const auto& [key, path] : paths::named()) {
    EXPECT_TRUE(keys.insert(key).second) << key << " is named twice";
    EXPECT_TRUE(core.group(path) != nullptr || core.dataset(path) != nullptr) << key << ": " << path;
  }
  for (const char* family : kHashFamilies) EXPECT_NE(core.dataset(paths::hashes(family)), nullptr) << family;
  for (const char* family : kSketchFamilies) {
    EXPECT_NE(core.dataset(paths::sketch_l2(family)), nullptr) << family;
    EXPECT_NE(core.dataset(paths::sketch_projection(family)), nullptr) << family;
  }
  EXPECT_EQ(core.to_json().at("constants").at("paths").size(), keys.size());
  EXPECT_EQ(paths::leaf(paths::kTraceL2), "l2");
}

TEST(ReceiptDescription, EntriesThatDisagreeAreRefusedAndAgreeingOnesMerged) {
  ReceiptEntries twice = core_receipt_entries();
  twice.attributes.push_back({"/manifest/precision", ReceiptValue::kString, Presence::kOptional, 0, "another", "fp32"});
  const ReceiptSchema merged(twice);
  EXPECT_NE(merged.attribute("/manifest", "precision")->writer.find("another"), std::string::npos);
  twice.attributes.push_back({"/manifest/precision", ReceiptValue::kInteger, Presence::kOptional, 0, "a third", "1"});
  EXPECT_THROW(ReceiptSchema{twice}, std::logic_error);
}

TEST(ReceiptDescription, PatternsMatchOneNamePerStarAndExactEntriesWin) {
  EXPECT_TRUE(path_matches("/fp8/*", "/fp8/amax"));
  EXPECT_FALSE(path_matches("/fp8/*", "/fp8"));
  EXPECT_FALSE(path_matches("/fp8/*", "/fp8/a/b"));
  EXPECT_FALSE(path_matches("/fp8/*", "/fp9/amax"));
  EXPECT_TRUE(path_matches("/tensors/*/*", "/tensors/step_000002/wte"));
  const ReceiptSchema& schema = run::full_receipt_schema();
  EXPECT_EQ(schema.dataset("/fp8/names")->dtype, ReceiptDtype::kString);
  EXPECT_EQ(schema.dataset("/fp8/amax")->dtype, ReceiptDtype::kFloat64);
  EXPECT_EQ(schema.dataset("/fp8/amax/x"), nullptr);
}

}  // namespace
}  // namespace harness::receipt

namespace harness::receipt {
namespace {

// The verdict gates counters and reads a run's reduction order by what the description
// says of them, so each role and gate must be described where a writer records it.
TEST(ReceiptDescription, CountersAndSettingsCarryTheRolesTheVerdictReads) {
  const ReceiptSchema& schema = run::full_receipt_schema();
  EXPECT_EQ(schema.dataset("/compile/UncachedCompile")->gate, CounterGate::kCompilesAfterWarmup);
  EXPECT_EQ(schema.dataset("/compile/HostSync")->gate, CounterGate::kHostSyncs);
  EXPECT_EQ(schema.dataset("/compile/CompileTime")->gate, CounterGate::kNone);
  EXPECT_EQ(schema.dataset("/memory/total")->gate, CounterGate::kPeakBytes);
  EXPECT_EQ(schema.dataset("/memory/names")->gate, CounterGate::kNone);
  int orders = 0, seeds = 0;
  for (const ReceiptAttribute& a : schema.entries().attributes) {
    orders += a.role == AttributeRole::kReductionOrder;
    seeds += a.role == AttributeRole::kReductionSeed;
  }
  EXPECT_EQ(orders, 1);
  EXPECT_EQ(seeds, 1);
  EXPECT_EQ(accel::to_string(accel::NoiseMode::Seeded), kSeededOrder);
  EXPECT_EQ(accel::to_string(accel::NoiseMode::Racy), kRacyOrder);
}

}  // namespace
}  // namespace harness::receipt

namespace harness::receipt {
namespace {

// A required entry binds the receipts of its minor on: an older receipt lacks it lawfully.
TEST_F(ReceiptSchemaTest, ARequiredEntryBindsOnlyReceiptsOfItsMinorOn) {
  const std::string path = run("r.h5", "cpu-ref", {});
  ReceiptEntries entries = run::full_receipt_schema().entries();
  entries.datasets.push_back({"/steps/momentum", ReceiptDtype::kFloat64, {ReceiptDim::kSteps}, false, "",
                              Presence::kRequired, static_cast<int>(kSchemaMinor) + 1, "a later writer", "not yet"});
  EXPECT_TRUE(validate_receipt(path, ReceiptSchema(entries)).valid());
}

}  // namespace
}  // namespace harness::receipt
