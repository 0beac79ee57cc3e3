#include "tpu_mesh_engine.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "compiler.h"
#include "op_rules.h"
#include "sharding.h"

namespace harness::tpu {
namespace {

// Bounds on what a program from disk may ask each device to allocate (floats): far above
// what any canary preset needs, far below what would exhaust the host.
constexpr std::int64_t kMaxSlabNumel = std::int64_t{1} << 32;
constexpr std::int64_t kMaxScratchNumel = std::int64_t{1} << 30;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TpuMeshEngine::TpuMeshEngine(MeshConfig config)
    : config_(std::move(config)), cache_(config_.compile_cache_dir),
      step_peak_bytes_(kMemoryCategories + 1, 0) {}

// The manifest_attributes() and step_state() below, described (docs/engines/tpu-mesh.md).
ReceiptEntries mesh_receipt_entries() {
  const std::string writer = "tpu-mesh";
  const auto setting = [&](const char* name, ReceiptValue kind, const char* meaning) {
    return ReceiptAttribute{fmt::format("/manifest/{}", name), kind, Presence::kOptional, 0, writer, meaning};
  };
  using V = ReceiptValue;
  ReceiptEntries e;
  e.attributes = {setting("mesh", V::kString, "DxM"),
                  setting("mesh_axes", V::kString, "data,model"),
                  setting("mesh_devices", V::kInteger, "the mesh's devices"),
                  setting("shard_plan", V::kString, "dp, tp or zero3"),
                  setting("precision", V::kString, "fp32 or bf16"),
                  setting("compile_mode", V::kString, "step or microstep"),
                  setting("grad_accum", V::kInteger, "micro-batches per step"),
                  setting("leak_scalars", V::kInteger, "1 when Python-side scalars leak into the graph"),
                  setting("compile_cache", V::kString, "the persistent cache's directory, empty for none"),
                  setting("program_format_version", V::kInteger, "the compiled programs' format")};
  e.groups = {{"/compile", Presence::kOptional, 0, writer, "per step, the compiler's counters"},
              {"/memory", Presence::kOptional, 0, writer, "per step, each device's peak bytes by category"}};
  e.datasets = {{"/memory/names", ReceiptDtype::kString, {ReceiptDim::kAny}, false, "", Presence::kRequired, 0, writer,
                 "device0, device1, ..."},
                {"/memory/*", ReceiptDtype::kFloat64, {ReceiptDim::kSteps, ReceiptDim::kColumns}, false, "/memory/names",
                 Presence::kOptional, 0, writer, "each device's peak bytes of one category during step s",
                 CounterGate::kPeakBytes}};
  const std::vector<ReceiptDataset> counters = compile_counters(writer);
  e.datasets.insert(e.datasets.end(), counters.begin(), counters.end());
  return e;
}

std::map<std::string, AttributeValue> TpuMeshEngine::manifest_attributes() const {
  return {{"mesh", config_.mesh.to_string()},
          {"mesh_axes", std::string("data,model")},
          {"mesh_devices", std::int64_t{config_.mesh.devices()}},
          {"shard_plan", to_string(config_.plan)},
          {"precision", to_string(config_.precision)},
          {"compile_mode", to_string(config_.compile_mode)},
          {"grad_accum", std::int64_t{config_.grad_accum}},
          {"leak_scalars", std::int64_t{config_.leak_scalars ? 1 : 0}},
          {"compile_cache", config_.compile_cache_dir},
          {"program_format_version", std::int64_t{kProgramFormatVersion}}};
}

std::vector<StepState> TpuMeshEngine::step_state() const {
  StepState compile{"compile", {}, {}};
  const CompileCounters& c = counters_;
  compile.fields = {{"CompileTime", {c.compile_seconds}},
                    {"ExecuteTime", {c.execute_seconds}},
                    {"UncachedCompile", {double(c.uncached_compile)}},
                    {"CachedCompile", {double(c.cached_compile)}},
                    {"PersistentCacheHit", {double(c.persistent_hit)}},
                    {"PersistentCacheMiss", {double(c.persistent_miss)}},
                    {"PersistentCacheDeserializeFailure", {double(c.deserialize_failure)}},
                    {"HostSync", {double(c.host_sync)}}};
  // Plans are symmetric: every device has the same block shapes, so the same peaks.
  StepState memory{"memory", {}, {}};
  const auto devices = static_cast<std::size_t>(config_.mesh.devices());
  for (std::size_t d = 0; d < devices; ++d) memory.columns.push_back(fmt::format("device{}", d));
  for (int category = 0; category < kMemoryCategories; ++category) {
    memory.fields.emplace_back(to_string(static_cast<MemoryCategory>(category)),
                               std::vector<double>(devices, double(step_peak_bytes_[static_cast<std::size_t>(category)])));
  }
  memory.fields.emplace_back("total", std::vector<double>(devices, double(step_peak_bytes_.back())));
  return {compile, memory};
}

void TpuMeshEngine::check_table(const TensorTable& table) const {
  validate_plan(table, plan_shardings(table, config_), config_);
}

void TpuMeshEngine::bind(const TensorTable& table) {
  check_table(table);
  table_ = &table;
  specs_ = plan_shardings(table, config_);
  table_digest_ = table_digest(table);
  executor_.bind(table, config_.mesh, specs_);
  // Activations shard their batch as the tokens do (on `data`, or not at all).
  const auto& token_inputs = table.of_kind(TensorKind::Input);
  const TensorId inputs = token_inputs.empty() ? kNoTensor : token_inputs.front();
  batch_shards_ = inputs == kNoTensor ? 1
                                      : axis_size(config_.mesh, effective(specs_[static_cast<std::size_t>(inputs)], config_.mesh).dims.at(0).axis);
  executor_.set_trace_callback(
      [this](int slot, int micro_batch, std::span<const float> value) { collect_trace(slot, micro_batch, value); });
}

// The programs the last step ran: a resumed run must run the same ones.
EngineState TpuMeshEngine::save_state() const {
  std::string fingerprints;
  for (const TracedProgram& s : segments_) fingerprints += (fingerprints.empty() ? "" : ",") + s.fingerprint;
  return {{}, {{"compile_fingerprints", fingerprints}}};
}

// ---- op traces -----------------------------------------------------------------------------

// A trace is a node in the graph; its value arrives when the program runs. An activation
// arrives one micro-batch at a time (rows k*B/K.. of the step's batch); anything else is
// whole each time, and its value after the last micro-batch is the step's.
void TpuMeshEngine::trace(const OpSite& site, TensorId tensor) {
  const std::size_t slot = traces_used_++;
  if (slot == traces_.size()) traces_.emplace_back();
  TracedValue& traced = traces_[slot];  // reused step after step: its value keeps its buffer
  traced.site.assign(site.name);
  traced.layer = site.layer;
  traced.phase = site.phase;
  traced.tensor = tensor;
  traced.arrived = false;
  record<OpKind::Trace>(site, {tensor}, {static_cast<float>(slot)});
}

void TpuMeshEngine::collect_trace(int slot, int micro_batch, std::span<const float> value) {
  const auto at = static_cast<std::size_t>(slot);
  if (at >= traces_used_) throw std::logic_error(fmt::format("tpu-mesh: trace slot {} of {} ran", slot, traces_used_));
  TracedValue& traced = traces_[at];
  if (config_.grad_accum == 1) {  // each value arrives once, whole
    if (at < traces_delivered_ || traced.arrived) {
      throw std::logic_error(fmt::format("tpu-mesh: trace slot {} ran twice in one step", slot));
    }
    if (at == traces_delivered_) {
      deliver(traced, value);  // straight from the executor's buffer, while it is in cache
      deliver_arrived();
    } else {
      traced.value.assign(value.begin(), value.end());
      traced.arrived = true;
    }
    return;
  }
  assemble_micro_batch(traced, micro_batch, value);
}

// Micro-batch k of an activation holds, on each of the D data shards, the shard's k-th
// slice of rows: the value arrives as D blocks (device order) of B/(D*K) rows, and block d
// belongs at global row d*B/D + k*B/(D*K).
void TpuMeshEngine::assemble_micro_batch(TracedValue& traced, int micro_batch, std::span<const float> value) {
  traced.arrived = true;
  const TensorDesc& t = (*table_)[traced.tensor];
  const bool sliced = t.kind == TensorKind::Activation || t.kind == TensorKind::ActivationGrad;
  if (!sliced) {
    traced.value.assign(value.begin(), value.end());
    return;
  }
  traced.value.resize(static_cast<std::size_t>(t.numel()));
  const std::size_t row = static_cast<std::size_t>(t.numel() / t.shape[0]);
  const std::size_t shards = static_cast<std::size_t>(batch_shards_), block = value.size() / shards;
  const std::size_t shard_rows = static_cast<std::size_t>(t.shape[0]) / shards * row;  // one shard's rows, in floats
  for (std::size_t d = 0; d < shards; ++d) {
    std::copy(value.begin() + static_cast<std::ptrdiff_t>(d * block), value.begin() + static_cast<std::ptrdiff_t>((d + 1) * block),
              traced.value.begin() + static_cast<std::ptrdiff_t>(d * shard_rows + static_cast<std::size_t>(micro_batch) * block));
  }
}

void TpuMeshEngine::deliver(const TracedValue& traced, std::span<const float> value) {
  if (trace_sink() != nullptr) trace_sink()->on_trace(OpSite{traced.site, traced.layer, traced.phase}, traced.tensor, value);
  ++traces_delivered_;
}

// The sink sees the model's op order: values that arrived before an earlier slot's wait.
void TpuMeshEngine::deliver_arrived() {
  while (traces_delivered_ < traces_used_ && traces_[traces_delivered_].arrived) {
    deliver(traces_[traces_delivered_], traces_[traces_delivered_].value);
  }
}

void TpuMeshEngine::deliver_traces() {
  deliver_arrived();
  if (traces_delivered_ != traces_used_) {
    throw std::logic_error(fmt::format("tpu-mesh: trace slot {} of {} never ran", traces_delivered_, traces_used_));
  }
  traces_used_ = traces_delivered_ = 0;
}

// ---- host <-> device ---------------------------------------------------------------------

void TpuMeshEngine::upload(TensorId id, std::span<const float> values) {
  const TensorDesc& t = (*table_)[id];
  if (in_step_ && config_.leak_scalars && t.kind == TensorKind::Scalar && t.role.learning_rate) {
    // The trap, on purpose: the host value becomes a constant of the program.
    Node node{OpKind::Constant, t.name, -1, Phase::Optimizer, {id}, {values[0]}};
    pending_.nodes.push_back(std::move(node));
    return;
  }
  if (in_step_ && pending_uses(id)) cut_graph("upload", id);
  executor_.upload(id, values);
}

void TpuMeshEngine::upload_tokens(TensorId id, std::span<const std::int32_t> tokens) {
  if (in_step_ && pending_uses(id)) cut_graph("upload", id);
  executor_.upload_tokens(id, tokens);
}

std::span<const float> TpuMeshEngine::read(TensorId id) {
  if (in_step_) {
    if (!pending_.nodes.empty()) ++counters_.host_sync;
    cut_graph("read", id);
  }
  return executor_.assemble(id);
}

bool TpuMeshEngine::implements(OpKind op) const { return rules_of(op).lower != nullptr; }

bool TpuMeshEngine::pending_uses(TensorId id) const {
  for (const Node& node : pending_.nodes) {
    if (std::find(node.tensors.begin(), node.tensors.end(), id) != node.tensors.end()) return true;
  }
  return false;
}

// A transfer between traced ops must see their results: it cuts the graph there.
void TpuMeshEngine::cut_graph(const std::string& what, TensorId id) {
  if (pending_.nodes.empty()) return;
  const Node& last = pending_.nodes.back();
  breaks_.push_back({what, (*table_)[id].name, last.site, last.phase});
  flush();
}

// ---- step boundary -----------------------------------------------------------------------

void TpuMeshEngine::step_begin(int) {
  in_step_ = true;
  traces_used_ = traces_delivered_ = 0;  // a step cut short by an error left its own
  counters_ = CompileCounters{};
  segments_.clear();
  breaks_.clear();
  std::fill(step_peak_bytes_.begin(), step_peak_bytes_.end(), 0);
}

void TpuMeshEngine::step_end() {
  flush();
  in_step_ = false;
  deliver_traces();
}

// Timed as CompileTime from the lookup on: a warm start's disk load counts too.
std::shared_ptr<const Executable> TpuMeshEngine::lookup_or_compile(const Graph& graph, ProgramRole role,
                                                                   const std::string& fingerprint) {
  const auto start = std::chrono::steady_clock::now();
  const CacheLookup hit = cache_.find(fingerprint, [this](const Executable& exe) { return fits(exe); });
  if (hit.deserialize_failure) ++counters_.deserialize_failure;
  if (hit.disk_miss) ++counters_.persistent_miss;
  if (hit.source == CacheSource::Memory) ++counters_.cached_compile;
  if (hit.source == CacheSource::Disk) ++counters_.persistent_hit;
  if (hit.executable) {
    counters_.compile_seconds += seconds_since(start);
    return hit.executable;
  }
  std::shared_ptr<const Executable> exe = cache_.insert(compile(graph, *table_, config_, specs_, fingerprint, role));
  counters_.compile_seconds += seconds_since(start);
  ++counters_.uncached_compile;
  return exe;
}

// A program from disk must have been compiled for this mesh and these tensor blocks.
bool TpuMeshEngine::fits(const Executable& exe) const {
  if (exe.mesh_data != config_.mesh.data || exe.mesh_model != config_.mesh.model ||
      exe.micro_batches != config_.grad_accum) {
    return false;
  }
  for (const BufferInfo& b : exe.buffers) {
    if (!b.persistent) continue;
    if (b.tensor < 0 || static_cast<std::size_t>(b.tensor) >= table_->size()) return false;
    const TensorDesc& t = (*table_)[b.tensor];
    const std::int64_t slices = b.micro_slice == kWholeBuffer ? 1 : exe.micro_batches;
    if (!is_device_data(t.kind) || b.int32 != (t.dtype == DType::I32) ||
        b.numel * slices != local_numel(t.shape, specs_[static_cast<std::size_t>(b.tensor)], config_.mesh)) {
      return false;
    }
  }
  return exe.scratch_numel <= kMaxScratchNumel && exe.slab_numel <= kMaxSlabNumel;
}

// Step mode: the traced graph is one program. Micro-step mode: its forward+backward part
// runs once per micro-batch (the first program writes the gradients, the second adds to
// them), then its optimizer part: three programs, each compiled once.
void TpuMeshEngine::flush() {
  if (pending_.nodes.empty()) return;
  if (config_.compile_mode == CompileMode::Step) {
    execute(std::move(pending_), ProgramRole::Step, 1);
  } else {
    PhaseSplit parts = split_phases(pending_);
    if (!parts.gradients.nodes.empty()) {
      execute(parts.gradients, ProgramRole::GradCreate, 1);
      if (config_.grad_accum > 1) execute(parts.gradients, ProgramRole::GradAccumulate, config_.grad_accum - 1);
    }
    if (!parts.optimizer.nodes.empty()) execute(std::move(parts.optimizer), ProgramRole::Optimizer, 1);
  }
  pending_ = Graph{};
}

// Compile-or-lookup once, then run `runs` times; the accumulating program starts at
// micro-batch 1 (micro-batch 0 is the creating program's).
void TpuMeshEngine::execute(Graph graph, ProgramRole role, int runs) {
  const auto start = std::chrono::steady_clock::now();
  const std::string flags = fmt::format("{};program={}", config_.fingerprint_flags(), to_string(role));
  const std::string fp = fingerprint(graph, table_digest_, flags);
  counters_.compile_seconds += seconds_since(start);  // tracing overhead counts as compile time
  const std::shared_ptr<const Executable> exe = lookup_or_compile(graph, role, fp);
  const int first_micro_batch = role == ProgramRole::GradAccumulate ? 1 : 0;
  const auto run_start = std::chrono::steady_clock::now();
  for (int k = 0; k < runs; ++k) executor_.run(*exe, first_micro_batch + k);
  counters_.execute_seconds += seconds_since(run_start);
  note_memory(*exe);
  segments_.push_back({std::move(graph), fp, std::string(to_string(role))});
}

void TpuMeshEngine::note_memory(const Executable& exe) {
  for (int c = 0; c < kMemoryCategories; ++c) {
    auto& peak = step_peak_bytes_[static_cast<std::size_t>(c)];
    peak = std::max(peak, exe.peak_bytes[static_cast<std::size_t>(c)]);
  }
  step_peak_bytes_.back() = std::max(step_peak_bytes_.back(), exe.peak_total_bytes);
}

// ---- ops: traced, not executed -----------------------------------------------------------

void TpuMeshEngine::record_node(OpKind op, const OpSite& site, std::vector<TensorId> tensors, std::vector<float> attrs) {
  if (!in_step_) throw std::logic_error("tpu-mesh: an op outside step_begin()/step_end()");
  const OpDescription& d = describe(op);
  if (!d.takes(tensors.size()) || attrs.size() != d.node_attribute_floats()) {
    throw std::logic_error(fmt::format("tpu-mesh: {} recorded with {} operands and {} attribute values, against its "
                                       "description", d.name, tensors.size(), attrs.size()));
  }
  pending_.nodes.push_back({op, std::string(site.name), site.layer, site.phase, std::move(tensors), std::move(attrs)});
}

void TpuMeshEngine::zero(TensorId id) {
  const TensorDesc& t = (*table_)[id];
  record<OpKind::Zero>(OpSite{t.name, -1, Phase::Forward}, {id});
}

void TpuMeshEngine::encoder_forward(const OpSite& s, TensorId out, TensorId inputs, TensorId wte, TensorId wpe) {
  record<OpKind::EncoderForward>(s, {out, inputs, wte, wpe});
}
void TpuMeshEngine::encoder_backward(const OpSite& s, TensorId dwte, TensorId dwpe, TensorId dout, TensorId inputs) {
  record<OpKind::EncoderBackward>(s, {dwte, dwpe, dout, inputs});
}
void TpuMeshEngine::layernorm_forward(const OpSite& s, TensorId out, TensorId mean, TensorId rstd, TensorId inp,
                                      TensorId weight, TensorId bias, float eps) {
  record<OpKind::LayerNormForward>(s, {out, mean, rstd, inp, weight, bias}, {eps});
}
void TpuMeshEngine::layernorm_backward(const OpSite& s, TensorId dinp, TensorId dweight, TensorId dbias, TensorId dout,
                                       TensorId inp, TensorId weight, TensorId mean, TensorId rstd) {
  record<OpKind::LayerNormBackward>(s, {dinp, dweight, dbias, dout, inp, weight, mean, rstd});
}
void TpuMeshEngine::linear_forward(const OpSite& s, TensorId out, TensorId inp, TensorId weight, TensorId bias) {
  record<OpKind::LinearForward>(s, {out, inp, weight, bias});
}
void TpuMeshEngine::linear_backward(const OpSite& s, TensorId dinp, TensorId dweight, TensorId dbias, TensorId dout,
                                    TensorId inp, TensorId weight) {
  record<OpKind::LinearBackward>(s, {dinp, dweight, dbias, dout, inp, weight});
}
void TpuMeshEngine::attention_forward(const OpSite& s, TensorId out, TensorId att, TensorId qkv) {
  record<OpKind::AttentionForward>(s, {out, att, qkv});
}
void TpuMeshEngine::attention_backward(const OpSite& s, TensorId dqkv, TensorId dout, TensorId qkv, TensorId att) {
  record<OpKind::AttentionBackward>(s, {dqkv, dout, qkv, att});
}
void TpuMeshEngine::rmsnorm_forward(const OpSite& s, TensorId out, TensorId rstd, TensorId inp, TensorId weight,
                                    float eps) {
  record<OpKind::RmsNormForward>(s, {out, rstd, inp, weight}, {eps});
}
void TpuMeshEngine::rmsnorm_backward(const OpSite& s, TensorId dinp, TensorId dweight, TensorId dout, TensorId inp,
                                     TensorId weight, TensorId rstd) {
  record<OpKind::RmsNormBackward>(s, {dinp, dweight, dout, inp, weight, rstd});
}
void TpuMeshEngine::rope_forward(const OpSite& s, TensorId out, TensorId inp, int head_size, double theta) {
  std::vector<float> attrs{static_cast<float>(head_size)};
  for (float half : double_attrs(theta)) attrs.push_back(half);
  record<OpKind::RopeForward>(s, {out, inp}, std::move(attrs));
}
void TpuMeshEngine::rope_backward(const OpSite& s, TensorId dinp, TensorId dout, int head_size, double theta) {
  std::vector<float> attrs{static_cast<float>(head_size)};
  for (float half : double_attrs(theta)) attrs.push_back(half);
  record<OpKind::RopeBackward>(s, {dinp, dout}, std::move(attrs));
}
void TpuMeshEngine::swiglu_forward(const OpSite& s, TensorId out, TensorId gate, TensorId up) {
  record<OpKind::SwigluForward>(s, {out, gate, up});
}
void TpuMeshEngine::swiglu_backward(const OpSite& s, TensorId dgate, TensorId dup, TensorId dout, TensorId gate,
                                    TensorId up) {
  record<OpKind::SwigluBackward>(s, {dgate, dup, dout, gate, up});
}
void TpuMeshEngine::gqa_attention_forward(const OpSite& s, TensorId out, TensorId att, TensorId q, TensorId k,
                                          TensorId v) {
  record<OpKind::GqaAttentionForward>(s, {out, att, q, k, v});
}
void TpuMeshEngine::gqa_attention_backward(const OpSite& s, TensorId dq, TensorId dk, TensorId dv, TensorId dout,
                                           TensorId q, TensorId k, TensorId v, TensorId att) {
  record<OpKind::GqaAttentionBackward>(s, {dq, dk, dv, dout, q, k, v, att});
}
void TpuMeshEngine::moe_route_forward(const OpSite& s, TensorId weights, TensorId expert, TensorId slot,
                                      TensorId probs, TensorId routing, TensorId logits, int top_k, int capacity,
                                      float balance_coef) {
  record<OpKind::MoeRouteForward>(s, {weights, expert, slot, probs, routing, logits},
                                  {static_cast<float>(top_k), static_cast<float>(capacity), balance_coef});
}
void TpuMeshEngine::moe_route_backward(const OpSite& s, TensorId dlogits, TensorId dweights, TensorId probs,
                                       TensorId weights, TensorId expert, float balance_coef) {
  record<OpKind::MoeRouteBackward>(s, {dlogits, dweights, probs, weights, expert}, {balance_coef});
}
void TpuMeshEngine::moe_dispatch_forward(const OpSite& s, TensorId expert_in, TensorId inp, TensorId expert,
                                         TensorId slot) {
  record<OpKind::MoeDispatchForward>(s, {expert_in, inp, expert, slot});
}
void TpuMeshEngine::moe_dispatch_backward(const OpSite& s, TensorId dinp, TensorId dexpert_in, TensorId expert,
                                          TensorId slot) {
  record<OpKind::MoeDispatchBackward>(s, {dinp, dexpert_in, expert, slot});
}
void TpuMeshEngine::moe_combine_forward(const OpSite& s, TensorId out, TensorId expert_out, TensorId weights,
                                        TensorId expert, TensorId slot) {
  record<OpKind::MoeCombineForward>(s, {out, expert_out, weights, expert, slot});
}
void TpuMeshEngine::moe_combine_backward(const OpSite& s, TensorId dexpert_out, TensorId dweights, TensorId dout,
                                         TensorId expert_out, TensorId weights, TensorId expert, TensorId slot) {
  record<OpKind::MoeCombineBackward>(s, {dexpert_out, dweights, dout, expert_out, weights, expert, slot});
}
void TpuMeshEngine::expert_linear_forward(const OpSite& s, TensorId out, TensorId inp, TensorId weight) {
  record<OpKind::ExpertLinearForward>(s, {out, inp, weight});
}
void TpuMeshEngine::expert_linear_backward(const OpSite& s, TensorId dinp, TensorId dweight, TensorId dout,
                                           TensorId inp, TensorId weight) {
  record<OpKind::ExpertLinearBackward>(s, {dinp, dweight, dout, inp, weight});
}
void TpuMeshEngine::gelu_forward(const OpSite& s, TensorId out, TensorId inp) { record<OpKind::GeluForward>(s, {out, inp}); }
void TpuMeshEngine::gelu_backward(const OpSite& s, TensorId dinp, TensorId inp, TensorId dout) {
  record<OpKind::GeluBackward>(s, {dinp, inp, dout});
}
void TpuMeshEngine::gelu_erf_forward(const OpSite& s, TensorId out, TensorId inp) {
  record<OpKind::GeluErfForward>(s, {out, inp});
}
void TpuMeshEngine::gelu_erf_backward(const OpSite& s, TensorId dinp, TensorId inp, TensorId dout) {
  record<OpKind::GeluErfBackward>(s, {dinp, inp, dout});
}
void TpuMeshEngine::residual_forward(const OpSite& s, TensorId out, TensorId a, TensorId b) {
  record<OpKind::ResidualForward>(s, {out, a, b});
}
void TpuMeshEngine::residual_backward(const OpSite& s, TensorId da, TensorId db, TensorId dout) {
  record<OpKind::ResidualBackward>(s, {da, db, dout});
}
void TpuMeshEngine::crossentropy_forward(const OpSite& s, TensorId loss, TensorId probs, TensorId logits,
                                         TensorId targets) {
  record<OpKind::CrossEntropyForward>(s, {loss, probs, logits, targets});
}
void TpuMeshEngine::crossentropy_backward(const OpSite& s, TensorId dlogits, TensorId probs, TensorId targets) {
  record<OpKind::CrossEntropyBackward>(s, {dlogits, probs, targets});
}
void TpuMeshEngine::global_norm(const OpSite& s, TensorId norm, std::span<const TensorId> tensors) {
  std::vector<TensorId> operands{norm};
  operands.insert(operands.end(), tensors.begin(), tensors.end());
  record_node(OpKind::GlobalNorm, s, std::move(operands));
}
void TpuMeshEngine::clip_by_norm(const OpSite& s, std::span<const TensorId> tensors, TensorId norm, float max_norm) {
  std::vector<TensorId> operands{norm};
  operands.insert(operands.end(), tensors.begin(), tensors.end());
  record_node(OpKind::ClipByNorm, s, std::move(operands), {max_norm});
}
void TpuMeshEngine::adamw_update(const OpSite& s, TensorId param, TensorId grad, TensorId m, TensorId v, TensorId lr,
                                 TensorId bias_correction1, TensorId bias_correction2, const AdamWConfig& c) {
  record<OpKind::AdamW>(s, {param, grad, m, v, lr, bias_correction1, bias_correction2},
         {c.beta1, c.beta2, c.eps, c.weight_decay});
}
void TpuMeshEngine::nudge_ulps(const OpSite& s, TensorId tensor, TensorId ulps) {
  record<OpKind::NudgeUlps>(s, {tensor, ulps});
}

}  // namespace harness::tpu
