// The linear layer: y = x W^T + b, column- or row-parallel by its weight's sharding.
#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "op_rules.h"

namespace harness::tpu {
namespace {

void check_linear_forward(const Compilation& c, const Node& n) {
  const NodeOperands<OpKind::LinearForward> op{n};
  const Shape &out = c.shape(op.get<"out">()), &inp = c.shape(op.get<"inp">()), &w = c.shape(op.get<"weight">());
  if (inp.back() != w[1] || out.back() != w[0] || rows(out) != rows(inp)) {
    c.reject(n, fmt::format("shapes {} = {} @ {}^T do not agree", fmt::join(out, "x"), fmt::join(inp, "x"),
                            fmt::join(w, "x")));
  }
}

void check_linear_backward(const Compilation& c, const Node& n) {
  const NodeOperands<OpKind::LinearBackward> op{n};
  const Shape &inp = c.shape(op.get<"inp">()), &w = c.shape(op.get<"weight">());
  c.expect(n, inp.back() == w[1] && c.shape(op.get<"dout">()).back() == w[0] && c.shape(op.get<"dinp">()) == inp &&
                  c.shape(op.get<"dweight">()) == w,
           "gradient shapes do not match their forward operands");
}

void propagate_linear(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::LinearForward> op{n};
  PartitionSpec out = c.spec_of(op.get<"inp">());
  out.dims.back() = c.spec_of(op.get<"weight">()).dims[0];
  if (out.dims.back().axis == Axis::Data) out.dims.back() = DimSharding{};  // zero3: gathered before use
  c.spec_of(op.get<"out">()) = out;
}

// The GEMM's packed operands: the weight, or N rows of the output.
void need_gemm_scratch(Compilation& c, TensorId weight, TensorId inp) {
  const Shape w = c.compute_shape(weight);
  c.need_scratch(std::max(w[0] * w[1], rows(c.lshape(inp)) * w[0]));
}

void lower_linear_forward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::LinearForward> op{n};
  const TensorId out = op.get<"out">(), inp = op.get<"inp">(), w_id = op.get<"weight">();
  const Shape w = c.compute_shape(w_id);
  const std::int64_t N = rows(c.lshape(inp)), C = w[1], OC = w[0];
  const Axis partial = c.contraction_axis(n, c.eff(inp).dims.back(), c.eff(w_id).dims[1]);
  const int weight = c.weight_operand(w_id, true);
  const int bias = c.weight_operand(op.get<"bias">(), false);
  if (partial != Axis::None) {  // row-parallel: partial sums, all-reduce, then the bias once
    c.emit(InstrKind::Linear, {c.buffer(out), c.buffer(inp), weight, -1}, {N, C, OC});
    c.emit(InstrKind::AllReduce, {c.buffer(out)}, {N * OC}, {}, partial);
    if (bias >= 0) c.emit(InstrKind::BiasAdd, {c.buffer(out), bias}, {N, OC});
  } else {
    c.emit(InstrKind::Linear, {c.buffer(out), c.buffer(inp), weight, bias}, {N, C, OC});
  }
  c.round_activation(out);
  need_gemm_scratch(c, w_id, inp);
}

void lower_linear_backward(Compilation& c, const Node& n) {
  const NodeOperands<OpKind::LinearBackward> op{n};
  const TensorId dinp_id = op.get<"dinp">(), dout = op.get<"dout">(), w_id = op.get<"weight">();
  const Shape w = c.compute_shape(w_id);
  const std::int64_t N = rows(c.lshape(op.get<"inp">())), C = w[1], OC = w[0];
  const Axis partial = c.contraction_axis(n, c.eff(dout).dims.back(), c.eff(w_id).dims[0]);
  const int weight = c.weight_operand(w_id, true);
  std::vector<PendingGradient> pending;
  const int dinp = partial != Axis::None ? c.zeroed_temp("partial." + c.table()[dinp_id].name, c.lnumel(dinp_id),
                                                         MemoryCategory::Activations)
                                         : c.buffer(dinp_id);
  const int dweight = c.gradient_target(op.get<"dweight">(), pending);
  const int dbias = c.gradient_target(op.get<"dbias">(), pending);
  c.emit(InstrKind::LinearBackward, {dinp, dweight, dbias, c.buffer(dout), c.buffer(op.get<"inp">()), weight},
         {N, C, OC});
  if (partial != Axis::None) {  // column-parallel: dinp is a partial sum over the split outputs
    c.emit(InstrKind::AllReduce, {dinp}, {c.lnumel(dinp_id)}, {}, partial);
    c.emit(InstrKind::AddInPlace, {c.buffer(dinp_id), dinp}, {c.lnumel(dinp_id)});
  }
  c.finish_gradients(pending);
  c.round_activation(dinp_id);
  need_gemm_scratch(c, w_id, op.get<"inp">());
}

constexpr OpRules kRules[] = {
    {OpKind::LinearForward, check_linear_forward, propagate_linear, lower_linear_forward},
    {OpKind::LinearBackward, check_linear_backward, nullptr, lower_linear_backward},
};

}  // namespace

std::span<const OpRules> linear_rules() { return kRules; }

}  // namespace harness::tpu
