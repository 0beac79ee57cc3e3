#include "bisect.h"

#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace harness::check {
namespace {

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Runs that make the same roundings: the first step where a loss, a gradient norm or a
// hash differs by a single bit; the first hash that differs names the tensor.
void bisect_bitwise(const ReceiptData& a, const ReceiptData& b, Bisection& out) {
  const std::optional<TensorMove> moved = first_moved(a, b);
  int first_scalar = -1;
  for (int s = 0; s < a.steps() && first_scalar < 0; ++s) {
    const auto i = static_cast<std::size_t>(s);
    if (!same_bits(a.loss[i], b.loss[i]) || !same_bits(a.grad_norm[i], b.grad_norm[i])) first_scalar = s;
  }
  if (moved && (first_scalar < 0 || moved->step <= first_scalar)) {
    out.first_divergent_step = moved->step;
    out.first_divergent_tensor = moved;
    out.first_divergent_metric = "hashes";
  } else if (first_scalar >= 0) {
    out.first_divergent_step = first_scalar;
    out.first_divergent_metric = same_bits(a.loss[static_cast<std::size_t>(first_scalar)],
                                           b.loss[static_cast<std::size_t>(first_scalar)]) ? "grad_norm" : "loss";
  }
}

// Runs that do not: the first step where a metric leaves the composed budget; a sketch
// distance names the tensor.
void bisect_budgeted(const ReceiptData& a, const ReceiptData& b, const ComposedBudget& budget, Bisection& out) {
  for (const Deviation& d : metric_deviations(a, b)) {
    const double allowed = budget.allowed(d.metric, d.step, d.reference);
    if (!(d.deviation > allowed) && !std::isnan(d.deviation)) continue;
    out.first_divergent_step = d.step;
    out.first_divergent_metric = d.metric;
    out.deviation = d.deviation;
    out.allowed = allowed;
    if (!d.tensor.empty()) out.first_divergent_tensor = TensorMove{"params", d.tensor, d.step, d.deviation};
    return;  // deviations come in step order
  }
}

}  // namespace

Bisection bisect(const ReceiptData& a, const ReceiptData& b, const Budgets& budgets) {
  check_contracts(a, b);
  Bisection out;
  out.a_path = a.path;
  out.b_path = b.path;
  out.a_lane = a.lane;
  out.b_lane = b.lane;
  out.steps = a.steps();
  const ComposedBudget budget = budget_between(budgets, a, b);
  out.bitwise = budget.bitwise();
  out.budget = budget.names();
  if (out.bitwise) {
    bisect_bitwise(a, b, out);
  } else {
    bisect_budgeted(a, b, budget, out);
  }
  out.equal_steps = out.diverged() ? out.first_divergent_step : out.steps;
  return out;
}

nlohmann::json to_json(const Bisection& b) {
  nlohmann::json tensor = nullptr;
  if (b.first_divergent_tensor) {
    tensor = {{"family", b.first_divergent_tensor->family}, {"tensor", b.first_divergent_tensor->tensor}};
  }
  return {{"version", kBisectJsonVersion},
          {"verdict", b.diverged() ? "diverged" : "equivalent"},
          {"a", {{"path", b.a_path}, {"lane", b.a_lane}}},
          {"b", {{"path", b.b_path}, {"lane", b.b_lane}}},
          {"steps", b.steps},
          {"data", "equal"},
          {"mode", b.bitwise ? "bitwise" : "budget"},
          {"budget", b.budget},
          {"equal_steps", b.equal_steps},
          {"first_divergent_step", b.diverged() ? nlohmann::json(b.first_divergent_step) : nlohmann::json(nullptr)},
          {"first_divergent_metric", b.diverged() ? nlohmann::json(b.first_divergent_metric) : nlohmann::json(nullptr)},
          {"first_divergent_tensor", tensor},
          {"deviation", b.bitwise || !b.diverged() ? nlohmann::json(nullptr) : nlohmann::json(b.deviation)},
          {"allowed", b.bitwise || !b.diverged() ? nlohmann::json(nullptr) : nlohmann::json(b.allowed)}};
}

std::string to_text(const Bisection& b) {
  std::string out = fmt::format("{:<12}{} ({})\n{:<12}{} ({})\n{:<12}equal ({} batch hashes)\n", "bisect", b.a_lane,
                                b.a_path, "against", b.b_lane, b.b_path, "data", b.steps);
  const std::string kind = b.bitwise ? "bitwise equal" : fmt::format("within {}", fmt::join(b.budget, " + "));
  if (!b.diverged()) return out + fmt::format("{:<12}steps 0-{} {}: the runs are equivalent\n", "equal", b.steps - 1, kind);
  if (b.equal_steps > 0) out += fmt::format("{:<12}steps 0-{} {}\n", "equal", b.equal_steps - 1, kind);
  std::string where;
  if (b.first_divergent_tensor) {
    where = fmt::format(" in {} {}", b.first_divergent_tensor->family, b.first_divergent_tensor->tensor);
  }
  out += b.bitwise ? fmt::format("{:<12}step {} differs first{} ({})\n", "diverges", b.first_divergent_step, where,
                                 b.first_divergent_metric)
                   : fmt::format("{:<12}step {} leaves the budget first{}: {} |d| {:.3g} against {:.3g} allowed\n",
                                 "diverges", b.first_divergent_step, where, b.first_divergent_metric, b.deviation, b.allowed);
  return out;
}

}  // namespace harness::check
