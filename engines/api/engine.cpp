#include "engine.h"

#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "op_description.h"

namespace harness {

// ---- the Engine interface against the op descriptions -------------------------------------
// Each op's virtual must take exactly what its description says, in order: the OpSite, a
// TensorId per fixed operand (and a std::span<const TensorId> for a variadic op's tensors),
// then its call attributes by type. A virtual that drifts from its description, or an
// operand added to one but not the other, is a build error here.
namespace {

enum class CallParameter { Tensor, Tensors, Float, Int, Double, AdamW };

constexpr CallParameter parameter_of(AttributeType type) {
  switch (type) {
    case AttributeType::Float: return CallParameter::Float;
    case AttributeType::Int: return CallParameter::Int;
    case AttributeType::Double: return CallParameter::Double;
    case AttributeType::AdamW: return CallParameter::AdamW;
  }
  return CallParameter::Float;
}

constexpr std::size_t call_parameters(const OpDescription& d) {
  std::size_t n = d.operands.size() + (d.variadic() ? 1 : 0);
  for (const AttributeDescription& a : d.attributes) n += a.node_only ? 0 : 1;
  return n;
}

// The i-th parameter after the OpSite.
constexpr CallParameter call_parameter(const OpDescription& d, std::size_t i) {
  if (d.variadic()) {
    const std::size_t tensors_at = d.tensors_first_in_call ? 0 : d.operands.size();
    if (i == tensors_at) return CallParameter::Tensors;
    if (i > tensors_at) --i;
  }
  if (i < d.operands.size()) return CallParameter::Tensor;
  i -= d.operands.size();
  for (const AttributeDescription& a : d.attributes) {
    if (a.node_only) continue;
    if (i == 0) return parameter_of(a.type);
    --i;
  }
  return CallParameter::Tensor;  // past the end: call_parameters() bounds every use
}

template <CallParameter P> struct ParameterType;
template <> struct ParameterType<CallParameter::Tensor> { using type = TensorId; };
template <> struct ParameterType<CallParameter::Tensors> { using type = std::span<const TensorId>; };
template <> struct ParameterType<CallParameter::Float> { using type = float; };
template <> struct ParameterType<CallParameter::Int> { using type = int; };
template <> struct ParameterType<CallParameter::Double> { using type = double; };
template <> struct ParameterType<CallParameter::AdamW> { using type = const AdamWConfig&; };

template <OpKind K, std::size_t... I>
auto described_call(std::index_sequence<I...>) {
  if constexpr (describe(K).site_in_call) {
    return static_cast<void (Engine::*)(const OpSite&,
                                        typename ParameterType<call_parameter(describe(K), I)>::type...)>(nullptr);
  } else {
    return static_cast<void (Engine::*)(typename ParameterType<call_parameter(describe(K), I)>::type...)>(nullptr);
  }
}

// The member-function type op K's description says its virtual has.
template <OpKind K>
using DescribedCall = decltype(described_call<K>(std::make_index_sequence<call_parameters(describe(K))>{}));

// Every op's entry in kEngineCall (engine.h) is its virtual with exactly the described
// parameters; an engine call with no entry (nullptr) fails too.
// (The assertion sits in the template, so a failing one names its op.)
template <OpKind K>
constexpr bool call_is_described() {
  if constexpr (!describe(K).engine_call) {
    static_assert(std::is_same_v<decltype(kEngineCall<K>), const std::nullptr_t>,
                  "an op that is not an engine call has an Engine member");
  } else {
    static_assert(std::is_same_v<std::remove_const_t<decltype(kEngineCall<K>)>, DescribedCall<K>>,
                  "the Engine virtual differs from its op's description");
  }
  return true;
}

template <std::size_t... I>
constexpr bool every_call_is_described(std::index_sequence<I...>) {
  return (call_is_described<static_cast<OpKind>(I)>() && ...);
}
static_assert(every_call_is_described(std::make_index_sequence<kOpDescriptions.size()>{}));

// Each entry of engine_ops.inc names its op's family (which decides whether its virtual is
// pure) as the op's description does.
#define HARNESS_ENGINE_OP(op_family, op_kind, member, parameters)       \
  static_assert(describe(OpKind::op_kind).family == OpFamily::op_family, \
                #member ": engine_ops.inc gives another family than its description");
#include "engine_ops.inc"
#undef HARNESS_ENGINE_OP

}  // namespace

std::string_view to_string(Phase phase) {
  switch (phase) {
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Optimizer: return "optimizer";
  }
  return "unknown";
}

// ---- the llama and MoE ops, for engines that do not run them yet -------------------------
// The run refuses a canary that calls them on such an engine before step 0 (implements), so
// reaching one of these is a bug in the caller, never a user's input.

namespace {
[[noreturn]] void not_implemented(const Engine& engine, OpKind op) {
  throw std::logic_error(std::string(describe(op).name) + " called on engine " + std::string(engine.name()) +
                         ", which does not implement it (Engine::implements)");
}
}  // namespace

bool Engine::implements(OpKind op) const { return describe(op).family == OpFamily::Core; }

// Each llama or mixture-of-experts op's default, from engine_ops.inc; the core ops have
// none (pure). The parameters are named in the list and unused here.
#define HARNESS_ENGINE_OP_DEFAULT_Core(kind, member, parameters)
#define HARNESS_ENGINE_OP_DEFAULT_Llama(kind, member, parameters) \
  void Engine::member parameters { not_implemented(*this, OpKind::kind); }
#define HARNESS_ENGINE_OP_DEFAULT_MixtureOfExperts HARNESS_ENGINE_OP_DEFAULT_Llama
#define HARNESS_ENGINE_OP(family, kind, member, parameters) HARNESS_ENGINE_OP_DEFAULT_##family(kind, member, parameters)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "engine_ops.inc"
#pragma GCC diagnostic pop
#undef HARNESS_ENGINE_OP
#undef HARNESS_ENGINE_OP_DEFAULT_Core
#undef HARNESS_ENGINE_OP_DEFAULT_Llama
#undef HARNESS_ENGINE_OP_DEFAULT_MixtureOfExperts

}  // namespace harness
