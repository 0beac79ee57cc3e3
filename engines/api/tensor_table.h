// The tensor table: every tensor of a model described exactly once.
//
// Name, shape, dtype and kind live here and nowhere else. Engines derive their memory
// layout from it (all tensors of one kind form one flat arena, in table order, so
// parameters, gradients and both Adam moments share one layout, as in llm.c); the
// recorder derives hashing order, receipt names and dump names from it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace harness {

using TensorId = std::int32_t;
inline constexpr TensorId kNoTensor = -1;

enum class DType : std::uint8_t { F32, I32 };

enum class TensorKind : std::uint8_t {
  Parameter,       // fp32 master weights
  Gradient,        // d loss / d parameter, same layout as Parameter
  AdamM,           // first moment, same layout as Parameter
  AdamV,           // second moment, same layout as Parameter
  Activation,      // forward intermediate
  ActivationGrad,  // d loss / d activation
  Scalar,          // 0-D fp32 value (learning rate, loss, ...): a device tensor, not a constant
  Input,           // int32 token ids uploaded every step
};

std::string_view to_string(TensorKind kind);

// How a weight takes part in tensor parallelism (Megatron-style): a column-parallel linear
// splits its output dimension (dim 0 of the weight and of its bias), a row-parallel one its
// input dimension (dim 1 of the weight; its bias is added after the all-reduce, whole).
enum class LinearRole : std::uint8_t { None, ColumnParallel, RowParallel };

// The FP8 zone of a linear layer's weight (Transformer Engine's recipe, per layer kind):
// accel's `fp8=qkv+mlp_fc` selects the layers by these, whatever the canary calls them.
enum class Fp8Zone : std::uint8_t { None, Qkv, AttnProj, MlpFc, MlpProj };

// What a tensor is for, set once by the canary where it describes the tensor. Engines take
// every numerics and sharding decision from the role (and the kind), never from the name.
struct TensorRole {
  // Activations: a statistic (a norm's mean or reciprocal std, the loss's softmax
  // probabilities) stays fp32 where bf16 autocast stores the other activations in bf16.
  bool fp32_statistic = false;
  // Parameters: the linear layer's parallel role and FP8 zone.
  LinearRole linear = LinearRole::None;
  Fp8Zone fp8_zone = Fp8Zone::None;
  // A column-parallel output made of equal parts ([q | k | v] of a fused qkv): tensor
  // parallelism gives each device its slice of every part.
  int parallel_groups = 1;
  // A linear's split dimension made of whole units (attention heads of this many rows or
  // columns): tensor parallelism splits it only between units.
  int parallel_unit = 1;
  // Activations: the dimension that indexes attention heads (-1: none); tensor parallelism
  // splits attention by heads, so the heads must divide over the model axis.
  int heads_dim = -1;
  // Scalars: the learning rate, a per-step host value (tpu-mesh's --leak-scalars bakes it
  // into the program on purpose).
  bool learning_rate = false;
  // Parameters: every GEMM reads it in fp32, even under bf16 autocast (a MoE router, whose
  // rounded weights would move its decisions; Megatron's moe_router_dtype = fp32).
  bool fp32_weight = false;
  // Leading dimensions that stack independent layers of one shape (a MoE's experts, E of
  // them). Parameters: the linear role splits the dimensions after them, and expert
  // parallelism splits the first of them. Activations: rows gathered from the whole batch
  // by expert, so their first dimension is no batch a micro-batch could split.
  int stacked_dims = 0;
};

struct TensorDesc {
  std::string name;
  std::vector<std::int64_t> shape;  // empty for a 0-D scalar
  DType dtype = DType::F32;
  TensorKind kind = TensorKind::Activation;
  TensorId mirrors = kNoTensor;  // Gradient/AdamM/AdamV: the Parameter it shadows; ActivationGrad: its Activation
  TensorRole role = {};          // shadows and activation gradients share their tensor's role

  std::int64_t numel() const;
  std::int64_t dim(std::size_t axis) const { return shape.at(axis); }
  std::size_t rank() const { return shape.size(); }
};

class TensorTable {
 public:
  TensorId add(TensorDesc desc);
  // Adds a Parameter together with its Gradient, AdamM and AdamV shadows.
  TensorId add_parameter(std::string name, std::vector<std::int64_t> shape, TensorRole role = {});

  const TensorDesc& operator[](TensorId id) const { return tensors_.at(static_cast<std::size_t>(id)); }
  std::size_t size() const { return tensors_.size(); }
  std::span<const TensorDesc> all() const { return tensors_; }

  // Tensors of one kind in table order: the canonical order for arenas and hashes.
  const std::vector<TensorId>& of_kind(TensorKind kind) const;
  // The shadow of `parameter` of the given kind (Gradient, AdamM or AdamV).
  TensorId shadow(TensorId parameter, TensorKind kind) const;
  // Offset (in elements) of `id` inside the arena of its kind.
  std::int64_t arena_offset(TensorId id) const { return offsets_.at(static_cast<std::size_t>(id)); }
  std::int64_t arena_numel(TensorKind kind) const;
  TensorId find(std::string_view name, TensorKind kind) const;  // kNoTensor when absent

 private:
  std::vector<TensorDesc> tensors_;
  std::vector<std::int64_t> offsets_;
  std::vector<std::vector<TensorId>> by_kind_ = std::vector<std::vector<TensorId>>(8);
  std::vector<std::int64_t> arena_sizes_ = std::vector<std::int64_t>(8, 0);
  std::vector<std::vector<TensorId>> shadows_;  // per parameter: grad, m, v
};

}  // namespace harness
