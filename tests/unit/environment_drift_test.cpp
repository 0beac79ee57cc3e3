// Environment drift (harness/nightly/environment_drift.h): stack lines split into entries
// by their own grammar, and the entry that moved with the failing lanes ranked first, with
// the reruns a person can run and the one refresh to review.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "environment_drift.h"
#include "nightly.h"
#include "reports.h"

namespace harness::nightly {
namespace {

using nlohmann::json;

const std::string kLibraries = "HDF5 1.10.8; oneTBB 2021.8.0; xxHash 0.8.1; cereal 1.3.2; fmt 9.1.0";

json stack_move(const std::string& key, const std::string& run, const std::string& golden) {
  return {{"key", key}, {"a", run}, {"b", golden}, {"one_sided", false}};
}

// A lane whose golden check has `status` and these stack differences (run a, golden b).
json lane(const std::string& id, const std::string& status, const json& stack_diff) {
  const json verdict = {{"stack_diff", stack_diff}};
  return {{"id", id},
          {"lane", "micro/" + id},
          {"status", status},
          {"seconds", 1.0},
          {"receipt", "receipts/" + id + ".h5"},
          {"series", json::object()},
          {"triage", nullptr},
          {"checks", json::array({{{"check", "golden"}, {"status", status}, {"summary", "x"}, {"verdict", verdict}}})}};
}

json summary_of(const json& lanes) {
  return {{"matrix", {{"path", "canaries/nightly.toml"}}},
          {"budgets", {{"path", "canaries/budgets.toml"}}},
          {"goldens", "goldens"},
          {"lanes", lanes}};
}

TEST(StackEntries, EachLineSplitsByItsOwnGrammar) {
  const auto libraries = stack_entries("libraries", kLibraries);
  EXPECT_EQ(libraries.size(), 5u);
  EXPECT_EQ(libraries.at("libraries.fmt"), "9.1.0");
  EXPECT_EQ(libraries.at("libraries.oneTBB"), "2021.8.0");
  const auto toolchain = stack_entries("toolchain", "GNU 12.2.0; flags: Release -march=x86-64 -ffp-contract=off");
  EXPECT_EQ(toolchain.at("toolchain.GNU"), "12.2.0");
  EXPECT_EQ(toolchain.at("toolchain.flags"), "Release -march=x86-64 -ffp-contract=off");
  const auto python =
      stack_entries("toolchain", "CPython 3.11.2 (GCC 12.2.0); numerics env: "
                                 "XLA_FLAGS=--xla_cpu_enable_fast_math=false OMP_NUM_THREADS=2");
  EXPECT_EQ(python.at("toolchain.CPython"), "3.11.2 (GCC 12.2.0)");
  EXPECT_EQ(python.at("toolchain.numerics env.XLA_FLAGS"), "--xla_cpu_enable_fast_math=false");
  EXPECT_EQ(python.at("toolchain.numerics env.OMP_NUM_THREADS"), "2");
  const auto flags =
      stack_entries("toolchain", "CPython 3.11.2; numerics env: XLA_FLAGS=--xla_a=1 --xla_b=2 PJRT_DEVICE=CPU");
  EXPECT_EQ(flags.at("toolchain.numerics env.XLA_FLAGS"), "--xla_a=1 --xla_b=2");  // a value of several words
  EXPECT_EQ(flags.at("toolchain.numerics env.PJRT_DEVICE"), "CPU");
  EXPECT_EQ(flags.size(), 3u);
  const auto gpu = stack_entries("kernels", "device=NVIDIA H100 80GB HBM3 threads=2");
  EXPECT_EQ(gpu.at("kernels.device"), "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(gpu.at("kernels.threads"), "2");
  const auto kernels = stack_entries("kernels", "gemm=avx512 elementwise=avx512-16");
  EXPECT_EQ(kernels.at("kernels.gemm"), "avx512");
  EXPECT_EQ(kernels.at("kernels.elementwise"), "avx512-16");
  const auto cpu = stack_entries("cpu", "AMD EPYC 7B13 [avx avx2 fma]");
  ASSERT_EQ(cpu.size(), 1u);
  EXPECT_EQ(cpu.at("cpu"), "AMD EPYC 7B13 [avx avx2 fma]");
}

// The case: two stack lines differ in one library version and every lane fails:
// that library ranks first, and explains the failures; an entry one lane alone moved
// ranks after it and is rerun with the golden's value.
TEST(EnvironmentDrift, TheLibraryThatMovedWithEveryFailingLaneRanksFirst) {
  const std::string bumped = "HDF5 1.10.8; oneTBB 2021.8.0; xxHash 0.8.1; cereal 1.3.2; fmt 9.0.0";
  const json drift = environment_drift(summary_of(json::array({
      lane("ref", "fail", json::array({stack_move("libraries", bumped, kLibraries),
                                        stack_move("git_commit", "b", "a")})),
      lane("tp", "fail", json::array({stack_move("libraries", bumped, kLibraries),
                                       stack_move("kernels", "gemm=generic elementwise=sse-4",
                                                  "gemm=avx2-fma elementwise=sse-4")})),
      lane("bf16", "fail", json::array({stack_move("libraries", bumped, kLibraries)})),
  })));
  ASSERT_TRUE(drift.is_object());
  EXPECT_EQ(drift["failing_lanes"].size(), 3u);
  const json& top = drift["entries"][0];
  EXPECT_EQ(top["entry"], "libraries.fmt");
  EXPECT_EQ(top["failing"], 3);
  EXPECT_EQ(top["moves"], json::array({"9.1.0 -> 9.0.0"}));
  EXPECT_TRUE(top["explains"].get<bool>());
  EXPECT_TRUE(top["set_by"].is_null());  // a library comes with the machine: no rerun sets it
  ASSERT_EQ(drift["entries"].size(), 2u);  // git_commit is the code, not the environment
  EXPECT_EQ(drift["entries"][1]["entry"], "kernels.gemm");
  EXPECT_FALSE(drift["entries"][1]["explains"].get<bool>());
  ASSERT_EQ(drift["reruns"].size(), 1u);
  EXPECT_EQ(drift["reruns"][0]["command"],
            "HARNESS_GEMM_KERNEL=avx2-fma harness nightly --matrix canaries/nightly.toml --budgets "
            "canaries/budgets.toml --goldens goldens --lanes tp --out drift-kernels-gemm");
  EXPECT_EQ(drift["refresh"][0],
            "harness golden refresh --matrix canaries/nightly.toml --budgets canaries/budgets.toml --goldens goldens "
            "--reason 'environment drift: libraries.fmt 9.1.0 -> 9.0.0'");
  EXPECT_NE(drift["summary"].get<std::string>().find("libraries.fmt (9.1.0 -> 9.0.0) moved in 3 of 3 failing lanes"),
            std::string::npos);
}

// An entry that moved in a passing lane too explains less than one that moved only where
// lanes fail, even when it moved in as many failing lanes.
TEST(EnvironmentDrift, AnEntryThatMovedWhereLanesPassRanksBelow) {
  const json host = stack_move("host", "ci-2", "ci-1");
  const json threads = stack_move("threads", "4", "2");
  const json drift = environment_drift(summary_of(json::array({
      lane("a", "fail", json::array({host, threads})),
      lane("b", "fail", json::array({host, threads})),
      lane("c", "pass", json::array({host})),
  })));
  ASSERT_TRUE(drift.is_object());
  EXPECT_EQ(drift["entries"][0]["entry"], "threads");
  EXPECT_EQ(drift["entries"][0]["passing"], 0);
  EXPECT_EQ(drift["entries"][1]["entry"], "host");
  EXPECT_EQ(drift["entries"][1]["passing"], 1);
  ASSERT_EQ(drift["reruns"].size(), 1u);
  EXPECT_NE(drift["reruns"][0]["command"].get<std::string>().find("--lanes a,b --out drift-threads --threads 2"),
            std::string::npos);
}

// The Python stack's environment variables are set by their own names; one the golden ran
// without is unset.
TEST(EnvironmentDrift, AnEnvironmentVariableIsSetOrUnsetToTheGoldensValue) {
  const std::string golden = "CPython 3.11.2 (GCC 12.2.0); numerics env: OMP_NUM_THREADS=1";
  const std::string run = "CPython 3.11.2 (GCC 12.2.0); numerics env: OMP_NUM_THREADS=2 XLA_FLAGS=--xla_foo";
  const json moved = json::array({stack_move("toolchain", run, golden)});
  const json drift = environment_drift(summary_of(json::array({lane("x", "fail", moved), lane("y", "fail", moved)})));
  ASSERT_TRUE(drift.is_object());
  std::vector<std::string> commands;
  for (const json& r : drift["reruns"]) commands.push_back(r["command"]);
  ASSERT_EQ(commands.size(), 2u);
  EXPECT_TRUE(commands[0].starts_with("OMP_NUM_THREADS=1 harness nightly") ||
              commands[1].starts_with("OMP_NUM_THREADS=1 harness nightly"));
  EXPECT_TRUE(commands[0].starts_with("env -u XLA_FLAGS harness nightly") ||
              commands[1].starts_with("env -u XLA_FLAGS harness nightly"));
}

// Drift is a claim about several lanes on a moved stack: not one lane, not an unmoved stack.
TEST(EnvironmentDrift, OneFailingLaneOrAnUnmovedStackIsNoDrift) {
  const json moved = json::array({stack_move("cpu", "AMD EPYC", "Intel Xeon")});
  const json one_failing = summary_of(json::array({lane("a", "fail", moved), lane("b", "pass", moved)}));
  EXPECT_TRUE(environment_drift(one_failing).is_null());
  EXPECT_TRUE(environment_drift(summary_of(json::array({lane("a", "fail", json::array()),
                                                        lane("b", "fail", json::array())}))).is_null());
  const json drift = environment_drift(summary_of(json::array({lane("a", "fail", moved), lane("b", "fail", moved)})));
  ASSERT_TRUE(drift.is_object());
  EXPECT_EQ(drift["entries"][0]["entry"], "cpu");
  EXPECT_EQ(drift["entries"][0]["moves"], json::array({"Intel Xeon -> AMD EPYC"}));
}

// The reports carry it: summary.md's table and commands, the page's section.
TEST(EnvironmentDrift, TheReportsShowTheRankingAndTheCommands) {
  const json moved = json::array({stack_move("libraries", "fmt 9.0.0; HDF5 1.10.8", "fmt 9.1.0; HDF5 1.10.8")});
  json summary = summary_of(json::array({lane("a", "fail", moved), lane("b", "fail", moved)}));
  summary["environment_drift"] = environment_drift(summary);
  summary["verdict"] = "fail";
  summary["matrix"].update({{"canary", "micro"}, {"steps", 12}, {"reference", "a"}, {"content_hash", "h"},
                            {"lanes", json::array({"a", "b"})}});
  summary["budgets"]["content_hash"] = "h";
  summary["shards"] = json::array({{{"started_utc", "t"}, {"seconds", 1.0}}});
  const std::string md = markdown_report(summary);
  EXPECT_NE(md.find("| `libraries.fmt` | 9.1.0 -> 9.0.0 | 2 | 0 |"), std::string::npos) << md;
  EXPECT_NE(md.find("harness golden refresh --matrix"), std::string::npos);
  const std::string html = html_report(summary);
  EXPECT_NE(html.find("<h2>Environment drift</h2>"), std::string::npos);
  EXPECT_NE(html.find("libraries.fmt"), std::string::npos);
}

}  // namespace
}  // namespace harness::nightly
