// Per-tensor digests recorded every step: the XXH3-64 hash (exact identity) and a value
// sketch (how far apart two non-identical runs are, per tensor).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "api/engine.h"
#include "gpt2.h"
#include "receipt/receipt_writer.h"

namespace harness::run {

// XXH3-64, seed 0, over the tensor's logical value as little-endian fp32, row-major.
std::uint64_t tensor_hash(std::span<const float> values);

// L2 norm and a count sketch: the tensor is cut into blocks of kSketchBlock elements;
// block j adds its sum, times a sign s(j), into bucket b(j) of kSketchWidth buckets, where
// b and s come from Philox(salt, j). Equivalent to multiplying by a fixed sparse random
// +-1 matrix (a Johnson-Lindenstrauss-style projection), at one pass over the data.
// Sums are in double, in a fixed order (four interleaved lanes, then a fixed combine):
// deterministic for any thread count.
class TensorSketcher {
 public:
  TensorSketcher(std::size_t numel, std::uint64_t salt);  // draws every block's (b, s) once
  receipt::TensorSketch operator()(std::span<const float> values) const;

 private:
  std::vector<std::uint8_t> block_codes_;  // bucket in bits 0..6, sign in bit 7
};

// Digests every step of one model: hashes of params, grads, adam_m, adam_v and sketches
// of params and grads, for every parameter in canonical order, tensors in parallel.
class StepDigester {
 public:
  explicit StepDigester(const canary::Gpt2Canary& model);
  void digest(Engine& engine, receipt::StepRecord& record) const;

 private:
  const canary::Gpt2Canary& model_;
  std::vector<TensorSketcher> sketchers_;  // one per parameter (grads share the layout)
};

}  // namespace harness::run
