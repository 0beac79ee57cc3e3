#include "shard_environment.h"

#include <charconv>
#include <cstdlib>

#include <fmt/format.h>

namespace harness::nightly {
namespace {

int as_number(const Environment& env, const std::string& name) {
  const std::string value = env(name).value_or("");
  int number = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size()) {
    throw MatrixError(fmt::format("--shard auto: {}='{}' is not a whole number", name, value));
  }
  return number;
}

Shard checked(int index, int count, const std::string& source) {
  if (count < 1 || index < 0 || index >= count) {
    throw MatrixError(fmt::format("--shard auto: {} gives shard {} of {}, not 0 <= index < count", source, index, count));
  }
  return parse_shard(fmt::format("{}/{}", index, count));
}

}  // namespace

Environment process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    return value ? std::optional<std::string>(value) : std::nullopt;
  };
}

Shard shard_from_environment(const Environment& env) {
  // Explicit values win: whatever the scheduler, a job can say which shard it is.
  if (env("HARNESS_SHARD_INDEX")) {
    if (!env("HARNESS_SHARD_COUNT")) throw MatrixError("--shard auto: HARNESS_SHARD_INDEX is set; set HARNESS_SHARD_COUNT too");
    return checked(as_number(env, "HARNESS_SHARD_INDEX"), as_number(env, "HARNESS_SHARD_COUNT"),
                   "HARNESS_SHARD_INDEX/HARNESS_SHARD_COUNT");
  }
  // Slurm job array (sbatch --array=0-3 or 1-4): the task id counted from the array's first.
  if (env("SLURM_ARRAY_TASK_ID")) {
    if (env("SLURM_ARRAY_TASK_STEP") && as_number(env, "SLURM_ARRAY_TASK_STEP") != 1) {
      throw MatrixError("--shard auto: the Slurm array steps by SLURM_ARRAY_TASK_STEP != 1; use a contiguous --array "
                        "range (e.g. --array=0-3)");
    }
    if (!env("SLURM_ARRAY_TASK_COUNT")) {
      throw MatrixError("--shard auto: SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT is not");
    }
    const int first = env("SLURM_ARRAY_TASK_MIN") ? as_number(env, "SLURM_ARRAY_TASK_MIN") : 0;
    return checked(as_number(env, "SLURM_ARRAY_TASK_ID") - first, as_number(env, "SLURM_ARRAY_TASK_COUNT"),
                   "the Slurm array (SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN, SLURM_ARRAY_TASK_COUNT)");
  }
  // Kubernetes Indexed Job: the pod's index; the count (.spec.completions) is not in the
  // environment, so the Job passes it as HARNESS_SHARD_COUNT.
  if (env("JOB_COMPLETION_INDEX")) {
    if (!env("HARNESS_SHARD_COUNT")) {
      throw MatrixError("--shard auto: JOB_COMPLETION_INDEX is set (a Kubernetes Indexed Job); set HARNESS_SHARD_COUNT "
                        "to the Job's .spec.completions");
    }
    return checked(as_number(env, "JOB_COMPLETION_INDEX"), as_number(env, "HARNESS_SHARD_COUNT"),
                   "JOB_COMPLETION_INDEX/HARNESS_SHARD_COUNT");
  }
  if (env("HARNESS_SHARD_COUNT")) throw MatrixError("--shard auto: HARNESS_SHARD_COUNT is set; set HARNESS_SHARD_INDEX too");
  throw MatrixError("--shard auto: no scheduler told this runner its shard: set HARNESS_SHARD_INDEX and "
                    "HARNESS_SHARD_COUNT (e.g. from a GitHub Actions matrix), or run in a Slurm job array or a "
                    "Kubernetes Indexed Job (docs/nightly.md)");
}

}  // namespace harness::nightly
