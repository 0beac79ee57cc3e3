// Element-wise ops (both GELUs, the residual add, SwiGLU) and RoPE, which turns pairs within
// each head: every device computes its own block, no collective.
#include "op_rules.h"

namespace harness::tpu {
namespace {

// The output (the first operand) is sharded as the first input (the second).
void output_follows_first_input(Compilation& c, const Node& n) { c.spec_of(n.tensors[0]) = c.spec_of(n.tensors[1]); }

// Both GELUs (tanh and erf) lay out their operands alike: only the instruction differs.
template <OpKind K, InstrKind I>
void lower_gelu_forward(Compilation& c, const Node& n) {
  const NodeOperands<K> op{n};
  const TensorId out = op.template get<"out">();
  c.emit(I, {c.buffer(out), c.buffer(op.template get<"inp">())}, {c.lnumel(out)});
  c.round_activation(out);
}

template <OpKind K, InstrKind I>
void lower_gelu_backward(Compilation& c, const Node& n) {
  const NodeOperands<K> op{n};
  const TensorId dinp = op.template get<"dinp">();
  c.emit(I, {c.buffer(dinp), c.buffer(op.template get<"inp">()), c.buffer(op.template get<"dout">())},
         {c.lnumel(dinp)});
  c.round_activation(dinp);
}

void check_residual_forward(const Compilation& c, const Node& n) {
  const NodeOperands<OpKind::ResidualForward> op{n};
  c.expect(n, c.shape(op.get<"out">()) == c.shape(op.get<"a">()) && c.shape(op.get<"a">()) == c.shape(op.get<"b">()),
           "residual operands differ in shape");
}

void lower_residual_forward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::ResidualForward> op{n};
  const TensorId out = op.get<"out">();
  c.emit(InstrKind::Add, {c.buffer(out), c.buffer(op.get<"a">()), c.buffer(op.get<"b">())}, {c.lnumel(out)});
  c.round_activation(out);
}

void lower_residual_backward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::ResidualBackward> op{n};
  const TensorId da = op.get<"da">(), db = op.get<"db">(), dout = op.get<"dout">();
  c.emit(InstrKind::AddInPlace, {c.buffer(da), c.buffer(dout)}, {c.lnumel(dout)});
  c.emit(InstrKind::AddInPlace, {c.buffer(db), c.buffer(dout)}, {c.lnumel(dout)});
  c.round_activation(da);
  c.round_activation(db);
}

// (out, inp) forward, (dinp, dout) backward: the written operand, then the read one, each
// (B, T, heads*hd).
void check_rope(const Compilation& c, const Node& n) {
  const Shape &written = c.shape(n.tensors[0]), &read = c.shape(n.tensors[1]);
  const auto hd = static_cast<std::int64_t>(n.attrs.at(0));
  c.expect(n, written == read && read.size() == 3 && hd > 0 && hd % 2 == 0 && read.back() % hd == 0,
           "rope needs equal (B,T,heads*hd) operands and an even head size that divides the last dimension");
}

// Each device turns the heads of its block.
void lower_rope(Compilation& c, const Node& n, InstrKind kind, TensorId written, TensorId read) {
  const Shape x = c.lshape(read);
  const auto hd = static_cast<std::int64_t>(n.attrs.at(0));
  if (x[2] % hd != 0) c.reject(n, "a block that splits a head");
  c.emit(kind, {c.buffer(written), c.buffer(read)}, {x[0], x[1], x[2] / hd, hd}, {n.attrs.at(1), n.attrs.at(2)});
  c.round_activation(written);
}

void lower_rope_forward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::RopeForward> op{n};
  lower_rope(c, n, InstrKind::RopeForward, op.get<"out">(), op.get<"inp">());
}

void lower_rope_backward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::RopeBackward> op{n};
  lower_rope(c, n, InstrKind::RopeBackward, op.get<"dinp">(), op.get<"dout">());
}

void check_swiglu(const Compilation& c, const Node& n) {
  for (TensorId id : n.tensors) c.expect(n, c.shape(id) == c.shape(n.tensors[0]), "swiglu operands differ in shape");
}

void propagate_swiglu(Compilation& c, const Node& n) {  // gate and up split alike (both column-parallel)
  const NodeOperands<OpKind::SwigluForward> op{n};
  if (c.spec_of(op.get<"gate">()) != c.spec_of(op.get<"up">())) c.reject(n, "gate and up sharded differently");
  c.spec_of(op.get<"out">()) = c.spec_of(op.get<"gate">());
}

void lower_swiglu_forward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::SwigluForward> op{n};
  c.emit(InstrKind::SwigluForward, {c.buffer(op.get<"out">()), c.buffer(op.get<"gate">()), c.buffer(op.get<"up">())},
         {c.lnumel(op.get<"out">())});
  c.round_activation(op.get<"out">());
}

void lower_swiglu_backward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::SwigluBackward> op{n};
  c.emit(InstrKind::SwigluBackward,
         {c.buffer(op.get<"dgate">()), c.buffer(op.get<"dup">()), c.buffer(op.get<"dout">()),
          c.buffer(op.get<"gate">()), c.buffer(op.get<"up">())},
         {c.lnumel(op.get<"dout">())});
  c.round_activation(op.get<"dgate">());
  c.round_activation(op.get<"dup">());
}

constexpr OpRules kRules[] = {
    {OpKind::GeluForward, nullptr, output_follows_first_input, lower_gelu_forward<OpKind::GeluForward, InstrKind::GeluForward>},
    {OpKind::GeluBackward, nullptr, nullptr, lower_gelu_backward<OpKind::GeluBackward, InstrKind::GeluBackward>},
    {OpKind::GeluErfForward, nullptr, output_follows_first_input,
     lower_gelu_forward<OpKind::GeluErfForward, InstrKind::GeluErfForward>},
    {OpKind::GeluErfBackward, nullptr, nullptr, lower_gelu_backward<OpKind::GeluErfBackward, InstrKind::GeluErfBackward>},
    {OpKind::ResidualForward, check_residual_forward, output_follows_first_input, lower_residual_forward},
    {OpKind::ResidualBackward, nullptr, nullptr, lower_residual_backward},
    {OpKind::RopeForward, check_rope, output_follows_first_input, lower_rope_forward},
    {OpKind::RopeBackward, check_rope, nullptr, lower_rope_backward},
    {OpKind::SwigluForward, check_swiglu, propagate_swiglu, lower_swiglu_forward},
    {OpKind::SwigluBackward, check_swiglu, nullptr, lower_swiglu_backward},
};

}  // namespace

std::span<const OpRules> pointwise_rules() { return kRules; }

}  // namespace harness::tpu
