// LayerNorm (gpt2) and RMSNorm (llama): over the channels, which no plan may split.
#include "op_rules.h"

namespace harness::tpu {
namespace {

void check_layernorm_forward(const Compilation& c, const Node& n) {
  const NodeOperands<OpKind::LayerNormForward> op{n};
  const Shape& inp = c.shape(op.get<"inp">());
  c.expect(n, c.shape(op.get<"out">()) == inp && c.shape(op.get<"weight">()).back() == inp.back(),
           "layernorm weight does not match the channels");
}

// The statistics drop the channel dimension.
PartitionSpec statistics_spec(Compilation& c, TensorId inp) {
  PartitionSpec stats = c.spec_of(inp);
  stats.dims.pop_back();
  return stats;
}

void propagate_layernorm(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::LayerNormForward> op{n};
  const TensorId inp = op.get<"inp">();
  if (c.eff(inp).dims.back().axis != Axis::None) c.reject(n, "layernorm over a sharded channel dimension");
  c.spec_of(op.get<"out">()) = c.spec_of(inp);
  c.spec_of(op.get<"mean">()) = statistics_spec(c, inp);
  c.spec_of(op.get<"rstd">()) = statistics_spec(c, inp);
}

void lower_layernorm_forward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::LayerNormForward> op{n};
  const Shape in = c.lshape(op.get<"inp">());
  c.emit(InstrKind::LayerNormForward,
         {c.buffer(op.get<"out">()), c.buffer(op.get<"mean">()), c.buffer(op.get<"rstd">()), c.buffer(op.get<"inp">()),
          c.weight_operand(op.get<"weight">(), false), c.weight_operand(op.get<"bias">(), false)},
         {rows(in), in.back()}, {n.attrs.at(0)});
  c.round_activation(op.get<"out">());
}

void lower_layernorm_backward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::LayerNormBackward> op{n};
  const Shape in = c.lshape(op.get<"inp">());
  std::vector<PendingGradient> pending;
  const int weight = c.weight_operand(op.get<"weight">(), false);
  const int dweight = c.gradient_target(op.get<"dweight">(), pending);
  const int dbias = c.gradient_target(op.get<"dbias">(), pending);
  c.emit(InstrKind::LayerNormBackward,
         {c.buffer(op.get<"dinp">()), dweight, dbias, c.buffer(op.get<"dout">()), c.buffer(op.get<"inp">()), weight,
          c.buffer(op.get<"mean">()), c.buffer(op.get<"rstd">())},
         {rows(in), in.back()});
  c.finish_gradients(pending);
  c.round_activation(op.get<"dinp">());
}

void check_rmsnorm_forward(const Compilation& c, const Node& n) {
  const NodeOperands<OpKind::RmsNormForward> op{n};
  const Shape& inp = c.shape(op.get<"inp">());
  c.expect(n, c.shape(op.get<"out">()) == inp && c.shape(op.get<"weight">()).back() == inp.back(),
           "rmsnorm weight does not match the channels");
}

void check_rmsnorm_backward(const Compilation& c, const Node& n) {
  const NodeOperands<OpKind::RmsNormBackward> op{n};
  const Shape& inp = c.shape(op.get<"inp">());
  c.expect(n, c.shape(op.get<"dinp">()) == inp && c.shape(op.get<"dout">()) == inp &&
                  c.shape(op.get<"dweight">()) == c.shape(op.get<"weight">()),
           "rmsnorm gradients do not match their forward operands");
}

void propagate_rmsnorm(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::RmsNormForward> op{n};
  const TensorId inp = op.get<"inp">();
  if (c.eff(inp).dims.back().axis != Axis::None) c.reject(n, "rmsnorm over a sharded channel dimension");
  c.spec_of(op.get<"out">()) = c.spec_of(inp);
  c.spec_of(op.get<"rstd">()) = statistics_spec(c, inp);
}

void lower_rmsnorm_forward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::RmsNormForward> op{n};
  const Shape in = c.lshape(op.get<"inp">());
  c.emit(InstrKind::RmsNormForward,
         {c.buffer(op.get<"out">()), c.buffer(op.get<"rstd">()), c.buffer(op.get<"inp">()),
          c.weight_operand(op.get<"weight">(), false)},
         {rows(in), in.back()}, {n.attrs.at(0)});
  c.round_activation(op.get<"out">());
}

void lower_rmsnorm_backward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::RmsNormBackward> op{n};
  const Shape in = c.lshape(op.get<"inp">());
  std::vector<PendingGradient> pending;
  const int weight = c.weight_operand(op.get<"weight">(), false);
  const int dweight = c.gradient_target(op.get<"dweight">(), pending);
  c.emit(InstrKind::RmsNormBackward,
         {c.buffer(op.get<"dinp">()), dweight, c.buffer(op.get<"dout">()), c.buffer(op.get<"inp">()), weight,
          c.buffer(op.get<"rstd">())},
         {rows(in), in.back()});
  c.finish_gradients(pending);
  c.round_activation(op.get<"dinp">());
}

constexpr OpRules kRules[] = {
    {OpKind::LayerNormForward, check_layernorm_forward, propagate_layernorm, lower_layernorm_forward},
    {OpKind::LayerNormBackward, nullptr, nullptr, lower_layernorm_backward},
    {OpKind::RmsNormForward, check_rmsnorm_forward, propagate_rmsnorm, lower_rmsnorm_forward},
    {OpKind::RmsNormBackward, check_rmsnorm_backward, nullptr, lower_rmsnorm_backward},
};

}  // namespace

std::span<const OpRules> normalization_rules() { return kRules; }

}  // namespace harness::tpu
