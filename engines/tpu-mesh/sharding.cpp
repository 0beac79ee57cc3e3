#include "sharding.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace harness::tpu {
namespace {

bool active(Axis axis, const Mesh& mesh) { return axis != Axis::None && axis_size(mesh, axis) > 1; }

// Global index along one dimension of local index i on the device at `coord` of `parts`.
std::int64_t global_index(std::int64_t i, std::int64_t extent, const DimSharding& d, int parts, int coord) {
  if (parts == 1) return i;
  const std::int64_t group_extent = extent / d.groups;
  const std::int64_t local_group_extent = group_extent / parts;
  const std::int64_t group = i / local_group_extent;
  return group * group_extent + coord * local_group_extent + i % local_group_extent;
}

// Visits the device's block as contiguous runs, row-major: fn(local offset, global
// offset, length). Along the last dimension a run is one group's slice; every other
// dimension is stepped one index at a time.
template <typename Fn>
void for_each_block_run(const std::vector<std::int64_t>& global, const PartitionSpec& spec, const Mesh& mesh,
                        int device, Fn fn) {
  const PartitionSpec eff = effective(spec, mesh);
  const std::vector<std::int64_t> local = local_shape(global, spec, mesh);
  const std::size_t rank = global.size();
  if (rank == 0) {
    fn(0, 0, 1);
    return;
  }
  auto parts = [&](std::size_t d) { return axis_size(mesh, eff.dims[d].axis); };
  auto coord = [&](std::size_t d) { return axis_coord(mesh, eff.dims[d].axis, device); };
  const std::size_t last = rank - 1;
  const std::int64_t run = local[last] / (parts(last) == 1 ? 1 : eff.dims[last].groups);
  std::int64_t outer = 1;
  for (std::size_t d = 0; d < last; ++d) outer *= local[d];
  std::vector<std::int64_t> index(rank, 0);
  std::int64_t local_offset = 0;
  for (std::int64_t row = 0; row < outer; ++row) {
    std::int64_t row_start = 0;  // global offset of the row, without the last dimension
    for (std::size_t d = 0; d < last; ++d) row_start = row_start * global[d] + global_index(index[d], global[d], eff.dims[d], parts(d), coord(d));
    for (std::int64_t i = 0; i < local[last]; i += run) {
      fn(local_offset, row_start * global[last] + global_index(i, global[last], eff.dims[last], parts(last), coord(last)), run);
      local_offset += run;
    }
    for (std::size_t d = last; d-- > 0;) {  // row-major increment of the outer index
      if (++index[d] < local[d]) break;
      index[d] = 0;
    }
  }
}

// Megatron-style, from the tensor's linear role: column-parallel weights and biases split
// their output dimension (dim 0), row-parallel weights their input dimension (dim 1);
// a fused output ([q | k | v]) splits per part. Stacked weights (experts) count their
// dimensions after the stacking ones.
PartitionSpec tensor_parallel_spec(const TensorDesc& param) {
  PartitionSpec spec = PartitionSpec::replicated(param.rank());
  if (param.role.linear == LinearRole::None) return spec;
  const std::size_t split = static_cast<std::size_t>(param.role.stacked_dims) +
                            (param.role.linear == LinearRole::RowParallel ? 1 : 0);
  if (split >= param.rank()) {
    const char* role = param.role.linear == LinearRole::RowParallel ? "row-parallel" : "column-parallel";
    throw std::logic_error(
        fmt::format("{}: a {} role splits dimension {} of a tensor of rank {}", param.name, role, split, param.rank()));
  }
  DimSharding& dim = spec.dims[split];
  dim.axis = Axis::Model;
  dim.groups = param.role.parallel_groups;
  return spec;
}

PartitionSpec parameter_spec(const TensorDesc& param, ShardPlan plan) {
  switch (plan) {
    case ShardPlan::DataParallel: return PartitionSpec::replicated(param.rank());
    case ShardPlan::TensorParallel: return tensor_parallel_spec(param);
    case ShardPlan::Zero3: {
      PartitionSpec spec = PartitionSpec::replicated(param.rank());
      spec.dims[0].axis = Axis::Data;  // parameters and optimizer state sharded on `data`
      return spec;
    }
    case ShardPlan::ExpertParallel: {
      PartitionSpec spec = PartitionSpec::replicated(param.rank());
      if (param.role.stacked_dims > 0) spec.dims[0].axis = experts_axis(ShardPlan::ExpertParallel);
      return spec;
    }
  }
  return PartitionSpec::replicated(param.rank());
}

}  // namespace

std::string to_string(Axis axis) {
  switch (axis) {
    case Axis::None: return "None";
    case Axis::Data: return "data";
    case Axis::Model: return "model";
  }
  return "?";
}

Axis experts_axis(ShardPlan plan) { return plan == ShardPlan::ExpertParallel ? Axis::Data : Axis::None; }

bool PartitionSpec::shards_on(Axis axis) const {
  for (const DimSharding& d : dims) {
    if (d.axis == axis) return true;
  }
  return false;
}

std::string PartitionSpec::to_string() const {
  std::vector<std::string> parts;
  for (const DimSharding& d : dims) {
    parts.push_back(d.groups > 1 ? fmt::format("{}/{}", tpu::to_string(d.axis), d.groups) : tpu::to_string(d.axis));
  }
  return fmt::format("P({})", fmt::join(parts, ", "));
}

int axis_size(const Mesh& mesh, Axis axis) {
  switch (axis) {
    case Axis::None: return 1;
    case Axis::Data: return mesh.data;
    case Axis::Model: return mesh.model;
  }
  return 1;
}

int axis_coord(const Mesh& mesh, Axis axis, int device) {
  switch (axis) {
    case Axis::None: return 0;
    case Axis::Data: return mesh.data_coord(device);
    case Axis::Model: return mesh.model_coord(device);
  }
  return 0;
}

PartitionSpec effective(const PartitionSpec& spec, const Mesh& mesh) {
  PartitionSpec out = spec;
  for (DimSharding& d : out.dims) {
    if (!active(d.axis, mesh)) d = DimSharding{};
  }
  return out;
}

std::vector<std::int64_t> local_shape(const std::vector<std::int64_t>& global, const PartitionSpec& spec,
                                      const Mesh& mesh) {
  std::vector<std::int64_t> local = global;
  for (std::size_t d = 0; d < global.size() && d < spec.dims.size(); ++d) local[d] /= axis_size(mesh, spec.dims[d].axis);
  return local;
}

std::int64_t local_numel(const std::vector<std::int64_t>& global, const PartitionSpec& spec, const Mesh& mesh) {
  std::int64_t n = 1;
  for (std::int64_t e : local_shape(global, spec, mesh)) n *= e;
  return n;
}

bool owns_distinct_block(const PartitionSpec& spec, const Mesh& mesh, int device) {
  for (Axis axis : {Axis::Data, Axis::Model}) {
    if (!spec.shards_on(axis) && axis_coord(mesh, axis, device) != 0) return false;
  }
  return true;
}

bool holds_first_element(const PartitionSpec& spec, const Mesh& mesh, int device) {
  for (Axis axis : {Axis::Data, Axis::Model}) {
    if (spec.shards_on(axis) && axis_coord(mesh, axis, device) != 0) return false;
  }
  return true;
}

template <typename T>
void copy_block_from_global(const std::vector<std::int64_t>& global, const PartitionSpec& spec, const Mesh& mesh,
                            int device, const T* global_values, T* local_values) {
  for_each_block_run(global, spec, mesh, device, [&](std::int64_t local, std::int64_t g, std::int64_t n) {
    std::copy(global_values + g, global_values + g + n, local_values + local);
  });
}

template <typename T>
void copy_block_to_global(const std::vector<std::int64_t>& global, const PartitionSpec& spec, const Mesh& mesh,
                          int device, const T* local_values, T* global_values) {
  for_each_block_run(global, spec, mesh, device, [&](std::int64_t local, std::int64_t g, std::int64_t n) {
    std::copy(local_values + local, local_values + local + n, global_values + g);
  });
}

template void copy_block_from_global<float>(const std::vector<std::int64_t>&, const PartitionSpec&, const Mesh&, int,
                                            const float*, float*);
template void copy_block_from_global<std::int32_t>(const std::vector<std::int64_t>&, const PartitionSpec&,
                                                   const Mesh&, int, const std::int32_t*, std::int32_t*);
template void copy_block_to_global<float>(const std::vector<std::int64_t>&, const PartitionSpec&, const Mesh&, int,
                                          const float*, float*);

std::vector<PartitionSpec> plan_shardings(const TensorTable& table, const MeshConfig& config) {
  std::vector<PartitionSpec> specs;
  specs.reserve(table.size());
  for (const TensorDesc& t : table.all()) specs.push_back(PartitionSpec::replicated(t.rank()));
  for (TensorId p : table.of_kind(TensorKind::Parameter)) {
    const PartitionSpec spec = parameter_spec(table[p], config.plan);
    specs[static_cast<std::size_t>(p)] = spec;
    for (TensorKind kind : {TensorKind::Gradient, TensorKind::AdamM, TensorKind::AdamV}) {
      specs[static_cast<std::size_t>(table.shadow(p, kind))] = spec;
    }
  }
  // On every plan the batch is split on `data`.
  for (TensorId id : table.of_kind(TensorKind::Input)) specs[static_cast<std::size_t>(id)].dims[0].axis = Axis::Data;
  return specs;
}

void validate_plan(const TensorTable& table, const std::vector<PartitionSpec>& specs, const MeshConfig& config) {
  const std::string where = fmt::format("--shard-plan {} on --mesh {}", to_string(config.plan), config.mesh.to_string());
  for (const TensorDesc& t : table.all()) {
    const PartitionSpec& spec = specs[static_cast<std::size_t>(&t - table.all().data())];
    for (std::size_t d = 0; d < spec.dims.size(); ++d) {
      const int parts = axis_size(config.mesh, spec.dims[d].axis) * spec.dims[d].groups;
      // A linear split between heads: each shard holds whole heads.
      const int unit = spec.dims[d].axis == Axis::Model ? t.role.parallel_unit : 1;
      if (t.shape[d] % (static_cast<std::int64_t>(parts) * unit) != 0) {
        const std::string what = unit > 1 ? fmt::format("shards of whole heads ({} wide)", unit)
                                          : (spec.dims[d].groups > 1 ? "group slices" : "shards");
        throw std::invalid_argument(fmt::format(
            "{}: {} dimension {} has size {}, which does not divide into {} {}; choose a mesh whose {} axis "
            "divides it",
            where, t.name, d, t.shape[d], parts, what, to_string(spec.dims[d].axis)));
      }
    }
    // Tensor parallelism splits attention by heads: the heads must divide over `model`.
    const int heads_dim = t.role.heads_dim;
    if (config.plan == ShardPlan::TensorParallel && t.kind == TensorKind::Activation && heads_dim >= 0 &&
        t.shape[static_cast<std::size_t>(heads_dim)] % config.mesh.model != 0) {
      throw std::invalid_argument(fmt::format("{}: {} heads of {} do not divide over {} model devices", where,
                                              t.shape[static_cast<std::size_t>(heads_dim)], t.name, config.mesh.model));
    }
    // Micro-batches split activations along the batch; expert rows fill each expert's
    // capacity from the step's whole batch (routing's priority runs over all of it).
    if (config.grad_accum > 1 && t.kind == TensorKind::Activation && t.role.stacked_dims > 0) {
      throw std::invalid_argument(fmt::format(
          "--grad-accum {}: {} holds every expert's rows of the step's whole batch (routing fills each expert's "
          "capacity from all of it), which micro-batches cannot split; run this canary without --grad-accum",
          config.grad_accum, t.name));
    }
    // Each data shard of the batch splits again into the micro-batches.
    if (t.kind == TensorKind::Input && t.shape[0] % (config.mesh.data * config.grad_accum) != 0) {
      throw std::invalid_argument(fmt::format(
          "--grad-accum {}: the batch of {} sequences does not split into {} data shards x {} micro-batches; choose "
          "a count that divides {}",
          config.grad_accum, t.shape[0], config.mesh.data, config.grad_accum, t.shape[0] / config.mesh.data));
    }
  }
}

}  // namespace harness::tpu
