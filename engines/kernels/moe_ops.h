// The mixture-of-experts ops of the engine API (engines/api/engine.h) on host tensors: the
// kernels of moe_kernels.h with their sizes taken from the tensors' shapes, for every engine
// that keeps its tensors in a HostTensors (cpu-ref, and accel, which then stores the
// results in its formats). Shapes: logits and probs (B,T,E); weights, expert and slot
// (B,T,K); expert buffers (E,cap,C); routing (E + kRoutingRecordExtra).
#pragma once

#include "api/engine.h"
#include "host_tensors.h"

namespace harness::kernels::moe_ops {

// Routes, then writes the layer's routing record (its balance loss included).
void route_forward(HostTensors& t, TensorId weights, TensorId expert, TensorId slot, TensorId probs, TensorId routing,
                   TensorId logits, int top_k, int capacity, float balance_coef);
void route_backward(HostTensors& t, TensorId dlogits, TensorId dweights, TensorId probs, TensorId weights,
                    TensorId expert, float balance_coef);
void dispatch_forward(HostTensors& t, TensorId expert_in, TensorId inp, TensorId expert, TensorId slot);
void dispatch_backward(HostTensors& t, TensorId dinp, TensorId dexpert_in, TensorId expert, TensorId slot);
void combine_forward(HostTensors& t, TensorId out, TensorId expert_out, TensorId weights, TensorId expert,
                     TensorId slot);
void combine_backward(HostTensors& t, TensorId dexpert_out, TensorId dweights, TensorId dout, TensorId expert_out,
                      TensorId weights, TensorId expert, TensorId slot);

}  // namespace harness::kernels::moe_ops
