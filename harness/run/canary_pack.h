// Canary packs (docs/design.md, "Canary packs"): what any training stack needs to train on
// exactly the harness's initial weights and data, in one checksummed HDF5 file.
//
//   /manifest        attributes pack_version (1), canary (the canary JSON exactly as a
//                    receipt's manifest holds it), seed, data_seed, steps, created_utc,
//                    git_commit
//   /init/names      fixed-length strings: the parameters in canonical order
//   /init/<name>     float32 with the tensor's shape: the parameters at the start of step 0
//                    (the model's own initialisation, read back from a cpu-ref engine)
//   /batches/tokens  int32 (N, B, T+1): batch s of the canary's own data generator
//   /eval/tokens     int32 (B, T+1): the held-out batch, when the canary has [eval]
//                    (docs/logit-kl.md); attributes every, rows, held_out_hash, source
//
// The file is written as `<out>.partial` and renamed into place when complete: a failed
// or killed export never leaves a file under the requested name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace harness::run {

inline constexpr std::int64_t kPackVersion = 1;

struct PackOptions {
  std::string canary = "tiny";
  std::optional<int> steps;  // default: the preset's
  std::optional<std::int64_t> seed;  // default: the canary's [train] seed
  std::string out;
  bool force = false;
};

struct PackSummary {
  std::string path, canary;
  int steps = 0;
  std::int64_t seed = 0;
  std::size_t tensors = 0;
  std::int64_t parameters = 0;  // elements over every tensor
  int batch_size = 0, row_length = 0;
};

// Validates every option first (throws UsageError, see canary_run.h, before any file is
// created), then writes the pack. A failure while writing removes the partial file and
// throws (an h5::Hdf5Error or std::filesystem::filesystem_error naming the file).
PackSummary export_pack(const PackOptions& options);

}  // namespace harness::run
