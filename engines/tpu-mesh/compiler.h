// The tpu-mesh compiler: a traced Graph in, an Executable out.
//
// Passes, in order:
//  1. verification: operand shapes and dtypes of every node agree with its op;
//  2. sharding propagation: activations get PartitionSpecs from their producers, starting
//     from the plan's shardings of parameters and inputs; activation gradients mirror
//     their activations;
//  3. lowering with collective insertion: each node becomes kernels on local blocks plus
//     the collectives its shardings need (all-reduce after a contraction over a sharded
//     dimension, all-gather of zero3 parameters before use, reduce-scatter of their
//     gradients, the loss mean over `data`); bf16 precision inserts casts and roundings;
//  4. buffer planning: live ranges of transient buffers, offsets in one slab per device
//     (buffers whose lives do not overlap share memory), per-device peak bytes by category.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "graph.h"
#include "program.h"

namespace harness::tpu {

// A graph the compiler cannot accept (bad shapes, a sharding it cannot lower). Names the op.
struct CompileError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

Executable compile(const Graph& graph, const TensorTable& table, const MeshConfig& config,
                   const std::vector<PartitionSpec>& plan, const std::string& fingerprint);

}  // namespace harness::tpu
