// The moe canary on tpu-mesh: one device is bitwise cpu-ref on every plan (routing records
// included); expert parallelism moves rows and never values (bitwise dp on the same mesh,
// as zero3 is); every plan and mesh stays inside moe-tiny's fp32 mesh budget with cpu-ref's
// routing decisions; a fixed mesh is bitwise on any thread count; ep holds 1/data of the
// experts' bytes per device; and what the mesh cannot run is refused with a line naming it.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "budgets.h"
#include "canary_file.h"
#include "receipt/hdf5_file.h"
#include "receipt_bits.h"

namespace harness::tpu {
namespace {

using harness::testing::lane;
using harness::testing::max_loss_gap;
using harness::testing::receipt_dataset;
using harness::testing::ReceiptBits;
using harness::testing::run_and_read;
using harness::testing::scratch;

using Flags = std::map<std::string, std::string>;

run::RunOptions moe_lane(int steps, int threads, Flags flags) {
  return lane("moe-tiny", steps, threads, "tpu-mesh", "", std::move(flags));
}

// A run's receipt and its routing: the decisions' hashes and tokens per expert, per step and layer.
struct MoeRun {
  ReceiptBits bits;
  std::vector<double> decisions, tokens0, dropped;
};

MoeRun run_moe(run::RunOptions options, const std::string& tag) {
  MoeRun r{run_and_read(std::move(options), tag), {}, {}, {}};
  r.decisions = receipt_dataset(tag, "/routing/decisions_hash");
  r.tokens0 = receipt_dataset(tag, "/routing/tokens_expert_0");
  r.dropped = receipt_dataset(tag, "/routing/dropped");
  return r;
}

bool same_routing(const MoeRun& a, const MoeRun& b) {
  return a.decisions == b.decisions && a.tokens0 == b.tokens0 && a.dropped == b.dropped;
}

const MoeRun& cpu_reference() {
  static const MoeRun reference = run_moe(lane("moe-tiny", 3, 2), "moe_cpu_ref");
  return reference;
}

TEST(TpuMeshMoe, OneDeviceIsBitwiseCpuRefOnEveryPlan) {
  for (const char* plan : {"dp", "tp", "zero3", "ep"}) {
    const MoeRun one = run_moe(moe_lane(3, 2, {{"shard-plan", plan}}), "moe_one_device");
    EXPECT_TRUE(cpu_reference().bits.same_numbers(one.bits)) << plan;
    EXPECT_TRUE(same_routing(cpu_reference(), one)) << plan;
  }
}

// Wherever an expert runs it sees all of its rows, in slot order: under ep on its owner
// after the all-to-all, under dp and zero3 on every device after the exchange. The
// exchange only moves rows, so the three plans compute the same bits on one mesh.
TEST(TpuMeshMoe, ExpertParallelismMovesRowsNeverValues) {
  for (const char* mesh : {"2x1", "4x1"}) {
    const MoeRun dp = run_moe(moe_lane(3, 2, {{"mesh", mesh}, {"shard-plan", "dp"}}), "moe_dp");
    for (const char* plan : {"ep", "zero3"}) {
      const MoeRun other = run_moe(moe_lane(3, 2, {{"mesh", mesh}, {"shard-plan", plan}}), "moe_other");
      EXPECT_TRUE(dp.bits.same_numbers(other.bits)) << plan << " on " << mesh;
      EXPECT_TRUE(same_routing(dp, other)) << plan << " on " << mesh;
    }
  }
}

// Within [moe-tiny.mesh-fp32]'s loss window of cpu-ref, with cpu-ref's routing decisions.
TEST(TpuMeshMoe, EveryPlanAndMeshStaysWithinItsBudgetWithCpuRefsDecisions) {
  const check::Budgets budgets = check::load_budgets(std::string(HARNESS_SOURCE_DIR) + "/canaries/budgets.toml");
  const double allowed = budgets.find("mesh-fp32", "moe-tiny")->metrics.at("loss").front().atol;
  ASSERT_GT(allowed, 0);
  bool any_moved = false;
  const std::pair<const char*, const char*> cases[] = {{"dp", "2x1"}, {"tp", "1x2"}, {"tp", "2x2"},
                                                       {"ep", "2x2"}, {"ep", "4x1"}, {"zero3", "2x2"}};
  for (const auto& [plan, mesh] : cases) {
    const MoeRun run = run_moe(moe_lane(3, 2, {{"mesh", mesh}, {"shard-plan", plan}}), "moe_budget");
    EXPECT_EQ(run.bits.batches, cpu_reference().bits.batches);
    EXPECT_LE(max_loss_gap(run.bits, cpu_reference().bits), allowed) << plan << " " << mesh;
    EXPECT_EQ(run.decisions, cpu_reference().decisions) << plan << " " << mesh;
    any_moved = any_moved || !run.bits.same_numbers(cpu_reference().bits);
  }
  EXPECT_TRUE(any_moved) << "no plan changed a bit; sharding did nothing";
}

TEST(TpuMeshMoe, FixedMeshAndPlanIsBitwiseOnAnyThreadCount) {
  for (const char* plan : {"ep", "tp"}) {
    const Flags flags{{"mesh", "2x2"}, {"shard-plan", plan}, {"precision", "bf16"}};
    const MoeRun two = run_moe(moe_lane(2, 2, flags), "moe_repro2");
    for (int threads : {1, 3}) {
      const MoeRun other = run_moe(moe_lane(2, threads, flags), "moe_repro");
      EXPECT_TRUE(two.bits.same_numbers(other.bits)) << plan << " on " << threads << " threads";
      EXPECT_TRUE(same_routing(two, other)) << plan << " on " << threads << " threads";
    }
  }
}

// Each of 4 devices holds one expert of every layer under ep, all four under dp.
TEST(TpuMeshMoe, ExpertParallelismHoldsOneNthOfTheExpertsPerDevice) {
  run_and_read(moe_lane(1, 2, {{"mesh", "4x1"}, {"shard-plan", "dp"}}), "moe_memory_dp");
  run_and_read(moe_lane(1, 2, {{"mesh", "4x1"}, {"shard-plan", "ep"}}), "moe_memory_ep");
  const canary::CanaryConfig config = canary::load_canary("moe-tiny");
  const double expert_bytes = 4.0 * static_cast<double>(config.layers) * 3 * static_cast<double>(config.experts) *
                              static_cast<double>(config.mlp_hidden * config.channels);
  for (const char* category : {"/memory/parameters", "/memory/optimizer_state"}) {
    const std::vector<double> dp = receipt_dataset("moe_memory_dp", category);
    const std::vector<double> ep = receipt_dataset("moe_memory_ep", category);
    ASSERT_EQ(dp.size(), 4u);
    const double copies = std::string(category) == "/memory/optimizer_state" ? 2 : 1;  // m and v
    for (std::size_t d = 0; d < dp.size(); ++d) EXPECT_EQ(dp[d] - ep[d], copies * expert_bytes * 3 / 4) << category;
  }
}

// The refusal's message; refused before step 0, the run leaves no receipt.
std::string refusal(run::RunOptions options) {
  options.out = scratch().path("moe_refused.h5");
  std::filesystem::remove(options.out);
  try {
    run::run_canary(options);
  } catch (const std::exception& e) {
    EXPECT_FALSE(std::filesystem::exists(options.out)) << e.what();
    return e.what();
  }
  return "";
}

TEST(TpuMeshMoe, RefusesWhatTheMeshCannotRunWithALineNamingIt) {
  EXPECT_NE(refusal(moe_lane(1, 2, {{"mesh", "8x1"}, {"shard-plan", "ep"}}))
                .find("blocks.0.moe.experts.gate.weight dimension 0 has size 4, which does not divide into 8 shards"),
            std::string::npos);
  EXPECT_NE(refusal(moe_lane(1, 2, {{"mesh", "2x1"}, {"grad-accum", "2"}}))
                .find("--grad-accum 2: blocks.0.moe.dispatch.out holds every expert's rows of the step's whole batch"),
            std::string::npos);
}

}  // namespace
}  // namespace harness::tpu
