// A canary's training data: batch s is a pure function of s, so replay needs only the
// step number. Two sources (docs/canary-files.md, "[data]"): the builtin byte stream
// (byte_stream.h) and a user's token file (token_file.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "preset.h"

namespace harness::canary {

struct Batch {
  int step = 0;
  int batch_size = 0;
  int context_length = 0;
  std::vector<std::int32_t> tokens;   // (B, T+1), row-major
  std::vector<std::int32_t> inputs;   // (B, T)  = tokens[:, :T]
  std::vector<std::int32_t> targets;  // (B, T)  = tokens[:, 1:]
};

// A batch from its (B, T+1) rows: inputs and targets are the rows' two shifted views.
Batch assemble_batch(int step, int batch_size, int context_length, std::vector<std::int32_t> tokens);

class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual Batch batch(int step) const = 0;
};

// The source the canary's [data] names. Throws std::invalid_argument when it cannot be
// built (a token file that changed since the canary was loaded).
std::unique_ptr<DataSource> make_data_source(const CanaryConfig& config);

// The held-out batch that [eval] evaluates (docs/logit-kl.md): batch kHeldOutBatch of the
// canary's data, past the last step a run may train (kMaxSteps). The builtin stream's rows
// there are never trained on; a token file's windows wrap, so its held-out windows are
// fixed but may overlap the text a long run trains on.
inline constexpr int kHeldOutBatch = 1000000;
Batch held_out_batch(const DataSource& data);

// XXH3-64 (seed 0) over the batch's (B, T+1) int32 tokens as little-endian bytes: the
// receipt's data contract.
std::uint64_t batch_hash(const Batch& batch);

}  // namespace harness::canary
