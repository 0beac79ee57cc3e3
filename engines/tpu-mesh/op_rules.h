// What tpu-mesh knows of each op, in one entry per op: its shape rule, its sharding rule
// and its lowering. The operand layout (counts, optional operands, written operands) is
// the op's description's (engines/api/op_description.h) and is checked for every node
// before its shape rule runs. An op family's entries sit together in ops/FAMILY.cpp, next
// to nothing but that family's semantics; rules_of() finds an op's entry. The ops with an
// entry are the ops tpu-mesh implements (TpuMeshEngine::implements).
#pragma once

#include <span>

#include "compilation.h"

namespace harness::tpu {

struct OpRules {
  OpKind op;
  // Pass 1: what the op needs of its operands' shapes (and dtypes beyond f32), through
  // Compilation::expect/reject. Null: the description's layout is all it needs.
  void (*check_shapes)(const Compilation&, const Node&) = nullptr;
  // Pass 2: the PartitionSpecs of what the op writes, from those of what it reads; rejects
  // a sharding it cannot lower. Null: the op writes no activation (backward ops: their
  // activation gradients mirror their activations; optimizer and step-control ops).
  void (*propagate)(Compilation&, const Node&) = nullptr;
  // Pass 3: the op's kernels on local blocks and the collectives its shardings need.
  void (*lower)(Compilation&, const Node&) = nullptr;
};

// The op's entry; one with a null `lower` for an op tpu-mesh does not implement.
const OpRules& rules_of(OpKind op);

// The families (ops/*.cpp): each lists the entries of its ops.
std::span<const OpRules> embedding_rules();
std::span<const OpRules> linear_rules();
std::span<const OpRules> normalization_rules();
std::span<const OpRules> attention_rules();
std::span<const OpRules> pointwise_rules();
std::span<const OpRules> loss_rules();
std::span<const OpRules> optimizer_rules();
std::span<const OpRules> step_control_rules();
std::span<const OpRules> mixture_of_experts_rules();

}  // namespace harness::tpu
