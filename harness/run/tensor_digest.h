// Per-tensor digests recorded every step: the XXH3-64 hash (exact identity) and a value
// sketch (how far apart two non-identical runs are, per tensor).
#pragma once

#include <cstdint>
#include <span>

#include "api/engine.h"
#include "gpt2.h"
#include "receipt/receipt_writer.h"

namespace harness::run {

// XXH3-64, seed 0, over the tensor's logical value as little-endian fp32, row-major.
std::uint64_t tensor_hash(std::span<const float> values);

// L2 norm and a count sketch: the tensor is cut into blocks of kSketchBlock elements;
// block j adds its sum, times a sign s(j), into bucket b(j) of kSketchWidth buckets, where
// b and s come from Philox(salt, j). Equivalent to multiplying by a fixed sparse random
// ±1 matrix (a Johnson-Lindenstrauss-style projection), at one pass over the data.
// All sums are sequential in double: deterministic for any thread count.
receipt::TensorSketch tensor_sketch(std::span<const float> values, std::uint64_t salt);

// Fills record.hashes (params, grads, adam_m, adam_v) and record.sketches (params,
// grads) for every parameter of `model`, in canonical order.
void digest_step(Engine& engine, const canary::Gpt2Canary& model, receipt::StepRecord& record);

}  // namespace harness::run
