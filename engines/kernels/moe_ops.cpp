#include "moe_ops.h"

#include "moe_kernels.h"

namespace harness::kernels::moe_ops {
namespace {
int rows(const HostTensors& t, TensorId id) { return static_cast<int>(t.rows(id)); }
int dim(const HostTensors& t, TensorId id, int i) { return static_cast<int>(t.desc(id).dim(i)); }
}  // namespace

void route_forward(HostTensors& t, TensorId weights, TensorId expert, TensorId slot, TensorId probs, TensorId routing,
                   TensorId logits, int top_k, int capacity, float balance_coef) {
  moe_route_with_record(t.f32(probs), t.f32(weights), t.f32(expert), t.f32(slot), t.f32(routing), t.f32(logits),
                        rows(t, probs), t.last_dim(probs), top_k, capacity, balance_coef);
}

void route_backward(HostTensors& t, TensorId dlogits, TensorId dweights, TensorId probs, TensorId weights,
                    TensorId expert, float balance_coef) {
  moe_route_backward(t.f32(dlogits), t.f32(dweights), t.f32(probs), t.f32(weights), t.f32(expert), rows(t, probs),
                     t.last_dim(probs), t.last_dim(weights), balance_coef);
}

void dispatch_forward(HostTensors& t, TensorId expert_in, TensorId inp, TensorId expert, TensorId slot) {
  moe_dispatch_forward(t.f32(expert_in), t.f32(inp), t.f32(expert), t.f32(slot), rows(t, inp), dim(t, expert_in, 2),
                       dim(t, expert_in, 0), t.last_dim(expert), dim(t, expert_in, 1));
}

void dispatch_backward(HostTensors& t, TensorId dinp, TensorId dexpert_in, TensorId expert, TensorId slot) {
  moe_dispatch_backward(t.f32(dinp), t.f32(dexpert_in), t.f32(expert), t.f32(slot), rows(t, dinp),
                        dim(t, dexpert_in, 2), t.last_dim(expert), dim(t, dexpert_in, 1));
}

void combine_forward(HostTensors& t, TensorId out, TensorId expert_out, TensorId weights, TensorId expert,
                     TensorId slot) {
  moe_combine_forward(t.f32(out), t.f32(expert_out), t.f32(weights), t.f32(expert), t.f32(slot), rows(t, out),
                      dim(t, expert_out, 2), t.last_dim(expert), dim(t, expert_out, 1));
}

void combine_backward(HostTensors& t, TensorId dexpert_out, TensorId dweights, TensorId dout, TensorId expert_out,
                      TensorId weights, TensorId expert, TensorId slot) {
  moe_combine_backward(t.f32(dexpert_out), t.f32(dweights), t.f32(dout), t.f32(expert_out), t.f32(weights),
                       t.f32(expert), t.f32(slot), rows(t, dout), dim(t, expert_out, 2), t.last_dim(expert),
                       dim(t, expert_out, 1));
}

}  // namespace harness::kernels::moe_ops
