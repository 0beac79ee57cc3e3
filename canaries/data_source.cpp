#include "data_source.h"

#include <bit>

#include <xxhash.h>

#include "byte_stream.h"
#include "canary_file.h"
#include "token_file.h"

namespace harness::canary {

Batch assemble_batch(int step, int batch_size, int context_length, std::vector<std::int32_t> tokens) {
  Batch batch;
  batch.step = step;
  batch.batch_size = batch_size;
  batch.context_length = context_length;
  batch.tokens = std::move(tokens);
  const int row_length = context_length + 1;
  for (int b = 0; b < batch_size; ++b) {
    const auto row_begin = batch.tokens.begin() + b * row_length;
    batch.inputs.insert(batch.inputs.end(), row_begin, row_begin + context_length);
    batch.targets.insert(batch.targets.end(), row_begin + 1, row_begin + row_length);
  }
  return batch;
}

std::unique_ptr<DataSource> make_data_source(const CanaryConfig& config) {
  switch (config.data_source) {
    case DataSourceKind::kTokens: return std::make_unique<TokenFile>(config);
    case DataSourceKind::kBuiltin: break;
  }
  return std::make_unique<ByteStream>(config);
}

Batch held_out_batch(const DataSource& data) {
  static_assert(kHeldOutBatch >= kMaxSteps, "a run may train on every batch below kMaxSteps");
  return data.batch(kHeldOutBatch);
}

std::uint64_t batch_hash(const Batch& batch) {
  static_assert(std::endian::native == std::endian::little, "hashes assume a little-endian host");
  return XXH3_64bits(batch.tokens.data(), batch.tokens.size() * sizeof(std::int32_t));
}

}  // namespace harness::canary
