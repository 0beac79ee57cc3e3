#include "accel_engine.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_reduce.h>

#include "kernels/deterministic_reduce.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/moe_ops.h"
#include "limited_accumulator_gemm.h"
#include "numerics/formats.h"

namespace harness::accel {
namespace {

using numerics::Fp8Format;
constexpr std::int64_t kElementGrain = 16384;

// out = fp8 grid values of x * scale, in parallel blocks.
void quantise(const float* x, float scale, float* out, std::int64_t n, Fp8Format format) {
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, n, kElementGrain), [&](const auto& r) {
    numerics::scale_round_to_fp8(x + r.begin(), scale, out + r.begin(), r.end() - r.begin(), format);
  });
}

// At least n floats in `buffer`: it only grows, so an operand buffer shared by tensors of
// several sizes is zero-filled once, not each time a larger one follows a smaller one.
void grow(std::vector<float>& buffer, std::int64_t n) {
  if (buffer.size() < static_cast<std::size_t>(n)) buffer.resize(static_cast<std::size_t>(n));
}

// The larger of two amaxes; a NaN wins (it marks the step).
float amax_of(float a, float b) { return a != a || b != b ? a + b : (a > b ? a : b); }

// max |x| in parallel blocks; max is order-free, so any split gives the same bits.
float parallel_amax(const float* x, std::int64_t n) {
  return tbb::parallel_reduce(
      tbb::blocked_range<std::int64_t>(0, n, kElementGrain), 0.0f,
      [&](const auto& r, float running) {
        return amax_of(numerics::tensor_amax(x + r.begin(), r.end() - r.begin()), running);
      },
      amax_of);
}

// quantise() and parallel_amax() of the same x in one pass: each block's amax and its
// quantised values while the block is in cache (for a scale that does not wait for the amax).
float quantise_with_amax(const float* x, float scale, float* out, std::int64_t n, Fp8Format format) {
  return tbb::parallel_reduce(
      tbb::blocked_range<std::int64_t>(0, n, kElementGrain), 0.0f,
      [&](const auto& r, float running) {
        numerics::scale_round_to_fp8(x + r.begin(), scale, out + r.begin(), r.end() - r.begin(), format);
        return amax_of(numerics::tensor_amax(x + r.begin(), r.end() - r.begin()), running);
      },
      amax_of);
}

// A zone's label in receipts and checkpoints: its layer, the weight's name without the
// trailing ".weight" ("blocks.2.mlp.fc"). A label only: the zone itself is the weight's role.
std::string layer_label(const std::string& weight_name) {
  constexpr std::string_view suffix = ".weight";
  return weight_name.ends_with(suffix) ? weight_name.substr(0, weight_name.size() - suffix.size()) : weight_name;
}

std::uint64_t choose_noise_seed(const AccelConfig& c) {
  if (c.noise != NoiseMode::Seeded) return 0;
  // 63 bits, so the seed fits the manifest's int64 attribute and --noise-seed reads it back.
  return c.noise_seed.value_or(entropy_seed() & static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()));
}

// A run of one tensor's elements whose squares global_norm sums as one fp32 partial.
struct NormBlock {
  const float* x;
  std::int64_t n;
};

// How many blocks' sums sums_of_squares runs side by side.
constexpr std::size_t kInterleavedBlocks = 8;

// sums[g] = x[0]^2 + x[1]^2 + ... of blocks[g], added one element at a time in fp32, for
// up to kInterleavedBlocks blocks. One block's sum is a chain of dependent additions, so
// alone it runs at one element per addition latency; the blocks' chains are independent,
// so interleaving them keeps several in flight, and every block's own additions keep
// their order: the same bits as one block at a time.
void sums_of_squares(const NormBlock* blocks, std::size_t count, float* sums) {
  float s[kInterleavedBlocks] = {};
  std::int64_t common = blocks[0].n;
  for (std::size_t g = 1; g < count; ++g) common = std::min(common, blocks[g].n);
  if (count == kInterleavedBlocks) {
    for (std::int64_t i = 0; i < common; ++i) {
      for (std::size_t g = 0; g < kInterleavedBlocks; ++g) s[g] += blocks[g].x[i] * blocks[g].x[i];
    }
  } else {
    common = 0;
  }
  for (std::size_t g = 0; g < count; ++g) {
    for (std::int64_t i = common; i < blocks[g].n; ++i) s[g] += blocks[g].x[i] * blocks[g].x[i];
    sums[g] = s[g];
  }
}

}  // namespace

AccelEngine::AccelEngine(const AccelConfig& config) : config_(config), noise_(config.noise, choose_noise_seed(config)) {}

void AccelEngine::bind(const TensorTable& table) {
  t_.bind(table);
  prepared_.clear();  // another model's weights, maybe of other shapes
  zones_.clear();
  zone_index_.clear();
  for (TensorId id : table.of_kind(TensorKind::Parameter)) {
    if ((zone_bit(table[id].role.fp8_zone) & config_.fp8_zones) == 0) continue;
    zone_index_[id] = zones_.size();
    zones_.push_back({layer_label(table[id].name), numerics::Fp8ScalingState(Fp8Format::E4M3, config_.scaling),
                      numerics::Fp8ScalingState(Fp8Format::E4M3, config_.scaling),
                      numerics::Fp8ScalingState(Fp8Format::E5M2, config_.scaling), 1.0f, 1.0f, {}, kNoTensor, -1});
  }
}

void AccelEngine::check_table(const TensorTable& table) const {
  unsigned covered = 0;
  for (TensorId id : table.of_kind(TensorKind::Parameter)) covered |= zone_bit(table[id].role.fp8_zone);
  for (unsigned zone = 1; zone != 0 && zone <= config_.fp8_zones; zone <<= 1) {
    if ((config_.fp8_zones & zone) != 0 && (covered & zone) == 0) {
      throw std::invalid_argument(fmt::format("--features: FP8 zone {} covers no weight of this canary; name the "
                                              "zones its weights are in (fp8=qkv,attn_proj: moe's experts are in "
                                              "no FP8 zone yet)",
                                              zone_name(zone)));
    }
  }
}

void AccelEngine::upload(TensorId id, std::span<const float> values) {
  t_.upload(id, values);
  values_changed(id);
}

void AccelEngine::zero(TensorId id) {
  t_.zero(id);
  values_changed(id);
}

void AccelEngine::values_changed(TensorId id) {
  if (const auto it = prepared_.find(id); it != prepared_.end()) it->second.current = false;
}

void AccelEngine::step_begin(int step) {
  step_ = step;
  noise_.begin_step(step);
  for (auto& [weight, prepared] : prepared_) prepared.current = false;  // the optimizer changed the weights
}

void AccelEngine::step_end() {
  last_step_fp8_ = {};
  for (ZoneScaling& z : zones_) {
    for (numerics::Fp8ScalingState* role : {&z.input, &z.weight, &z.grad_output}) {
      last_step_fp8_.amax.push_back(role->step_amax());
      last_step_fp8_.scale.push_back(role->scale());
      role->end_step();
    }
  }
}

// Between steps the FP8 state is each role's scale and amax history; the noise has no
// state of its own (its orders are drawn from the seed and the step), so it is a fact.
EngineState AccelEngine::save_state() const {
  EngineState state;
  state.facts["noise"] = fmt::format("{}:{}", to_string(config_.noise), noise_.seed());
  for (const ZoneScaling& z : zones_) {
    for (const auto& [role, scaling] : roles(z)) {
      const std::string key = fmt::format("fp8/{}/{}", z.site, role);
      state.arrays[key + "/scale"] = {scaling->scale()};
      state.arrays[key + "/history"].assign(scaling->history().begin(), scaling->history().end());
    }
  }
  return state;
}

void AccelEngine::restore_state(const EngineState& state) {
  for (auto& [weight, prepared] : prepared_) prepared.current = false;  // quantised with the scales replaced here
  for (ZoneScaling& z : zones_) {
    for (const auto& [role, scaling] : roles(z)) {
      const std::string key = fmt::format("fp8/{}/{}", z.site, role);
      const auto scale = state.arrays.find(key + "/scale");
      const auto history = state.arrays.find(key + "/history");
      if (scale == state.arrays.end() || history == state.arrays.end() || scale->second.size() != 1) {
        throw std::invalid_argument(fmt::format("checkpoint: no FP8 scaling state for {} (saved without these FP8 zones?)", key));
      }
      scaling->restore(scale->second[0], history->second);
    }
  }
}

Engine::ReductionOrder AccelEngine::reduction_order() const {
  switch (config_.noise) {
    case NoiseMode::Seeded: return ReductionOrder::kSeeded;
    case NoiseMode::Racy: return ReductionOrder::kRacy;
    case NoiseMode::Off: return ReductionOrder::kFixed;
  }
  return ReductionOrder::kFixed;
}

std::optional<Engine::ReductionSeed> AccelEngine::reduction_seed() const {
  if (config_.noise != NoiseMode::Seeded) return std::nullopt;
  return ReductionSeed{"noise-seed", static_cast<std::int64_t>(noise_.seed())};
}

// The manifest_attributes() and step_state() below, described (docs/engines/accel.md).
ReceiptEntries accel_receipt_entries() {
  const std::string writer = "accel", fp8 = "accel with FP8 zones";
  const auto setting = [](const char* name, ReceiptValue kind, const std::string& by, const char* meaning,
                          AttributeRole role = AttributeRole::kNone) {
    return ReceiptAttribute{fmt::format("/manifest/{}", name), kind, Presence::kOptional, 0, by, meaning, role};
  };
  using V = ReceiptValue;
  ReceiptEntries e;
  e.attributes = {setting("numerics", V::kString, writer, "fp32, or bf16 autocast with fp32 master weights"),
                  setting("noise_mode", V::kString, writer, "seeded, racy or off (the reduction order)",
                          AttributeRole::kReductionOrder),
                  setting("noise_seed", V::kInteger, writer, "the seeded reduction order's seed (--noise-seed)",
                          AttributeRole::kReductionSeed),
                  setting("fp8_zones", V::kString, writer, "none, or the FP8 zones"),
                  setting("fp8_format", V::kString, fp8, "the FP8 formats of each role"),
                  setting("fp8_recipe", V::kString, fp8, "delayed or current scaling"),
                  setting("fp8_amax_history", V::kInteger, fp8, "amax history length"),
                  setting("fp8_amax_algo", V::kString, fp8, "max or most_recent"),
                  setting("fp8_margin", V::kInteger, fp8, "scaling margin in powers of two"),
                  setting("fp8_accumulate", V::kString, fp8, "full, or limited:N")};
  e.groups = {{"/fp8", Presence::kOptional, 0, fp8, "per step, each FP8 role's amax and scale"}};
  e.datasets = {{"/fp8/names", ReceiptDtype::kString, {ReceiptDim::kAny}, false, "", Presence::kRequired, 0, fp8,
                 "<zone site>/<role>"},
                {"/fp8/*", ReceiptDtype::kFloat64, {ReceiptDim::kSteps, ReceiptDim::kColumns}, false, "/fp8/names",
                 Presence::kOptional, 0, fp8, "amax or scale of each role during step s"}};
  return e;
}

std::map<std::string, AttributeValue> AccelEngine::manifest_attributes() const {
  std::map<std::string, AttributeValue> a;
  a["numerics"] = std::string(config_.bf16 ? "bf16 autocast, fp32 master weights" : "fp32");
  a["noise_mode"] = std::string(to_string(config_.noise));
  if (config_.noise == NoiseMode::Seeded) a["noise_seed"] = static_cast<std::int64_t>(noise_.seed());
  std::vector<std::string> zones;
  for (unsigned zone : {kZoneQkv, kZoneAttnProj, kZoneMlpFc, kZoneMlpProj}) {
    if (config_.fp8_zones & zone) zones.push_back(zone_name(zone));
  }
  a["fp8_zones"] = zones.empty() ? std::string("none") : fmt::format("{}", fmt::join(zones, ","));
  if (config_.fp8()) {
    a["fp8_format"] = std::string("hybrid: e4m3 forward input and weight, e5m2 backward output-gradient");
    a["fp8_recipe"] = std::string(to_string(config_.scaling.recipe));
    a["fp8_amax_history"] = static_cast<std::int64_t>(config_.scaling.amax_history_len);
    a["fp8_amax_algo"] = std::string(to_string(config_.scaling.amax_algo));
    a["fp8_margin"] = static_cast<std::int64_t>(config_.scaling.margin);
    a["fp8_accumulate"] = config_.accumulate_interval == 0 ? std::string("full")
                                                           : fmt::format("limited:{}", config_.accumulate_interval);
  }
  return a;
}

std::vector<StepState> AccelEngine::step_state() const {
  if (zones_.empty()) return {};
  StepState s;
  s.group = "fp8";
  for (const ZoneScaling& z : zones_) {
    for (const char* role : {"/input", "/weight", "/grad_output"}) s.columns.push_back(z.site + role);
  }
  s.fields = {{"amax", last_step_fp8_.amax}, {"scale", last_step_fp8_.scale}};
  return {s};
}

// ---- numerics policy --------------------------------------------------------------------

bool AccelEngine::stores_bf16(TensorId id) const {
  // Under bf16, activations and their gradients live in bf16; softmax/LayerNorm statistics,
  // the loss's probabilities, parameters, gradients and optimizer state stay fp32.
  if (!config_.bf16) return false;
  const TensorDesc& d = t_.desc(id);
  if (d.kind != TensorKind::Activation && d.kind != TensorKind::ActivationGrad) return false;
  return !d.role.fp32_statistic;
}

void AccelEngine::store(TensorId id) {
  if (!stores_bf16(id)) return;
  float* x = f32(id);
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, t_.numel(id), kElementGrain),
                    [&](const auto& r) { numerics::round_to_bf16_inplace(x + r.begin(), r.end() - r.begin()); });
}

Engine::OpNumerics AccelEngine::op_numerics(OpKind op, const OpSite& site, std::span<const TensorId> operands) {
  const OpDescription& d = describe(op);
  OpNumerics n;
  UnitNumerics unit;  // a unit's numerics apply to the linears' GEMMs; any other op's: none (bf16 stores)
  // The ops whose GEMMs read a prepared weight under its unit's numerics (linear_forward,
  // linear_backward): the products' operands are the weight as prepared_weight makes it
  // and activations as stored.
  if (op == OpKind::LinearForward || op == OpKind::LinearBackward) {
    const TensorId weight = operands[d.index_of("weight")];
    unit = unit_numerics(site, weight);
    if (unit.zone != nullptr) {
      n.scaled = fp8_operands(op, operands, unit);
      n.descale_roundings = 4;  // output_scale = fl(fl(1/s_a) fl(1/s_b)), then each partial's multiply
      n.accumulator = {config_.accumulate_interval, kLimitedAccumulatorFractionBits};  // interval 0: fp32
    }
    if (weight_in_bf16(weight, unit)) n.operands = numerics::Precision::Bf16;
  }
  const bool attention = op == OpKind::AttentionForward || op == OpKind::GqaAttentionForward;
  for (std::size_t i = 0; i < operands.size(); ++i) {
    // att is saved, not a result: the kernel rounds it itself (probabilities_in_bf16).
    const bool probabilities = attention && d.operands[i].name == "att" && probabilities_in_bf16();
    const bool bf16 = operands[i] != kNoTensor && ((d.result(i) && result_in_bf16(operands[i], unit)) || probabilities);
    n.results.push_back(bf16 ? numerics::Precision::Bf16 : numerics::Precision::Fp32);
  }
  return n;
}

std::vector<std::optional<Engine::OpNumerics::Scaled>> AccelEngine::fp8_operands(OpKind op,
                                                                                 std::span<const TensorId> operands,
                                                                                 const UnitNumerics& unit) const {
  // As declared: the forward's operands in E4M3 and the output gradient in E5M2 (hybrid),
  // each with its role's scale; --fp8-e5m2 and --fp8-saturate are faults, undeclared.
  const float overscale = unit.saturate ? kSaturatingOverscale : 1.0f;  // a power of two: exact
  const auto scaled = [&](Fp8Format format, float used) {
    return OpNumerics::Scaled{numerics::fp8_precision(format), static_cast<double>(used / overscale)};
  };
  const OpDescription& d = describe(op);
  std::vector<std::optional<OpNumerics::Scaled>> s(operands.size());
  s[d.index_of("inp")] = scaled(Fp8Format::E4M3, unit.zone->input_scale);
  s[d.index_of("weight")] = scaled(Fp8Format::E4M3, prepared_.at(operands[d.index_of("weight")]).scale);
  if (op == OpKind::LinearBackward) s[d.index_of("dout")] = scaled(Fp8Format::E5M2, unit.zone->grad_output_scale);
  return s;
}

bool AccelEngine::weight_in_bf16(TensorId weight, const UnitNumerics& unit) const {
  return config_.bf16 && !t_.desc(weight).role.fp32_weight && !unit.fp32;
}

AccelEngine::UnitNumerics AccelEngine::unit_numerics(const OpSite& site, TensorId weight) {
  const ZoneUnit unit{zone_bit(t_.desc(weight).role.fp8_zone), site.layer};
  UnitNumerics u;
  u.fp32 = config_.bf16_off.count(unit) != 0;
  const auto it = zone_index_.find(weight);
  if (it == zone_index_.end() || u.fp32 || config_.fp8_off.count(unit) != 0) return u;
  u.zone = &zones_[it->second];
  u.format = config_.fp8_e5m2.count(unit) != 0 ? Fp8Format::E5M2 : Fp8Format::E4M3;
  u.saturate = config_.fp8_saturate.count(unit) != 0;
  return u;
}

const AccelEngine::PreparedWeight& AccelEngine::prepared_weight(TensorId weight, const UnitNumerics& unit) {
  PreparedWeight& p = prepared_[weight];
  if (p.current) return p;
  const TensorDesc& d = t_.desc(weight);  // (OC, C), or (E, OC, C)
  if (unit.zone != nullptr) {
    p.scale = scaled_fp8_operand(weight, unit.zone->weight, unit.format, unit.saturate, p.rows).scale;
  } else {
    const float* w = f32(weight);
    p.rows.assign(w, w + d.numel());
    if (weight_in_bf16(weight, unit)) numerics::round_to_bf16_inplace(p.rows.data(), d.numel());
  }
  p.transposed.resize(p.rows.size());
  const int OC = static_cast<int>(d.dim(d.rank() - 2)), C = static_cast<int>(d.dim(d.rank() - 1));
  const std::int64_t block = static_cast<std::int64_t>(OC) * C;
  for (std::int64_t at = 0; at < d.numel(); at += block) {
    kernels::transpose(p.rows.data() + at, OC, C, p.transposed.data() + at);
  }
  p.current = true;
  return p;
}

const float* AccelEngine::fp8_operand(TensorId id, float scale, Fp8Format format, std::vector<float>& buffer) {
  const float* x = f32(id);
  grow(buffer, t_.numel(id));
  quantise(x, scale, buffer.data(), t_.numel(id), format);
  return buffer.data();
}

AccelEngine::ScaledOperand AccelEngine::scaled_fp8_operand(TensorId id, numerics::Fp8ScalingState& role,
                                                           Fp8Format format, bool saturate,
                                                           std::vector<float>& buffer) {
  const float* x = f32(id);
  const std::int64_t n = t_.numel(id);
  grow(buffer, n);
  const float overscale = saturate ? kSaturatingOverscale : 1.0f;
  if (!role.scale_precedes_amax()) {  // the scale needs this tensor's amax: two passes
    const float scale = role.scale_for(parallel_amax(x, n)) * overscale;
    quantise(x, scale, buffer.data(), n, format);
    return {buffer.data(), scale};
  }
  const float scale = role.scale() * overscale;  // what scale_for() returns below, whatever the amax
  role.scale_for(quantise_with_amax(x, scale, buffer.data(), n, format));
  return {buffer.data(), scale};
}

// ---- ops ----------------------------------------------------------------------------------

void AccelEngine::encoder_forward(const OpSite&, TensorId out, TensorId inputs, TensorId wte, TensorId wpe) {
  const TensorDesc& o = t_.desc(out);  // (B,T,C)
  kernels::encoder_forward(f32(out), t_.i32(inputs), f32(wte), wpe == kNoTensor ? nullptr : f32(wpe), int(o.dim(0)),
                           int(o.dim(1)), int(o.dim(2)));
  store(out);
}

void AccelEngine::encoder_backward(const OpSite&, TensorId dwte, TensorId dwpe, TensorId dout, TensorId inputs) {
  const TensorDesc& o = t_.desc(dout);
  ReduceContext ctx = reduce_context();
  accel::encoder_backward(ctx, f32(dwte), dwpe == kNoTensor ? nullptr : f32(dwpe), f32(dout), t_.i32(inputs), int(o.dim(0)), int(o.dim(1)),
                          int(o.dim(2)), int(t_.desc(dwte).dim(0)));
}

void AccelEngine::layernorm_forward(const OpSite&, TensorId out, TensorId mean, TensorId rstd, TensorId inp,
                                    TensorId weight, TensorId bias, float eps) {
  kernels::layernorm_forward(f32(out), f32(mean), f32(rstd), f32(inp), f32(weight), f32(bias), int(t_.rows(inp)),
                             t_.last_dim(inp), eps);
  store(out);
}

void AccelEngine::layernorm_backward(const OpSite&, TensorId dinp, TensorId dweight, TensorId dbias, TensorId dout,
                                     TensorId inp, TensorId weight, TensorId mean, TensorId rstd) {
  ReduceContext ctx = reduce_context();
  accel::layernorm_backward(ctx, f32(dinp), f32(dweight), f32(dbias), f32(dout), f32(inp), f32(weight), f32(mean),
                            f32(rstd), int(t_.rows(inp)), t_.last_dim(inp));
  store(dinp);
}

void AccelEngine::linear_forward(const OpSite& site, TensorId out, TensorId inp, TensorId weight, TensorId bias) {
  const TensorDesc& wd = t_.desc(weight);  // (OC,C)
  const int N = int(t_.rows(inp)), C = int(wd.dim(1)), OC = int(wd.dim(0));
  const UnitNumerics unit = unit_numerics(site, weight);
  ZoneScaling* zone = unit.zone;
  const PreparedWeight& w = prepared_weight(weight, unit);
  const float* a = f32(inp);
  GemmNumerics fp8_gemm;
  if (zone != nullptr) {
    const ScaledOperand input = scaled_fp8_operand(inp, zone->input, unit.format, unit.saturate, zone->quantised_input);
    a = input.values;
    zone->input_scale = input.scale;
    zone->quantised_from = inp;
    zone->quantised_step = step_;
    fp8_gemm = {(1.0f / zone->input_scale) * (1.0f / w.scale), config_.accumulate_interval};
  }
  // out = bias, then the split-K partial products added in the noise source's order, then
  // stored: each row tile in turn, while it is in cache.
  const SplitKOutput output{bias == kNoTensor ? SplitKOutput::Start::Zero : SplitKOutput::Start::Row,
                            bias == kNoTensor ? nullptr : f32(bias), result_in_bf16(out, unit)};
  ReduceContext ctx = reduce_context();
  split_k_gemm(ctx, N, OC, C, a, C, w.transposed.data(), OC, f32(out), split_k_chunk(N, OC, C), fp8_gemm, output);
}

void AccelEngine::linear_backward(const OpSite& site, TensorId dinp, TensorId dweight, TensorId dbias,
                                  TensorId dout, TensorId inp, TensorId weight) {
  const TensorDesc& wd = t_.desc(weight);
  const int N = int(t_.rows(inp)), C = int(wd.dim(1)), OC = int(wd.dim(0));
  const UnitNumerics unit = unit_numerics(site, weight);
  ZoneScaling* zone = unit.zone;
  const PreparedWeight& w = prepared_weight(weight, unit);
  const float* dy = f32(dout);
  const float* x = f32(inp);
  GemmNumerics dgrad, wgrad;
  if (zone != nullptr) {
    const ScaledOperand grad_output =
        scaled_fp8_operand(dout, zone->grad_output, Fp8Format::E5M2, unit.saturate, operand_a_);
    dy = grad_output.values;
    const float dy_scale = grad_output.scale;
    zone->grad_output_scale = dy_scale;
    // The input as this step's forward quantised it (quantised again only when the backward
    // runs without that forward, the same values either way).
    x = zone->quantised_from == inp && zone->quantised_step == step_
            ? zone->quantised_input.data()
            : fp8_operand(inp, zone->input_scale, unit.format, operand_b_);
    dgrad = {(1.0f / dy_scale) * (1.0f / w.scale), config_.accumulate_interval};
    wgrad = {(1.0f / dy_scale) * (1.0f / zone->input_scale), config_.accumulate_interval};
  }
  ReduceContext ctx = reduce_context();
  // forward: out[n][o] = sum_c inp[n][c] * weight[o][c] + bias[o]
  // dinp (N,C) += dout (N,OC) @ weight (OC,C), split over OC
  split_k_gemm(ctx, N, C, OC, dy, OC, w.rows.data(), C, f32(dinp), split_k_chunk(N, C, OC), dgrad,
               {SplitKOutput::Start::Accumulate, nullptr, result_in_bf16(dinp, unit)});
  // dweight (OC,C) += dout^T (OC,N) @ inp (N,C), split over tokens
  kernels::transpose(dy, N, OC, t_.scratch());
  split_k_gemm(ctx, OC, C, N, t_.scratch(), N, x, C, f32(dweight), kTokenChunk, wgrad);
  if (dbias != kNoTensor) token_sum(ctx, f32(dout), N, OC, f32(dbias));
}

void AccelEngine::attention_forward(const OpSite&, TensorId out, TensorId att, TensorId qkv) {
  const TensorDesc& a = t_.desc(att);  // (B,NH,T,T)
  const int C = int(t_.desc(out).dim(2)), NH = int(a.dim(1));
  const float* x = f32(qkv);  // (B,T,3C): [q | k | v] per token
  const AttentionHeads heads{x, x + C, x + 2 * C, 3 * C, 3 * C, NH, NH, C / NH};
  accel::gqa_attention_forward(f32(out), C, f32(att), heads, int(a.dim(0)), int(a.dim(2)), probabilities_in_bf16());
  store(out);
}

void AccelEngine::attention_backward(const OpSite&, TensorId dqkv, TensorId dout, TensorId qkv, TensorId att) {
  const TensorDesc& a = t_.desc(att);
  const int C = int(t_.desc(dout).dim(2)), NH = int(a.dim(1));
  const float* x = f32(qkv);
  float* dx = f32(dqkv);
  const AttentionHeads heads{x, x + C, x + 2 * C, 3 * C, 3 * C, NH, NH, C / NH};
  accel::gqa_attention_backward(noise_, {noise_.take_reduction_index()}, {dx, dx + C, dx + 2 * C}, f32(dout), C, heads,
                                f32(att), int(a.dim(0)), int(a.dim(2)), config_.bf16);
  store(dqkv);
}

// ---- the llama ops: elementwise ones reuse cpu-ref's kernels, then store in bf16 ---------

void AccelEngine::rmsnorm_forward(const OpSite&, TensorId out, TensorId rstd, TensorId inp, TensorId weight, float eps) {
  kernels::rmsnorm_forward(f32(out), f32(rstd), f32(inp), f32(weight), int(t_.rows(inp)), t_.last_dim(inp), eps);
  store(out);
}

void AccelEngine::rmsnorm_backward(const OpSite&, TensorId dinp, TensorId dweight, TensorId dout, TensorId inp,
                                   TensorId weight, TensorId rstd) {
  ReduceContext ctx = reduce_context();
  accel::rmsnorm_backward(ctx, f32(dinp), f32(dweight), f32(dout), f32(inp), f32(weight), f32(rstd),
                          int(t_.rows(inp)), t_.last_dim(inp));
  store(dinp);
}

void AccelEngine::rope_forward(const OpSite&, TensorId out, TensorId inp, int head_size, double theta) {
  const TensorDesc& x = t_.desc(inp);  // (B,T,heads*head_size)
  const kernels::RopeTables& r = rope_tables_.get(int(x.dim(1)), head_size, theta);
  kernels::rope_forward(f32(out), f32(inp), r.cos.data(), r.sin.data(), int(x.dim(0)), int(x.dim(1)),
                        int(x.dim(2) / head_size), head_size);
  store(out);
}

void AccelEngine::rope_backward(const OpSite&, TensorId dinp, TensorId dout, int head_size, double theta) {
  const TensorDesc& x = t_.desc(dout);
  const kernels::RopeTables& r = rope_tables_.get(int(x.dim(1)), head_size, theta);
  kernels::rope_backward(f32(dinp), f32(dout), r.cos.data(), r.sin.data(), int(x.dim(0)), int(x.dim(1)),
                         int(x.dim(2) / head_size), head_size);
  store(dinp);
}

void AccelEngine::swiglu_forward(const OpSite&, TensorId out, TensorId gate, TensorId up) {
  kernels::swiglu_forward(f32(out), f32(gate), f32(up), t_.numel(out));
  store(out);
}

void AccelEngine::swiglu_backward(const OpSite&, TensorId dgate, TensorId dup, TensorId dout, TensorId gate,
                                  TensorId up) {
  kernels::swiglu_backward(f32(dgate), f32(dup), f32(dout), f32(gate), f32(up), t_.numel(dout));
  store(dgate);
  store(dup);
}

AttentionHeads AccelEngine::gqa_heads(TensorId att, TensorId q, TensorId k, TensorId v) {
  const int NH = int(t_.desc(att).dim(1)), q_ld = t_.last_dim(q), kv_ld = t_.last_dim(k), hd = q_ld / NH;
  return {f32(q), f32(k), f32(v), q_ld, kv_ld, NH, kv_ld / hd, hd};
}

void AccelEngine::gqa_attention_forward(const OpSite&, TensorId out, TensorId att, TensorId q, TensorId k, TensorId v) {
  const TensorDesc& a = t_.desc(att);  // (B,NH,T,T)
  accel::gqa_attention_forward(f32(out), t_.last_dim(out), f32(att), gqa_heads(att, q, k, v), int(a.dim(0)),
                               int(a.dim(2)), probabilities_in_bf16());
  store(out);
}

void AccelEngine::gqa_attention_backward(const OpSite&, TensorId dq, TensorId dk, TensorId dv, TensorId dout,
                                         TensorId q, TensorId k, TensorId v, TensorId att) {
  const TensorDesc& a = t_.desc(att);
  accel::gqa_attention_backward(noise_, {noise_.take_reduction_index()}, {f32(dq), f32(dk), f32(dv)}, f32(dout),
                                t_.last_dim(dout), gqa_heads(att, q, k, v), f32(att), int(a.dim(0)), int(a.dim(2)),
                                config_.bf16);
  store(dq);
  store(dk);
  store(dv);
}

void AccelEngine::gelu_forward(const OpSite&, TensorId out, TensorId inp) {
  kernels::gelu_forward(f32(out), f32(inp), t_.numel(inp));
  store(out);
}

void AccelEngine::gelu_backward(const OpSite&, TensorId dinp, TensorId inp, TensorId dout) {
  kernels::gelu_backward(f32(dinp), f32(inp), f32(dout), t_.numel(inp));
  store(dinp);
}

void AccelEngine::gelu_erf_forward(const OpSite&, TensorId out, TensorId inp) {
  kernels::gelu_erf_forward(f32(out), f32(inp), t_.numel(inp));
  store(out);
}

void AccelEngine::gelu_erf_backward(const OpSite&, TensorId dinp, TensorId inp, TensorId dout) {
  kernels::gelu_erf_backward(f32(dinp), f32(inp), f32(dout), t_.numel(inp));
  store(dinp);
}

void AccelEngine::residual_forward(const OpSite&, TensorId out, TensorId a, TensorId b) {
  kernels::residual_forward(f32(out), f32(a), f32(b), t_.numel(out));
  store(out);
}

void AccelEngine::residual_backward(const OpSite&, TensorId da, TensorId db, TensorId dout) {
  kernels::add_inplace(f32(da), f32(dout), t_.numel(dout));
  kernels::add_inplace(f32(db), f32(dout), t_.numel(dout));
  store(da);
  store(db);
}

void AccelEngine::crossentropy_forward(const OpSite&, TensorId loss, TensorId probs, TensorId logits, TensorId targets) {
  const int N = int(t_.rows(logits));
  std::vector<float> losses(static_cast<std::size_t>(N));
  kernels::crossentropy_rows(f32(probs), losses.data(), f32(logits), t_.i32(targets), N, t_.last_dim(logits));
  ReduceContext ctx = reduce_context();
  *f32(loss) = noisy_sum(ctx, losses.data(), N) / static_cast<float>(N);
}

void AccelEngine::crossentropy_backward(const OpSite&, TensorId dlogits, TensorId probs, TensorId targets) {
  kernels::crossentropy_backward(f32(dlogits), f32(probs), t_.i32(targets), int(t_.rows(probs)), t_.last_dim(probs));
  store(dlogits);
}

void AccelEngine::global_norm(const OpSite&, TensorId norm, std::span<const TensorId> tensors) {
  // fp32 sums of squares per block of every tensor (as a GPU's per-block partials), the
  // blocks added in the noise source's order.
  std::vector<NormBlock> blocks;
  for (TensorId id : tensors) {
    for (std::int64_t at = 0; at < t_.numel(id); at += kernels::kElementBlock) {
      blocks.push_back({f32(id) + at, std::min<std::int64_t>(kernels::kElementBlock, t_.numel(id) - at)});
    }
  }
  float total = 0.0f;
  const Reduction reduction{noise_.take_reduction_index()};
  const int parts = static_cast<int>(blocks.size());
  if (noise_.mode() == NoiseMode::Racy) {  // each block's sum is a task: their completion order is the noise
    reduce_parts(noise_, reduction, parts, 1, &total, workspace_,
                 [&](int part, float* partial) { sums_of_squares(&blocks[static_cast<std::size_t>(part)], 1, partial); });
  } else {  // the blocks' sums first, interleaved, then added in the noise source's order
    std::vector<float> block_sums(blocks.size());
    const std::size_t groups = (blocks.size() + kInterleavedBlocks - 1) / kInterleavedBlocks;
    tbb::parallel_for(std::size_t{0}, groups, [&](std::size_t group) {
      const std::size_t first = group * kInterleavedBlocks;
      sums_of_squares(&blocks[first], std::min(kInterleavedBlocks, blocks.size() - first), &block_sums[first]);
    });
    reduce_parts(noise_, reduction, parts, 1, &total, workspace_,
                 [&](int part, float* partial) { *partial = block_sums[static_cast<std::size_t>(part)]; },
                 /*serial_parts=*/true);
  }
  *f32(norm) = __builtin_sqrtf(total);
}

void AccelEngine::clip_by_norm(const OpSite&, std::span<const TensorId> tensors, TensorId norm, float max_norm) {
  const float n = scalar(norm);
  if (!(n > max_norm)) return;
  const float factor = max_norm / (n + 1e-6f);
  for (TensorId id : tensors) kernels::scale_inplace(f32(id), factor, t_.numel(id));
}

void AccelEngine::adamw_update(const OpSite&, TensorId param, TensorId grad, TensorId m, TensorId v, TensorId lr,
                               TensorId bias_correction1, TensorId bias_correction2, const AdamWConfig& c) {
  // fp32 master weights and optimizer state, as mixed-precision training keeps them.
  const kernels::AdamWStep step{scalar(lr), c.beta1, c.beta2, c.eps, c.weight_decay, scalar(bias_correction1),
                                scalar(bias_correction2)};
  kernels::adamw_update(f32(param), f32(grad), f32(m), f32(v), t_.numel(param), step);
}

void AccelEngine::nudge_ulps(const OpSite&, TensorId tensor, TensorId ulps) {
  const auto n = static_cast<std::int32_t>(scalar(ulps));
  if (n > 0) *f32(tensor) = kernels::next_up(*f32(tensor), n);
  values_changed(tensor);
}

// ---- the mixture-of-experts ops (kernels/moe_ops.h), then stored in their formats --------

void AccelEngine::moe_route_forward(const OpSite&, TensorId weights, TensorId expert, TensorId slot, TensorId probs,
                                    TensorId routing, TensorId logits, int top_k, int capacity, float balance_coef) {
  kernels::moe_ops::route_forward(t_, weights, expert, slot, probs, routing, logits, top_k, capacity, balance_coef);
}

void AccelEngine::moe_route_backward(const OpSite&, TensorId dlogits, TensorId dweights, TensorId probs,
                                     TensorId weights, TensorId expert, float balance_coef) {
  kernels::moe_ops::route_backward(t_, dlogits, dweights, probs, weights, expert, balance_coef);
}

void AccelEngine::moe_dispatch_forward(const OpSite&, TensorId expert_in, TensorId inp, TensorId expert,
                                       TensorId slot) {
  kernels::moe_ops::dispatch_forward(t_, expert_in, inp, expert, slot);
  store(expert_in);
}

void AccelEngine::moe_dispatch_backward(const OpSite&, TensorId dinp, TensorId dexpert_in, TensorId expert,
                                        TensorId slot) {
  kernels::moe_ops::dispatch_backward(t_, dinp, dexpert_in, expert, slot);
  store(dinp);
}

void AccelEngine::moe_combine_forward(const OpSite&, TensorId out, TensorId expert_out, TensorId weights,
                                      TensorId expert, TensorId slot) {
  kernels::moe_ops::combine_forward(t_, out, expert_out, weights, expert, slot);
  store(out);
}

void AccelEngine::moe_combine_backward(const OpSite&, TensorId dexpert_out, TensorId dweights, TensorId dout,
                                       TensorId expert_out, TensorId weights, TensorId expert, TensorId slot) {
  kernels::moe_ops::combine_backward(t_, dexpert_out, dweights, dout, expert_out, weights, expert, slot);
  store(dexpert_out);
  store(dweights);
}

// Each expert's GEMM as linear_forward's (bf16 operands under bf16, the split-K partial
// products in the noise source's order), on its block of the buffers and of the weights.
void AccelEngine::expert_linear_forward(const OpSite&, TensorId out, TensorId inp, TensorId weight) {
  const TensorDesc& wd = t_.desc(weight);  // (E,OC,C)
  const int E = int(wd.dim(0)), OC = int(wd.dim(1)), C = int(wd.dim(2)), cap = int(t_.desc(inp).dim(1));
  const PreparedWeight& w = prepared_weight(weight);
  ReduceContext ctx = reduce_context();
  for (int e = 0; e < E; ++e) {
    split_k_gemm(ctx, cap, OC, C, f32(inp) + std::int64_t{e} * cap * C, C,
                 w.transposed.data() + std::int64_t{e} * OC * C, OC, f32(out) + std::int64_t{e} * cap * OC,
                 split_k_chunk(cap, OC, C), {}, {SplitKOutput::Start::Zero, nullptr, stores_bf16(out)});
  }
}

void AccelEngine::expert_linear_backward(const OpSite&, TensorId dinp, TensorId dweight, TensorId dout, TensorId inp,
                                         TensorId weight) {
  const TensorDesc& wd = t_.desc(weight);
  const int E = int(wd.dim(0)), OC = int(wd.dim(1)), C = int(wd.dim(2)), cap = int(t_.desc(inp).dim(1));
  const PreparedWeight& w = prepared_weight(weight);
  ReduceContext ctx = reduce_context();
  for (int e = 0; e < E; ++e) {
    const float* dy = f32(dout) + std::int64_t{e} * cap * OC;
    const float* x = f32(inp) + std::int64_t{e} * cap * C;
    // dinp_e (cap,C) += dout_e (cap,OC) @ weight_e (OC,C), split over OC
    split_k_gemm(ctx, cap, C, OC, dy, OC, w.rows.data() + std::int64_t{e} * OC * C, C,
                 f32(dinp) + std::int64_t{e} * cap * C, split_k_chunk(cap, C, OC), {},
                 {SplitKOutput::Start::Accumulate, nullptr, stores_bf16(dinp)});
    // dweight_e (OC,C) += dout_e^T (OC,cap) @ inp_e (cap,C), split over the rows
    kernels::transpose(dy, cap, OC, t_.scratch());
    split_k_gemm(ctx, OC, C, cap, t_.scratch(), cap, x, C, f32(dweight) + std::int64_t{e} * OC * C, kTokenChunk, {});
  }
}

}  // namespace harness::accel
