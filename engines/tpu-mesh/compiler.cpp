#include "compiler.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace harness::tpu {
namespace {

using Shape = std::vector<std::int64_t>;
constexpr std::int64_t kSlabAlignment = 16;  // floats: 64-byte aligned buffer starts

std::int64_t product(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t extent : shape) n *= extent;
  return n;
}
// Product of all but the last dimension (1 for a 0-D or 1-D tensor).
std::int64_t rows(const Shape& shape) {
  std::int64_t n = 1;
  for (std::size_t i = 0; i + 1 < shape.size(); ++i) n *= shape[i];
  return n;
}

MemoryCategory category_of(TensorKind kind) {
  switch (kind) {
    case TensorKind::Parameter: return MemoryCategory::Parameters;
    case TensorKind::Gradient: return MemoryCategory::Gradients;
    case TensorKind::AdamM:
    case TensorKind::AdamV: return MemoryCategory::OptimizerState;
    default: return MemoryCategory::Activations;
  }
}


// Whether the forward and backward nodes may all run before the optimizer nodes (once per
// micro-batch): none of them reads a value an earlier optimizer node wrote. The one
// optimizer node traced early is a leaked scalar's Constant, which only the update reads.
void check_phases_separable(const Graph& graph) {
  std::vector<TensorId> optimizer_outputs;
  for (const Node& n : graph.nodes) {
    if (n.phase == Phase::Optimizer) {
      for (TensorId id : outputs_of(n)) optimizer_outputs.push_back(id);
      continue;
    }
    for (TensorId id : n.tensors) {
      if (id != kNoTensor && std::find(optimizer_outputs.begin(), optimizer_outputs.end(), id) != optimizer_outputs.end()) {
        throw CompileError(fmt::format("tpu-mesh compile: {} ({}) reads a value the optimizer wrote earlier in the "
                                       "step; micro-batches cannot split this step",
                                       n.site, to_string(n.op)));
      }
    }
  }
}

// A gradient contribution that needs a collective before it is added to its gradient.
struct PendingGradient {
  TensorId grad;
  int contribution;
};

class Compiler {
 public:
  Compiler(const Graph& graph, const TensorTable& table, const MeshConfig& config, const std::vector<PartitionSpec>& plan,
           ProgramRole role)
      : graph_(graph), table_(table), config_(config), mesh_(config.mesh), spec_(plan), role_(role),
        micro_batches_(config.grad_accum), buffer_of_(table.size(), -1) {}

  Executable run(const std::string& fingerprint) {
    exe_.format_version = kProgramFormatVersion;
    exe_.fingerprint = fingerprint;
    exe_.mesh_data = mesh_.data;
    exe_.mesh_model = mesh_.model;
    exe_.micro_batches = micro_batches_;
    for (std::size_t i = 0; i < graph_.nodes.size(); ++i) verify(graph_.nodes[i]);
    check_values_are_graph_local();
    propagate();
    for (const TensorDesc& t : table_.all()) {
      if (is_device_data(t.kind)) buffer(static_cast<TensorId>(&t - table_.all().data()));
    }
    if (role_ == ProgramRole::Step && micro_batches_ > 1) {
      lower_unrolled_micro_batches();
    } else {
      micro_ = role_ == ProgramRole::Step ? kWholeBuffer : kRunMicroBatch;
      accumulating_ = role_ == ProgramRole::GradAccumulate;
      lower_nodes([](const Node&) { return true; });
    }
    plan_buffers();
    return std::move(exe_);
  }

 private:
  // ---- pass 1: verification ------------------------------------------------------------
  [[noreturn]] void reject(const Node& n, const std::string& why) const {
    throw CompileError(fmt::format("tpu-mesh compile: {} ({}): {}", n.site, to_string(n.op), why));
  }
  const Shape& shape(TensorId id) const { return table_[id].shape; }
  void expect(const Node& n, bool ok, const char* what) const {
    if (!ok) reject(n, what);
  }

  // The node's layout against its op's description: operand and attribute counts, and a
  // tensor wherever one is not optional; then what each op needs of the shapes.
  void verify_layout(const Node& n) const {
    if (static_cast<std::size_t>(n.op) >= kOpDescriptions.size()) reject(n, "unknown op");
    const OpDescription& d = describe(n.op);
    if (!d.takes(n.tensors.size())) {
      reject(n, fmt::format("{} operands where the op takes {}{}", n.tensors.size(), d.operands.size(),
                            d.variadic() ? " or more" : ""));
    }
    if (n.attrs.size() != d.node_attribute_floats()) {
      reject(n, fmt::format("{} attribute values where the op takes {}", n.attrs.size(), d.node_attribute_floats()));
    }
    for (std::size_t i = 0; i < d.operands.size(); ++i) {
      if (n.tensors[i] == kNoTensor && !d.operands[i].optional) {
        reject(n, fmt::format("operand {} is not optional", d.operands[i].name));
      }
    }
    for (TensorId id : n.tensors) {
      if (id != kNoTensor && (id < 0 || static_cast<std::size_t>(id) >= table_.size())) reject(n, "unknown tensor");
    }
  }

  void verify(const Node& n) const {
    verify_layout(n);
    const auto& t = n.tensors;
    for (TensorId id : t) {
      if (id == kNoTensor) continue;
      const bool tokens = table_[id].kind == TensorKind::Input;
      if (!tokens && table_[id].dtype != DType::F32) reject(n, fmt::format("{} must be f32", table_[id].name));
    }
    switch (n.op) {
      case OpKind::LinearForward: {
        const NodeOperands<OpKind::LinearForward> op{n};
        const Shape &out = shape(op.get<"out">()), &inp = shape(op.get<"inp">()), &w = shape(op.get<"weight">());
        if (inp.back() != w[1] || out.back() != w[0] || rows(out) != rows(inp)) {
          reject(n, fmt::format("shapes {} = {} @ {}^T do not agree", fmt::join(out, "x"), fmt::join(inp, "x"),
                                fmt::join(w, "x")));
        }
        break;
      }
      case OpKind::LinearBackward: {
        const NodeOperands<OpKind::LinearBackward> op{n};
        const Shape &inp = shape(op.get<"inp">()), &w = shape(op.get<"weight">());
        expect(n, inp.back() == w[1] && shape(op.get<"dout">()).back() == w[0] && shape(op.get<"dinp">()) == inp &&
                      shape(op.get<"dweight">()) == w,
               "gradient shapes do not match their forward operands");
        break;
      }
      case OpKind::ResidualForward: {
        const NodeOperands<OpKind::ResidualForward> op{n};
        expect(n, shape(op.get<"out">()) == shape(op.get<"a">()) && shape(op.get<"a">()) == shape(op.get<"b">()),
               "residual operands differ in shape");
        break;
      }
      case OpKind::LayerNormForward: {
        const NodeOperands<OpKind::LayerNormForward> op{n};
        const Shape& inp = shape(op.get<"inp">());
        expect(n, shape(op.get<"out">()) == inp && shape(op.get<"weight">()).back() == inp.back(),
               "layernorm weight does not match the channels");
        break;
      }
      case OpKind::AttentionForward: {
        const NodeOperands<OpKind::AttentionForward> op{n};
        expect(n, shape(op.get<"qkv">()).back() == 3 * shape(op.get<"out">()).back() && shape(op.get<"att">()).size() == 4,
               "attention needs qkv (B,T,3C) and att (B,NH,T,T)");
        break;
      }
      case OpKind::CrossEntropyForward: {
        const NodeOperands<OpKind::CrossEntropyForward> op{n};
        const TensorId targets = op.get<"targets">();
        expect(n, table_[targets].dtype == DType::I32 && rows(shape(op.get<"logits">())) == product(shape(targets)),
               "targets must be int32 with one per logits row");
        break;
      }
      case OpKind::RmsNormForward: {
        const NodeOperands<OpKind::RmsNormForward> op{n};
        const Shape& inp = shape(op.get<"inp">());
        expect(n, shape(op.get<"out">()) == inp && shape(op.get<"weight">()).back() == inp.back(),
               "rmsnorm weight does not match the channels");
        break;
      }
      case OpKind::RmsNormBackward: {
        const NodeOperands<OpKind::RmsNormBackward> op{n};
        const Shape& inp = shape(op.get<"inp">());
        expect(n, shape(op.get<"dinp">()) == inp && shape(op.get<"dout">()) == inp &&
                      shape(op.get<"dweight">()) == shape(op.get<"weight">()),
               "rmsnorm gradients do not match their forward operands");
        break;
      }
      case OpKind::RopeForward:
      case OpKind::RopeBackward: {  // (out, inp) forward, (dinp, dout) backward: written, then read
        const Shape &written = shape(t[0]), &read = shape(t[1]);
        const auto hd = static_cast<std::int64_t>(n.attrs.at(0));
        expect(n, written == read && read.size() == 3 && hd > 0 && hd % 2 == 0 && read.back() % hd == 0,
               "rope needs equal (B,T,heads*hd) operands and an even head size that divides the last dimension");
        break;
      }
      case OpKind::SwigluForward:
      case OpKind::SwigluBackward:
        for (TensorId id : t) expect(n, shape(id) == shape(t[0]), "swiglu operands differ in shape");
        break;
      case OpKind::GqaAttentionBackward: {
        const NodeOperands<OpKind::GqaAttentionBackward> op{n};
        const Shape& q = shape(op.get<"q">());
        expect(n, shape(op.get<"dq">()) == q && shape(op.get<"dk">()) == shape(op.get<"k">()) &&
                      shape(op.get<"dv">()) == shape(op.get<"v">()) && shape(op.get<"dout">()) == q,
               "gqa attention gradients do not match their forward operands");
        break;
      }
      case OpKind::GqaAttentionForward: {
        const NodeOperands<OpKind::GqaAttentionForward> op{n};
        const Shape &att = shape(op.get<"att">()), &q = shape(op.get<"q">());
        expect(n, att.size() == 4 && q.back() % att[1] == 0 && shape(op.get<"k">()) == shape(op.get<"v">()) &&
                      shape(op.get<"out">()) == q,
               "gqa attention needs q and out (B,T,NH*hd), k and v alike (B,T,NKV*hd) and att (B,NH,T,T)");
        break;
      }
      default: break;
    }
  }

  // Activations and their gradients live in the graph's own transient buffers: a graph
  // may read one (or accumulate into one, as backward ops do) only after writing it.
  // A graph break between a producer and its consumer would carry a value across
  // programs, which this compiler does not do: it refuses rather than read stale memory.
  void check_values_are_graph_local() const {
    std::vector<bool> written(table_.size(), false);
    for (const Node& n : graph_.nodes) {
      const std::vector<TensorId> outputs = outputs_of(n), overwritten = overwritten_by(n);
      for (TensorId id : n.tensors) {
        if (id == kNoTensor) continue;
        const TensorKind kind = table_[id].kind;
        if (kind != TensorKind::Activation && kind != TensorKind::ActivationGrad) continue;
        const bool overwrites = n.phase == Phase::Forward &&
                                std::find(overwritten.begin(), overwritten.end(), id) != overwritten.end();
        if (!overwrites && !written[static_cast<std::size_t>(id)]) {
          reject(n, fmt::format("reads {} {} that this graph did not write; a graph break (a host read or upload "
                                "inside the step) separates it from its producer. Move the read out of the step",
                                to_string(kind), table_[id].name));
        }
      }
      for (TensorId id : outputs) {
        if (id != kNoTensor) written[static_cast<std::size_t>(id)] = true;
      }
    }
  }

  // ---- pass 2: sharding propagation ------------------------------------------------------
  PartitionSpec& spec_of(TensorId id) { return spec_[static_cast<std::size_t>(id)]; }
  PartitionSpec eff(TensorId id) const { return effective(spec_[static_cast<std::size_t>(id)], mesh_); }

  void propagate() {
    for (const Node& n : graph_.nodes) {
      const auto& t = n.tensors;
      switch (n.op) {
        case OpKind::EncoderForward: {
          const NodeOperands<OpKind::EncoderForward> op{n};
          PartitionSpec& out = spec_of(op.get<"out">());
          out = PartitionSpec::replicated(3);
          out.dims[0] = spec_of(op.get<"inputs">()).dims[0];  // batch follows the tokens
          break;
        }
        case OpKind::LayerNormForward: {
          const NodeOperands<OpKind::LayerNormForward> op{n};
          const TensorId inp = op.get<"inp">();
          if (eff(inp).dims.back().axis != Axis::None) reject(n, "layernorm over a sharded channel dimension");
          spec_of(op.get<"out">()) = spec_of(inp);
          PartitionSpec stats = spec_of(inp);
          stats.dims.pop_back();
          spec_of(op.get<"mean">()) = stats;
          spec_of(op.get<"rstd">()) = stats;
          break;
        }
        case OpKind::LinearForward: {
          const NodeOperands<OpKind::LinearForward> op{n};
          PartitionSpec out = spec_of(op.get<"inp">());
          out.dims.back() = spec_of(op.get<"weight">()).dims[0];
          if (out.dims.back().axis == Axis::Data) out.dims.back() = DimSharding{};  // zero3: gathered before use
          spec_of(op.get<"out">()) = out;
          break;
        }
        case OpKind::AttentionForward: {
          const NodeOperands<OpKind::AttentionForward> op{n};
          const PartitionSpec& qkv = spec_of(op.get<"qkv">());
          const DimSharding heads{qkv.dims[2].axis, 1};
          spec_of(op.get<"out">()) = PartitionSpec{{qkv.dims[0], qkv.dims[1], heads}};
          spec_of(op.get<"att">()) = PartitionSpec{{qkv.dims[0], heads, DimSharding{}, DimSharding{}}};
          if (effective(qkv, mesh_).dims[2].axis != Axis::None && qkv.dims[2].groups != 3) {
            reject(n, "qkv sharded without its q|k|v grouping");
          }
          break;
        }
        case OpKind::RmsNormForward: {
          const NodeOperands<OpKind::RmsNormForward> op{n};
          const TensorId inp = op.get<"inp">();
          if (eff(inp).dims.back().axis != Axis::None) reject(n, "rmsnorm over a sharded channel dimension");
          spec_of(op.get<"out">()) = spec_of(inp);
          PartitionSpec stats = spec_of(inp);
          stats.dims.pop_back();
          spec_of(op.get<"rstd">()) = stats;
          break;
        }
        case OpKind::SwigluForward: {  // gate and up split alike (both column-parallel)
          const NodeOperands<OpKind::SwigluForward> op{n};
          if (spec_of(op.get<"gate">()) != spec_of(op.get<"up">())) reject(n, "gate and up sharded differently");
          spec_of(op.get<"out">()) = spec_of(op.get<"gate">());
          break;
        }
        case OpKind::GqaAttentionForward: {  // heads follow q's split
          const NodeOperands<OpKind::GqaAttentionForward> op{n};
          const PartitionSpec& q = spec_of(op.get<"q">());
          const DimSharding heads{q.dims[2].axis, 1};
          if (spec_of(op.get<"k">()).dims[2] != heads || spec_of(op.get<"v">()).dims[2] != heads) {
            reject(n, "q, k and v sharded differently");
          }
          spec_of(op.get<"out">()) = PartitionSpec{{q.dims[0], q.dims[1], heads}};
          spec_of(op.get<"att">()) = PartitionSpec{{q.dims[0], heads, DimSharding{}, DimSharding{}}};
          break;
        }
        case OpKind::RopeForward:
        case OpKind::GeluForward:
        case OpKind::ResidualForward:  // out follows the first input
          spec_of(t[0]) = spec_of(t[1]);
          break;
        case OpKind::CrossEntropyForward: {
          const NodeOperands<OpKind::CrossEntropyForward> op{n};
          spec_of(op.get<"probs">()) = spec_of(op.get<"logits">());
          break;
        }
        default: break;
      }
    }
    for (TensorId g : table_.of_kind(TensorKind::ActivationGrad)) {
      if (const TensorId act = table_[g].mirrors; act != kNoTensor) spec_of(g) = spec_of(act);
    }
  }

  // ---- pass 3: lowering ------------------------------------------------------------------
  template <typename Keep>
  void lower_nodes(Keep keep) {
    for (node_ = 0; node_ < static_cast<int>(graph_.nodes.size()); ++node_) {
      const Node& n = graph_.nodes[static_cast<std::size_t>(node_)];
      if (keep(n)) lower(n);
    }
  }
  // One program for a step of K micro-batches: forward and backward once per micro-batch
  // (each reading its fixed slice of the inputs, the later ones adding to the gradients
  // and the loss), then the optimizer once. The same kernels in the same order as the
  // micro-step programs, so both modes give the same bits.
  void lower_unrolled_micro_batches() {
    check_phases_separable(graph_);
    for (int k = 0; k < micro_batches_; ++k) {
      micro_ = k;
      accumulating_ = k > 0;
      lower_nodes([](const Node& n) { return n.phase != Phase::Optimizer; });
    }
    micro_ = kWholeBuffer;
    lower_nodes([](const Node& n) { return n.phase == Phase::Optimizer; });
  }

  bool active(Axis axis) const { return axis_size(mesh_, axis) > 1; }
  // A tensor's block on one device; activations (and their gradients) hold one micro-batch.
  Shape lshape(TensorId id) const {
    Shape s = local_shape(shape(id), spec_[static_cast<std::size_t>(id)], mesh_);
    const TensorKind kind = table_[id].kind;
    if (micro_batches_ > 1 && (kind == TensorKind::Activation || kind == TensorKind::ActivationGrad)) {
      s[0] /= micro_batches_;
    }
    return s;
  }
  std::int64_t lnumel(TensorId id) const { return product(lshape(id)); }
  // The shape a parameter is computed with: its block, gathered over `data` (zero3).
  Shape compute_shape(TensorId id) const {
    PartitionSpec s = spec_[static_cast<std::size_t>(id)];
    for (DimSharding& d : s.dims) {
      if (d.axis == Axis::Data) d = DimSharding{};
    }
    return local_shape(shape(id), s, mesh_);
  }

  int buffer(TensorId id) {
    if (id == kNoTensor) return -1;
    int& b = buffer_of_[static_cast<std::size_t>(id)];
    if (b < 0) {
      const TensorDesc& d = table_[id];
      BufferInfo info;
      info.category = category_of(d.kind);
      info.persistent = is_device_data(d.kind);
      info.tensor = id;
      info.int32 = d.dtype == DType::I32;
      info.numel = lnumel(id);
      b = exe_.add_buffer(info, fmt::format("{}:{}", d.name, to_string(d.kind)));
    }
    return b;
  }
  // Token ids as a kernel operand: the whole block, or the micro-batch's slice of it.
  int tokens(TensorId id) {
    if (micro_batches_ == 1) return buffer(id);
    const auto key = std::make_pair(id, micro_);
    if (auto it = token_views_.find(key); it != token_views_.end()) return it->second;
    BufferInfo info;
    info.category = MemoryCategory::Activations;
    info.persistent = true;
    info.tensor = id;
    info.int32 = true;
    info.micro_slice = micro_;
    info.numel = lnumel(id) / micro_batches_;
    const int b = exe_.add_buffer(info, fmt::format("{}:micro{}", table_[id].name, micro_));
    token_views_[key] = b;
    return b;
  }
  int temp(const std::string& name, std::int64_t numel, MemoryCategory category) {
    BufferInfo info;
    info.category = category;
    info.numel = numel;
    return exe_.add_buffer(info, name);
  }
  void emit(InstrKind kind, const std::vector<std::int32_t>& buffers, const std::vector<std::int64_t>& dims,
            const std::vector<float>& attrs = {}, Axis axis = Axis::None, const std::vector<PartitionSpec>& specs = {}) {
    exe_.append(kind, node_, buffers, dims, attrs, axis, specs);
  }
  int zeroed_temp(const std::string& name, std::int64_t numel, MemoryCategory category) {
    const int b = temp(name, numel, category);
    emit(InstrKind::Fill, {b}, {numel}, {0.0f});
    return b;
  }

  // A parameter as an operand of compute: gathered over `data` under zero3, cast to bf16
  // for matmuls under bf16 precision. Reused within a phase; gathered again in the next
  // (FSDP's memory trade: parameters are not kept whole from forward to backward).
  int weight_operand(TensorId param, bool matmul) {
    if (param == kNoTensor) return -1;
    const bool cast = matmul && config_.precision == Precision::Bf16;
    const auto key = std::make_pair(param, cast);
    if (auto it = operand_cache_.find(key); it != operand_cache_.end()) return it->second;
    int source = buffer(param);
    const PartitionSpec s = eff(param);
    const std::int64_t n = product(compute_shape(param));
    if (s.shards_on(Axis::Data)) {
      if (s.shards_on(Axis::Model)) reject(graph_.nodes[static_cast<std::size_t>(node_)], "a parameter sharded on both axes");
      const int gathered = temp("gathered." + table_[param].name, n, MemoryCategory::Temporaries);
      emit(InstrKind::AllGather, {gathered, source}, shape(param), {}, Axis::Data, {spec_of(param)});
      source = gathered;
    }
    if (cast) {
      const int converted = temp("bf16." + table_[param].name, n, MemoryCategory::Temporaries);
      emit(InstrKind::CastBf16, {converted, source}, {n});
      source = converted;
    }
    operand_cache_[key] = source;
    return source;
  }

  // Where an op writes its contribution to a gradient: straight into the gradient when the
  // contribution is complete on this device; when the batch is split over `data` it is a
  // partial sum, so it goes to a zeroed temporary that finish_gradients() reduces first.
  int gradient_target(TensorId grad, std::vector<PendingGradient>& pending) {
    if (grad == kNoTensor) return -1;
    if (!active(Axis::Data)) return buffer(grad);
    const int contribution =
        zeroed_temp("contribution." + table_[grad].name, product(compute_shape(grad)), MemoryCategory::Gradients);
    pending.push_back({grad, contribution});
    return contribution;
  }
  // All-reduce (gradient replicated over `data`) or reduce-scatter (sharded, zero3), in the
  // fixed device order, then add into the gradient.
  void finish_gradients(const std::vector<PendingGradient>& pending) {
    for (const PendingGradient& p : pending) {
      const std::int64_t n = lnumel(p.grad);
      int reduced = p.contribution;
      if (eff(p.grad).shards_on(Axis::Data)) {
        reduced = temp("shard." + table_[p.grad].name, n, MemoryCategory::Gradients);
        emit(InstrKind::ReduceScatter, {reduced, p.contribution}, shape(p.grad), {}, Axis::Data, {spec_of(p.grad)});
      } else {
        emit(InstrKind::AllReduce, {p.contribution}, {n}, {}, Axis::Data);
      }
      emit(InstrKind::AddInPlace, {buffer(p.grad), reduced}, {n});
    }
  }

  // bf16 precision stores activations and their gradients as bf16 (statistics and the
  // softmax probabilities of the loss stay fp32, as in accel).
  void round_activation(TensorId id) {
    if (config_.precision != Precision::Bf16 || id == kNoTensor) return;
    const TensorDesc& d = table_[id];
    if (d.kind != TensorKind::Activation && d.kind != TensorKind::ActivationGrad) return;
    if (d.role.fp32_statistic) return;
    emit(InstrKind::RoundBf16, {buffer(id)}, {lnumel(id)});
  }

  // The mesh axis a contraction runs over when both operands shard its dimension the same
  // way (the result is then a partial sum); None when the contraction is local.
  Axis contraction_axis(const Node& n, const DimSharding& a, const DimSharding& b) const {
    if (a.axis == b.axis && a.axis != Axis::None && a.groups != b.groups) reject(n, "operands grouped differently");
    if (a.axis != b.axis) {
      if (a.axis != Axis::None && b.axis != Axis::None) reject(n, "operands sharded on different axes");
      if (a.axis == Axis::Data || b.axis == Axis::Data) return Axis::None;  // zero3 parameters: gathered
      reject(n, "a one-sided sharded contraction (plans never produce it)");
    }
    return a.axis;
  }

  void lower_linear_forward(const Node& n) {
    const NodeOperands<OpKind::LinearForward> op{n};
    const TensorId out = op.get<"out">(), inp = op.get<"inp">(), w_id = op.get<"weight">();
    const Shape w = compute_shape(w_id);
    const std::int64_t N = rows(lshape(inp)), C = w[1], OC = w[0];
    const Axis partial = contraction_axis(n, eff(inp).dims.back(), eff(w_id).dims[1]);
    const int weight = weight_operand(w_id, true);
    const int bias = weight_operand(op.get<"bias">(), false);
    if (partial != Axis::None) {  // row-parallel: partial sums, all-reduce, then the bias once
      emit(InstrKind::Linear, {buffer(out), buffer(inp), weight, -1}, {N, C, OC});
      emit(InstrKind::AllReduce, {buffer(out)}, {N * OC}, {}, partial);
      if (bias >= 0) emit(InstrKind::BiasAdd, {buffer(out), bias}, {N, OC});
    } else {
      emit(InstrKind::Linear, {buffer(out), buffer(inp), weight, bias}, {N, C, OC});
    }
    round_activation(out);
  }

  void lower_linear_backward(const Node& n) {
    const NodeOperands<OpKind::LinearBackward> op{n};
    const TensorId dinp_id = op.get<"dinp">(), dout = op.get<"dout">(), w_id = op.get<"weight">();
    const Shape w = compute_shape(w_id);
    const std::int64_t N = rows(lshape(op.get<"inp">())), C = w[1], OC = w[0];
    const Axis partial = contraction_axis(n, eff(dout).dims.back(), eff(w_id).dims[0]);
    const int weight = weight_operand(w_id, true);
    std::vector<PendingGradient> pending;
    const int dinp = partial != Axis::None
                         ? zeroed_temp("partial." + table_[dinp_id].name, lnumel(dinp_id), MemoryCategory::Activations)
                         : buffer(dinp_id);
    const int dweight = gradient_target(op.get<"dweight">(), pending);
    const int dbias = gradient_target(op.get<"dbias">(), pending);
    emit(InstrKind::LinearBackward, {dinp, dweight, dbias, buffer(dout), buffer(op.get<"inp">()), weight}, {N, C, OC});
    if (partial != Axis::None) {  // column-parallel: dinp is a partial sum over the split outputs
      emit(InstrKind::AllReduce, {dinp}, {lnumel(dinp_id)}, {}, partial);
      emit(InstrKind::AddInPlace, {buffer(dinp_id), dinp}, {lnumel(dinp_id)});
    }
    finish_gradients(pending);
    round_activation(dinp_id);
  }

  void lower_layernorm(const Node& n) {
    if (n.op == OpKind::LayerNormForward) {
      const NodeOperands<OpKind::LayerNormForward> op{n};
      const Shape in = lshape(op.get<"inp">());
      emit(InstrKind::LayerNormForward,
           {buffer(op.get<"out">()), buffer(op.get<"mean">()), buffer(op.get<"rstd">()), buffer(op.get<"inp">()),
            weight_operand(op.get<"weight">(), false), weight_operand(op.get<"bias">(), false)},
           {rows(in), in.back()}, {n.attrs.at(0)});
      round_activation(op.get<"out">());
      return;
    }
    const NodeOperands<OpKind::LayerNormBackward> op{n};
    const Shape in = lshape(op.get<"inp">());
    std::vector<PendingGradient> pending;
    const int weight = weight_operand(op.get<"weight">(), false);
    const int dweight = gradient_target(op.get<"dweight">(), pending);
    const int dbias = gradient_target(op.get<"dbias">(), pending);
    emit(InstrKind::LayerNormBackward,
         {buffer(op.get<"dinp">()), dweight, dbias, buffer(op.get<"dout">()), buffer(op.get<"inp">()), weight,
          buffer(op.get<"mean">()), buffer(op.get<"rstd">())},
         {rows(in), in.back()});
    finish_gradients(pending);
    round_activation(op.get<"dinp">());
  }

  void lower_encoder(const Node& n) {
    if (n.op == OpKind::EncoderForward) {
      const NodeOperands<OpKind::EncoderForward> op{n};
      const Shape out = lshape(op.get<"out">());
      emit(InstrKind::EncoderForward,
           {buffer(op.get<"out">()), tokens(op.get<"inputs">()), weight_operand(op.get<"wte">(), false),
            weight_operand(op.get<"wpe">(), false)},
           {out[0], out[1], out[2]});
      round_activation(op.get<"out">());
      return;
    }
    const NodeOperands<OpKind::EncoderBackward> op{n};
    const Shape dout = lshape(op.get<"dout">());
    std::vector<PendingGradient> pending;
    const int dwte = gradient_target(op.get<"dwte">(), pending);
    const int dwpe = gradient_target(op.get<"dwpe">(), pending);
    emit(InstrKind::EncoderBackward, {dwte, dwpe, buffer(op.get<"dout">()), tokens(op.get<"inputs">())},
         {dout[0], dout[1], dout[2]});
    finish_gradients(pending);
  }

  void lower_attention(const Node& n) {
    if (n.op == OpKind::AttentionForward) {
      const NodeOperands<OpKind::AttentionForward> op{n};
      const TensorId out = op.get<"out">(), att = op.get<"att">();
      const Shape out_shape = lshape(out);
      emit(InstrKind::AttentionForward, {buffer(out), buffer(att), buffer(op.get<"qkv">())},
           {out_shape[0], out_shape[1], out_shape[2], lshape(att)[1]});
      round_activation(out);
      round_activation(att);
      return;
    }
    const NodeOperands<OpKind::AttentionBackward> op{n};
    const Shape dout = lshape(op.get<"dout">());
    emit(InstrKind::AttentionBackward,
         {buffer(op.get<"dqkv">()), buffer(op.get<"dout">()), buffer(op.get<"qkv">()), buffer(op.get<"att">())},
         {dout[0], dout[1], dout[2], lshape(op.get<"att">())[1]});
    round_activation(op.get<"dqkv">());
  }

  void lower_rmsnorm(const Node& n) {
    if (n.op == OpKind::RmsNormForward) {
      const NodeOperands<OpKind::RmsNormForward> op{n};
      const Shape in = lshape(op.get<"inp">());
      emit(InstrKind::RmsNormForward,
           {buffer(op.get<"out">()), buffer(op.get<"rstd">()), buffer(op.get<"inp">()),
            weight_operand(op.get<"weight">(), false)},
           {rows(in), in.back()}, {n.attrs.at(0)});
      round_activation(op.get<"out">());
      return;
    }
    const NodeOperands<OpKind::RmsNormBackward> op{n};
    const Shape in = lshape(op.get<"inp">());
    std::vector<PendingGradient> pending;
    const int weight = weight_operand(op.get<"weight">(), false);
    const int dweight = gradient_target(op.get<"dweight">(), pending);
    emit(InstrKind::RmsNormBackward,
         {buffer(op.get<"dinp">()), dweight, buffer(op.get<"dout">()), buffer(op.get<"inp">()), weight,
          buffer(op.get<"rstd">())},
         {rows(in), in.back()});
    finish_gradients(pending);
    round_activation(op.get<"dinp">());
  }

  // out from inp (forward), dinp from dout (backward), (B,T,heads*hd): each device turns the
  // heads of its block.
  void lower_rope(const Node& n) {
    const bool forward = n.op == OpKind::RopeForward;
    const NodeOperands<OpKind::RopeForward> fwd{n};
    const NodeOperands<OpKind::RopeBackward> bwd{n};
    const TensorId written = forward ? fwd.get<"out">() : bwd.get<"dinp">();
    const TensorId read = forward ? fwd.get<"inp">() : bwd.get<"dout">();
    const Shape x = lshape(read);
    const auto hd = static_cast<std::int64_t>(n.attrs.at(0));
    if (x[2] % hd != 0) reject(n, "a block that splits a head");
    emit(forward ? InstrKind::RopeForward : InstrKind::RopeBackward, {buffer(written), buffer(read)},
         {x[0], x[1], x[2] / hd, hd}, {n.attrs.at(1), n.attrs.at(2)});
    round_activation(written);
  }

  void lower_swiglu(const Node& n) {
    if (n.op == OpKind::SwigluForward) {
      const NodeOperands<OpKind::SwigluForward> op{n};
      emit(InstrKind::SwigluForward, {buffer(op.get<"out">()), buffer(op.get<"gate">()), buffer(op.get<"up">())},
           {lnumel(op.get<"out">())});
      round_activation(op.get<"out">());
      return;
    }
    const NodeOperands<OpKind::SwigluBackward> op{n};
    emit(InstrKind::SwigluBackward,
         {buffer(op.get<"dgate">()), buffer(op.get<"dup">()), buffer(op.get<"dout">()), buffer(op.get<"gate">()),
          buffer(op.get<"up">())},
         {lnumel(op.get<"dout">())});
    round_activation(op.get<"dgate">());
    round_activation(op.get<"dup">());
  }

  // Each device runs its heads: NH/model query heads over NKV/model kv heads, so the
  // grouping of query heads over kv heads is the same on every device.
  void lower_gqa_attention(const Node& n) {
    const bool forward = n.op == OpKind::GqaAttentionForward;
    const NodeOperands<OpKind::GqaAttentionForward> fwd{n};
    const NodeOperands<OpKind::GqaAttentionBackward> bwd{n};
    const TensorId att = forward ? fwd.get<"att">() : bwd.get<"att">();
    const TensorId q = forward ? fwd.get<"q">() : bwd.get<"q">(), k = forward ? fwd.get<"k">() : bwd.get<"k">();
    const Shape qs = lshape(q);
    const std::int64_t heads = lshape(att)[1], hd = qs[2] / heads, kv_width = lshape(k)[2];
    if (kv_width % hd != 0 || kv_width == 0 || heads % (kv_width / hd) != 0) {
      reject(n, "a block whose query heads do not group over whole kv heads");
    }
    const std::int64_t kv_heads = kv_width / hd;
    std::vector<std::int32_t> buffers;  // the instruction takes the op's operands in their order
    for (TensorId id : n.tensors) buffers.push_back(buffer(id));
    emit(forward ? InstrKind::GqaAttentionForward : InstrKind::GqaAttentionBackward, buffers,
         {qs[0], qs[1], heads, kv_heads, hd});
    for (TensorId id : outputs_of(n)) round_activation(id);
  }

  void lower_loss(const Node& n) {
    if (n.op == OpKind::CrossEntropyForward) {
      const NodeOperands<OpKind::CrossEntropyForward> op{n};
      const TensorId logits_id = op.get<"logits">();
      const Shape logits = lshape(logits_id);
      const std::int64_t N = rows(logits), V = logits.back(), global_rows = rows(shape(logits_id));
      const Axis batch_axis = eff(logits_id).dims[0].axis;
      const int losses = temp("loss.rows", N, MemoryCategory::Activations);
      emit(InstrKind::CrossEntropyRows, {buffer(op.get<"probs">()), losses, buffer(logits_id), tokens(op.get<"targets">())},
           {N, V});
      // Every micro-batch divides by the whole batch's rows, so the K partial means add up
      // to the step's mean loss.
      emit(InstrKind::LossMean, {buffer(op.get<"loss">()), losses}, {N, N * axis_size(mesh_, batch_axis), global_rows},
           {accumulating_ ? 1.0f : 0.0f}, batch_axis);
      return;
    }
    const NodeOperands<OpKind::CrossEntropyBackward> op{n};
    const TensorId probs_id = op.get<"probs">();
    const Shape probs = lshape(probs_id);
    emit(InstrKind::CrossEntropyBackward, {buffer(op.get<"dlogits">()), buffer(probs_id), tokens(op.get<"targets">())},
         {rows(probs), probs.back(), rows(shape(probs_id))});
    round_activation(op.get<"dlogits">());
  }

  void lower_optimizer(const Node& n) {
    const auto& t = n.tensors;
    if (n.op == OpKind::AdamW) {
      const TensorId param = NodeOperands<OpKind::AdamW>{n}.get<"param">();
      std::vector<std::int32_t> buffers;  // the instruction takes the op's operands in their order
      for (TensorId id : t) buffers.push_back(buffer(id));
      emit(InstrKind::AdamW, buffers, {lnumel(param)}, n.attrs);
      operand_cache_.erase({param, false});
      operand_cache_.erase({param, true});
      return;
    }
    // global_norm and clip_by_norm: the norm, then the tensors (the description's variadic tail)
    const std::size_t fixed = describe(n.op).operands.size();
    std::vector<std::int32_t> buffers;
    for (std::size_t i = 0; i < fixed; ++i) buffers.push_back(buffer(t[i]));
    std::vector<std::int64_t> sizes;
    std::vector<PartitionSpec> specs;
    for (std::size_t i = fixed; i < t.size(); ++i) {
      buffers.push_back(buffer(t[i]));
      sizes.push_back(lnumel(t[i]));
      specs.push_back(eff(t[i]));
    }
    if (n.op == OpKind::GlobalNorm) {
      emit(InstrKind::GlobalNorm, buffers, sizes, {}, Axis::None, specs);
    } else {
      emit(InstrKind::Clip, buffers, sizes, n.attrs);
    }
  }

  // The traced tensor's blocks go to the host as they are after the op: one micro-batch's
  // rows of an activation, the whole of anything else (the engine assembles the step).
  void lower_trace(const Node& n) {
    const TensorId id = n.tensors.at(0);
    Shape global = shape(id);
    const TensorKind kind = table_[id].kind;
    if (micro_batches_ > 1 && (kind == TensorKind::Activation || kind == TensorKind::ActivationGrad)) {
      global[0] /= micro_batches_;
    }
    const float micro = kind == TensorKind::Activation || kind == TensorKind::ActivationGrad ? static_cast<float>(micro_) : 0.0f;
    emit(InstrKind::Trace, {buffer(id)}, global, {n.attrs.at(0), micro}, Axis::None, {eff(id)});
  }

  void lower(const Node& n) {
    if (n.phase != cache_phase_) {
      operand_cache_.clear();
      cache_phase_ = n.phase;
    }
    switch (n.op) {
      case OpKind::Zero: {
        const TensorId id = NodeOperands<OpKind::Zero>{n}.get<"tensor">();
        // A later micro-batch adds to the gradients the first one wrote.
        if (accumulating_ && table_[id].kind == TensorKind::Gradient) break;
        emit(InstrKind::Fill, {buffer(id)}, {lnumel(id)}, {0.0f});
        break;
      }
      case OpKind::Constant: {
        const TensorId id = NodeOperands<OpKind::Constant>{n}.get<"tensor">();
        emit(InstrKind::Fill, {buffer(id)}, {lnumel(id)}, {n.attrs.at(0)});
        break;
      }
      case OpKind::EncoderForward:
      case OpKind::EncoderBackward: lower_encoder(n); break;
      case OpKind::LayerNormForward:
      case OpKind::LayerNormBackward: lower_layernorm(n); break;
      case OpKind::LinearForward: lower_linear_forward(n); break;
      case OpKind::LinearBackward: lower_linear_backward(n); break;
      case OpKind::AttentionForward:
      case OpKind::AttentionBackward: lower_attention(n); break;
      case OpKind::GeluForward: {
        const NodeOperands<OpKind::GeluForward> op{n};
        const TensorId out = op.get<"out">();
        emit(InstrKind::GeluForward, {buffer(out), buffer(op.get<"inp">())}, {lnumel(out)});
        round_activation(out);
        break;
      }
      case OpKind::GeluBackward: {
        const NodeOperands<OpKind::GeluBackward> op{n};
        const TensorId dinp = op.get<"dinp">();
        emit(InstrKind::GeluBackward, {buffer(dinp), buffer(op.get<"inp">()), buffer(op.get<"dout">())}, {lnumel(dinp)});
        round_activation(dinp);
        break;
      }
      case OpKind::ResidualForward: {
        const NodeOperands<OpKind::ResidualForward> op{n};
        const TensorId out = op.get<"out">();
        emit(InstrKind::Add, {buffer(out), buffer(op.get<"a">()), buffer(op.get<"b">())}, {lnumel(out)});
        round_activation(out);
        break;
      }
      case OpKind::ResidualBackward: {
        const NodeOperands<OpKind::ResidualBackward> op{n};
        const TensorId da = op.get<"da">(), db = op.get<"db">(), dout = op.get<"dout">();
        emit(InstrKind::AddInPlace, {buffer(da), buffer(dout)}, {lnumel(dout)});
        emit(InstrKind::AddInPlace, {buffer(db), buffer(dout)}, {lnumel(dout)});
        round_activation(da);
        round_activation(db);
        break;
      }
      case OpKind::CrossEntropyForward:
      case OpKind::CrossEntropyBackward: lower_loss(n); break;
      case OpKind::GlobalNorm:
      case OpKind::ClipByNorm:
      case OpKind::AdamW: lower_optimizer(n); break;
      case OpKind::NudgeUlps: {
        // The fault perturbs the batch's first element: micro-batch 0 holds it.
        if (accumulating_) break;
        const NodeOperands<OpKind::NudgeUlps> op{n};
        const TensorId tensor = op.get<"tensor">();
        emit(InstrKind::Nudge, {buffer(tensor), buffer(op.get<"ulps">())}, {}, {}, Axis::None, {eff(tensor)});
        break;
      }
      case OpKind::Trace: lower_trace(n); break;
      case OpKind::RmsNormForward:
      case OpKind::RmsNormBackward: lower_rmsnorm(n); break;
      case OpKind::RopeForward:
      case OpKind::RopeBackward: lower_rope(n); break;
      case OpKind::SwigluForward:
      case OpKind::SwigluBackward: lower_swiglu(n); break;
      case OpKind::GqaAttentionForward:
      case OpKind::GqaAttentionBackward: lower_gqa_attention(n); break;
    }
    if (n.op == OpKind::LinearForward || n.op == OpKind::LinearBackward) {  // the GEMM's packed operands
      const bool forward = n.op == OpKind::LinearForward;
      const NodeOperands<OpKind::LinearForward> fwd{n};
      const NodeOperands<OpKind::LinearBackward> bwd{n};
      const Shape w = compute_shape(forward ? fwd.get<"weight">() : bwd.get<"weight">());
      const std::int64_t N = rows(lshape(forward ? fwd.get<"inp">() : bwd.get<"inp">()));
      exe_.scratch_numel = std::max({exe_.scratch_numel, w[0] * w[1], N * w[0]});
    }
  }

  // ---- pass 4: buffer planning -----------------------------------------------------------
  void plan_buffers() {
    for (std::size_t i = 0; i < exe_.instrs.size(); ++i) {
      for (std::int32_t b : exe_.buffers_of(exe_.instrs[i])) {
        if (b < 0) continue;
        BufferInfo& info = exe_.buffers[static_cast<std::size_t>(b)];
        if (info.first_use < 0) info.first_use = static_cast<std::int32_t>(i);
        info.last_use = static_cast<std::int32_t>(i);
      }
    }
    assign_offsets();
    measure_peaks();
  }

  static std::int64_t aligned(std::int64_t n) { return (n + kSlabAlignment - 1) / kSlabAlignment * kSlabAlignment; }
  static bool lives_overlap(const BufferInfo& a, const BufferInfo& b) {
    return a.first_use <= b.last_use && b.first_use <= a.last_use;
  }

  // Greedy first fit, largest buffers first: each goes to the lowest offset that no
  // buffer alive at the same time occupies.
  void assign_offsets() {
    std::vector<int> order;
    for (std::size_t b = 0; b < exe_.buffers.size(); ++b) {
      if (!exe_.buffers[b].persistent && exe_.buffers[b].first_use >= 0) order.push_back(static_cast<int>(b));
    }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return exe_.buffers[a].numel > exe_.buffers[b].numel; });
    std::vector<int> placed;
    for (int b : order) {
      BufferInfo& info = exe_.buffers[static_cast<std::size_t>(b)];
      std::vector<std::pair<std::int64_t, std::int64_t>> taken;
      for (int p : placed) {
        const BufferInfo& other = exe_.buffers[static_cast<std::size_t>(p)];
        if (lives_overlap(info, other)) taken.emplace_back(other.offset, other.offset + aligned(other.numel));
      }
      std::sort(taken.begin(), taken.end());
      std::int64_t offset = 0;
      for (const auto& [begin, end] : taken) {
        if (offset + aligned(info.numel) <= begin) break;
        offset = std::max(offset, end);
      }
      info.offset = offset;
      exe_.slab_numel = std::max(exe_.slab_numel, offset + aligned(info.numel));
      placed.push_back(b);
    }
  }

  void measure_peaks() {
    std::vector<std::int64_t> persistent(kMemoryCategories, 0);
    for (const BufferInfo& b : exe_.buffers) {
      if (b.persistent && b.micro_slice == kWholeBuffer) persistent[static_cast<std::size_t>(b.category)] += b.numel * 4;
    }
    exe_.peak_bytes = persistent;
    std::int64_t persistent_total = 0;
    for (std::int64_t bytes : persistent) persistent_total += bytes;
    exe_.peak_total_bytes = persistent_total;
    for (std::size_t i = 0; i < exe_.instrs.size(); ++i) {
      std::vector<std::int64_t> live = persistent;
      for (const BufferInfo& b : exe_.buffers) {
        if (!b.persistent && b.first_use >= 0 && b.first_use <= static_cast<int>(i) && static_cast<int>(i) <= b.last_use) {
          live[static_cast<std::size_t>(b.category)] += b.numel * 4;
        }
      }
      std::int64_t total = 0;
      for (int c = 0; c < kMemoryCategories; ++c) {
        exe_.peak_bytes[static_cast<std::size_t>(c)] = std::max(exe_.peak_bytes[static_cast<std::size_t>(c)], live[static_cast<std::size_t>(c)]);
        total += live[static_cast<std::size_t>(c)];
      }
      exe_.peak_total_bytes = std::max(exe_.peak_total_bytes, total);
    }
  }

  const Graph& graph_;
  const TensorTable& table_;
  const MeshConfig& config_;
  const Mesh mesh_;
  std::vector<PartitionSpec> spec_;
  const ProgramRole role_;
  const int micro_batches_;
  std::int32_t micro_ = kWholeBuffer;  // the input slice the nodes being lowered read
  bool accumulating_ = false;          // adding to gradients and loss (a later micro-batch)
  std::vector<int> buffer_of_;
  std::map<std::pair<TensorId, std::int32_t>, int> token_views_;
  std::map<std::pair<TensorId, bool>, int> operand_cache_;
  Phase cache_phase_ = Phase::Forward;
  Executable exe_;
  int node_ = -1;
};

}  // namespace

const char* to_string(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::Parameters: return "parameters";
    case MemoryCategory::Gradients: return "gradients";
    case MemoryCategory::OptimizerState: return "optimizer_state";
    case MemoryCategory::Activations: return "activations";
    case MemoryCategory::Temporaries: return "temporaries";
  }
  return "?";
}

std::string_view to_string(ProgramRole role) {
  switch (role) {
    case ProgramRole::Step: return "step";
    case ProgramRole::GradCreate: return "grad-create";
    case ProgramRole::GradAccumulate: return "grad-accumulate";
    case ProgramRole::Optimizer: return "optimizer";
  }
  return "?";
}

Executable compile(const Graph& graph, const TensorTable& table, const MeshConfig& config,
                   const std::vector<PartitionSpec>& plan, const std::string& fingerprint, ProgramRole role) {
  return Compiler(graph, table, config, plan, role).run(fingerprint);
}

PhaseSplit split_phases(const Graph& graph) {
  check_phases_separable(graph);
  PhaseSplit split;
  for (const Node& n : graph.nodes) (n.phase == Phase::Optimizer ? split.optimizer : split.gradients).nodes.push_back(n);
  return split;
}

}  // namespace harness::tpu
