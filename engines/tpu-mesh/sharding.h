// Shardings on the mesh: which tensor dimension is split over which mesh axis.
//
// A PartitionSpec gives every dimension of a tensor an axis (None = replicated), like
// jax.sharding.PartitionSpec. `groups` splits a dimension into equal groups first and
// shards each group: qkv's output dimension is [q | k | v], and tensor parallelism gives
// each device its heads' slice of q, of k and of v (groups = 3), as Megatron does.
// Axes of size 1 never shard anything: a 1x1 mesh runs exactly cpu-ref's program.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "api/tensor_table.h"
#include "mesh_config.h"

namespace harness::tpu {

// Device data: what lives on the devices across steps, in blocks the plan fixes
// (parameters, gradients, moments, scalars, tokens). Activations and their gradients
// are transient buffers of one compiled program.
inline bool is_device_data(TensorKind kind) {
  return kind != TensorKind::Activation && kind != TensorKind::ActivationGrad;
}

enum class Axis : std::uint8_t { None, Data, Model };
std::string to_string(Axis axis);

struct DimSharding {
  Axis axis = Axis::None;
  int groups = 1;
  bool operator==(const DimSharding&) const = default;
};

struct PartitionSpec {
  std::vector<DimSharding> dims;  // one per tensor dimension; empty for a 0-D tensor

  static PartitionSpec replicated(std::size_t rank) { return {std::vector<DimSharding>(rank)}; }
  bool shards_on(Axis axis) const;
  bool operator==(const PartitionSpec&) const = default;
  std::string to_string() const;  // "P(data, None, model/3)"
};

int axis_size(const Mesh& mesh, Axis axis);
int axis_coord(const Mesh& mesh, Axis axis, int device);
// The spec with axes of size 1 removed: what actually shards on this mesh.
PartitionSpec effective(const PartitionSpec& spec, const Mesh& mesh);

// The shape of one device's block.
std::vector<std::int64_t> local_shape(const std::vector<std::int64_t>& global, const PartitionSpec& spec,
                                      const Mesh& mesh);
std::int64_t local_numel(const std::vector<std::int64_t>& global, const PartitionSpec& spec, const Mesh& mesh);

// Whether `device` holds a distinct copy: the devices at coordinate 0 of every axis the
// tensor is replicated over. Summing over owners counts every element exactly once.
bool owns_distinct_block(const PartitionSpec& spec, const Mesh& mesh, int device);
// Whether `device`'s block contains the tensor's element 0.
bool holds_first_element(const PartitionSpec& spec, const Mesh& mesh, int device);

// Copies between a global tensor (row-major) and one device's block of it.
template <typename T>
void copy_block_from_global(const std::vector<std::int64_t>& global, const PartitionSpec& spec, const Mesh& mesh,
                            int device, const T* global_values, T* local_values);
template <typename T>
void copy_block_to_global(const std::vector<std::int64_t>& global, const PartitionSpec& spec, const Mesh& mesh,
                          int device, const T* local_values, T* global_values);

// The axis a plan splits the experts of a mixture of experts over (their stacked weights'
// first dimension and the expert buffers'): `data` under ep (GShard's expert parallelism:
// the devices that split the batch hold E / data experts each), none otherwise.
Axis experts_axis(ShardPlan plan);

// The plan's shardings of the persistent tensors (parameters and their gradients and
// Adam moments, inputs, scalars), indexed by TensorId. Activations get theirs from
// sharding propagation in the compiler; their entries here are replicated.
std::vector<PartitionSpec> plan_shardings(const TensorTable& table, const MeshConfig& config);

// The validity gate, run before step 0: every sharded dimension divides by its axis size
// (times its groups), the attention heads divide over `model` and each data shard of the
// batch into --grad-accum micro-batches. Throws
// std::invalid_argument naming the plan, tensor, dimension and sizes.
void validate_plan(const TensorTable& table, const std::vector<PartitionSpec>& specs, const MeshConfig& config);

}  // namespace harness::tpu
