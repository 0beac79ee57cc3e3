// The traced graph: every op call of a step as an IR node (op, operands, attributes),
// and the fingerprint that keys the compilation cache.
//
// A node's operands are the tensor ids of the Engine call, in its order; names, shapes
// and dtypes come from the TensorTable, whose digest enters every fingerprint. Values
// never enter a graph, except a Constant node:
// the trap of a host scalar baked into the program (--leak-scalars).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "api/engine.h"

namespace harness::tpu {

enum class OpKind : std::uint8_t {
  Zero,
  Constant,  // tensors[0] = attrs[0]: a host value baked into the program
  EncoderForward,
  EncoderBackward,
  LayerNormForward,
  LayerNormBackward,
  LinearForward,
  LinearBackward,
  AttentionForward,
  AttentionBackward,
  GeluForward,
  GeluBackward,
  ResidualForward,
  ResidualBackward,
  CrossEntropyForward,
  CrossEntropyBackward,
  GlobalNorm,  // tensors = norm, then the tensors whose norm it is
  ClipByNorm,  // tensors = norm, then the tensors it scales
  AdamW,       // tensors = param, grad, m, v, lr, bias_correction1, bias_correction2
  NudgeUlps,
  Trace,  // tensors[0] is delivered to the trace sink; attrs[0] = its slot in the step's traces
  // the llama ops (appended: the values above are part of every fingerprint)
  RmsNormForward,         // out, rstd, inp, weight; attrs: eps
  RmsNormBackward,        // dinp, dweight, dout, inp, weight, rstd
  RopeForward,            // out, inp; attrs: head size, theta (as two halves of its bits)
  RopeBackward,           // dinp, dout; attrs: as RopeForward
  SwigluForward,          // out, gate, up
  SwigluBackward,         // dgate, dup, dout, gate, up
  GqaAttentionForward,    // out, att, q, k, v
  GqaAttentionBackward,   // dq, dk, dv, dout, q, k, v, att
};
std::string_view to_string(OpKind op);

struct Node {
  OpKind op = OpKind::Zero;
  std::string site;  // the model op's name, e.g. "blocks.2.attn.proj"
  int layer = -1;
  Phase phase = Phase::Forward;
  std::vector<TensorId> tensors;  // operands in the Engine call's order; kNoTensor allowed
  std::vector<float> attrs;       // eps; max_norm; AdamW beta1, beta2, eps, weight decay; a constant
};

// The tensors a node writes (the others it only reads).
std::vector<TensorId> outputs_of(const Node& node);

struct Graph {
  std::vector<Node> nodes;
};

// XXH3-128 of the tensor table's description (names, kinds, shapes, dtypes: computed once
// per table), hashed first into every fingerprint.
std::string table_digest(const TensorTable& table);

// XXH3-128 (hex) over the format version, the flags that change compiled output, the
// table digest and every node's fields (op, site, layer, phase, operand ids, attribute
// bits), hashed without formatting any text, since it runs every step. Never tensor values; never debug settings (cache dir, threads).
std::string fingerprint(const Graph& graph, const std::string& table_digest, const std::string& flags);

}  // namespace harness::tpu
