#include "executor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include "kernels/deterministic_reduce.h"
#include "kernels/kernels.h"
#include "kernels/llama_kernels.h"
#include "kernels/moe_kernels.h"

namespace harness::tpu {
namespace {

int as_int(std::int64_t v) { return static_cast<int>(v); }

std::int64_t numel_of(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (std::int64_t e : shape) n *= e;
  return n;
}

// The mesh axes of size > 1 that no tensor's (effective) spec shards: pure replication.
std::vector<Axis> replica_axes(const Mesh& mesh, const std::vector<PartitionSpec>& specs) {
  std::vector<Axis> axes;
  for (Axis axis : {Axis::Data, Axis::Model}) {
    if (axis_size(mesh, axis) == 1) continue;
    const bool sharded = std::any_of(specs.begin(), specs.end(),
                                     [&](const PartitionSpec& s) { return effective(s, mesh).shards_on(axis); });
    if (!sharded) axes.push_back(axis);
  }
  return axes;
}

bool verify_replicas_requested() {
  const char* mode = std::getenv("HARNESS_MESH_REPLICAS");
  if (mode == nullptr || *mode == '\0' || std::string_view(mode) == "once") return false;
  if (std::string_view(mode) == "verify") return true;
  throw std::invalid_argument(fmt::format("HARNESS_MESH_REPLICAS: '{}' is not a mode; use once (default) or verify", mode));
}

}  // namespace

void MeshExecutor::bind(const TensorTable& table, const Mesh& mesh, std::vector<PartitionSpec> specs) {
  table_ = &table;
  mesh_ = mesh;
  specs_ = std::move(specs);
  replica_axes_ = replica_axes(mesh_, specs_);
  verify_replicas_ = verify_replicas_requested() && !replica_axes_.empty();
  running_.assign(static_cast<std::size_t>(mesh.devices()), 1);
  running_devices_.clear();
  for (int d = 0; d < mesh.devices(); ++d) {
    for (Axis axis : replica_axes_) {
      if (!verify_replicas_ && axis_coord(mesh, axis, d) != 0) running_[static_cast<std::size_t>(d)] = 0;
    }
    if (runs(d)) running_devices_.push_back(d);
  }
  devices_.assign(static_cast<std::size_t>(mesh.devices()), Device{});
  host_.assign(table.size(), {});
  for (Device& device : devices_) {
    device.tensors.resize(table.size());
    device.tokens.resize(table.size());
    for (const TensorDesc& t : table.all()) {
      const auto id = static_cast<std::size_t>(&t - table.all().data());
      if (!is_device_data(t.kind)) continue;
      const auto n = static_cast<std::size_t>(local_numel(t.shape, specs_[id], mesh));
      if (t.dtype == DType::I32) device.tokens[id].assign(n, 0);
      else device.tensors[id].assign(n, 0.0f);
    }
  }
}

void MeshExecutor::upload(TensorId id, std::span<const float> values) {
  const TensorDesc& t = (*table_)[id];
  if (!is_device_data(t.kind)) throw std::logic_error("tpu-mesh: upload into a transient tensor " + t.name);
  if (static_cast<std::int64_t>(values.size()) != t.numel()) throw std::invalid_argument("upload: wrong size for " + t.name);
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    copy_block_from_global(t.shape, specs_[static_cast<std::size_t>(id)], mesh_, static_cast<int>(d), values.data(),
                           devices_[d].tensors[static_cast<std::size_t>(id)].data());
  }
}

void MeshExecutor::upload_tokens(TensorId id, std::span<const std::int32_t> tokens) {
  const TensorDesc& t = (*table_)[id];
  if (static_cast<std::int64_t>(tokens.size()) != t.numel()) throw std::invalid_argument("upload: wrong size for " + t.name);
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    copy_block_from_global(t.shape, specs_[static_cast<std::size_t>(id)], mesh_, static_cast<int>(d), tokens.data(),
                           devices_[d].tokens[static_cast<std::size_t>(id)].data());
  }
}

std::span<const float> MeshExecutor::assemble(TensorId id) {
  const TensorDesc& t = (*table_)[id];
  if (!is_device_data(t.kind) || t.dtype != DType::F32) {
    throw std::logic_error(fmt::format("tpu-mesh: {} is a transient buffer of the compiled step; only parameters, "
                                       "gradients, moments and scalars can be read",
                                       t.name));
  }
  std::vector<float>& host = host_[static_cast<std::size_t>(id)];
  host.assign(static_cast<std::size_t>(t.numel()), 0.0f);
  const PartitionSpec& spec = specs_[static_cast<std::size_t>(id)];
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    if (!owns_distinct_block(effective(spec, mesh_), mesh_, static_cast<int>(d))) continue;
    copy_block_to_global(t.shape, spec, mesh_, static_cast<int>(d), devices_[d].tensors[static_cast<std::size_t>(id)].data(),
                         host.data());
  }
  return host;
}

float* MeshExecutor::f32(int device, const Executable& exe, std::int32_t buffer) {
  if (buffer < 0) return nullptr;
  const BufferInfo& b = exe.buffers[static_cast<std::size_t>(buffer)];
  Device& d = devices_[static_cast<std::size_t>(device)];
  return b.persistent ? d.tensors[static_cast<std::size_t>(b.tensor)].data() : d.slab.data() + b.offset;
}

const std::int32_t* MeshExecutor::i32(int device, const Executable& exe, std::int32_t buffer) {
  const BufferInfo& b = exe.buffers[static_cast<std::size_t>(buffer)];
  const std::int32_t* whole = devices_[static_cast<std::size_t>(device)].tokens[static_cast<std::size_t>(b.tensor)].data();
  if (b.micro_slice == kWholeBuffer) return whole;
  const std::int64_t slice = b.micro_slice == kRunMicroBatch ? micro_batch_ : b.micro_slice;
  return whole + slice * b.numel;
}

std::vector<int> MeshExecutor::group(int device, Axis axis) const {
  std::vector<int> members;
  for (int d = 0; d < mesh_.devices(); ++d) {
    const bool same_elsewhere = axis == Axis::Data ? mesh_.model_coord(d) == mesh_.model_coord(device)
                                                   : mesh_.data_coord(d) == mesh_.data_coord(device);
    if (axis == Axis::None ? d == device : same_elsewhere) members.push_back(d);
  }
  return members;  // device order is coordinate order along `axis`
}

void MeshExecutor::run(const Executable& exe, int micro_batch) {
  if (exe.mesh_data != mesh_.data || exe.mesh_model != mesh_.model) {
    throw std::logic_error("tpu-mesh: executable compiled for another mesh");
  }
  if (micro_batch < 0 || micro_batch >= exe.micro_batches) throw std::logic_error("tpu-mesh: micro-batch out of range");
  micro_batch_ = micro_batch;
  for (Device& d : devices_) {
    if (static_cast<std::int64_t>(d.slab.size()) < exe.slab_numel) d.slab.resize(static_cast<std::size_t>(exe.slab_numel));
    if (static_cast<std::int64_t>(d.scratch.size()) < exe.scratch_numel) {
      d.scratch.resize(static_cast<std::size_t>(exe.scratch_numel));
    }
  }
  for (const Instr& in : exe.instrs) {
    if (in.op() == InstrKind::RopeForward || in.op() == InstrKind::RopeBackward) {
      const std::span<const std::int64_t> n = exe.dims_of(in);
      const std::span<const float> attrs = exe.attrs_of(in);
      rope_tables_.get(as_int(n[1]), as_int(n[3]), attrs_double(attrs[0], attrs[1]));  // made here, read in parallel
    }
    if (in.op() == InstrKind::Trace) {
      run_trace(exe, in);
    } else if (in.is_collective()) {
      if (std::find(replica_axes_.begin(), replica_axes_.end(), in.mesh_axis()) != replica_axes_.end()) {
        throw std::logic_error("tpu-mesh: a collective over an axis no tensor is sharded on");
      }
      run_collective(exe, in);
    } else if (running_devices_.size() == 1) {
      run_kernel(running_devices_.front(), exe, in);
    } else {
      tbb::parallel_for(std::size_t{0}, running_devices_.size(), [&](std::size_t k) { run_kernel(running_devices_[k], exe, in); });
    }
  }
  if (verify_replicas_) verify_replicas();
}

void MeshExecutor::verify_replicas() const {
  for (std::size_t d = 0; d < devices_.size(); ++d) {
    int twin = static_cast<int>(d);  // the replica at coordinate 0 of every replica axis
    for (Axis axis : replica_axes_) {
      twin -= axis_coord(mesh_, axis, static_cast<int>(d)) * (axis == Axis::Data ? mesh_.model : 1);
    }
    for (std::size_t id = 0; id < table_->size(); ++id) {
      const std::vector<float>& mine = devices_[d].tensors[id];
      const std::vector<float>& twins = devices_[static_cast<std::size_t>(twin)].tensors[id];
      // Bits, not values: a NaN equals its copy, and -0 differs from +0.
      const bool same = mine.size() == twins.size() &&
                        (mine.empty() || std::memcmp(mine.data(), twins.data(), mine.size() * sizeof(float)) == 0);
      if (!same) {
        throw std::logic_error(fmt::format("tpu-mesh: device {} holds other values of {} than its replica {}", d,
                                           (*table_)[static_cast<TensorId>(id)].name, twin));
      }
    }
  }
}

float* KernelCall::P(std::size_t i) const { return executor.f32(device, exe, buffers[i]); }
const std::int32_t* KernelCall::I(std::size_t i) const { return executor.i32(device, exe, buffers[i]); }
const Mesh& KernelCall::mesh() const { return executor.mesh_; }
const kernels::RopeTables& KernelCall::rope_tables(int T, int head_size, double theta) const {
  return executor.rope_tables_.get(T, head_size, theta);
}

// Every kernel is its instruction's (instructions.cpp), on this device's blocks.
void MeshExecutor::run_kernel(int device, const Executable& exe, const Instr& in) {
  const auto kernel = instruction(in.op()).kernel;
  if (kernel == nullptr) throw std::logic_error("tpu-mesh: a collective dispatched as a kernel");
  kernel(KernelCall{*this, exe, in, device, exe.buffers_of(in), exe.dims_of(in), exe.attrs_of(in),
                    devices_[static_cast<std::size_t>(device)].scratch.data()});
}

// Like assemble(), for any buffer of the program: each distinct block once, in device order.
void MeshExecutor::run_trace(const Executable& exe, const Instr& in) {
  if (!on_trace_) return;
  const std::vector<std::int64_t> global(exe.dims_of(in).begin(), exe.dims_of(in).end());
  const PartitionSpec spec = exe.spec_of(in, 0);
  trace_value_.resize(static_cast<std::size_t>(numel_of(global)));  // the distinct blocks cover it all
  for (int d = 0; d < mesh_.devices(); ++d) {
    if (!owns_distinct_block(spec, mesh_, d)) continue;
    copy_block_to_global(global, spec, mesh_, d, f32(d, exe, exe.buffers_of(in)[0]), trace_value_.data());
  }
  const auto slice = static_cast<std::int32_t>(exe.attrs_of(in)[1]);
  const int micro_batch = slice == kRunMicroBatch ? micro_batch_ : std::max(slice, 0);
  on_trace_(static_cast<int>(exe.attrs_of(in)[0]), micro_batch, trace_value_);
}

// The placed rows of a group's routing choices, between the buffers indexed by (expert,
// slot) on each token's device and the blocks of the devices that hold the expert: member
// j holds experts [j * per_device, (j + 1) * per_device), or all of them when per_device is
// E (each device then receives every member's rows). Towards the experts every receiving
// block starts at zero (an empty slot holds zeros, as cpu-ref's buffers do); back towards
// the tokens each device's whole buffer does. Members go in coordinate order and their
// choices in order; rows move whole, so no value changes on the way.
void MeshExecutor::exchange_expert_rows(const Executable& exe, const Instr& in, const std::vector<int>& members) {
  const std::span<const std::int64_t> n = exe.dims_of(in);
  const std::int64_t E = n[0], cap = n[1], width = n[2], choices = n[3], per_device = n[4];
  const bool to_experts = exe.attrs_of(in)[0] == 0.0f;
  const std::span<const std::int32_t> b = exe.buffers_of(in);
  const std::int64_t dst_numel = (to_experts ? per_device : E) * cap * width;
  for (int m : members) std::fill(f32(m, exe, b[0]), f32(m, exe, b[0]) + dst_numel, 0.0f);
  // Member index holding expert e, and the row of (e, s) in that member's block.
  const auto holder = [&](std::int64_t e, std::size_t self) {
    return per_device == E ? self : static_cast<std::size_t>(e / per_device);
  };
  const auto block_row = [&](std::int64_t e, std::int64_t s) { return ((e % per_device) * cap + s) * width; };
  for (std::size_t j = 0; j < members.size(); ++j) {
    const float* expert = f32(members[j], exe, b[2]);
    const float* slot = f32(members[j], exe, b[3]);
    for (std::int64_t i = 0; i < choices; ++i) {
      if (slot[i] == kernels::kDroppedSlot) continue;
      const auto e = static_cast<std::int64_t>(expert[i]), s = static_cast<std::int64_t>(slot[i]);
      const std::int64_t whole_row = (e * cap + s) * width;
      if (to_experts) {
        const float* row = f32(members[j], exe, b[1]) + whole_row;
        for (std::size_t r = 0; r < members.size(); ++r) {
          if (per_device != E && holder(e, j) != r) continue;
          std::copy(row, row + width, f32(members[r], exe, b[0]) + block_row(e, s));
        }
      } else {
        const float* row = f32(members[holder(e, j)], exe, b[1]) + block_row(e, s);
        std::copy(row, row + width, f32(members[j], exe, b[0]) + whole_row);
      }
    }
  }
}

// Collectives combine the devices of each group in coordinate order: ((x0 + x1) + x2) + ...
void MeshExecutor::run_collective(const Executable& exe, const Instr& in) {
  const std::vector<std::int64_t> n(exe.dims_of(in).begin(), exe.dims_of(in).end());
  const std::span<const std::int32_t> buffers = exe.buffers_of(in);
  for (int leader = 0; leader < mesh_.devices(); ++leader) {
    if (!runs(leader)) continue;  // a replica: its group's members are replicas too
    const std::vector<int> members = group(leader, in.mesh_axis());
    if (members.front() != leader) continue;  // each group once, from its first device
    switch (in.op()) {
      case InstrKind::AllReduce: {
        float* sum = f32(leader, exe, buffers[0]);
        for (std::size_t k = 1; k < members.size(); ++k) kernels::add_inplace(sum, f32(members[k], exe, buffers[0]), n[0]);
        for (std::size_t k = 1; k < members.size(); ++k) std::copy(sum, sum + n[0], f32(members[k], exe, buffers[0]));
        break;
      }
      case InstrKind::AllGather: {
        const PartitionSpec block = exe.spec_of(in, 0);
        float* whole = f32(leader, exe, buffers[0]);
        for (int m : members) copy_block_to_global(n, block, mesh_, m, f32(m, exe, buffers[1]), whole);
        for (std::size_t k = 1; k < members.size(); ++k) {
          std::copy(whole, whole + numel_of(n), f32(members[k], exe, buffers[0]));
        }
        break;
      }
      case InstrKind::ReduceScatter: {
        float* sum = f32(leader, exe, buffers[1]);
        for (std::size_t k = 1; k < members.size(); ++k) {
          kernels::add_inplace(sum, f32(members[k], exe, buffers[1]), numel_of(n));
        }
        const PartitionSpec block = exe.spec_of(in, 0);
        for (int m : members) copy_block_from_global(n, block, mesh_, m, sum, f32(m, exe, buffers[0]));
        break;
      }
      case InstrKind::LossMean: {
        // The rows of every device in batch order, then cpu-ref's blocked mean over them.
        std::vector<float> losses;
        losses.reserve(static_cast<std::size_t>(n[1]));
        for (int m : members) {
          const float* rows = f32(m, exe, buffers[1]);
          losses.insert(losses.end(), rows, rows + n[0]);
        }
        const float total = kernels::blocked_sum<float>(n[1], kernels::kTokenBlock,
                                                        [&](std::int64_t i) { return losses[static_cast<std::size_t>(i)]; });
        const float mean = total / static_cast<float>(n[2]);
        const bool accumulate = exe.attrs_of(in)[0] != 0.0f;
        for (int m : members) {
          float* loss = f32(m, exe, buffers[0]);
          *loss = accumulate ? *loss + mean : mean;
        }
        break;
      }
      case InstrKind::GlobalNorm: {
        // Partials of every tensor in order, over the devices holding distinct blocks in
        // device order, then one fixed tree: on one device, exactly cpu-ref's global_norm.
        std::vector<double> partials;
        for (std::size_t t = 1; t < buffers.size(); ++t) {
          const PartitionSpec spec = exe.spec_of(in, static_cast<int>(t - 1));
          for (int d = 0; d < mesh_.devices(); ++d) {
            if (!owns_distinct_block(spec, mesh_, d)) continue;
            const std::size_t at = partials.size();
            partials.resize(at + static_cast<std::size_t>(kernels::sum_of_squares_partial_count(n[t - 1])));
            kernels::sum_of_squares_partials(f32(d, exe, buffers[t]), n[t - 1], partials.data() + at);
          }
        }
        kernels::combine_pairwise(partials, static_cast<std::int64_t>(partials.size()), 1);
        const float norm = static_cast<float>(__builtin_sqrt(partials.empty() ? 0.0 : partials[0]));
        for (int d = 0; d < mesh_.devices(); ++d) *f32(d, exe, buffers[0]) = norm;
        return;  // one reduction over all devices, not per group
      }
      case InstrKind::ExpertExchange: exchange_expert_rows(exe, in, members); break;
      default: throw std::logic_error("tpu-mesh: a kernel dispatched as a collective");
    }
  }
}

}  // namespace harness::tpu
