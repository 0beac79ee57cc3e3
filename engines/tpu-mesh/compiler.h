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
//     with micro-batches (--grad-accum) activations are shaped for one micro-batch and
//     the inputs are read a slice at a time;
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

// What a program does with the step's batch (--compile-mode, --grad-accum K):
//  - Step: the whole graph; with K > 1 its forward and backward are unrolled once per
//    micro-batch (fixed slices), then the optimizer runs once;
//  - GradCreate: forward and backward of the micro-batch the run is given, gradients and
//    loss written (the graph's own zeroing of the gradients included);
//  - GradAccumulate: the same, gradients and loss added to (their zeroing left out);
//  - Optimizer: the optimizer nodes alone.
enum class ProgramRole { Step, GradCreate, GradAccumulate, Optimizer };
std::string_view to_string(ProgramRole role);

Executable compile(const Graph& graph, const TensorTable& table, const MeshConfig& config,
                   const std::vector<PartitionSpec>& plan, const std::string& fingerprint,
                   ProgramRole role = ProgramRole::Step);

// A step's graph cut into its forward+backward part and its optimizer part, each in
// traced order. Throws CompileError when the cut would reorder a dependency (a forward or
// backward node reading what an earlier optimizer node wrote).
struct PhaseSplit {
  Graph gradients;
  Graph optimizer;
};
PhaseSplit split_phases(const Graph& graph);

}  // namespace harness::tpu
