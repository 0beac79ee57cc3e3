// Every op of the call boundary, described once: its name, its tensor operands in order
// (what each is called, whether the op reads it, writes it or reads and adds into it, and
// whether it may be kNoTensor), a variadic tail for the ops over a list of tensors, and
// its attributes. The Engine interface is checked against this table at compile time
// (engine.cpp), a lazy engine records its nodes from it (tpu-mesh's record<Op>()), and the
// graph's op names, written operands and operand checks are read from it (tpu-mesh's
// graph.cpp and compiler.cpp; its own rules in ops/). A new op is one entry here, one virtual in engine.h and one
// kernel per engine (docs/engine-boundary.md, "Adding an op").
//
// OpKind values are part of every compiled program's fingerprint and of the programs in a
// persistent compile cache: new ops are appended, never inserted.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace harness {

enum class OpKind : std::uint8_t {
  Zero,
  Constant,  // not an Engine call: a host value baked into a traced program (tpu-mesh --leak-scalars)
  EncoderForward,
  EncoderBackward,
  LayerNormForward,
  LayerNormBackward,
  LinearForward,
  LinearBackward,
  AttentionForward,
  AttentionBackward,
  GeluForward,
  GeluBackward,
  ResidualForward,
  ResidualBackward,
  CrossEntropyForward,
  CrossEntropyBackward,
  GlobalNorm,
  ClipByNorm,
  AdamW,
  NudgeUlps,
  Trace,
  // the llama ops
  RmsNormForward,
  RmsNormBackward,
  RopeForward,
  RopeBackward,
  SwigluForward,
  SwigluBackward,
  GqaAttentionForward,
  GqaAttentionBackward,
  // the mixture-of-experts ops
  MoeRouteForward,
  MoeRouteBackward,
  MoeDispatchForward,
  MoeDispatchBackward,
  MoeCombineForward,
  MoeCombineBackward,
  ExpertLinearForward,
  ExpertLinearBackward,
  // exact GELU (a canary's `gelu = "erf"`), appended: the kinds above keep their values
  GeluErfForward,
  GeluErfBackward,
  kLast = GeluErfBackward,
};

// Which architecture's ops an op belongs to. An engine runs the core ops; the others it
// runs when it says so (Engine::implements), and a canary calling one it lacks is refused
// before step 0.
enum class OpFamily : std::uint8_t { Core, Llama, MixtureOfExperts };

// How an op uses an operand. Write: overwritten (forward outputs). Accumulate: read and
// added into or updated in place (backward ops add into their gradients, as llm.c; AdamW
// updates the parameter and its moments; clipping scales gradients). Read: only read.
enum class Access : std::uint8_t { Read, Write, Accumulate };

struct OperandDescription {
  std::string_view name;
  Access access = Access::Read;
  bool optional = false;  // may be kNoTensor (no wpe for llama, no bias)
  // Written for a later op's use rather than as the op's result: a forward's statistics
  // for its backward, AdamW's moments. A fault moves an op's first result and `--trace
  // ops` records its results (canary.h, Canary::call); saved operands are neither.
  bool saved = false;
};

// A plain (non-tensor) argument of an op, and how many floats it takes in a traced node
// (a double travels as the two halves of its bits, high word first).
enum class AttributeType : std::uint8_t { Float, Int, Double, AdamW };
constexpr std::size_t node_floats(AttributeType type) {
  return type == AttributeType::Double ? 2 : type == AttributeType::AdamW ? 4 : 1;
}

struct AttributeDescription {
  std::string_view name;
  AttributeType type = AttributeType::Float;
  bool node_only = false;  // added by a lazy engine to its node, not an argument of the call
};

struct OpDescription {
  OpKind kind;
  std::string_view name;  // the Engine call's name ("rmsnorm_forward"): traces, errors, docs
  std::span<const OperandDescription> operands;  // in the recorded node's order
  // The ops over a list of tensors (global_norm, clip_by_norm): one more operand per
  // tensor after the fixed ones, each used this way; empty name for the others. The call
  // takes them as a std::span<const TensorId>, after the fixed operands or, with
  // `tensors_first_in_call`, before them.
  OperandDescription each_tensor;
  std::span<const AttributeDescription> attributes;  // after the operands, in order
  bool engine_call = true;                           // false: exists in traced graphs only
  bool tensors_first_in_call = false;
  bool site_in_call = true;  // the call's first argument is the OpSite (zero() names its tensor instead)
  OpFamily family = OpFamily::Core;

  constexpr bool variadic() const { return !each_tensor.name.empty(); }
  // Whether `count` operands fit: exactly the fixed ones, or (variadic) those plus any number.
  constexpr bool takes(std::size_t count) const {
    return variadic() ? count >= operands.size() : count == operands.size();
  }
  constexpr Access access(std::size_t operand) const {
    return operand < operands.size() ? operands[operand].access : each_tensor.access;
  }
  constexpr bool writes(std::size_t operand) const { return access(operand) != Access::Read; }
  // Whether fixed operand `operand` is one of the op's results: written and not saved.
  constexpr bool result(std::size_t operand) const {
    return operand < operands.size() && writes(operand) && !operands[operand].saved;
  }
  // The floats a traced node of this op carries: every attribute's, in order.
  constexpr std::size_t node_attribute_floats() const {
    std::size_t n = 0;
    for (const AttributeDescription& a : attributes) n += node_floats(a.type);
    return n;
  }
  // The index of the fixed operand called `operand` (compile-time lookups by the passes
  // that read an operand by its role); operands.size() when there is none.
  constexpr std::size_t index_of(std::string_view operand) const {
    for (std::size_t i = 0; i < operands.size(); ++i) {
      if (operands[i].name == operand) return i;
    }
    return operands.size();
  }
};

namespace op_tables {
using A = Access;
using O = OperandDescription;
using Attr = AttributeDescription;
using T = AttributeType;
constexpr O saved(std::string_view name, Access access = A::Write) { return {name, access, false, true}; }
inline constexpr O kZero[] = {{"tensor", A::Write}};
inline constexpr O kConstant[] = {{"tensor", A::Write}};
inline constexpr Attr kConstantAttrs[] = {{"value", T::Float, true}};
inline constexpr O kEncoderForward[] = {{"out", A::Write}, {"inputs"}, {"wte"}, {"wpe", A::Read, true}};
inline constexpr O kEncoderBackward[] = {{"dwte", A::Accumulate}, {"dwpe", A::Accumulate, true}, {"dout"}, {"inputs"}};
inline constexpr O kLayerNormForward[] = {{"out", A::Write}, saved("mean"), saved("rstd"),
                                          {"inp"},           {"weight"},         {"bias"}};
inline constexpr Attr kEpsAttrs[] = {{"eps"}};
inline constexpr O kLayerNormBackward[] = {{"dinp", A::Accumulate}, {"dweight", A::Accumulate}, {"dbias", A::Accumulate},
                                           {"dout"}, {"inp"}, {"weight"}, {"mean"}, {"rstd"}};
inline constexpr O kLinearForward[] = {{"out", A::Write}, {"inp"}, {"weight"}, {"bias", A::Read, true}};
inline constexpr O kLinearBackward[] = {{"dinp", A::Accumulate}, {"dweight", A::Accumulate},
                                        {"dbias", A::Accumulate, true}, {"dout"}, {"inp"}, {"weight"}};
inline constexpr O kAttentionForward[] = {{"out", A::Write}, saved("att"), {"qkv"}};
inline constexpr O kAttentionBackward[] = {{"dqkv", A::Accumulate}, {"dout"}, {"qkv"}, {"att"}};
inline constexpr O kGeluForward[] = {{"out", A::Write}, {"inp"}};
inline constexpr O kGeluBackward[] = {{"dinp", A::Accumulate}, {"inp"}, {"dout"}};
inline constexpr O kResidualForward[] = {{"out", A::Write}, {"a"}, {"b"}};
inline constexpr O kResidualBackward[] = {{"da", A::Accumulate}, {"db", A::Accumulate}, {"dout"}};
inline constexpr O kCrossEntropyForward[] = {{"loss", A::Write}, saved("probs"), {"logits"}, {"targets"}};
inline constexpr O kCrossEntropyBackward[] = {{"dlogits", A::Accumulate}, {"probs"}, {"targets"}};
inline constexpr O kGlobalNorm[] = {{"norm", A::Write}};
inline constexpr O kClipByNorm[] = {{"norm"}};
inline constexpr Attr kClipAttrs[] = {{"max_norm"}};
inline constexpr O kAdamW[] = {{"param", A::Accumulate}, {"grad"}, saved("m", A::Accumulate), saved("v", A::Accumulate),
                               {"lr"}, {"bias_correction1"}, {"bias_correction2"}};
inline constexpr Attr kAdamWAttrs[] = {{"config", T::AdamW}};  // beta1, beta2, eps, weight_decay
inline constexpr O kNudgeUlps[] = {{"tensor", A::Accumulate}, {"ulps"}};
inline constexpr O kTrace[] = {{"tensor"}};
inline constexpr Attr kTraceAttrs[] = {{"slot", T::Int, true}};  // its place among the step's traces
inline constexpr O kRmsNormForward[] = {{"out", A::Write}, saved("rstd"), {"inp"}, {"weight"}};
inline constexpr O kRmsNormBackward[] = {{"dinp", A::Accumulate}, {"dweight", A::Accumulate}, {"dout"}, {"inp"},
                                         {"weight"}, {"rstd"}};
inline constexpr O kRopeForward[] = {{"out", A::Write}, {"inp"}};
inline constexpr O kRopeBackward[] = {{"dinp", A::Accumulate}, {"dout"}};
inline constexpr Attr kRopeAttrs[] = {{"head_size", T::Int}, {"theta", T::Double}};
inline constexpr O kSwigluForward[] = {{"out", A::Write}, {"gate"}, {"up"}};
inline constexpr O kSwigluBackward[] = {{"dgate", A::Accumulate}, {"dup", A::Accumulate}, {"dout"}, {"gate"}, {"up"}};
inline constexpr O kGqaAttentionForward[] = {{"out", A::Write}, saved("att"), {"q"}, {"k"}, {"v"}};
inline constexpr O kGqaAttentionBackward[] = {{"dq", A::Accumulate}, {"dk", A::Accumulate}, {"dv", A::Accumulate},
                                              {"dout"}, {"q"}, {"k"}, {"v"}, {"att"}};
// Routing decisions (expert, slot) and weights are (B,T,K); probs and logits (B,T,E); the
// routing record (E+4) holds the step's tokens per expert, dropped choices, balance loss
// and a 48-bit hash of the decisions (kernels/moe_kernels.h).
inline constexpr O kMoeRouteForward[] = {{"weights", A::Write}, {"expert", A::Write}, {"slot", A::Write},
                                         saved("probs"), {"routing", A::Write}, {"logits"}};
inline constexpr Attr kMoeRouteAttrs[] = {{"top_k", T::Int}, {"capacity", T::Int}, {"balance_coef"}};
inline constexpr O kMoeRouteBackward[] = {{"dlogits", A::Accumulate}, {"dweights"}, {"probs"}, {"weights"}, {"expert"}};
inline constexpr Attr kBalanceAttrs[] = {{"balance_coef"}};
inline constexpr O kMoeDispatchForward[] = {{"expert_in", A::Write}, {"inp"}, {"expert"}, {"slot"}};
inline constexpr O kMoeDispatchBackward[] = {{"dinp", A::Accumulate}, {"dexpert_in"}, {"expert"}, {"slot"}};
inline constexpr O kMoeCombineForward[] = {{"out", A::Write}, {"expert_out"}, {"weights"}, {"expert"}, {"slot"}};
inline constexpr O kMoeCombineBackward[] = {{"dexpert_out", A::Accumulate}, {"dweights", A::Accumulate}, {"dout"},
                                            {"expert_out"}, {"weights"}, {"expert"}, {"slot"}};
// Every expert's own linear layer: inp (E,cap,C) @ weight (E,OC,C)^T -> out (E,cap,OC).
inline constexpr O kExpertLinearForward[] = {{"out", A::Write}, {"inp"}, {"weight"}};
inline constexpr O kExpertLinearBackward[] = {{"dinp", A::Accumulate}, {"dweight", A::Accumulate}, {"dout"}, {"inp"},
                                              {"weight"}};
}  // namespace op_tables

// An op that a model calls, with fixed operands (and attributes).
constexpr OpDescription op(OpKind kind, std::string_view name, std::span<const OperandDescription> operands,
                           std::span<const AttributeDescription> attributes = {}) {
  OpDescription d{kind, name, operands, OperandDescription{}, attributes};
  return d;
}
// An op over a list of tensors besides its fixed operands.
constexpr OpDescription over_tensors(OpDescription d, OperandDescription each_tensor, bool tensors_first_in_call) {
  d.each_tensor = each_tensor;
  d.tensors_first_in_call = tensors_first_in_call;
  return d;
}

// An op of an architecture's family rather than the core.
constexpr OpDescription of_family(OpDescription d, OpFamily family) {
  d.family = family;
  return d;
}

// Indexed by OpKind.
inline constexpr std::array<OpDescription, static_cast<std::size_t>(OpKind::kLast) + 1> kOpDescriptions = [] {
  namespace t = op_tables;
  OpDescription zero = op(OpKind::Zero, "zero", t::kZero);
  zero.site_in_call = false;
  OpDescription constant = op(OpKind::Constant, "constant", t::kConstant, t::kConstantAttrs);
  constant.engine_call = false;
  const auto llama = [](OpDescription d) { return of_family(d, OpFamily::Llama); };
  const auto moe = [](OpDescription d) { return of_family(d, OpFamily::MixtureOfExperts); };
  return std::array<OpDescription, static_cast<std::size_t>(OpKind::kLast) + 1>{
      zero,
      constant,
      op(OpKind::EncoderForward, "encoder_forward", t::kEncoderForward),
      op(OpKind::EncoderBackward, "encoder_backward", t::kEncoderBackward),
      op(OpKind::LayerNormForward, "layernorm_forward", t::kLayerNormForward, t::kEpsAttrs),
      op(OpKind::LayerNormBackward, "layernorm_backward", t::kLayerNormBackward),
      op(OpKind::LinearForward, "linear_forward", t::kLinearForward),
      op(OpKind::LinearBackward, "linear_backward", t::kLinearBackward),
      op(OpKind::AttentionForward, "attention_forward", t::kAttentionForward),
      op(OpKind::AttentionBackward, "attention_backward", t::kAttentionBackward),
      op(OpKind::GeluForward, "gelu_forward", t::kGeluForward),
      op(OpKind::GeluBackward, "gelu_backward", t::kGeluBackward),
      op(OpKind::ResidualForward, "residual_forward", t::kResidualForward),
      op(OpKind::ResidualBackward, "residual_backward", t::kResidualBackward),
      op(OpKind::CrossEntropyForward, "crossentropy_forward", t::kCrossEntropyForward),
      op(OpKind::CrossEntropyBackward, "crossentropy_backward", t::kCrossEntropyBackward),
      over_tensors(op(OpKind::GlobalNorm, "global_norm", t::kGlobalNorm), {"tensors", Access::Read}, false),
      over_tensors(op(OpKind::ClipByNorm, "clip_by_norm", t::kClipByNorm, t::kClipAttrs),
                   {"tensors", Access::Accumulate}, true),
      op(OpKind::AdamW, "adamw", t::kAdamW, t::kAdamWAttrs),
      op(OpKind::NudgeUlps, "nudge_ulps", t::kNudgeUlps),
      op(OpKind::Trace, "trace", t::kTrace, t::kTraceAttrs),
      llama(op(OpKind::RmsNormForward, "rmsnorm_forward", t::kRmsNormForward, t::kEpsAttrs)),
      llama(op(OpKind::RmsNormBackward, "rmsnorm_backward", t::kRmsNormBackward)),
      llama(op(OpKind::RopeForward, "rope_forward", t::kRopeForward, t::kRopeAttrs)),
      llama(op(OpKind::RopeBackward, "rope_backward", t::kRopeBackward, t::kRopeAttrs)),
      llama(op(OpKind::SwigluForward, "swiglu_forward", t::kSwigluForward)),
      llama(op(OpKind::SwigluBackward, "swiglu_backward", t::kSwigluBackward)),
      llama(op(OpKind::GqaAttentionForward, "gqa_attention_forward", t::kGqaAttentionForward)),
      llama(op(OpKind::GqaAttentionBackward, "gqa_attention_backward", t::kGqaAttentionBackward)),
      moe(op(OpKind::MoeRouteForward, "moe_route_forward", t::kMoeRouteForward, t::kMoeRouteAttrs)),
      moe(op(OpKind::MoeRouteBackward, "moe_route_backward", t::kMoeRouteBackward, t::kBalanceAttrs)),
      moe(op(OpKind::MoeDispatchForward, "moe_dispatch_forward", t::kMoeDispatchForward)),
      moe(op(OpKind::MoeDispatchBackward, "moe_dispatch_backward", t::kMoeDispatchBackward)),
      moe(op(OpKind::MoeCombineForward, "moe_combine_forward", t::kMoeCombineForward)),
      moe(op(OpKind::MoeCombineBackward, "moe_combine_backward", t::kMoeCombineBackward)),
      moe(op(OpKind::ExpertLinearForward, "expert_linear_forward", t::kExpertLinearForward)),
      moe(op(OpKind::ExpertLinearBackward, "expert_linear_backward", t::kExpertLinearBackward)),
      op(OpKind::GeluErfForward, "gelu_erf_forward", t::kGeluForward),
      op(OpKind::GeluErfBackward, "gelu_erf_backward", t::kGeluBackward),
  };
}();

constexpr const OpDescription& describe(OpKind op) { return kOpDescriptions[static_cast<std::size_t>(op)]; }

// The table is indexed by kind: every entry sits at its own kind's index.
constexpr bool op_table_is_indexed_by_kind() {
  for (std::size_t i = 0; i < kOpDescriptions.size(); ++i) {
    if (static_cast<std::size_t>(kOpDescriptions[i].kind) != i) return false;
  }
  return true;
}
static_assert(op_table_is_indexed_by_kind(), "kOpDescriptions must list the ops in OpKind order");

// An operand's name as a template argument: NodeOperands<K>::get<"weight">() (tpu-mesh's
// graph.h) finds its index in op K's description when it compiles.
template <std::size_t N>
struct OperandName {
  char text[N]{};
  consteval OperandName(const char (&name)[N]) {  // NOLINT: implicit, so that "weight" converts
    for (std::size_t i = 0; i < N; ++i) text[i] = name[i];
  }
  constexpr std::string_view view() const { return {text, N - 1}; }
};

// The fixed operand called `operand` of `op`, checked at compile time where it is used
// as a constant (a misspelt or removed operand is a build error, not a wrong index).
consteval std::size_t operand_index(OpKind op, std::string_view operand) {
  const std::size_t i = describe(op).index_of(operand);
  if (i == describe(op).operands.size()) throw "no operand of that name";  // not a constant expression: a build error
  return i;
}

}  // namespace harness
