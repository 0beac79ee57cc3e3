// The per-tensor digests a receipt holds (docs/receipt-schema.md, "Digests: the algorithms,
// exactly"): the XXH3-64 hash (exact identity) and a value sketch (how far apart two
// non-identical runs are). Part of the installed receipt library (docs/cpp.md), so a C++
// or CUDA training loop digests its tensors exactly as the harness does.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "receipt/receipt_schema.h"

namespace harness::receipt {

// A tensor's sketch: its L2 norm and its count sketch (what TensorSketcher computes).
struct TensorSketch {
  double l2 = 0;
  std::array<double, kSketchWidth> projection{};
};

// XXH3-64, seed 0, over the tensor's logical value as little-endian fp32, row-major.
std::uint64_t tensor_hash(std::span<const float> values);

// The data contract's batch_hash: XXH3-64, seed 0, over the batch's int32 tokens (B, T+1),
// little-endian, row-major (what canary::batch_hash computes for the harness's batches).
std::uint64_t batch_hash(std::span<const std::int32_t> tokens);

// L2 norm and a count sketch: the tensor is cut into blocks of kSketchBlock elements;
// block j adds its sum, times a sign s(j), into bucket b(j) of kSketchWidth buckets, where
// b and s come from Philox(salt, j). Equivalent to multiplying by a fixed sparse random
// +-1 matrix (a Johnson-Lindenstrauss-style projection), at one pass over the data.
// Sums are in double, in a fixed order (four interleaved lanes, then a fixed combine):
// deterministic for any thread count. The salt of a tensor is sketch_salt(its name).
class TensorSketcher {
 public:
  TensorSketcher(std::size_t numel, std::uint64_t salt);  // draws every block's (b, s) once
  TensorSketch operator()(std::span<const float> values) const;

 private:
  std::vector<std::uint8_t> block_codes_;  // bucket in bits 0..6, sign in bit 7
};

// The sketch salt of the tensor named `name` (a parameter's canary name; a gradient uses
// its parameter's): the FNV-1a 64 stream id of the name.
std::uint64_t sketch_salt(const char* name);

}  // namespace harness::receipt
