// The exact GELU (`model.gelu = "erf"`, the op gelu_erf_*) through a canary on every
// engine: bitwise across thread counts on each, one tpu-mesh device bitwise cpu-ref's, and
// the option really switches the op (the numbers move from the tanh GELU's, a little).
// The canary-file key: a choice, refused where the architecture has no GELU, carried by
// the identity only when it is not the default.
#include <cmath>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "canary_file.h"
#include "preset.h"
#include "exact_gelu_canary.h"
#include "receipt_bits.h"

namespace harness::testing {
namespace {

using Flags = std::map<std::string, std::string>;

TEST(GeluErfCanary, EveryEngineIsBitwiseAcrossThreadCounts) {
  struct Engine {
    const char* name;
    const char* features;
    Flags flags;
  };
  const Engine engines[] = {{"cpu-ref", "", {}},
                            {"accel", "bf16", {{"noise", "off"}}},
                            {"tpu-mesh", "", {{"mesh", "2x2"}, {"shard-plan", "tp"}}},
                            {"tpu-mesh", "", {{"mesh", "2x1"}, {"shard-plan", "zero3"}, {"precision", "bf16"}}}};
  for (const Engine& e : engines) {
    const ReceiptBits one = run_and_read(lane(micro_with_exact_gelu(), 4, 1, e.name, e.features, e.flags), "erf_t1");
    EXPECT_TRUE(one.same_numbers(run_and_read(lane(micro_with_exact_gelu(), 4, 3, e.name, e.features, e.flags), "erf_t3")))
        << e.name << " " << e.features;
    EXPECT_TRUE(std::isfinite(one.loss.back())) << e.name;
  }
}

TEST(GeluErfCanary, OneMeshDeviceIsCpuRefBitForBit) {
  const ReceiptBits reference = run_and_read(lane(micro_with_exact_gelu(), 4, 2), "erf_ref");
  EXPECT_TRUE(reference.same_numbers(run_and_read(lane(micro_with_exact_gelu(), 4, 2, "tpu-mesh", "", {{"mesh", "1x1"}}), "erf_mesh")));
}

TEST(GeluErfCanary, TheOptionSwitchesTheOpAndMovesTheLossALittle) {
  const ReceiptBits erf = run_and_read(lane(micro_with_exact_gelu(), 4, 2), "erf");
  const ReceiptBits tanh = run_and_read(lane("micro", 4, 2), "tanh");
  ASSERT_EQ(erf.loss.size(), tanh.loss.size());
  EXPECT_NE(erf.params, tanh.params);
  EXPECT_NE(erf.loss, tanh.loss);
  for (std::size_t s = 0; s < erf.loss.size(); ++s) {  // the two GELUs differ by < 1e-3 of an activation
    EXPECT_NEAR(erf.loss[s], tanh.loss[s], 1e-3 * tanh.loss[s]) << s;
  }
}

TEST(GeluErfCanary, TheKeyIsAChoiceCarriedByTheIdentityOnlyWhenNotTheDefault) {
  const canary::CanaryConfig erf = canary::load_canary(micro_with_exact_gelu());
  EXPECT_EQ(erf.gelu, "erf");
  EXPECT_EQ(erf.to_json().at("gelu"), "erf");
  EXPECT_EQ(canary::CanaryConfig::from_json(erf.to_json()).to_json(), erf.to_json());
  const canary::CanaryConfig micro = canary::load_canary("micro");
  EXPECT_EQ(micro.gelu, "tanh");
  EXPECT_FALSE(micro.to_json().contains("gelu"));  // the identity of every canary before the key
  const std::string bad = scratch().path("bad-gelu.toml");
  std::ofstream(bad) << "schema_version = 1\nname = \"b\"\narchitecture = \"gpt2\"\n[model]\nvocab = 16\ncontext = 4\n"
                        "channels = 8\nlayers = 1\nheads = 2\ngelu = \"exact\"\n[train]\nbatch = 1\nsteps = 2\n";
  try {
    canary::load_canary(bad);
    FAIL() << "a GELU that is neither tanh nor erf was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("model.gelu: 'exact' is not one of tanh, erf"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace harness::testing
