// The compiled program ("executable"): a flat list of instructions over buffer slots,
// the same on every device of the mesh (SPMD), plus the buffer plan. What the compiler
// emits, the executor runs and the persistent compile cache stores (cereal below).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include "api/tensor_table.h"
#include "mesh_config.h"
#include "sharding.h"

namespace harness::tpu {

// Format version of the IR and the executable: bump it when either changes meaning, so
// that a persistent cache entry of an older engine is never trusted.
inline constexpr std::uint32_t kProgramFormatVersion = 1;

enum class InstrKind : std::uint8_t {
  // kernels: every device runs them on its own blocks
  Fill,                  // buffers: dst; attrs: value
  EncoderForward,        // out, inputs, wte, wpe; dims: B, T, C
  EncoderBackward,       // dwte, dwpe, dout, inputs; dims: B, T, C
  LayerNormForward,      // out, mean, rstd, inp, weight, bias; dims: N, C; attrs: eps
  LayerNormBackward,     // dinp, dweight, dbias, dout, inp, weight, mean, rstd; dims: N, C
  Linear,                // out, inp, weight, bias|-1; dims: N, C, OC
  LinearBackward,        // dinp, dweight, dbias|-1, dout, inp, weight; dims: N, C, OC
  AttentionForward,      // out, att, qkv; dims: B, T, C, NH
  AttentionBackward,     // dqkv, dout, qkv, att; dims: B, T, C, NH
  GeluForward,           // out, inp; dims: n
  GeluBackward,          // dinp, inp, dout; dims: n
  Add,                   // out, a, b; dims: n
  AddInPlace,            // dst, src; dims: n
  BiasAdd,               // out, bias; dims: N, OC
  CrossEntropyRows,      // probs, losses, logits, targets; dims: N, V
  CrossEntropyBackward,  // dlogits, probs, targets; dims: N, V, N of the global batch
  Clip,                  // norm, tensors...; dims: numel per tensor; attrs: max_norm
  AdamW,                 // param, grad, m, v, lr, bias_correction1, bias_correction2; dims: n; attrs: beta1, beta2, eps, wd
  Nudge,                 // tensor, ulps; specs: the tensor's (only the device holding element 0 moves)
  RoundBf16,             // buffer; dims: n
  CastBf16,              // dst, src; dims: n
  // collectives: devices exchange values, in a fixed order (docs/engines/tpu-mesh.md)
  AllReduce,             // buffer; axis; dims: n
  AllGather,             // dst (whole), src (block); axis; dims: global shape; specs: the block's
  ReduceScatter,         // dst (block), src (whole, partial); axis; dims: global shape; specs: the block's
  LossMean,              // loss, losses; axis (data or None); dims: N local, N global
  GlobalNorm,            // norm, tensors...; dims: numel per tensor; specs: per tensor
};

struct Instr {
  InstrKind kind = InstrKind::Fill;
  std::int32_t node = -1;  // the IR node it lowers: the model op it belongs to
  std::vector<std::int32_t> buffers;
  std::vector<std::int64_t> dims;
  std::vector<float> attrs;
  Axis axis = Axis::None;
  std::vector<PartitionSpec> specs;

  bool is_collective() const { return kind >= InstrKind::AllReduce; }
  template <class Archive>
  void serialize(Archive& ar) { ar(kind, node, buffers, dims, attrs, axis, specs); }
};

enum class MemoryCategory : std::uint8_t { Parameters, Gradients, OptimizerState, Activations, Temporaries };
inline constexpr int kMemoryCategories = 5;
const char* to_string(MemoryCategory category);  // "parameters", "gradients", ...

struct BufferInfo {
  std::string name;
  MemoryCategory category = MemoryCategory::Activations;
  bool persistent = false;   // lives across steps, per tensor (parameters, moments, gradients, scalars, inputs)
  TensorId tensor = kNoTensor;  // persistent buffers: the tensor they hold
  bool int32 = false;
  std::int64_t numel = 0;     // per device
  std::int64_t offset = 0;    // transient buffers: element offset in the device's slab
  std::int32_t first_use = -1, last_use = -1;  // instruction indices

  template <class Archive>
  void serialize(Archive& ar) { ar(name, category, persistent, tensor, int32, numel, offset, first_use, last_use); }
};

struct Executable {
  std::uint32_t format_version = 0;
  std::string fingerprint;
  int mesh_data = 1, mesh_model = 1;
  std::vector<Instr> instrs;
  std::vector<BufferInfo> buffers;
  std::int64_t slab_numel = 0;     // transient buffers, planned with reuse
  std::int64_t scratch_numel = 0;  // GEMM packing room per device
  // Per-device peak bytes by MemoryCategory, and of all categories together.
  std::vector<std::int64_t> peak_bytes = std::vector<std::int64_t>(kMemoryCategories, 0);
  std::int64_t peak_total_bytes = 0;

  Mesh mesh() const { return Mesh{mesh_data, mesh_model}; }
  template <class Archive>
  void serialize(Archive& ar) {
    ar(format_version, fingerprint, mesh_data, mesh_model, instrs, buffers, slab_numel, scratch_numel, peak_bytes,
       peak_total_bytes);
  }
};

template <class Archive>
void serialize(Archive& ar, DimSharding& d) { ar(d.axis, d.groups); }
template <class Archive>
void serialize(Archive& ar, PartitionSpec& s) { ar(s.dims); }

}  // namespace harness::tpu
