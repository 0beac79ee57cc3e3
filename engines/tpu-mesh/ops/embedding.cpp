// The token (and position) embedding.
#include "op_rules.h"

namespace harness::tpu {
namespace {

void propagate_encoder(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::EncoderForward> op{n};
  PartitionSpec& out = c.spec_of(op.get<"out">());
  out = PartitionSpec::replicated(3);
  out.dims[0] = c.spec_of(op.get<"inputs">()).dims[0];  // batch follows the tokens
}

void lower_encoder_forward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::EncoderForward> op{n};
  const Shape out = c.lshape(op.get<"out">());
  c.emit(InstrKind::EncoderForward,
         {c.buffer(op.get<"out">()), c.tokens(op.get<"inputs">()), c.weight_operand(op.get<"wte">(), false),
          c.weight_operand(op.get<"wpe">(), false)},
         {out[0], out[1], out[2]});
  c.round_activation(op.get<"out">());
}

void lower_encoder_backward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::EncoderBackward> op{n};
  const Shape dout = c.lshape(op.get<"dout">());
  std::vector<PendingGradient> pending;
  const int dwte = c.gradient_target(op.get<"dwte">(), pending);
  const int dwpe = c.gradient_target(op.get<"dwpe">(), pending);
  c.emit(InstrKind::EncoderBackward, {dwte, dwpe, c.buffer(op.get<"dout">()), c.tokens(op.get<"inputs">())},
         {dout[0], dout[1], dout[2]});
  c.finish_gradients(pending);
}

constexpr OpRules kRules[] = {
    {OpKind::EncoderForward, nullptr, propagate_encoder, lower_encoder_forward},
    {OpKind::EncoderBackward, nullptr, nullptr, lower_encoder_backward},
};

}  // namespace

std::span<const OpRules> embedding_rules() { return kRules; }

}  // namespace harness::tpu
