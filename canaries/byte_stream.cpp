#include "byte_stream.h"

#include <algorithm>
#include <bit>
#include <stdexcept>
#include <string>
#include <utility>

#include "numerics/det_math.h"
#include "numerics/philox.h"

namespace harness::canary {
namespace {

// Philox stream ids: one per purpose, so draws never overlap. Row streams put the row's
// (step, b) above the low 4 bits, which stay kRowStream.
constexpr std::uint64_t kPermutationStream = 1;
constexpr std::uint64_t kRowStream = 2;

// One Fisher-Yates shuffle of 0..n-1; draw i (from the top) is counter (which << 32) + i.
// `% (i + 1)` has a bias below 2^-23 for n <= 256: irrelevant here, and it keeps the
// recipe one line long for external re-implementations.
std::vector<int> draw_permutation(std::uint64_t seed, int which, int n) {
  std::vector<int> perm(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) perm[static_cast<std::size_t>(i)] = i;
  for (int i = n - 1; i > 0; --i) {
    const auto draw = numerics::philox_at(seed, kPermutationStream,
                                          (static_cast<std::uint64_t>(which) << 32) + static_cast<std::uint64_t>(i));
    const auto j = static_cast<std::size_t>(draw[0] % static_cast<std::uint32_t>(i + 1));
    std::swap(perm[static_cast<std::size_t>(i)], perm[j]);
  }
  return perm;
}

// Entropy of a uniform choice among `next`; a byte listed twice is one outcome with twice
// the probability.
double choice_entropy(std::array<int, ByteStream::kSuccessors> next) {
  std::sort(next.begin(), next.end());
  double h = 0.0;
  for (std::size_t i = 0; i < next.size();) {
    std::size_t run = 1;
    while (i + run < next.size() && next[i + run] == next[i]) ++run;
    const double q = static_cast<double>(run) / static_cast<double>(next.size());
    h -= q * numerics::det_log(q);
    i += run;
  }
  return h;
}

}  // namespace

ByteStream::ByteStream(const CanaryConfig& config) : config_(config), alphabet_(config.vocab_size) {
  // Tokens are bytes, and all vocab_size of them are used (an unused token's embedding
  // row is what the uniform alphabet exists to avoid); fewer than 2 * kSuccessors leaves
  // nothing to learn beyond the successor sets.
  if (config.vocab_size < 2 * kSuccessors || config.vocab_size > 256) {
    throw std::invalid_argument("byte stream needs 8 <= vocab_size <= 256 (it uses every byte value below "
                                "vocab_size), got " + std::to_string(config.vocab_size));
  }
  for (int j = 0; j < kSuccessors; ++j) permutations_.push_back(draw_permutation(config.data_seed, j, alphabet_));
}

std::array<int, ByteStream::kSuccessors> ByteStream::successors(int byte) const {
  std::array<int, kSuccessors> next{};
  for (int j = 0; j < kSuccessors; ++j) {
    next[static_cast<std::size_t>(j)] = permutations_[static_cast<std::size_t>(j)][static_cast<std::size_t>(byte)];
  }
  return next;
}

// Row b of batch `step`: token t uses word 0 of Philox counter t of the row's own stream
// (t = 0: the start byte; t > 0: which successor). kSuccessors divides 2^32, so the
// choice is exactly uniform.
std::vector<std::int32_t> ByteStream::row(int step, int b) const {
  const std::uint64_t row_id = (static_cast<std::uint64_t>(step) << 16) | static_cast<std::uint64_t>(b);
  const std::uint64_t stream = kRowStream + (row_id << 4);
  const int length = config_.context_length + 1;
  std::vector<std::int32_t> tokens;
  tokens.reserve(static_cast<std::size_t>(length));
  int byte = static_cast<int>(numerics::philox_at(config_.data_seed, stream, 0)[0] % static_cast<std::uint32_t>(alphabet_));
  tokens.push_back(byte);
  for (int t = 1; t < length; ++t) {
    const auto choice = numerics::philox_at(config_.data_seed, stream, static_cast<std::uint64_t>(t))[0] % kSuccessors;
    byte = permutations_[choice][static_cast<std::size_t>(byte)];
    tokens.push_back(byte);
  }
  return tokens;
}

Batch ByteStream::batch(int step) const {
  std::vector<std::int32_t> rows;
  rows.reserve(static_cast<std::size_t>(config_.batch_size * (config_.context_length + 1)));
  for (int b = 0; b < config_.batch_size; ++b) {
    const std::vector<std::int32_t> tokens = row(step, b);
    rows.insert(rows.end(), tokens.begin(), tokens.end());
  }
  return assemble_batch(step, config_.batch_size, config_.context_length, std::move(rows));
}

double ByteStream::entropy_rate_nats() const {
  // The uniform distribution is stationary (every byte has exactly kSuccessors incoming
  // edges of weight 1/kSuccessors) and each row starts in it, so the stream is stationary
  // and its entropy rate is the mean over bytes of the next-byte entropy.
  double total = 0.0;
  for (int x = 0; x < alphabet_; ++x) total += choice_entropy(successors(x));
  return total / alphabet_;
}

}  // namespace harness::canary
