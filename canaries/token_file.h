// A user's training tokens (data.source = "tokens"): raw little-endian token ids, uint16
// or uint32, as nanoGPT's and llm.c's .bin shards. Row b of batch s is the window of T+1
// tokens starting at ((s*B + b) * T) mod (N - T - 1) (docs/canary-files.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "data_source.h"

namespace harness::canary {

struct TokenFileContent {
  std::vector<std::int32_t> tokens;
  std::uint64_t xxh3 = 0;  // XXH3-64 (seed 0) of the file's bytes
};

// Reads and checks a token file: a whole number of `dtype` elements, at least
// context + 2 tokens, every id < vocab. Throws std::invalid_argument with a message that
// names the problem (the byte offset of a bad id), to be prefixed with the file and key.
TokenFileContent read_token_file(const std::filesystem::path& path, const std::string& dtype, int vocab, int context);

class TokenFile : public DataSource {
 public:
  // Reads config.tokens_path again and insists on the content the canary was loaded with.
  explicit TokenFile(const CanaryConfig& config);
  Batch batch(int step) const override;

 private:
  CanaryConfig config_;
  std::vector<std::int32_t> tokens_;
};

}  // namespace harness::canary
