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

  // out (B,T,C) = wte[inputs] + wpe[t]; wpe may be kNoTensor (no position embedding:
  // out = wte[inputs]), and then dwpe is kNoTensor in the backward
  virtual void encoder_forward(const OpSite& site, TensorId out, TensorId inputs, TensorId wte,
                               TensorId wpe) = 0;
  virtual void encoder_backward(const OpSite& site, TensorId dwte, TensorId dwpe, TensorId dout,
                                TensorId inputs) = 0;

  // out (N,C) = (inp - mean) * rstd * weight + bias; mean, rstd (N) saved for backward
  virtual void layernorm_forward(const OpSite& site, TensorId out, TensorId mean, TensorId rstd,
                                 TensorId inp, TensorId weight, TensorId bias, float eps) = 0;
  virtual void layernorm_backward(const OpSite& site, TensorId dinp, TensorId dweight, TensorId dbias,
                                  TensorId dout, TensorId inp, TensorId weight, TensorId mean,
                                  TensorId rstd) = 0;

  // out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be kNoTensor
  virtual void linear_forward(const OpSite& site, TensorId out, TensorId inp, TensorId weight,
                              TensorId bias) = 0;
  virtual void linear_backward(const OpSite& site, TensorId dinp, TensorId dweight, TensorId dbias,
                               TensorId dout, TensorId inp, TensorId weight) = 0;

  // Causal multi-head attention. qkv (B,T,3C) -> out (B,T,C); att (B,NH,T,T) saved.
  virtual void attention_forward(const OpSite& site, TensorId out, TensorId att, TensorId qkv) = 0;
  virtual void attention_backward(const OpSite& site, TensorId dqkv, TensorId dout, TensorId qkv,
                                  TensorId att) = 0;

  // ---- the llama architecture's ops (docs/design.md, "The `llama` architecture") --------
  // Their defaults throw: an engine that does not run them leaves them and says so in
  // implements() (below), and a canary whose step calls one is refused before step 0.

  // out (N,C) = inp * rstd * weight, rstd (N) = 1/sqrt(mean(inp^2) + eps) saved for backward
  virtual void rmsnorm_forward(const OpSite& site, TensorId out, TensorId rstd, TensorId inp, TensorId weight,
                               float eps);
  virtual void rmsnorm_backward(const OpSite& site, TensorId dinp, TensorId dweight, TensorId dout, TensorId inp,
                                TensorId weight, TensorId rstd);
  // Rotate-half RoPE over (B,T,heads*head_size): the pair (i, i+head_size/2) of position t
  // turns by t * theta^(-2i/head_size).
  virtual void rope_forward(const OpSite& site, TensorId out, TensorId inp, int head_size, double theta);
  virtual void rope_backward(const OpSite& site, TensorId dinp, TensorId dout, int head_size, double theta);
  // out = silu(gate) * up, elementwise
  virtual void swiglu_forward(const OpSite& site, TensorId out, TensorId gate, TensorId up);
  virtual void swiglu_backward(const OpSite& site, TensorId dgate, TensorId dup, TensorId dout, TensorId gate,
                               TensorId up);
  // Causal grouped-query attention: q (B,T,NH*hd), k and v (B,T,NKV*hd) -> out (B,T,NH*hd),
  // att (B,NH,T,T) saved; NH from att, hd and NKV from the shapes.
  virtual void gqa_attention_forward(const OpSite& site, TensorId out, TensorId att, TensorId q, TensorId k,
                                     TensorId v);
  virtual void gqa_attention_backward(const OpSite& site, TensorId dq, TensorId dk, TensorId dv, TensorId dout,
                                      TensorId q, TensorId k, TensorId v, TensorId att);

  // ---- the mixture-of-experts ops (docs/design.md, "The `moe` architecture") ----------
  // Defaults throw, as the llama ops'. Shapes: logits and probs (B,T,E); weights, expert
  // and slot (B,T,K); expert buffers (E,cap,C); routing (E+4), the step's record of the
  // layer (kernels/moe_kernels.h).
  // The router: softmax, top-K (ties to the lower expert), renormalised weights, capacity
  // `capacity` rows per expert (every first choice before any second); routing gets the
  // tokens per expert, the dropped choices, the balance loss (balance_coef * E * sum f_e P_e)
  // and the decisions' hash.
  virtual void moe_route_forward(const OpSite& site, TensorId weights, TensorId expert, TensorId slot, TensorId probs,
                                 TensorId routing, TensorId logits, int top_k, int capacity, float balance_coef);
  // dlogits += through the weights (dweights) and the balance loss, back through the softmax
  virtual void moe_route_backward(const OpSite& site, TensorId dlogits, TensorId dweights, TensorId probs,
                                  TensorId weights, TensorId expert, float balance_coef);
  // expert_in (E,cap,C) = each placed choice's row of inp (B,T,C), zeros elsewhere
  virtual void moe_dispatch_forward(const OpSite& site, TensorId expert_in, TensorId inp, TensorId expert,
                                    TensorId slot);
  virtual void moe_dispatch_backward(const OpSite& site, TensorId dinp, TensorId dexpert_in, TensorId expert,
                                     TensorId slot);
  // out (B,T,C) = sum over a token's placed choices of weight * expert_out[expert][slot]
  virtual void moe_combine_forward(const OpSite& site, TensorId out, TensorId expert_out, TensorId weights,
                                   TensorId expert, TensorId slot);
  virtual void moe_combine_backward(const OpSite& site, TensorId dexpert_out, TensorId dweights, TensorId dout,
                                    TensorId expert_out, TensorId weights, TensorId expert, TensorId slot);
  // out (E,cap,OC) = inp (E,cap,C) @ weight (E,OC,C)^T, expert by expert
  virtual void expert_linear_forward(const OpSite& site, TensorId out, TensorId inp, TensorId weight);
  virtual void expert_linear_backward(const OpSite& site, TensorId dinp, TensorId dweight, TensorId dout, TensorId inp,
                                      TensorId weight);

  // Whether this engine runs `op`: by default the core ops (OpDescription::family), whose
  // virtuals have no default. A canary whose step calls an op its engine lacks is refused
  // before step 0 (canary::engine_cannot_run: "op X is not implemented by engine Y").
  virtual bool implements(OpKind op) const;

  // GELU, tanh approximation.
  virtual void gelu_forward(const OpSite& site, TensorId out, TensorId inp) = 0;
  virtual void gelu_backward(const OpSite& site, TensorId dinp, TensorId inp, TensorId dout) = 0;
  // out = x Phi(x), the exact GELU (erf), elementwise
  virtual void gelu_erf_forward(const OpSite& site, TensorId out, TensorId inp) = 0;
  virtual void gelu_erf_backward(const OpSite& site, TensorId dinp, TensorId inp, TensorId dout) = 0;

  // out = a + b; backward adds dout to both da and db
  virtual void residual_forward(const OpSite& site, TensorId out, TensorId a, TensorId b) = 0;
  virtual void residual_backward(const OpSite& site, TensorId da, TensorId db, TensorId dout) = 0;

  // loss (0-D) = mean over (B,T) of -log softmax(logits)[target]; probs (B,T,V) saved
  virtual void crossentropy_forward(const OpSite& site, TensorId loss, TensorId probs, TensorId logits,
                                    TensorId targets) = 0;
  // dlogits += (probs - onehot(targets)) / (B*T)
  virtual void crossentropy_backward(const OpSite& site, TensorId dlogits, TensorId probs,
                                     TensorId targets) = 0;

  // norm (0-D) = sqrt(sum of squares over all tensors)
  virtual void global_norm(const OpSite& site, TensorId norm, std::span<const TensorId> tensors) = 0;
  // if norm > max_norm: every tensor *= max_norm / (norm + 1e-6)
  virtual void clip_by_norm(const OpSite& site, std::span<const TensorId> tensors, TensorId norm,
                            float max_norm) = 0;
  // AdamW (PyTorch semantics) on one parameter; lr, bias_correction1/2 are 0-D tensors.
  virtual void adamw_update(const OpSite& site, TensorId param, TensorId grad, TensorId m, TensorId v,
                            TensorId lr, TensorId bias_correction1, TensorId bias_correction2,
                            const AdamWConfig& config) = 0;

  // Fault injection: move element 0 of `tensor` up by `ulps` (a 0-D tensor, usually 0)
  // units in the last place. See docs/canary.md, "Fault injection".
  virtual void nudge_ulps(const OpSite& site, TensorId tensor, TensorId ulps) = 0;

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
template <> inline constexpr auto kEngineCall<OpKind::EncoderForward> = &Engine::encoder_forward;
template <> inline constexpr auto kEngineCall<OpKind::EncoderBackward> = &Engine::encoder_backward;
template <> inline constexpr auto kEngineCall<OpKind::LayerNormForward> = &Engine::layernorm_forward;
template <> inline constexpr auto kEngineCall<OpKind::LayerNormBackward> = &Engine::layernorm_backward;
template <> inline constexpr auto kEngineCall<OpKind::LinearForward> = &Engine::linear_forward;
template <> inline constexpr auto kEngineCall<OpKind::LinearBackward> = &Engine::linear_backward;
template <> inline constexpr auto kEngineCall<OpKind::AttentionForward> = &Engine::attention_forward;
template <> inline constexpr auto kEngineCall<OpKind::AttentionBackward> = &Engine::attention_backward;
template <> inline constexpr auto kEngineCall<OpKind::GeluForward> = &Engine::gelu_forward;
template <> inline constexpr auto kEngineCall<OpKind::GeluBackward> = &Engine::gelu_backward;
template <> inline constexpr auto kEngineCall<OpKind::ResidualForward> = &Engine::residual_forward;
template <> inline constexpr auto kEngineCall<OpKind::ResidualBackward> = &Engine::residual_backward;
template <> inline constexpr auto kEngineCall<OpKind::CrossEntropyForward> = &Engine::crossentropy_forward;
template <> inline constexpr auto kEngineCall<OpKind::CrossEntropyBackward> = &Engine::crossentropy_backward;
template <> inline constexpr auto kEngineCall<OpKind::GlobalNorm> = &Engine::global_norm;
template <> inline constexpr auto kEngineCall<OpKind::ClipByNorm> = &Engine::clip_by_norm;
template <> inline constexpr auto kEngineCall<OpKind::AdamW> = &Engine::adamw_update;
template <> inline constexpr auto kEngineCall<OpKind::NudgeUlps> = &Engine::nudge_ulps;
template <> inline constexpr auto kEngineCall<OpKind::Trace> = &Engine::trace;
template <> inline constexpr auto kEngineCall<OpKind::RmsNormForward> = &Engine::rmsnorm_forward;
template <> inline constexpr auto kEngineCall<OpKind::RmsNormBackward> = &Engine::rmsnorm_backward;
template <> inline constexpr auto kEngineCall<OpKind::RopeForward> = &Engine::rope_forward;
template <> inline constexpr auto kEngineCall<OpKind::RopeBackward> = &Engine::rope_backward;
template <> inline constexpr auto kEngineCall<OpKind::SwigluForward> = &Engine::swiglu_forward;
template <> inline constexpr auto kEngineCall<OpKind::SwigluBackward> = &Engine::swiglu_backward;
template <> inline constexpr auto kEngineCall<OpKind::GqaAttentionForward> = &Engine::gqa_attention_forward;
template <> inline constexpr auto kEngineCall<OpKind::GqaAttentionBackward> = &Engine::gqa_attention_backward;
template <> inline constexpr auto kEngineCall<OpKind::MoeRouteForward> = &Engine::moe_route_forward;
template <> inline constexpr auto kEngineCall<OpKind::MoeRouteBackward> = &Engine::moe_route_backward;
template <> inline constexpr auto kEngineCall<OpKind::MoeDispatchForward> = &Engine::moe_dispatch_forward;
template <> inline constexpr auto kEngineCall<OpKind::MoeDispatchBackward> = &Engine::moe_dispatch_backward;
template <> inline constexpr auto kEngineCall<OpKind::MoeCombineForward> = &Engine::moe_combine_forward;
template <> inline constexpr auto kEngineCall<OpKind::MoeCombineBackward> = &Engine::moe_combine_backward;
template <> inline constexpr auto kEngineCall<OpKind::ExpertLinearForward> = &Engine::expert_linear_forward;
template <> inline constexpr auto kEngineCall<OpKind::ExpertLinearBackward> = &Engine::expert_linear_backward;
template <> inline constexpr auto kEngineCall<OpKind::GeluErfForward> = &Engine::gelu_erf_forward;
template <> inline constexpr auto kEngineCall<OpKind::GeluErfBackward> = &Engine::gelu_erf_backward;

}  // namespace harness
