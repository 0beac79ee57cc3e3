// `--shard auto`: which shard of the matrix this runner takes, read from the scheduler that
// fanned the nightly out (docs/nightly.md, "Fan-out"): explicit variables (a GitHub Actions
// matrix sets them), a Slurm job array, or a Kubernetes Indexed Job.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "matrix.h"

namespace harness::nightly {

// A variable's value, or nullopt when it is not set.
using Environment = std::function<std::optional<std::string>(const std::string& name)>;
Environment process_environment();

// Throws MatrixError naming --shard auto, the variables it read and what to set.
Shard shard_from_environment(const Environment& environment);

}  // namespace harness::nightly
