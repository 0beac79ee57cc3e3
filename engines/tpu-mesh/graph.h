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
#include "api/op_description.h"
#include "api/step_compilation.h"

namespace harness::tpu {

// The ops are the call boundary's (engines/api/op_description.h): a node's operands and
// attributes are laid out as its op's description says.
using harness::OpKind;
std::string_view to_string(OpKind op);

// The call boundary's traced graph (engines/api/step_compilation.h): what audit reads.
using Node = GraphNode;
using Graph = OpGraph;

// A node's operands by name, as op K's description lays them out:
//   const NodeOperands<OpKind::LinearForward> op{n};  op.get<"weight">()
// The index is found when this compiles: a misspelt or removed operand is a build error.
template <OpKind K>
struct NodeOperands {
  const Node& node;
  template <OperandName Name>
  TensorId get() const {
    static constexpr std::size_t index = operand_index(K, Name.view());
    return node.tensors[index];
  }
};

// The tensors a node writes or adds into (the others it only reads), by its description.
std::vector<TensorId> outputs_of(const Node& node);
// The tensors a node overwrites (Access::Write): what it writes without reading first.
std::vector<TensorId> overwritten_by(const Node& node);

// XXH3-128 of the tensor table's description (names, kinds, shapes, dtypes: computed once
// per table), hashed first into every fingerprint.
std::string table_digest(const TensorTable& table);

// XXH3-128 (hex) over the format version, the flags that change compiled output, the
// table digest and every node's fields (op, site, layer, phase, operand ids, attribute
// bits), hashed without formatting any text, since it runs every step. Never tensor values; never debug settings (cache dir, threads).
std::string fingerprint(const Graph& graph, const std::string& table_digest, const std::string& flags);

}  // namespace harness::tpu
