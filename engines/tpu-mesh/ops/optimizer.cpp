// The optimizer step: the global gradient norm, clipping by it, and AdamW.
#include "op_rules.h"

namespace harness::tpu {
namespace {

void lower_adamw(Compilation& c, const Node& n) {
  const TensorId param = NodeOperands<OpKind::AdamW>{n}.get<"param">();
  c.emit(InstrKind::AdamW, c.operand_buffers(n), {c.lnumel(param)}, n.attrs);
  c.forget_operands_of(param);
}

// The fixed operands (the norm), then the tensors of the description's variadic tail,
// with each tensor's local size (and sharding, for the norm's reduction).
struct OverTensors {
  std::vector<std::int32_t> buffers;
  std::vector<std::int64_t> sizes;
  std::vector<PartitionSpec> specs;
};
OverTensors over_tensors(Compilation& c, const Node& n) {
  const std::size_t fixed = describe(n.op).operands.size();
  OverTensors o;
  for (std::size_t i = 0; i < fixed; ++i) o.buffers.push_back(c.buffer(n.tensors[i]));
  for (std::size_t i = fixed; i < n.tensors.size(); ++i) {
    o.buffers.push_back(c.buffer(n.tensors[i]));
    o.sizes.push_back(c.lnumel(n.tensors[i]));
    o.specs.push_back(c.eff(n.tensors[i]));
  }
  return o;
}

void lower_global_norm(Compilation& c, const Node& n) {
  const OverTensors o = over_tensors(c, n);
  c.emit(InstrKind::GlobalNorm, o.buffers, o.sizes, {}, Axis::None, o.specs);
}

void lower_clip(Compilation& c, const Node& n) {
  const OverTensors o = over_tensors(c, n);
  c.emit(InstrKind::Clip, o.buffers, o.sizes, n.attrs);
}

constexpr OpRules kRules[] = {
    {OpKind::GlobalNorm, nullptr, nullptr, lower_global_norm},
    {OpKind::ClipByNorm, nullptr, nullptr, lower_clip},
    {OpKind::AdamW, nullptr, nullptr, lower_adamw},
};

}  // namespace

std::span<const OpRules> optimizer_rules() { return kRules; }

}  // namespace harness::tpu
