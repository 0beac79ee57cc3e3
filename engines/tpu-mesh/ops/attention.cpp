// Causal self-attention: gpt2's over a fused qkv, llama's grouped-query attention. Each
// device runs the heads of its block.
#include "op_rules.h"

namespace harness::tpu {
namespace {

void check_attention_forward(const Compilation& c, const Node& n) {
  const NodeOperands<OpKind::AttentionForward> op{n};
  c.expect(
      n, c.shape(op.get<"qkv">()).back() == 3 * c.shape(op.get<"out">()).back() && c.shape(op.get<"att">()).size() == 4,
      "attention needs qkv (B,T,3C) and att (B,NH,T,T)");
}

void propagate_attention(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::AttentionForward> op{n};
  const PartitionSpec& qkv = c.spec_of(op.get<"qkv">());
  const DimSharding heads{qkv.dims[2].axis, 1};
  c.spec_of(op.get<"out">()) = PartitionSpec{{qkv.dims[0], qkv.dims[1], heads}};
  c.spec_of(op.get<"att">()) = PartitionSpec{{qkv.dims[0], heads, DimSharding{}, DimSharding{}}};
  if (effective(qkv, c.mesh()).dims[2].axis != Axis::None && qkv.dims[2].groups != 3) {
    c.reject(n, "qkv sharded without its q|k|v grouping");
  }
}

void lower_attention_forward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::AttentionForward> op{n};
  const TensorId out = op.get<"out">(), att = op.get<"att">();
  const Shape out_shape = c.lshape(out);
  c.emit(InstrKind::AttentionForward, {c.buffer(out), c.buffer(att), c.buffer(op.get<"qkv">())},
         {out_shape[0], out_shape[1], out_shape[2], c.lshape(att)[1]});
  c.round_activation(out);
  c.round_activation(att);
}

void lower_attention_backward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::AttentionBackward> op{n};
  const Shape dout = c.lshape(op.get<"dout">());
  c.emit(InstrKind::AttentionBackward,
         {c.buffer(op.get<"dqkv">()), c.buffer(op.get<"dout">()), c.buffer(op.get<"qkv">()), c.buffer(op.get<"att">())},
         {dout[0], dout[1], dout[2], c.lshape(op.get<"att">())[1]});
  c.round_activation(op.get<"dqkv">());
}

void check_gqa_forward(const Compilation& c, const Node& n) {
  const NodeOperands<OpKind::GqaAttentionForward> op{n};
  const Shape &att = c.shape(op.get<"att">()), &q = c.shape(op.get<"q">());
  c.expect(n, att.size() == 4 && q.back() % att[1] == 0 && c.shape(op.get<"k">()) == c.shape(op.get<"v">()) &&
                  c.shape(op.get<"out">()) == q,
           "gqa attention needs q and out (B,T,NH*hd), k and v alike (B,T,NKV*hd) and att (B,NH,T,T)");
}

void check_gqa_backward(const Compilation& c, const Node& n) {
  const NodeOperands<OpKind::GqaAttentionBackward> op{n};
  const Shape& q = c.shape(op.get<"q">());
  c.expect(n, c.shape(op.get<"dq">()) == q && c.shape(op.get<"dk">()) == c.shape(op.get<"k">()) &&
                  c.shape(op.get<"dv">()) == c.shape(op.get<"v">()) && c.shape(op.get<"dout">()) == q,
           "gqa attention gradients do not match their forward operands");
}

void propagate_gqa(Compilation& c, const Node& n) {  // heads follow q's split
  const NodeOperands<OpKind::GqaAttentionForward> op{n};
  const PartitionSpec& q = c.spec_of(op.get<"q">());
  const DimSharding heads{q.dims[2].axis, 1};
  if (c.spec_of(op.get<"k">()).dims[2] != heads || c.spec_of(op.get<"v">()).dims[2] != heads) {
    c.reject(n, "q, k and v sharded differently");
  }
  c.spec_of(op.get<"out">()) = PartitionSpec{{q.dims[0], q.dims[1], heads}};
  c.spec_of(op.get<"att">()) = PartitionSpec{{q.dims[0], heads, DimSharding{}, DimSharding{}}};
}

// NH/model query heads over NKV/model kv heads on each device, so the grouping of query
// heads over kv heads is the same on every device. The instruction takes the op's
// operands in their order.
void lower_gqa(Compilation& c, const Node& n, InstrKind kind, TensorId q, TensorId k, TensorId att) {
  const Shape qs = c.lshape(q);
  const std::int64_t heads = c.lshape(att)[1], hd = qs[2] / heads, kv_width = c.lshape(k)[2];
  if (kv_width % hd != 0 || kv_width == 0 || heads % (kv_width / hd) != 0) {
    c.reject(n, "a block whose query heads do not group over whole kv heads");
  }
  c.emit(kind, c.operand_buffers(n), {qs[0], qs[1], heads, kv_width / hd, hd});
  for (TensorId id : outputs_of(n)) c.round_activation(id);
}

void lower_gqa_forward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::GqaAttentionForward> op{n};
  lower_gqa(c, n, InstrKind::GqaAttentionForward, op.get<"q">(), op.get<"k">(), op.get<"att">());
}

void lower_gqa_backward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::GqaAttentionBackward> op{n};
  lower_gqa(c, n, InstrKind::GqaAttentionBackward, op.get<"q">(), op.get<"k">(), op.get<"att">());
}

constexpr OpRules kRules[] = {
    {OpKind::AttentionForward, check_attention_forward, propagate_attention, lower_attention_forward},
    {OpKind::AttentionBackward, nullptr, nullptr, lower_attention_backward},
    {OpKind::GqaAttentionForward, check_gqa_forward, propagate_gqa, lower_gqa_forward},
    {OpKind::GqaAttentionBackward, check_gqa_backward, nullptr, lower_gqa_backward},
};

}  // namespace

std::span<const OpRules> attention_rules() { return kRules; }

}  // namespace harness::tpu
