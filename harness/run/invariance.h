// Batch invariance (docs/invariance.md): does one sequence's forward give the same token
// probabilities alone as at a random place inside a batch of 2..N sequences? Inference
// stacks promise it (batch-invariant kernels, deterministic serving modes); a kernel that
// chooses its reduction by the batch's shape (split-K by the row count, as GEMM libraries'
// heuristics do) breaks it. Per batch size: bitwise or not, the largest move of a token's
// log-probability, and the first forward op whose output rows for the sequence differ,
// found from op traces.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/engine_settings.h"

namespace harness::run {

struct InvarianceOptions {
  std::string canary = "tiny";
  std::string engine = "cpu-ref";
  EngineSettings engine_settings;
  int max_batch = 8;                   // batch sizes 2..max_batch against the sequence alone
  std::optional<std::int64_t> seed;    // the parameters' (default: the canary's [train] seed)
  std::uint64_t position_seed = 0;     // draws the sequence's place in each batch (Philox)
  int threads = 0;
};

// One batch size against the sequence alone.
struct InvarianceCheck {
  int batch_size = 0;
  int position = 0;             // the sequence's row in the batch
  bool bitwise = true;          // every traced forward output of the sequence equal, logits included
  double max_logprob_delta = 0; // max over its tokens of |log p(target) - alone's|, in double
  std::string first_op;         // the first forward op whose rows for the sequence differ ("" when none)
  int first_op_layer = -1;
  std::string first_tensor;
};

struct InvarianceReport {
  std::string lane;  // <canary>/<engine>[+features]
  int sequence_tokens = 0;
  std::vector<InvarianceCheck> checks;
  std::optional<std::uint64_t> reduction_seed;  // a seeded engine's, pinned for every run
  // The smallest batch size that is not bitwise, when one is not.
  std::optional<int> smallest_breaking() const;
};

// Throws UsageError for a bad canary, engine or setting (before any run).
InvarianceReport check_batch_invariance(const InvarianceOptions& options);

nlohmann::json to_json(const InvarianceReport& report);
std::string to_text(const InvarianceReport& report);

}  // namespace harness::run
