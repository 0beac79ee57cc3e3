// The compiled program ("executable"): a flat list of instructions over buffer slots,
// the same on every device of the mesh (SPMD), plus the buffer plan. What the compiler
// emits, the executor runs and the persistent compile cache stores (cereal below).
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <string>
#include <string_view>
#include <vector>

#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include "api/tensor_table.h"
#include "mesh_config.h"
#include "sharding.h"

namespace harness::tpu {

// Format version of the IR and the executable: bump it when either changes meaning, so
// that a persistent cache entry of an older engine is never trusted.
inline constexpr std::uint32_t kProgramFormatVersion = 3;

enum class InstrKind : std::uint8_t {
  // kernels: every device runs them on its own blocks
  Fill,                  // buffers: dst; attrs: value
  EncoderForward,        // out, inputs, wte, wpe|-1; dims: B, T, C
  EncoderBackward,       // dwte, dwpe|-1, dout, inputs; dims: B, T, C
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
  LossMean,              // loss, losses; axis (data or None); dims: N local, N over the group, N of the
                         // global batch (the divisor); attrs: 1 to add to the loss (later micro-batches)
  GlobalNorm,            // norm, tensors...; dims: numel per tensor; specs: per tensor
  // host transfer (--trace ops): the tensor's blocks assembled and handed to the engine
  Trace,                 // buffer; dims: global shape (one micro-batch's, for activations);
                         // attrs: trace slot, micro slice (kWholeBuffer, k or kRunMicroBatch); specs: the tensor's
  // the llama kernels (appended: the kinds above keep their values in cached programs)
  RmsNormForward,        // out, rstd, inp, weight; dims: N, C; attrs: eps
  RmsNormBackward,       // dinp, dweight, dout, inp, weight, rstd; dims: N, C
  RopeForward,           // out, inp; dims: B, T, heads, head_size; attrs: theta as two halves of its bits
  RopeBackward,          // dinp, dout; dims: B, T, heads, head_size; attrs: theta as two halves of its bits
  SwigluForward,         // out, gate, up; dims: n
  SwigluBackward,        // dgate, dup, dout, gate, up; dims: n
  GqaAttentionForward,   // out, att, q, k, v; dims: B, T, heads, kv heads, head size
  GqaAttentionBackward,  // dq, dk, dv, dout, q, k, v, att; dims: B, T, heads, kv heads, head size
  // the mixture-of-experts kernels (kernels/moe_kernels.h); decisions are floats
  MoeRouteForward,       // weights, expert, slot, probs, record, logits; dims: N, E, K, cap; attrs: balance_coef
  MoeRouteBackward,      // dlogits, dweights, probs, weights, expert; dims: N, E, K; attrs: balance_coef
  MoeDispatchForward,    // expert_in (E,cap,C), inp, expert, slot; dims: N, C, E, K, cap
  MoeDispatchBackward,   // dinp, dexpert_in (E,cap,C), expert, slot; dims: N, C, K, cap
  MoeCombineForward,     // out, expert_out (E,cap,C), weights, expert, slot; dims: N, C, K, cap
  MoeCombineBackward,    // dexpert_out, dweights, dout, expert_out, weights, expert, slot; dims: N, C, K, cap
  ExpertLinear,          // out, inp, weight; dims: E (held here), cap, C, OC
  ExpertLinearBackward,  // dinp, dweight, dout, inp, weight; dims: E (held here), cap, C, OC
  TakeBlock,             // dst (block), src (whole, the same on every device); dims: global shape; specs: the block's
  // the collective of expert parallelism (appended: the kinds above keep their values)
  ExpertExchange,        // dst, src, expert, slot; axis; dims: E, cap, row width, choices here, experts per device;
                         // attrs: 0 from the tokens' devices to the experts', 1 back
  // exact GELU (appended)
  GeluErfForward,        // out, inp; dims: n
  GeluErfBackward,       // dinp, inp, dout; dims: n
  kLastKind = GeluErfBackward,
};

// A double attribute (RoPE's theta) as two float attributes holding its 64 bits, so that
// the program computes with exactly the value the model gave, and back (graph.cpp).
std::vector<float> double_attrs(double value);
double attrs_double(float high, float low);

// One instruction. Its operands live in the Executable's pools (buffers, dims, attrs,
// specs): an Instr is fixed-size, so a program is a handful of flat arrays that the
// persistent cache reads back in bulk.
struct Instr {
  std::int32_t kind = 0;   // InstrKind
  std::int32_t axis = 0;   // Axis
  std::int32_t node = -1;  // the IR node it lowers: the model op it belongs to
  std::int32_t buffers_at = 0, buffers_count = 0;
  std::int32_t dims_at = 0, dims_count = 0;
  std::int32_t attrs_at = 0, attrs_count = 0;
  std::int32_t specs_at = 0, specs_count = 0;

  InstrKind op() const { return static_cast<InstrKind>(kind); }
  Axis mesh_axis() const { return static_cast<Axis>(axis); }
  bool is_collective() const {
    return (op() >= InstrKind::AllReduce && op() <= InstrKind::GlobalNorm) || op() == InstrKind::ExpertExchange;
  }
  // dims are a global shape, as long as the spec of operand 0
  bool has_global_shape() const {
    return op() == InstrKind::AllGather || op() == InstrKind::ReduceScatter || op() == InstrKind::Trace ||
           op() == InstrKind::TakeBlock;
  }
};
inline constexpr std::size_t kInstrFields = 11;
static_assert(sizeof(Instr) == kInstrFields * sizeof(std::int32_t) && std::is_trivially_copyable_v<Instr>,
              "Instr is serialised as int32 fields");

enum class MemoryCategory : std::uint8_t { Parameters, Gradients, OptimizerState, Activations, Temporaries };
inline constexpr int kMemoryCategories = 5;
const char* to_string(MemoryCategory category);  // "parameters", "gradients", ...

// A persistent int32 buffer read one micro-batch at a time: which slice of it an operand is.
inline constexpr std::int32_t kWholeBuffer = -1;
inline constexpr std::int32_t kRunMicroBatch = -2;  // the slice of the micro-batch the run is given

struct BufferInfo {
  std::int32_t name_at = 0, name_size = 0;  // in Executable::buffer_names
  MemoryCategory category = MemoryCategory::Activations;
  bool persistent = false;   // lives across steps, per tensor (parameters, moments, gradients, scalars, inputs)
  TensorId tensor = kNoTensor;  // persistent buffers: the tensor they hold
  bool int32 = false;
  // kWholeBuffer, a fixed slice k (a step program unrolling its micro-batches) or
  // kRunMicroBatch (a micro-step program); a slice is `numel` elements at k * numel.
  std::int32_t micro_slice = kWholeBuffer;
  std::int64_t numel = 0;     // per device
  std::int64_t offset = 0;    // transient buffers: element offset in the device's slab
  std::int32_t first_use = -1, last_use = -1;  // instruction indices
};

struct Executable {
  std::uint32_t format_version = 0;
  std::string fingerprint;
  int mesh_data = 1, mesh_model = 1;
  std::int32_t micro_batches = 1;  // --grad-accum it was compiled for
  std::vector<Instr> instrs;
  // Operand pools the instructions index.
  std::vector<std::int32_t> operand_buffers;
  std::vector<std::int64_t> operand_dims;
  std::vector<float> operand_attrs;
  std::vector<std::int32_t> spec_offsets{0};  // spec i: spec_dims[2 * offsets[i] .. 2 * offsets[i + 1])
  std::vector<std::int32_t> spec_dims;        // (axis, groups) per dimension
  std::vector<BufferInfo> buffers;
  std::string buffer_names;        // every buffer's name, back to back (for diagnostics)
  std::int64_t slab_numel = 0;     // transient buffers, planned with reuse
  std::int64_t scratch_numel = 0;  // GEMM packing room per device
  // Per-device peak bytes by MemoryCategory, and of all categories together.
  std::vector<std::int64_t> peak_bytes = std::vector<std::int64_t>(kMemoryCategories, 0);
  std::int64_t peak_total_bytes = 0;

  Mesh mesh() const { return Mesh{mesh_data, mesh_model}; }
  std::span<const std::int32_t> buffers_of(const Instr& in) const {
    return {operand_buffers.data() + in.buffers_at, static_cast<std::size_t>(in.buffers_count)};
  }
  std::span<const std::int64_t> dims_of(const Instr& in) const {
    return {operand_dims.data() + in.dims_at, static_cast<std::size_t>(in.dims_count)};
  }
  std::span<const float> attrs_of(const Instr& in) const {
    return {operand_attrs.data() + in.attrs_at, static_cast<std::size_t>(in.attrs_count)};
  }
  PartitionSpec spec_of(const Instr& in, int k) const;
  std::string_view name_of(const BufferInfo& b) const {
    return std::string_view(buffer_names).substr(static_cast<std::size_t>(b.name_at), static_cast<std::size_t>(b.name_size));
  }
  int add_buffer(BufferInfo info, std::string_view name);  // returns its index
  // Appends an instruction with its operands to the pools.
  void append(InstrKind kind, std::int32_t node, std::span<const std::int32_t> buffers,
              std::span<const std::int64_t> dims, std::span<const float> attrs, Axis axis,
              std::span<const PartitionSpec> specs);

  // Serialised as flat arrays of numbers (cereal copies those in bulk) and one string of
  // buffer names: loading a program is a few copies, not an allocation per instruction.
  template <class Archive>
  void save(Archive& ar) const {
    std::vector<std::int32_t> fields(instrs.size() * kInstrFields);
    if (!instrs.empty()) std::memcpy(fields.data(), instrs.data(), fields.size() * sizeof(std::int32_t));
    const std::vector<std::int64_t> buffer_fields = flatten_buffers();
    ar(format_version, fingerprint, mesh_data, mesh_model, micro_batches, fields, operand_buffers, operand_dims, operand_attrs,
       spec_offsets, spec_dims, buffer_fields, buffer_names, slab_numel, scratch_numel, peak_bytes, peak_total_bytes);
  }
  template <class Archive>
  void load(Archive& ar) {
    std::vector<std::int32_t> fields;
    std::vector<std::int64_t> buffer_fields;
    ar(format_version, fingerprint, mesh_data, mesh_model, micro_batches, fields, operand_buffers, operand_dims, operand_attrs,
       spec_offsets, spec_dims, buffer_fields, buffer_names, slab_numel, scratch_numel, peak_bytes, peak_total_bytes);
    if (fields.size() % kInstrFields != 0) throw std::runtime_error("executable: truncated instruction list");
    instrs.resize(fields.size() / kInstrFields);
    if (!instrs.empty()) std::memcpy(static_cast<void*>(instrs.data()), fields.data(), fields.size() * sizeof(std::int32_t));
    unflatten_buffers(buffer_fields);
  }
  std::vector<std::int64_t> flatten_buffers() const;
  void unflatten_buffers(const std::vector<std::int64_t>& fields);  // throws on a mismatch
  // Every index in range: a deserialised program is checked before it runs.
  bool well_formed() const;
};


}  // namespace harness::tpu
