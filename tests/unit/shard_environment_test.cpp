// `--shard auto` reads each scheduler's variables; every incomplete set is a named error.
#include <map>

#include <gtest/gtest.h>

#include "shard_environment.h"

namespace harness::nightly {
namespace {

Environment fake(std::map<std::string, std::string> values) {
  return [values](const std::string& name) -> std::optional<std::string> {
    const auto it = values.find(name);
    return it == values.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

std::string error_of(const std::map<std::string, std::string>& values) {
  try {
    shard_from_environment(fake(values));
  } catch (const MatrixError& e) {
    return e.what();
  }
  return "";
}

TEST(ShardEnvironment, ExplicitVariablesGiveTheShard) {
  const Shard s = shard_from_environment(fake({{"HARNESS_SHARD_INDEX", "2"}, {"HARNESS_SHARD_COUNT", "3"}}));
  EXPECT_EQ(s.index, 2);
  EXPECT_EQ(s.count, 3);
}

TEST(ShardEnvironment, SlurmArrayCountsFromItsFirstTask) {
  // sbatch --array=1-4: tasks 1..4 are shards 0..3.
  const Shard s = shard_from_environment(
      fake({{"SLURM_ARRAY_TASK_ID", "3"}, {"SLURM_ARRAY_TASK_MIN", "1"}, {"SLURM_ARRAY_TASK_COUNT", "4"}}));
  EXPECT_EQ(s.index, 2);
  EXPECT_EQ(s.count, 4);
  EXPECT_NE(error_of({{"SLURM_ARRAY_TASK_ID", "3"}, {"SLURM_ARRAY_TASK_MIN", "1"}, {"SLURM_ARRAY_TASK_COUNT", "4"},
                      {"SLURM_ARRAY_TASK_STEP", "2"}})
                .find("contiguous"),
            std::string::npos);
  EXPECT_NE(error_of({{"SLURM_ARRAY_TASK_ID", "0"}}).find("SLURM_ARRAY_TASK_COUNT is not"), std::string::npos);
}

TEST(ShardEnvironment, KubernetesIndexedJobNeedsTheCount) {
  const Shard s = shard_from_environment(fake({{"JOB_COMPLETION_INDEX", "1"}, {"HARNESS_SHARD_COUNT", "2"}}));
  EXPECT_EQ(s.index, 1);
  EXPECT_EQ(s.count, 2);
  EXPECT_NE(error_of({{"JOB_COMPLETION_INDEX", "1"}}).find("set HARNESS_SHARD_COUNT"), std::string::npos);
}

TEST(ShardEnvironment, ExplicitVariablesWinOverTheScheduler) {
  const Shard s = shard_from_environment(fake({{"HARNESS_SHARD_INDEX", "0"}, {"HARNESS_SHARD_COUNT", "5"},
                                               {"SLURM_ARRAY_TASK_ID", "3"}, {"SLURM_ARRAY_TASK_COUNT", "4"}}));
  EXPECT_EQ(s.index, 0);
  EXPECT_EQ(s.count, 5);
}

TEST(ShardEnvironment, EveryIncompleteOrBadSetIsNamed) {
  EXPECT_NE(error_of({}).find("no scheduler told this runner its shard"), std::string::npos);
  EXPECT_NE(error_of({{"HARNESS_SHARD_INDEX", "1"}}).find("set HARNESS_SHARD_COUNT too"), std::string::npos);
  EXPECT_NE(error_of({{"HARNESS_SHARD_COUNT", "2"}}).find("set HARNESS_SHARD_INDEX too"), std::string::npos);
  EXPECT_NE(error_of({{"HARNESS_SHARD_INDEX", "x"}, {"HARNESS_SHARD_COUNT", "2"}}).find("HARNESS_SHARD_INDEX='x'"),
            std::string::npos);
  EXPECT_NE(error_of({{"HARNESS_SHARD_INDEX", "2"}, {"HARNESS_SHARD_COUNT", "2"}}).find("not 0 <= index < count"),
            std::string::npos);
  EXPECT_NE(error_of({{"SLURM_ARRAY_TASK_ID", "9"}, {"SLURM_ARRAY_TASK_MIN", "0"}, {"SLURM_ARRAY_TASK_COUNT", "4"}})
                .find("Slurm array"),
            std::string::npos);
}

}  // namespace
}  // namespace harness::nightly
