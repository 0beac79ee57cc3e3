// The ops that serve the step rather than the model: zeroing, a leaked host constant
// (--leak-scalars), the fault injector's nudge and the op tracer's host transfer.
#include "op_rules.h"

namespace harness::tpu {
namespace {

void lower_zero(Compilation& c, const Node& n) {
  const TensorId id = NodeOperands<OpKind::Zero>{n}.get<"tensor">();
  // A later micro-batch adds to the gradients the first one wrote.
  if (c.accumulating() && c.table()[id].kind == TensorKind::Gradient) return;
  c.emit(InstrKind::Fill, {c.buffer(id)}, {c.lnumel(id)}, {0.0f});
}

void lower_constant(Compilation& c, const Node& n) {
  const TensorId id = NodeOperands<OpKind::Constant>{n}.get<"tensor">();
  c.emit(InstrKind::Fill, {c.buffer(id)}, {c.lnumel(id)}, {n.attrs.at(0)});
}

void lower_nudge(Compilation& c, const Node& n) {
  // The fault perturbs the batch's first element: micro-batch 0 holds it.
  if (c.accumulating()) return;
  const NodeOperands<OpKind::NudgeUlps> op{n};
  const TensorId tensor = op.get<"tensor">();
  c.emit(InstrKind::Nudge, {c.buffer(tensor), c.buffer(op.get<"ulps">())}, {}, {}, Axis::None, {c.eff(tensor)});
}

// The traced tensor's blocks go to the host as they are after the op: one micro-batch's
// rows of an activation, the whole of anything else (the engine assembles the step).
void lower_trace(Compilation& c, const Node& n) {
  const TensorId id = n.tensors.at(0);
  Shape global = c.shape(id);
  const bool per_micro_batch = holds_micro_batch(c.table()[id].kind);
  if (c.micro_batches() > 1 && per_micro_batch) global[0] /= c.micro_batches();
  const float micro = per_micro_batch ? static_cast<float>(c.micro_batch()) : 0.0f;
  c.emit(InstrKind::Trace, {c.buffer(id)}, global, {n.attrs.at(0), micro}, Axis::None, {c.eff(id)});
}

constexpr OpRules kRules[] = {
    {OpKind::Zero, nullptr, nullptr, lower_zero},
    {OpKind::Constant, nullptr, nullptr, lower_constant},
    {OpKind::NudgeUlps, nullptr, nullptr, lower_nudge},
    {OpKind::Trace, nullptr, nullptr, lower_trace},
};

}  // namespace

std::span<const OpRules> step_control_rules() { return kRules; }

}  // namespace harness::tpu
