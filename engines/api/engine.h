// The call boundary: the op set the canary model is written against.
//
// Nothing engine-specific lives above this interface. The model calls ops with tensor
// handles (ids into the TensorTable it binds), never with pointers, so an engine may
// execute each call at once (cpu-ref, accel) or record it into a graph and run the
// graph at the step boundary (tpu-mesh). Values cross the boundary only through upload()
// and read(), and read() is a synchronisation point: the model reads nothing inside a
// step. Per-step scalars (learning rate, Adam bias corrections, fault ulps) are 0-D
// Scalar tensors filled by upload(), so a traced step is the same graph every step.
//
// Accumulation convention (as llm.c): backward ops ADD into their gradient outputs, and
// the model zeroes every gradient at the start of a step. Forward ops overwrite.
//
// Dimension key: B = batch, T = time, C = channels, V = vocab, NH = heads, OC = out ch.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine_settings.h"
#include "numerics/rounding_bounds.h"
#include "op_description.h"
#include "tensor_table.h"

namespace harness {

class StepCompilation;  // step_compilation.h

enum class Phase : std::uint8_t { Forward, Backward, Optimizer };
std::string_view to_string(Phase phase);

// Which model op a call belongs to: the identity used by fault injection, traces and
// bisect. `name` follows the tensor naming (`blocks.2.attn.proj`); layer is -1 outside blocks.
struct OpSite {
  std::string_view name;
  int layer = -1;
  Phase phase = Phase::Forward;
};

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // the model passes 0 for tensors that are not decayed
};

// A manifest attribute value (HDF5 string, int64 or float64 attribute).
using AttributeValue = std::variant<std::string, std::int64_t, double>;

// Engine state recorded once per step in a receipt group of its own, e.g. /fp8: the
// group holds `names` (the columns) and one float64 dataset (steps, columns) per field.
// With no columns each field holds one value per step: a 1-D dataset (steps), no `names`.
struct StepState {
  std::string group;
  std::vector<std::string> columns;
  std::vector<std::pair<std::string, std::vector<double>>> fields;  // field name -> one value per column (or one)
};

// Receives op traces (`--trace ops`): after a traced op, the full logical value of each
// output the model names, in the model's op order. Eager engines call it at once with
// their buffer; a lazy engine calls it while or after its program runs, with the global
// value assembled from its devices (and from its micro-batches). `value` is valid for the
// call only, and the sink must not call back into the engine (a program may be mid-run).
class TraceSink {
 public:
  virtual ~TraceSink() = default;
  virtual void on_trace(const OpSite& site, TensorId tensor, std::span<const float> value) = 0;
};

// Engine state that is not a tensor of the table, for checkpoints: FP8 scaling histories,
// the fingerprints of compiled programs. `arrays` are restored; `facts` are compared
// after a resumed step (a replay must run the same program).
struct EngineState {
  std::map<std::string, std::vector<float>> arrays;
  std::map<std::string, std::string> facts;
};

class Engine {
 public:
  virtual ~Engine() = default;

  virtual std::string_view name() const = 0;
  // The engine part of the lane name: the name, plus the mesh for tpu-mesh ("tpu-mesh@2x2").
  virtual std::string lane_engine() const { return std::string(name()); }
  // The canonical feature string of this configuration ("" for none): part of the lane name.
  virtual std::string features() const { return {}; }
  // The budget features of this configuration: what separates its numbers from the
  // bitwise reference (cpu-ref), by the names of the budgets file's entries
  // (docs/budgets.md), e.g. {"noise", "bf16"}; empty for a run that rounds like cpu-ref.
  // Declared from the engine's own numerics settings, written into the receipt manifest
  // as `budget_features` ('+'-joined): the verdict composes budgets from it alone. In
  // order from the most general to the most specific: calibrate proposes a budget for the
  // last one a comparison composes unless told which.
  virtual std::vector<std::string> budget_features() const = 0;
  // Engine settings for the receipt manifest (noise mode and seed, FP8 recipe, ...).
  virtual std::map<std::string, AttributeValue> manifest_attributes() const { return {}; }
  // How this engine orders its reductions (docs/determinism.md): the same order every run
  // (fixed), one drawn from a seed that a replay passes back (seeded), or whatever the
  // threads make it (racy: no two runs alike, nothing replays one).
  enum class ReductionOrder { kFixed, kSeeded, kRacy };
  virtual ReductionOrder reduction_order() const { return ReductionOrder::kFixed; }
  // A seeded engine's seed: the engine flag that sets it and the value this run drew. A
  // replay recipe carries it, and calibrate sets it per repeat.
  struct ReductionSeed {
    std::string flag;  // e.g. "noise-seed"
    std::int64_t seed = 0;
  };
  virtual std::optional<ReductionSeed> reduction_seed() const { return std::nullopt; }
  // The parts of this configuration's reduced precision that can go back to a wider format
  // one at a time, for `harness triage` (docs/triage.md), narrowest format first; empty for
  // an engine with none. `layers`: the canary's blocks.
  virtual std::vector<PrecisionSwitch> precision_switches(int /*layers*/) const { return {}; }
  // State of the step that just ended (after step_end()); empty for engines with none.
  virtual std::vector<StepState> step_state() const { return {}; }
  // What an engine that compiles its steps traced and ran in the last one; nullptr for an
  // engine that runs each op as it is called. `harness audit` needs one.
  virtual const StepCompilation* step_compilation() const { return nullptr; }
  // How this configuration computes an op on these operands (the call's tensors, in its
  // description's order), as the op oracle bounds it (docs/oracle.md): the precision its
  // products' operands are rounded to, the FP8 operands its products read quantised with a
  // scale, what each result is rounded to when stored, and whether these bounds describe it
  // at all. Asked once the op has run (a scale may come from the operand's own amax). What
  // the configuration declares: a deliberate fault (accel's --fp8-e5m2, --fp8-saturate) is
  // not declared, it is what the oracle must find. The default: everything in fp32, as cpu-ref.
  struct OpNumerics {
    // An operand of the products quantised to an FP8 format with this scale, read as
    // round(x scale) / scale (engines/numerics/fp8_scaling.h).
    struct Scaled {
      numerics::Precision format = numerics::Precision::Fp8E4M3;
      double scale = 1.0;
    };
    numerics::Precision operands = numerics::Precision::Fp32;
    std::vector<numerics::Precision> results;  // per operand; fp32 where not a result (empty: all fp32)
    std::vector<std::optional<Scaled>> scaled;  // per operand; none where not scaled (empty: none)
    int descale_roundings = 0;  // the fp32 roundings a GEMM of scaled operands adds to each term as it descales
    numerics::LimitedAccumulator accumulator;  // a GEMM's accumulator narrower than fp32 (interval 0: fp32)
    bool bounded = true;  // false: a way of computing the bounds do not model
    std::string why_not_bounded;
    numerics::Precision result(std::size_t operand) const {
      return operand < results.size() ? results[operand] : numerics::Precision::Fp32;
    }
    std::optional<Scaled> scaled_operand(std::size_t operand) const {
      return operand < scaled.size() ? scaled[operand] : std::nullopt;
    }
  };
  virtual OpNumerics op_numerics(OpKind, const OpSite&, std::span<const TensorId>) { return {}; }
  // Checks that this configuration can run the model (a mesh engine's shard plan must
  // divide it); throws std::invalid_argument naming the flag. Allocates nothing.
  virtual void check_table(const TensorTable&) const {}
  // Allocates device memory for every tensor of the table; call once before anything else.
  virtual void bind(const TensorTable& table) = 0;

  // Engine state beyond the tensors (see EngineState); restore throws std::invalid_argument
  // naming the entry when the state does not fit this configuration.
  virtual EngineState save_state() const { return {}; }
  virtual void restore_state(const EngineState&) {}

  // Where trace() delivers values; nullptr (the default) turns delivery off.
  void set_trace_sink(TraceSink* sink) { trace_sink_ = sink; }

  // ---- host <-> device --------------------------------------------------------------
  virtual void upload(TensorId id, std::span<const float> values) = 0;
  virtual void upload_tokens(TensorId id, std::span<const std::int32_t> tokens) = 0;
  // The tensor's full logical value (a sharded tensor assembled), valid until the next
  // call on the engine. A synchronisation point: never called inside a step.
  virtual std::span<const float> read(TensorId id) = 0;

  // ---- step boundary ----------------------------------------------------------------
  virtual void step_begin(int step) = 0;
  virtual void step_end() = 0;  // lazy engines compile-or-lookup and execute here

  // ---- ops ---------------------------------------------------------------------------
  virtual void zero(TensorId id) = 0;

  // Every compute op, from its one list (engine_ops.inc: what each computes, with its
  // parameters): a core op's virtual is pure; a llama or mixture-of-experts op's throws
  // by default (engine.cpp), for an engine that does not run it and says so in implements().
#define HARNESS_ENGINE_OP_DEFAULT_Core = 0
#define HARNESS_ENGINE_OP_DEFAULT_Llama
#define HARNESS_ENGINE_OP_DEFAULT_MixtureOfExperts
#define HARNESS_ENGINE_OP(family, kind, member, parameters) \
  virtual void member parameters HARNESS_ENGINE_OP_DEFAULT_##family;
#include "engine_ops.inc"
#undef HARNESS_ENGINE_OP
#undef HARNESS_ENGINE_OP_DEFAULT_Core
#undef HARNESS_ENGINE_OP_DEFAULT_Llama
#undef HARNESS_ENGINE_OP_DEFAULT_MixtureOfExperts

  // Whether this engine runs `op`: by default the core ops (OpDescription::family), whose
  // virtuals have no default. A canary whose step calls an op its engine lacks is refused
  // before step 0 (canary::engine_cannot_run: "op X is not implemented by engine Y").
  virtual bool implements(OpKind op) const;

  // Op tracing: deliver `tensor`'s value as it is now (after the op `site`, which the
  // model calls it after) to the trace sink. See docs/bisect.md, "Op traces".
  virtual void trace(const OpSite& site, TensorId tensor) = 0;

 protected:
  TraceSink* trace_sink() const { return trace_sink_; }

 private:
  TraceSink* trace_sink_ = nullptr;
};

// Each op's Engine member, by its kind: the one place an OpKind meets the virtual a model
// calls. engine.cpp holds every entry to its op's description at compile time; a model
// calls ops through them (canaries/canary.h, Ops::call<K>).
template <OpKind K>
inline constexpr auto kEngineCall = nullptr;  // not an engine call (Constant)
template <> inline constexpr auto kEngineCall<OpKind::Zero> = &Engine::zero;
template <> inline constexpr auto kEngineCall<OpKind::Trace> = &Engine::trace;
#define HARNESS_ENGINE_OP(family, kind, member, parameters) \
  template <> inline constexpr auto kEngineCall<OpKind::kind> = &Engine::member;
#include "engine_ops.inc"
#undef HARNESS_ENGINE_OP

}  // namespace harness
