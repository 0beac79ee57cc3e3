#include "token_file.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include <fmt/format.h>
#include <xxhash.h>

namespace harness::canary {
namespace {

std::size_t element_size(const std::string& dtype) {
  if (dtype == "uint16") return 2;
  if (dtype == "uint32") return 4;
  throw std::invalid_argument(fmt::format("dtype '{}' is not a token type; use uint16 or uint32", dtype));
}

std::vector<unsigned char> read_bytes(const std::filesystem::path& path) {
  // A device or a FIFO (/dev/zero, /dev/stdin) would be read forever or block: only a
  // regular file is token data.
  std::error_code error;
  if (std::filesystem::exists(path, error) && !std::filesystem::is_regular_file(path, error)) {
    throw std::invalid_argument(fmt::format("'{}' is not a regular file; name a token file", path.string()));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument(fmt::format("cannot read '{}': {}", path.string(), std::strerror(errno)));
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::invalid_argument(fmt::format("reading '{}' failed", path.string()));
  return bytes;
}

// Little-endian unsigned integer of `size` bytes at `p`, whatever the host's byte order.
std::uint32_t little_endian(const unsigned char* p, std::size_t size) {
  std::uint32_t v = 0;
  for (std::size_t i = size; i-- > 0;) v = (v << 8) | p[i];
  return v;
}

}  // namespace

TokenFileContent read_token_file(const std::filesystem::path& path, const std::string& dtype, int vocab, int context) {
  const std::size_t size = element_size(dtype);
  const std::vector<unsigned char> bytes = read_bytes(path);
  if (bytes.size() % size != 0) {
    throw std::invalid_argument(fmt::format("'{}' holds {} bytes, not a whole number of {} tokens", path.string(),
                                            bytes.size(), dtype));
  }
  const std::size_t count = bytes.size() / size;
  // A window is T+1 tokens and there must be at least two starts (N - T - 1 >= 1).
  const std::size_t needed = static_cast<std::size_t>(context) + 2;
  if (count < needed) {
    throw std::invalid_argument(fmt::format("'{}' holds {} tokens, fewer than model.context + 2 = {}", path.string(),
                                            count, needed));
  }
  TokenFileContent content;
  content.tokens.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint32_t id = little_endian(bytes.data() + i * size, size);
    if (id >= static_cast<std::uint32_t>(vocab)) {
      throw std::invalid_argument(fmt::format("'{}': token {} at byte offset {} (token {}) is not below model.vocab {}",
                                              path.string(), id, i * size, i, vocab));
    }
    content.tokens.push_back(static_cast<std::int32_t>(id));
  }
  content.xxh3 = XXH3_64bits(bytes.data(), bytes.size());
  return content;
}

TokenFile::TokenFile(const CanaryConfig& config) : config_(config) {
  TokenFileContent content = read_token_file(config.tokens_path, config.tokens_dtype, config.vocab_size,
                                             config.context_length);
  if (content.xxh3 != config.tokens_xxh3 || static_cast<std::int64_t>(content.tokens.size()) != config.tokens_count) {
    throw std::invalid_argument(fmt::format("token file '{}' changed since canary '{}' was loaded (XXH3 {:016x}, now "
                                            "{:016x}); load the canary again",
                                            config.tokens_path, config.name, config.tokens_xxh3, content.xxh3));
  }
  tokens_ = std::move(content.tokens);
}

Batch TokenFile::batch(int step) const {
  const std::int64_t B = config_.batch_size, T = config_.context_length;
  const std::int64_t starts = static_cast<std::int64_t>(tokens_.size()) - T - 1;
  std::vector<std::int32_t> rows;
  rows.reserve(static_cast<std::size_t>(B * (T + 1)));
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t start = ((step * B + b) * T) % starts;
    rows.insert(rows.end(), tokens_.begin() + start, tokens_.begin() + start + T + 1);
  }
  return assemble_batch(step, config_.batch_size, config_.context_length, std::move(rows));
}

}  // namespace harness::canary
