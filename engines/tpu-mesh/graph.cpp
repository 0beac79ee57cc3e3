#include "graph.h"

#include "program.h"

#include <bit>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xxhash.h>

namespace harness::tpu {

std::string_view to_string(OpKind op) {
  return static_cast<std::size_t>(op) < kOpDescriptions.size() ? describe(op).name : "?";
}

namespace {
template <typename Wanted>
std::vector<TensorId> operands_where(const Node& node, Wanted wanted) {
  const OpDescription& d = describe(node.op);
  std::vector<TensorId> found;
  for (std::size_t i = 0; i < node.tensors.size(); ++i) {
    if (wanted(d.access(i))) found.push_back(node.tensors[i]);
  }
  return found;
}
}  // namespace

std::vector<TensorId> outputs_of(const Node& node) {
  return operands_where(node, [](Access a) { return a != Access::Read; });
}

std::vector<TensorId> overwritten_by(const Node& node) {
  return operands_where(node, [](Access a) { return a == Access::Write; });
}

std::vector<float> double_attrs(double value) {
  const auto bits = std::bit_cast<std::uint64_t>(value);
  return {std::bit_cast<float>(static_cast<std::uint32_t>(bits >> 32)),
          std::bit_cast<float>(static_cast<std::uint32_t>(bits))};
}

double attrs_double(float high, float low) {
  return std::bit_cast<double>((static_cast<std::uint64_t>(std::bit_cast<std::uint32_t>(high)) << 32) |
                               std::bit_cast<std::uint32_t>(low));
}

std::string table_digest(const TensorTable& table) {
  std::string text;
  for (const TensorDesc& d : table.all()) {
    // The role decides bf16 rounding and shardings, so it is part of what a program is for.
    const TensorRole& r = d.role;
    fmt::format_to(std::back_inserter(text), "{}:{}:{}:{}:{}{}{}{}:{}:{}:{}\n", d.name, to_string(d.kind),
                   fmt::join(d.shape, "x"), d.dtype == DType::F32 ? "f32" : "i32", int(r.fp32_statistic),
                   int(r.linear), int(r.fp8_zone), int(r.learning_rate), r.parallel_groups, r.parallel_unit, r.heads_dim);
    // Added where set, so the digests (and cached programs) of tables without them stand.
    if (r.fp32_weight || r.stacked_dims != 0) {
      fmt::format_to(std::back_inserter(text), "fp32_weight={}:stacked_dims={}\n", int(r.fp32_weight), r.stacked_dims);
    }
  }
  const XXH128_hash_t h = XXH3_128bits(text.data(), text.size());
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

std::string fingerprint(const Graph& graph, const std::string& table_digest, const std::string& flags) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  auto add = [&](const void* data, std::size_t size) { XXH3_128bits_update(state, data, size); };
  auto add_string = [&](std::string_view text) {
    const std::uint64_t size = text.size();
    add(&size, sizeof size);  // length-prefixed: no two node lists hash the same bytes
    add(text.data(), text.size());
  };
  const std::uint32_t version = kProgramFormatVersion;
  add(&version, sizeof version);
  add_string(flags);
  add_string(table_digest);
  for (const Node& node : graph.nodes) {
    const std::int32_t header[3] = {static_cast<std::int32_t>(node.op), node.layer, static_cast<std::int32_t>(node.phase)};
    add(header, sizeof header);
    add_string(node.site);
    const std::uint64_t operands = node.tensors.size(), attrs = node.attrs.size();
    add(&operands, sizeof operands);
    add(node.tensors.data(), node.tensors.size() * sizeof(TensorId));
    add(&attrs, sizeof attrs);
    add(node.attrs.data(), node.attrs.size() * sizeof(float));
  }
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

}  // namespace harness::tpu
