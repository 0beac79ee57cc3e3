// Checkpoints (`--checkpoint-every K`): the whole state a run needs to go on from the
// start of a step, in an HDF5 file of its own next to the receipt, which records its path
// and content hash (docs/receipt-schema.md, "/checkpoints"; docs/bisect.md, "Replay").
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "api/engine.h"
#include "canary.h"

namespace harness::run {

inline constexpr std::int64_t kCheckpointVersion = 1;

// The state at the start of `step` (after step-1's update).
struct Checkpoint {
  int step = 0;
  std::string lane;
  std::int64_t seed = 0;
  std::uint64_t data_seed = 0;
  std::int64_t data_cursor = 0;  // the batch the next step reads (batches are indexed by step)
  std::vector<std::string> names;  // parameters, canonical order
  // params, adam_m, adam_v: per parameter, its values (row-major fp32)
  std::array<std::vector<std::vector<float>>, 3> tensors;
  EngineState engine;  // FP8 scaling state, noise, compile fingerprints
};

inline constexpr const char* kCheckpointFamilies[] = {"params", "adam_m", "adam_v"};

// "<receipt>.ckpt": the directory of a receipt's checkpoints.
std::string checkpoint_dir(const std::string& receipt_path);
// "step_000090.h5"
std::string checkpoint_file_name(int step);

// Reads the state out of the engine (between steps).
Checkpoint capture_checkpoint(Engine& engine, const canary::Canary& model, int step, const std::string& lane,
                              std::int64_t seed);
// Writes through "<path>.partial", renamed when complete: a checkpoint is whole or absent.
void save_checkpoint(const std::string& path, const Checkpoint& checkpoint);
// Throws UsageError naming the file when it is not a readable checkpoint of this version.
Checkpoint load_checkpoint(const std::string& path);
// Uploads parameters and moments and restores the engine's own state; throws UsageError
// when the checkpoint's tensors do not fit the model.
void restore_checkpoint(const Checkpoint& checkpoint, Engine& engine, const canary::Canary& model);

}  // namespace harness::run
