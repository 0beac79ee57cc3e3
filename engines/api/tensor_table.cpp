#include "tensor_table.h"

#include <stdexcept>

namespace harness {

std::string_view to_string(TensorKind kind) {
  switch (kind) {
    case TensorKind::Parameter: return "parameter";
    case TensorKind::Gradient: return "gradient";
    case TensorKind::AdamM: return "adam_m";
    case TensorKind::AdamV: return "adam_v";
    case TensorKind::Activation: return "activation";
    case TensorKind::ActivationGrad: return "activation_grad";
    case TensorKind::Scalar: return "scalar";
    case TensorKind::Input: return "input";
  }
  return "unknown";
}

std::int64_t TensorDesc::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

TensorId TensorTable::add(TensorDesc desc) {
  for (std::int64_t d : desc.shape) {
    if (d <= 0) throw std::invalid_argument("tensor '" + desc.name + "' has a non-positive dimension");
  }
  const auto kind = static_cast<std::size_t>(desc.kind);
  const auto id = static_cast<TensorId>(tensors_.size());
  offsets_.push_back(arena_sizes_[kind]);
  arena_sizes_[kind] += desc.numel();
  by_kind_[kind].push_back(id);
  tensors_.push_back(std::move(desc));
  return id;
}

TensorId TensorTable::add_parameter(std::string name, std::vector<std::int64_t> shape, TensorRole role) {
  const TensorId param = add({name, shape, DType::F32, TensorKind::Parameter, kNoTensor, role});
  std::vector<TensorId> shadows;
  for (TensorKind kind : {TensorKind::Gradient, TensorKind::AdamM, TensorKind::AdamV}) {
    shadows.push_back(add({name, shape, DType::F32, kind, param, role}));
  }
  if (shadows_.size() <= static_cast<std::size_t>(param)) shadows_.resize(static_cast<std::size_t>(param) + 1);
  shadows_[static_cast<std::size_t>(param)] = std::move(shadows);
  return param;
}

const std::vector<TensorId>& TensorTable::of_kind(TensorKind kind) const {
  return by_kind_[static_cast<std::size_t>(kind)];
}

TensorId TensorTable::shadow(TensorId parameter, TensorKind kind) const {
  const auto& shadows = shadows_.at(static_cast<std::size_t>(parameter));
  switch (kind) {
    case TensorKind::Gradient: return shadows.at(0);
    case TensorKind::AdamM: return shadows.at(1);
    case TensorKind::AdamV: return shadows.at(2);
    default: throw std::invalid_argument("shadow(): kind must be Gradient, AdamM or AdamV");
  }
}

std::int64_t TensorTable::arena_numel(TensorKind kind) const {
  return arena_sizes_[static_cast<std::size_t>(kind)];
}

TensorId TensorTable::find(std::string_view name, TensorKind kind) const {
  for (TensorId id : of_kind(kind)) {
    if (tensors_[static_cast<std::size_t>(id)].name == name) return id;
  }
  return kNoTensor;
}

}  // namespace harness
