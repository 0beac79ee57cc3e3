// Softmax cross-entropy over the vocabulary, averaged over the global batch.
#include "op_rules.h"

namespace harness::tpu {
namespace {

void check_crossentropy_forward(const Compilation& c, const Node& n) {
  const NodeOperands<OpKind::CrossEntropyForward> op{n};
  const TensorId targets = op.get<"targets">();
  c.expect(n, c.table()[targets].dtype == DType::I32 && rows(c.shape(op.get<"logits">())) == product(c.shape(targets)),
           "targets must be int32 with one per logits row");
}

void propagate_crossentropy(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::CrossEntropyForward> op{n};
  c.spec_of(op.get<"probs">()) = c.spec_of(op.get<"logits">());
}

// Each device's rows, then their mean over the batch axis in the fixed order. Every
// micro-batch divides by the whole batch's rows, so the K partial means add up to the
// step's mean loss.
void lower_crossentropy_forward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::CrossEntropyForward> op{n};
  const TensorId logits_id = op.get<"logits">();
  const Shape logits = c.lshape(logits_id);
  const std::int64_t N = rows(logits), V = logits.back(), global_rows = rows(c.shape(logits_id));
  const Axis batch_axis = c.eff(logits_id).dims[0].axis;
  const int losses = c.temp("loss.rows", N, MemoryCategory::Activations);
  c.emit(InstrKind::CrossEntropyRows,
         {c.buffer(op.get<"probs">()), losses, c.buffer(logits_id), c.tokens(op.get<"targets">())}, {N, V});
  c.emit(InstrKind::LossMean, {c.buffer(op.get<"loss">()), losses},
         {N, N * axis_size(c.mesh(), batch_axis), global_rows}, {c.accumulating() ? 1.0f : 0.0f}, batch_axis);
}

void lower_crossentropy_backward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::CrossEntropyBackward> op{n};
  const TensorId probs_id = op.get<"probs">();
  const Shape probs = c.lshape(probs_id);
  c.emit(InstrKind::CrossEntropyBackward,
         {c.buffer(op.get<"dlogits">()), c.buffer(probs_id), c.tokens(op.get<"targets">())},
         {rows(probs), probs.back(), rows(c.shape(probs_id))});
  c.round_activation(op.get<"dlogits">());
}

constexpr OpRules kRules[] = {
    {OpKind::CrossEntropyForward, check_crossentropy_forward, propagate_crossentropy, lower_crossentropy_forward},
    {OpKind::CrossEntropyBackward, nullptr, nullptr, lower_crossentropy_backward},
};

}  // namespace

std::span<const OpRules> loss_rules() { return kRules; }

}  // namespace harness::tpu
