// One compilation in progress: the graph, its tensors, the mesh and the shardings, and the
// executable being built. The compiler's passes (compiler.cpp) drive it node by node; each
// op's rules (op_rules.h, ops/) read and extend it through the helpers below, so an op's
// shape rule, sharding rule and lowering live together in its own entry and never in a
// switch over all ops.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "graph.h"
#include "program.h"

namespace harness::tpu {

enum class ProgramRole;

// A gradient contribution that needs a collective before it is added to its gradient.
struct PendingGradient {
  TensorId grad;
  int contribution;
};

using Shape = std::vector<std::int64_t>;
std::int64_t product(const Shape& shape);
// Product of all but the last dimension (1 for a 0-D or 1-D tensor).
std::int64_t rows(const Shape& shape);
// Activations and their gradients: a micro-batch's rows at a time under --grad-accum.
bool holds_micro_batch(TensorKind kind);

class Compilation {
 public:
  Compilation(const TensorTable& table, const MeshConfig& config, const std::vector<PartitionSpec>& plan);

  // ---- shapes (pass 1) -----------------------------------------------------------------
  // A CompileError naming the node's site and op.
  [[noreturn]] void reject(const Node& n, const std::string& why) const;
  void expect(const Node& n, bool ok, const char* what) const {
    if (!ok) reject(n, what);
  }
  const TensorTable& table() const { return table_; }
  const Shape& shape(TensorId id) const { return table_[id].shape; }

  // ---- shardings (pass 2) --------------------------------------------------------------
  PartitionSpec& spec_of(TensorId id) { return spec_[static_cast<std::size_t>(id)]; }
  // The spec as it acts on this mesh (an axis of size 1 shards nothing).
  PartitionSpec eff(TensorId id) const { return effective(spec_[static_cast<std::size_t>(id)], mesh_); }
  const Mesh& mesh() const { return mesh_; }
  ShardPlan plan() const { return config_.plan; }
  bool active(Axis axis) const { return axis_size(mesh_, axis) > 1; }

  // ---- lowering (pass 3) ---------------------------------------------------------------
  // The node being lowered, the micro-batch whose slice it reads, and whether it adds to
  // gradients and loss a first micro-batch wrote.
  void begin_node(int node, const Node& n);
  bool accumulating() const { return accumulating_; }
  void set_micro_batch(std::int32_t micro, bool accumulating) {
    micro_ = micro;
    accumulating_ = accumulating;
  }
  std::int32_t micro_batch() const { return micro_; }
  int micro_batches() const { return micro_batches_; }

  // A tensor's block on one device; activations (and their gradients) hold one micro-batch.
  Shape lshape(TensorId id) const;
  std::int64_t lnumel(TensorId id) const { return product(lshape(id)); }
  // The shape a parameter is computed with: its block, gathered over `data` (zero3).
  Shape compute_shape(TensorId id) const;

  // The buffer slot of a tensor (-1 for kNoTensor), made on first use.
  int buffer(TensorId id);
  // Token ids as a kernel operand: the whole block, or the micro-batch's slice of it.
  int tokens(TensorId id);
  int temp(const std::string& name, std::int64_t numel, MemoryCategory category);
  int zeroed_temp(const std::string& name, std::int64_t numel, MemoryCategory category);
  // The buffers of every operand of the node, in its description's order (the
  // instructions that take an op's operands as they come).
  std::vector<std::int32_t> operand_buffers(const Node& n);
  void emit(InstrKind kind, const std::vector<std::int32_t>& buffers, const std::vector<std::int64_t>& dims,
            const std::vector<float>& attrs = {}, Axis axis = Axis::None, const std::vector<PartitionSpec>& specs = {});

  // A parameter as an operand of compute: gathered over `data` under zero3, cast to bf16
  // for matmuls under bf16 precision (unless its role keeps it fp32). Reused within a
  // phase; gathered again in the next (FSDP's memory trade: parameters are not kept whole
  // from forward to backward). A block computed on where it lives (an expert under ep) is
  // never gathered: `gather` false.
  int weight_operand(TensorId param, bool matmul, bool gather = true);
  // After an op updated a parameter: its gathered or cast copies are stale.
  void forget_operands_of(TensorId param);
  // Where an op writes its contribution to a gradient: straight into the gradient when the
  // contribution is complete on this device; when the batch is split over `data` it is a
  // partial sum, so it goes to a zeroed temporary that finish_gradients() reduces first.
  int gradient_target(TensorId grad, std::vector<PendingGradient>& pending);
  // All-reduce (gradient replicated over `data`) or reduce-scatter (sharded, zero3), in the
  // fixed device order, then add into the gradient.
  void finish_gradients(const std::vector<PendingGradient>& pending);
  // bf16 precision stores activations and their gradients as bf16 (statistics and the
  // softmax probabilities of the loss stay fp32, as in accel).
  void round_activation(TensorId id);
  // The mesh axis a contraction runs over when both operands shard its dimension the same
  // way (the result is then a partial sum); None when the contraction is local.
  Axis contraction_axis(const Node& n, const DimSharding& a, const DimSharding& b) const;
  // GEMM packing room each device needs for this program.
  void need_scratch(std::int64_t numel);

  // The executable, for the passes that finish it (buffer planning).
  Executable& executable() { return exe_; }

 private:
  const TensorTable& table_;
  const MeshConfig& config_;
  const Mesh mesh_;
  std::vector<PartitionSpec> spec_;
  const int micro_batches_;
  std::int32_t micro_ = kWholeBuffer;  // the input slice the nodes being lowered read
  bool accumulating_ = false;          // adding to gradients and loss (a later micro-batch)
  std::vector<int> buffer_of_;
  std::map<std::pair<TensorId, std::int32_t>, int> token_views_;
  std::map<std::tuple<TensorId, bool, bool>, int> operand_cache_;  // (param, cast, gathered)
  Phase cache_phase_ = Phase::Forward;
  Executable exe_;
  int node_ = -1;
  const Node* current_ = nullptr;
};

}  // namespace harness::tpu
