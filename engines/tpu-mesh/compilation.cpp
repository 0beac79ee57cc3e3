#include "compilation.h"

#include <algorithm>

#include <fmt/format.h>

#include "compiler.h"

namespace harness::tpu {
namespace {

MemoryCategory category_of(TensorKind kind) {
  switch (kind) {
    case TensorKind::Parameter: return MemoryCategory::Parameters;
    case TensorKind::Gradient: return MemoryCategory::Gradients;
    case TensorKind::AdamM:
    case TensorKind::AdamV: return MemoryCategory::OptimizerState;
    default: return MemoryCategory::Activations;
  }
}

}  // namespace

bool holds_micro_batch(TensorKind kind) { return kind == TensorKind::Activation || kind == TensorKind::ActivationGrad; }

std::int64_t product(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t extent : shape) n *= extent;
  return n;
}

std::int64_t rows(const Shape& shape) {
  std::int64_t n = 1;
  for (std::size_t i = 0; i + 1 < shape.size(); ++i) n *= shape[i];
  return n;
}

Compilation::Compilation(const TensorTable& table, const MeshConfig& config, const std::vector<PartitionSpec>& plan)
    : table_(table), config_(config), mesh_(config.mesh), spec_(plan), micro_batches_(config.grad_accum),
      buffer_of_(table.size(), -1) {}

void Compilation::reject(const Node& n, const std::string& why) const {
  throw CompileError(fmt::format("tpu-mesh compile: {} ({}): {}", n.site, to_string(n.op), why));
}

void Compilation::begin_node(int node, const Node& n) {
  node_ = node;
  current_ = &n;
  if (n.phase != cache_phase_) {
    operand_cache_.clear();
    cache_phase_ = n.phase;
  }
}

Shape Compilation::lshape(TensorId id) const {
  Shape s = local_shape(shape(id), spec_[static_cast<std::size_t>(id)], mesh_);
  if (micro_batches_ > 1 && holds_micro_batch(table_[id].kind)) s[0] /= micro_batches_;
  return s;
}

Shape Compilation::compute_shape(TensorId id) const {
  PartitionSpec s = spec_[static_cast<std::size_t>(id)];
  for (DimSharding& d : s.dims) {
    if (d.axis == Axis::Data) d = DimSharding{};
  }
  return local_shape(shape(id), s, mesh_);
}

int Compilation::buffer(TensorId id) {
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

int Compilation::tokens(TensorId id) {
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

int Compilation::temp(const std::string& name, std::int64_t numel, MemoryCategory category) {
  BufferInfo info;
  info.category = category;
  info.numel = numel;
  return exe_.add_buffer(info, name);
}

int Compilation::zeroed_temp(const std::string& name, std::int64_t numel, MemoryCategory category) {
  const int b = temp(name, numel, category);
  emit(InstrKind::Fill, {b}, {numel}, {0.0f});
  return b;
}

std::vector<std::int32_t> Compilation::operand_buffers(const Node& n) {
  std::vector<std::int32_t> buffers;
  for (TensorId id : n.tensors) buffers.push_back(buffer(id));
  return buffers;
}

void Compilation::emit(InstrKind kind, const std::vector<std::int32_t>& buffers, const std::vector<std::int64_t>& dims,
                       const std::vector<float>& attrs, Axis axis, const std::vector<PartitionSpec>& specs) {
  exe_.append(kind, node_, buffers, dims, attrs, axis, specs);
}

int Compilation::weight_operand(TensorId param, bool matmul, bool gather) {
  if (param == kNoTensor) return -1;
  const bool cast = matmul && config_.precision == Precision::Bf16 && !table_[param].role.fp32_weight;
  const auto key = std::make_tuple(param, cast, gather);
  if (auto it = operand_cache_.find(key); it != operand_cache_.end()) return it->second;
  int source = buffer(param);
  const PartitionSpec s = eff(param);
  const std::int64_t n = gather ? product(compute_shape(param)) : lnumel(param);
  if (gather && s.shards_on(Axis::Data)) {
    if (s.shards_on(Axis::Model)) reject(*current_, "a parameter sharded on both axes");
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

void Compilation::forget_operands_of(TensorId param) {
  for (bool cast : {false, true}) {
    for (bool gathered : {false, true}) operand_cache_.erase({param, cast, gathered});
  }
}

int Compilation::gradient_target(TensorId grad, std::vector<PendingGradient>& pending) {
  if (grad == kNoTensor) return -1;
  if (!active(Axis::Data)) return buffer(grad);
  const int contribution =
      zeroed_temp("contribution." + table_[grad].name, product(compute_shape(grad)), MemoryCategory::Gradients);
  pending.push_back({grad, contribution});
  return contribution;
}

void Compilation::finish_gradients(const std::vector<PendingGradient>& pending) {
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

void Compilation::round_activation(TensorId id) {
  if (config_.precision != Precision::Bf16 || id == kNoTensor) return;
  const TensorDesc& d = table_[id];
  if (!holds_micro_batch(d.kind)) return;
  if (d.role.fp32_statistic) return;
  emit(InstrKind::RoundBf16, {buffer(id)}, {lnumel(id)});
}

Axis Compilation::contraction_axis(const Node& n, const DimSharding& a, const DimSharding& b) const {
  if (a.axis == b.axis && a.axis != Axis::None && a.groups != b.groups) reject(n, "operands grouped differently");
  if (a.axis != b.axis) {
    if (a.axis != Axis::None && b.axis != Axis::None) reject(n, "operands sharded on different axes");
    if (a.axis == Axis::Data || b.axis == Axis::Data) return Axis::None;  // zero3 parameters: gathered
    reject(n, "a one-sided sharded contraction (plans never produce it)");
  }
  return a.axis;
}

void Compilation::need_scratch(std::int64_t numel) { exe_.scratch_numel = std::max(exe_.scratch_numel, numel); }

}  // namespace harness::tpu
