// The simulated mesh: one memory per device and the executor that runs an Executable on
// all of them. Kernels run on every device at once (devices are parallel tasks on the
// host, each kernel deterministic on its own); collectives combine devices in a fixed
// order, so a fixed mesh and plan give the same bits on any host thread count.
//
// Replicas: along a mesh axis that no tensor of the plan is sharded on (`model` under dp
// and zero3), every coordinate holds the same blocks and runs the same program on them,
// so it computes the same bits. Only coordinate 0 of such an axis runs; every read
// (assemble, traces, the global norm) already takes distinct blocks from coordinate 0.
// HARNESS_MESH_REPLICAS=verify runs every replica and, after each program, checks that
// each replica's persistent blocks equal its coordinate-0 twin's (std::logic_error
// naming the tensor otherwise): the test that skipping them changes nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "instructions.h"
#include "kernels/llama_kernels.h"
#include "program.h"

namespace harness::tpu {

// Receives a Trace instruction's value: its trace slot and the global tensor (of
// micro-batch `micro_batch` for an activation) assembled from the devices' blocks, valid
// for the call only.
using TraceCallback = std::function<void(int slot, int micro_batch, std::span<const float> value)>;

class MeshExecutor {
 public:
  // Allocates every device's persistent buffers (its blocks of the persistent tensors).
  void bind(const TensorTable& table, const Mesh& mesh, std::vector<PartitionSpec> specs);

  // Host -> devices: each device receives its block (scalars: every device).
  void upload(TensorId id, std::span<const float> values);
  void upload_tokens(TensorId id, std::span<const std::int32_t> tokens);
  // Devices -> host: the global tensor assembled from its blocks, in a host buffer of its
  // own (so many reads can be held at once); valid until the same tensor is read again.
  std::span<const float> assemble(TensorId id);

  // Runs a program; `micro_batch` picks the slice of the inputs a micro-step program reads.
  void run(const Executable& exe, int micro_batch = 0);
  void set_trace_callback(TraceCallback callback) { on_trace_ = std::move(callback); }

 private:
  friend struct KernelCall;  // resolves its operands in a device's memory
  struct Device {
    std::vector<std::vector<float>> tensors;        // persistent blocks by TensorId (empty: none)
    std::vector<std::vector<std::int32_t>> tokens;  // int32 blocks by TensorId
    std::vector<float> slab;                        // transient buffers at planned offsets
    std::vector<float> scratch;                     // GEMM packing
  };

  float* f32(int device, const Executable& exe, std::int32_t buffer);
  const std::int32_t* i32(int device, const Executable& exe, std::int32_t buffer);
  void run_kernel(int device, const Executable& exe, const Instr& in);
  void run_collective(const Executable& exe, const Instr& in);
  void run_trace(const Executable& exe, const Instr& in);
  void exchange_expert_rows(const Executable& exe, const Instr& in, const std::vector<int>& members);
  // The devices that exchange along `axis` with `device`, in coordinate order.
  std::vector<int> group(int device, Axis axis) const;

  bool runs(int device) const { return running_[static_cast<std::size_t>(device)] != 0; }
  void verify_replicas() const;

  const TensorTable* table_ = nullptr;
  Mesh mesh_;
  std::vector<char> running_;        // by device: 1 where it runs (see "Replicas" above)
  std::vector<int> running_devices_;
  std::vector<Axis> replica_axes_;   // axes of size > 1 that no tensor is sharded on
  bool verify_replicas_ = false;
  std::vector<PartitionSpec> specs_;
  std::vector<Device> devices_;
  std::vector<std::vector<float>> host_;  // assembled tensors by TensorId
  int micro_batch_ = 0;                    // of the program running
  TraceCallback on_trace_;
  std::vector<float> trace_value_;         // a Trace instruction's assembled value
  // RoPE tables by (T, head size, theta): made by run() before the devices' kernels read
  // them in parallel (they only look tables up, never add one).
  kernels::RopeTableCache rope_tables_;
};

}  // namespace harness::tpu
