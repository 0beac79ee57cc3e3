#include "graph.h"

#include "program.h"

#include <bit>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xxhash.h>

namespace harness::tpu {

std::string_view to_string(OpKind op) {
  switch (op) {
    case OpKind::Zero: return "zero";
    case OpKind::Constant: return "constant";
    case OpKind::EncoderForward: return "encoder_forward";
    case OpKind::EncoderBackward: return "encoder_backward";
    case OpKind::LayerNormForward: return "layernorm_forward";
    case OpKind::LayerNormBackward: return "layernorm_backward";
    case OpKind::LinearForward: return "linear_forward";
    case OpKind::LinearBackward: return "linear_backward";
    case OpKind::AttentionForward: return "attention_forward";
    case OpKind::AttentionBackward: return "attention_backward";
    case OpKind::GeluForward: return "gelu_forward";
    case OpKind::GeluBackward: return "gelu_backward";
    case OpKind::ResidualForward: return "residual_forward";
    case OpKind::ResidualBackward: return "residual_backward";
    case OpKind::CrossEntropyForward: return "crossentropy_forward";
    case OpKind::CrossEntropyBackward: return "crossentropy_backward";
    case OpKind::GlobalNorm: return "global_norm";
    case OpKind::ClipByNorm: return "clip_by_norm";
    case OpKind::AdamW: return "adamw";
    case OpKind::NudgeUlps: return "nudge_ulps";
    case OpKind::Trace: return "trace";
    case OpKind::RmsNormForward: return "rmsnorm_forward";
    case OpKind::RmsNormBackward: return "rmsnorm_backward";
    case OpKind::RopeForward: return "rope_forward";
    case OpKind::RopeBackward: return "rope_backward";
    case OpKind::SwigluForward: return "swiglu_forward";
    case OpKind::SwigluBackward: return "swiglu_backward";
    case OpKind::GqaAttentionForward: return "gqa_attention_forward";
    case OpKind::GqaAttentionBackward: return "gqa_attention_backward";
  }
  return "?";
}

std::vector<TensorId> outputs_of(const Node& node) {
  const auto& t = node.tensors;
  auto first = [&](std::size_t n) { return std::vector<TensorId>(t.begin(), t.begin() + static_cast<long>(n)); };
  switch (node.op) {
    case OpKind::EncoderBackward:
    case OpKind::AttentionForward:
    case OpKind::ResidualBackward:
    case OpKind::CrossEntropyForward:
    case OpKind::RmsNormForward:
    case OpKind::RmsNormBackward:
    case OpKind::SwigluBackward:
    case OpKind::GqaAttentionForward: return first(2);
    case OpKind::LayerNormForward:
    case OpKind::LayerNormBackward:
    case OpKind::LinearBackward:
    case OpKind::GqaAttentionBackward: return first(3);
    case OpKind::ClipByNorm: return std::vector<TensorId>(t.begin() + 1, t.end());
    case OpKind::AdamW: return {t[0], t[2], t[3]};
    case OpKind::Trace: return {};  // reads only
    default: return first(1);
  }
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
