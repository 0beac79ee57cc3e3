// The canary's deterministic, learnable training data: a Markov chain over a small
// lexicon of lowercase words, written out as bytes ("word word word ...").
//
// Structure (docs/canary.md, "Data"):
//  - a lexicon of 64 words, 2..7 letters each, drawn once from data_seed;
//  - after each word comes a space, then one of that word's 4 successors, chosen with
//    probabilities 1/2, 1/4, 3/20, 1/10 (successors drawn once from data_seed);
//  - row b of batch s starts at a uniformly drawn word, skips 0..7 of its leading bytes,
//    and continues for T+1 bytes. Every draw is Philox(data_seed, stream, counter), so
//    any batch is a pure function of (data_seed, s): replay needs only the step number.
// Entropy: ln 256 = 5.545 nats/byte for a model that knows nothing; 27 symbols
// (ln 27 = 3.30) once the alphabet is learned; the true rate is about 0.22 nats/byte
// (1.21 nats of successor choice per word of ~5.5 bytes including the space). A model
// that learns letter bigrams goes well under 3.0; the floor is far below.
#pragma once

#include <cstdint>
#include <string>
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

class ByteStream {
 public:
  explicit ByteStream(const CanaryConfig& config);

  Batch batch(int step) const;
  const std::vector<std::string>& lexicon() const { return words_; }
  // Entropy rate of the source in nats per byte (the loss floor), computed exactly from
  // the chain's stationary distribution.
  double entropy_rate_nats() const;

  static constexpr int kWords = 64;
  static constexpr int kSuccessors = 4;

 private:
  int next_word(int word, std::uint32_t random_word) const;

  CanaryConfig config_;
  std::vector<std::string> words_;
  std::vector<std::vector<int>> successors_;  // kWords x kSuccessors
};

// XXH3-64 (seed 0) over the batch's (B, T+1) int32 tokens as little-endian bytes: the
// receipt's data contract.
std::uint64_t batch_hash(const Batch& batch);

}  // namespace harness::canary
