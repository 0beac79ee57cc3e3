// The mixture-of-experts ops (kernels/moe_kernels.h) on the mesh. Tokens are split on
// `data`; an expert buffer (E, cap, C) holds every expert's rows at the slots the router
// gave them.
//  - Routing is a function of the step's whole batch (capacity fills in one priority over
//    every token), so the router's small tensors (B,T,E and B,T,K) are gathered over `data`,
//    routed whole on every device by cpu-ref's kernel (the decisions are its bits), and each
//    device keeps its block of the results.
//  - Dispatch writes a device's own rows into a buffer indexed by (expert, slot); an
//    ExpertExchange then moves only the placed rows, in device order, to the devices that
//    hold the expert: all of them under dp, tp and zero3 (every device then runs every
//    expert on every row, cpu-ref's GEMMs exactly), the expert's owner under ep (an
//    all-to-all: the experts split over `data`). The reverse exchange brings each device
//    its own tokens' rows back for the combine.
//  - The experts' weights split like llama's MLP under tp (gate and up column-parallel,
//    down row-parallel with an all-reduce over `model`).
// Wherever an expert's GEMM runs it sees all of the expert's rows, so its weight gradient is
// complete there and needs no all-reduce over `data`.
#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kernels/moe_kernels.h"
#include "op_rules.h"

namespace harness::tpu {
namespace {

// ---- the batch split over `data` ---------------------------------------------------------

bool split_over_data(const Compilation& c, TensorId id) { return c.eff(id).shards_on(Axis::Data); }

// The tensor whole on every device: its buffer, or its blocks gathered over `data`.
int gathered(Compilation& c, TensorId id) {
  if (!split_over_data(c, id)) return c.buffer(id);
  const int whole = c.temp("whole." + c.table()[id].name, product(c.shape(id)), MemoryCategory::Activations);
  c.emit(InstrKind::AllGather, {whole, c.buffer(id)}, c.shape(id), {}, Axis::Data, {c.spec_of(id)});
  return whole;
}

// Where a result of the whole batch is computed: the tensor's buffer, or a whole temporary
// that keep_block() then cuts the device's block from.
int whole_result(Compilation& c, TensorId id) {
  if (!split_over_data(c, id)) return c.buffer(id);
  return c.temp("whole." + c.table()[id].name, product(c.shape(id)), MemoryCategory::Activations);
}

void keep_block(Compilation& c, int whole, TensorId id) {
  if (whole == c.buffer(id)) return;
  c.emit(InstrKind::TakeBlock, {c.buffer(id), whole}, c.shape(id), {}, Axis::None, {c.spec_of(id)});
}

// ---- expert buffers ----------------------------------------------------------------------

// The experts a device holds rows of: E / data under ep, all E otherwise.
std::int64_t experts_here(const Compilation& c, TensorId expert_buffer) { return c.lshape(expert_buffer)[0]; }

// Moves the placed rows of this device's choices (expert, slot) between a whole buffer
// indexed by (expert, slot) and the experts' blocks (to_experts), or back.
void exchange(Compilation& c, int dst, int src, TensorId expert_buffer, TensorId expert, TensorId slot,
              bool to_experts) {
  const Shape& s = c.shape(expert_buffer);
  c.emit(InstrKind::ExpertExchange, {dst, src, c.buffer(expert), c.buffer(slot)},
         {s[0], s[1], s[2], c.lnumel(expert), experts_here(c, expert_buffer)}, {to_experts ? 0.0f : 1.0f},
         Axis::Data);
}

// Where a device writes its own tokens' rows of `expert_buffer` (every expert's slots): the
// tensor's buffer when the batch is not split, else a whole buffer the exchange then sends
// from (zeroed first where the kernel adds into it).
int my_rows(Compilation& c, TensorId expert_buffer, bool split, bool zeroed) {
  if (!split) return c.buffer(expert_buffer);
  const std::string name = "send." + c.table()[expert_buffer].name;
  const std::int64_t numel = product(c.shape(expert_buffer));
  return zeroed ? c.zeroed_temp(name, numel, MemoryCategory::Activations)
                : c.temp(name, numel, MemoryCategory::Activations);
}

// The expert buffer whole (every expert, this device's rows at their slots): the buffer
// itself when the batch is not split, else its rows brought back from the experts' devices.
int rows_of_my_tokens(Compilation& c, TensorId expert_buffer, TensorId expert, TensorId slot) {
  if (!split_over_data(c, expert)) return c.buffer(expert_buffer);
  const int whole = c.temp("tokens." + c.table()[expert_buffer].name, product(c.shape(expert_buffer)),
                           MemoryCategory::Activations);
  exchange(c, whole, c.buffer(expert_buffer), expert_buffer, expert, slot, false);
  return whole;
}

// ---- route -------------------------------------------------------------------------------

void check_route_forward(const Compilation& c, const Node& n) {
  const NodeOperands<OpKind::MoeRouteForward> op{n};
  const Shape& logits = c.shape(op.get<"logits">());
  const auto K = static_cast<std::int64_t>(n.attrs.at(0));
  Shape choices = logits;
  choices.back() = K;
  c.expect(n, c.shape(op.get<"probs">()) == logits && c.shape(op.get<"weights">()) == choices &&
                  c.shape(op.get<"expert">()) == choices && c.shape(op.get<"slot">()) == choices,
           "routing tensors do not match the router's logits and top_k");
  c.expect(n, c.shape(op.get<"routing">()) == Shape{logits.back() + kernels::kRoutingRecordExtra},
           "the routing record does not hold E + kRoutingRecordExtra values");
}

void propagate_route(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::MoeRouteForward> op{n};
  const TensorId logits = op.get<"logits">();
  if (c.eff(logits).dims.back().axis != Axis::None) c.reject(n, "router logits split over the experts");
  for (TensorId out : {op.get<"weights">(), op.get<"expert">(), op.get<"slot">(), op.get<"probs">()}) {
    c.spec_of(out) = c.spec_of(logits);
  }
}

void lower_route_forward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::MoeRouteForward> op{n};
  const TensorId logits = op.get<"logits">();
  const Shape& s = c.shape(logits);
  const int weights = whole_result(c, op.get<"weights">()), expert = whole_result(c, op.get<"expert">());
  const int slot = whole_result(c, op.get<"slot">()), probs = whole_result(c, op.get<"probs">());
  c.emit(InstrKind::MoeRouteForward, {weights, expert, slot, probs, c.buffer(op.get<"routing">()), gathered(c, logits)},
         {rows(s), s.back(), static_cast<std::int64_t>(n.attrs.at(0)), static_cast<std::int64_t>(n.attrs.at(1))},
         {n.attrs.at(2)});
  keep_block(c, weights, op.get<"weights">());
  keep_block(c, expert, op.get<"expert">());
  keep_block(c, slot, op.get<"slot">());
  keep_block(c, probs, op.get<"probs">());
}

void lower_route_backward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::MoeRouteBackward> op{n};
  const TensorId dlogits = op.get<"dlogits">(), probs = op.get<"probs">();
  const Shape& s = c.shape(probs);
  const bool split = split_over_data(c, dlogits);
  // The balance term counts every token's choices: the backward runs on the whole batch.
  const int whole = split ? c.zeroed_temp("whole." + c.table()[dlogits].name, product(s), MemoryCategory::Activations)
                          : c.buffer(dlogits);
  c.emit(InstrKind::MoeRouteBackward,
         {whole, gathered(c, op.get<"dweights">()), gathered(c, probs), gathered(c, op.get<"weights">()),
          gathered(c, op.get<"expert">())},
         {rows(s), s.back(), c.shape(op.get<"weights">()).back()}, {n.attrs.at(0)});
  if (split) {
    const int block = c.temp("block." + c.table()[dlogits].name, c.lnumel(dlogits), MemoryCategory::Activations);
    c.emit(InstrKind::TakeBlock, {block, whole}, s, {}, Axis::None, {c.spec_of(dlogits)});
    c.emit(InstrKind::AddInPlace, {c.buffer(dlogits), block}, {c.lnumel(dlogits)});
  }
}

// ---- dispatch and combine ----------------------------------------------------------------

void propagate_dispatch(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::MoeDispatchForward> op{n};
  const TensorId expert_in = op.get<"expert_in">();
  PartitionSpec spec = PartitionSpec::replicated(c.shape(expert_in).size());
  spec.dims[0].axis = experts_axis(c.plan());
  c.spec_of(expert_in) = spec;
}

void lower_dispatch_forward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::MoeDispatchForward> op{n};
  const TensorId expert_in = op.get<"expert_in">(), inp = op.get<"inp">(), expert = op.get<"expert">();
  const TensorId slot = op.get<"slot">();
  const Shape& s = c.shape(expert_in);
  const bool split = split_over_data(c, expert);
  const int mine = my_rows(c, expert_in, split, false);  // the kernel writes every slot
  c.emit(InstrKind::MoeDispatchForward, {mine, c.buffer(inp), c.buffer(expert), c.buffer(slot)},
         {rows(c.lshape(inp)), s[2], s[0], c.lshape(expert).back(), s[1]});
  if (split) exchange(c, c.buffer(expert_in), mine, expert_in, expert, slot, true);
  c.round_activation(expert_in);
}

void lower_dispatch_backward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::MoeDispatchBackward> op{n};
  const TensorId dinp = op.get<"dinp">(), dexpert_in = op.get<"dexpert_in">(), expert = op.get<"expert">();
  const TensorId slot = op.get<"slot">();
  const Shape& s = c.shape(dexpert_in);
  c.emit(InstrKind::MoeDispatchBackward,
         {c.buffer(dinp), rows_of_my_tokens(c, dexpert_in, expert, slot), c.buffer(expert), c.buffer(slot)},
         {rows(c.lshape(dinp)), s[2], c.lshape(expert).back(), s[1]});
  c.round_activation(dinp);
}

void propagate_combine(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::MoeCombineForward> op{n};
  if (c.eff(op.get<"expert_out">()).dims.back().axis != Axis::None) c.reject(n, "expert outputs split over channels");
  PartitionSpec out = c.spec_of(op.get<"weights">());
  out.dims.back() = DimSharding{};
  c.spec_of(op.get<"out">()) = out;
}

void lower_combine_forward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::MoeCombineForward> op{n};
  const TensorId out = op.get<"out">(), expert_out = op.get<"expert_out">(), expert = op.get<"expert">();
  const TensorId slot = op.get<"slot">();
  const Shape& s = c.shape(expert_out);
  c.emit(InstrKind::MoeCombineForward,
         {c.buffer(out), rows_of_my_tokens(c, expert_out, expert, slot), c.buffer(op.get<"weights">()),
          c.buffer(expert), c.buffer(slot)},
         {rows(c.lshape(out)), s[2], c.lshape(expert).back(), s[1]});
  c.round_activation(out);
}

void lower_combine_backward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::MoeCombineBackward> op{n};
  const TensorId dexpert_out = op.get<"dexpert_out">(), expert = op.get<"expert">(), slot = op.get<"slot">();
  const TensorId dout = op.get<"dout">();
  const Shape& s = c.shape(dexpert_out);
  const bool split = split_over_data(c, expert);
  // This device's rows' gradients, then to every device that runs their experts.
  const int mine = my_rows(c, dexpert_out, split, true);
  c.emit(InstrKind::MoeCombineBackward,
         {mine, c.buffer(op.get<"dweights">()), c.buffer(dout),
          rows_of_my_tokens(c, op.get<"expert_out">(), expert, slot), c.buffer(op.get<"weights">()), c.buffer(expert),
          c.buffer(slot)},
         {rows(c.lshape(dout)), s[2], c.lshape(expert).back(), s[1]});
  if (split) {
    const int received = c.temp("received." + c.table()[dexpert_out].name, c.lnumel(dexpert_out),
                                MemoryCategory::Activations);
    exchange(c, received, mine, dexpert_out, expert, slot, true);
    c.emit(InstrKind::AddInPlace, {c.buffer(dexpert_out), received}, {c.lnumel(dexpert_out)});
  }
  c.round_activation(dexpert_out);
}

// ---- the experts' linear layers ------------------------------------------------------------

void check_expert_linear_forward(const Compilation& c, const Node& n) {
  const NodeOperands<OpKind::ExpertLinearForward> op{n};
  const Shape &out = c.shape(op.get<"out">()), &inp = c.shape(op.get<"inp">()), &w = c.shape(op.get<"weight">());
  if (inp.size() != 3 || w.size() != 3 || out.size() != 3 || inp[0] != w[0] || out[0] != w[0] || inp[1] != out[1] ||
      inp[2] != w[2] || out[2] != w[1]) {
    c.reject(n, fmt::format("shapes {} = {} @ {}^T per expert do not agree", fmt::join(out, "x"), fmt::join(inp, "x"),
                            fmt::join(w, "x")));
  }
}

void check_expert_linear_backward(const Compilation& c, const Node& n) {
  const NodeOperands<OpKind::ExpertLinearBackward> op{n};
  const Shape &inp = c.shape(op.get<"inp">()), &w = c.shape(op.get<"weight">());
  c.expect(n, c.shape(op.get<"dinp">()) == inp && c.shape(op.get<"dweight">()) == w && inp.size() == 3 &&
                  w.size() == 3 && c.shape(op.get<"dout">()) == Shape{w[0], inp[1], w[1]},
           "gradient shapes do not match their forward operands");
}

void propagate_expert_linear(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::ExpertLinearForward> op{n};
  PartitionSpec out = c.spec_of(op.get<"inp">());
  out.dims.back() = c.spec_of(op.get<"weight">()).dims[1];
  c.spec_of(op.get<"out">()) = out;
}

// An expert's weight where its rows are: its own block under ep (the experts split over
// `data` alike), else the weight as any layer reads it (gathered under zero3).
bool weight_stays_local(const Compilation& c, TensorId weight, TensorId rows_tensor) {
  return c.eff(weight).dims[0].axis == Axis::Data && c.eff(rows_tensor).dims[0].axis == Axis::Data;
}

struct ExpertGemm {
  std::int64_t experts, cap, C, OC;
  int weight;
};

ExpertGemm expert_gemm(Compilation& c, TensorId weight, TensorId inp) {
  const bool local = weight_stays_local(c, weight, inp);
  const Shape w = local ? c.lshape(weight) : c.compute_shape(weight), in = c.lshape(inp);
  c.need_scratch(std::max(w[1] * w[2], in[1] * w[1]));  // the packed weight, or cap rows of the output
  return {in[0], in[1], w[2], w[1], c.weight_operand(weight, true, !local)};
}

void lower_expert_linear_forward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::ExpertLinearForward> op{n};
  const TensorId out = op.get<"out">(), inp = op.get<"inp">(), weight = op.get<"weight">();
  const Axis partial = c.contraction_axis(n, c.eff(inp).dims.back(), c.eff(weight).dims[2]);
  const ExpertGemm g = expert_gemm(c, weight, inp);
  c.emit(InstrKind::ExpertLinear, {c.buffer(out), c.buffer(inp), g.weight}, {g.experts, g.cap, g.C, g.OC});
  // Row-parallel: partial sums over the split hidden channels.
  if (partial != Axis::None) c.emit(InstrKind::AllReduce, {c.buffer(out)}, {c.lnumel(out)}, {}, partial);
  c.round_activation(out);
}

void lower_expert_linear_backward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::ExpertLinearBackward> op{n};
  const TensorId dinp = op.get<"dinp">(), dout = op.get<"dout">(), weight = op.get<"weight">();
  const TensorId dweight = op.get<"dweight">();
  const Axis partial = c.contraction_axis(n, c.eff(dout).dims.back(), c.eff(weight).dims[1]);
  const ExpertGemm g = expert_gemm(c, weight, op.get<"inp">());
  // Column-parallel: dinp sums over the split outputs. Zero3: the whole gradient is
  // complete on every device, which keeps its block.
  const int dinp_target = partial != Axis::None ? c.zeroed_temp("partial." + c.table()[dinp].name, c.lnumel(dinp),
                                                                MemoryCategory::Activations)
                                                : c.buffer(dinp);
  const bool gathered_weight = split_over_data(c, dweight) && !weight_stays_local(c, weight, op.get<"inp">());
  const int dweight_target =
      gathered_weight ? c.zeroed_temp("whole." + c.table()[dweight].name, product(c.compute_shape(dweight)),
                                      MemoryCategory::Gradients)
                      : c.buffer(dweight);
  c.emit(InstrKind::ExpertLinearBackward,
         {dinp_target, dweight_target, c.buffer(dout), c.buffer(op.get<"inp">()), g.weight},
         {g.experts, g.cap, g.C, g.OC});
  if (partial != Axis::None) {
    c.emit(InstrKind::AllReduce, {dinp_target}, {c.lnumel(dinp)}, {}, partial);
    c.emit(InstrKind::AddInPlace, {c.buffer(dinp), dinp_target}, {c.lnumel(dinp)});
  }
  if (gathered_weight) {
    const int block = c.temp("block." + c.table()[dweight].name, c.lnumel(dweight), MemoryCategory::Gradients);
    c.emit(InstrKind::TakeBlock, {block, dweight_target}, c.shape(dweight), {}, Axis::None, {c.spec_of(dweight)});
    c.emit(InstrKind::AddInPlace, {c.buffer(dweight), block}, {c.lnumel(dweight)});
  }
  c.round_activation(dinp);
}

constexpr OpRules kRules[] = {
    {OpKind::MoeRouteForward, check_route_forward, propagate_route, lower_route_forward},
    {OpKind::MoeRouteBackward, nullptr, nullptr, lower_route_backward},
    {OpKind::MoeDispatchForward, nullptr, propagate_dispatch, lower_dispatch_forward},
    {OpKind::MoeDispatchBackward, nullptr, nullptr, lower_dispatch_backward},
    {OpKind::MoeCombineForward, nullptr, propagate_combine, lower_combine_forward},
    {OpKind::MoeCombineBackward, nullptr, nullptr, lower_combine_backward},
    {OpKind::ExpertLinearForward, check_expert_linear_forward, propagate_expert_linear, lower_expert_linear_forward},
    {OpKind::ExpertLinearBackward, check_expert_linear_backward, nullptr, lower_expert_linear_backward},
};

}  // namespace

std::span<const OpRules> mixture_of_experts_rules() { return kRules; }

}  // namespace harness::tpu
