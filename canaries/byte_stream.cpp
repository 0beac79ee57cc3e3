#include "byte_stream.h"

#include <bit>
#include <stdexcept>

#include <xxhash.h>

#include "numerics/det_math.h"
#include "numerics/philox.h"

namespace harness::canary {
namespace {

// Successor choice probabilities, as thresholds on a 32-bit random word (sum to 2^32).
constexpr std::uint64_t kChoiceThresholds[ByteStream::kSuccessors] = {
    2147483648ull,               // 1/2
    2147483648ull + 1073741824,  // + 1/4
    2147483648ull + 1073741824 + 644245094,  // + 3/20
    4294967296ull};                          // + 1/10 (the rest)
constexpr double kChoiceProbabilities[ByteStream::kSuccessors] = {0.5, 0.25, 0.15, 0.10};

// Philox stream ids: one per purpose, so draws never overlap.
constexpr std::uint64_t kLexiconStream = 1;
constexpr std::uint64_t kSuccessorStream = 2;
constexpr std::uint64_t kRowStream = 3;

}  // namespace

ByteStream::ByteStream(const CanaryConfig& config) : config_(config) {
  if (config.vocab_size < 123) {
    throw std::invalid_argument("byte stream needs vocab_size >= 123 (lowercase ASCII)");
  }
  const std::uint64_t seed = config.data_seed;
  for (int w = 0; w < kWords; ++w) {
    const auto draw = numerics::philox_at(seed, kLexiconStream, static_cast<std::uint64_t>(w));
    const int length = 2 + static_cast<int>(draw[0] % 6);
    std::string word;
    for (int i = 0; i < length; ++i) {
      const auto letter = numerics::philox_at(seed, kLexiconStream, (1ull << 32) + w * 16ull + i);
      word.push_back(static_cast<char>('a' + letter[0] % 26));
    }
    words_.push_back(std::move(word));
    std::vector<int> next;
    for (int k = 0; k < kSuccessors; ++k) {
      const auto pick = numerics::philox_at(seed, kSuccessorStream, w * 16ull + k);
      next.push_back(static_cast<int>(pick[0] % kWords));
    }
    successors_.push_back(std::move(next));
  }
}

int ByteStream::next_word(int word, std::uint32_t random_word) const {
  int choice = 0;
  while (random_word >= kChoiceThresholds[choice]) ++choice;
  return successors_[static_cast<std::size_t>(word)][static_cast<std::size_t>(choice)];
}

Batch ByteStream::batch(int step) const {
  Batch batch;
  batch.step = step;
  batch.batch_size = config_.batch_size;
  batch.context_length = config_.context_length;
  const int row_length = config_.context_length + 1;
  batch.tokens.reserve(static_cast<std::size_t>(config_.batch_size * row_length));
  for (int b = 0; b < config_.batch_size; ++b) {
    const std::uint64_t row_stream = (static_cast<std::uint64_t>(step) << 16) | static_cast<std::uint64_t>(b);
    std::uint64_t counter = 0;
    const auto start = numerics::philox_at(config_.data_seed, kRowStream + (row_stream << 4), counter++);
    int word = static_cast<int>(start[0] % kWords);
    int skip = static_cast<int>(start[1] % 8);
    std::string text;
    while (static_cast<int>(text.size()) < row_length + skip) {
      text += words_[static_cast<std::size_t>(word)];
      text.push_back(' ');
      const auto draw = numerics::philox_at(config_.data_seed, kRowStream + (row_stream << 4), counter++);
      word = next_word(word, draw[0]);
    }
    for (int t = 0; t < row_length; ++t) {
      batch.tokens.push_back(static_cast<unsigned char>(text[static_cast<std::size_t>(skip + t)]));
    }
  }
  for (int b = 0; b < config_.batch_size; ++b) {
    const auto row = batch.tokens.begin() + b * row_length;
    batch.inputs.insert(batch.inputs.end(), row, row + config_.context_length);
    batch.targets.insert(batch.targets.end(), row + 1, row + row_length);
  }
  return batch;
}

double ByteStream::entropy_rate_nats() const {
  // Stationary distribution of the word chain by power iteration (it is ergodic for the
  // lexicons drawn here; 2000 iterations converge far below the digits documented).
  std::vector<double> pi(kWords, 1.0 / kWords);
  for (int iteration = 0; iteration < 2000; ++iteration) {
    std::vector<double> next(kWords, 0.0);
    for (int w = 0; w < kWords; ++w) {
      for (int k = 0; k < kSuccessors; ++k) {
        next[static_cast<std::size_t>(successors_[w][k])] += pi[w] * kChoiceProbabilities[k];
      }
    }
    pi = next;
  }
  double nats_per_word = 0.0, bytes_per_word = 0.0;
  for (int w = 0; w < kWords; ++w) {
    // Successor entropy; successors drawn twice merge their probabilities.
    std::vector<double> p(kWords, 0.0);
    for (int k = 0; k < kSuccessors; ++k) p[static_cast<std::size_t>(successors_[w][k])] += kChoiceProbabilities[k];
    double h = 0.0;
    for (double q : p) {
      if (q > 0) h -= q * numerics::det_log(q);
    }
    nats_per_word += pi[w] * h;
    bytes_per_word += pi[w] * static_cast<double>(words_[static_cast<std::size_t>(w)].size() + 1);
  }
  return nats_per_word / bytes_per_word;
}

std::uint64_t batch_hash(const Batch& batch) {
  static_assert(std::endian::native == std::endian::little, "hashes assume a little-endian host");
  return XXH3_64bits(batch.tokens.data(), batch.tokens.size() * sizeof(std::int32_t));
}

}  // namespace harness::canary
