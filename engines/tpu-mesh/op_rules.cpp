#include "op_rules.h"

#include <array>
#include <stdexcept>

#include <fmt/format.h>

namespace harness::tpu {
namespace {

constexpr std::size_t kOps = static_cast<std::size_t>(OpKind::kLast) + 1;

// Every family's entries by op; an op with two is a build mistake that the first use names.
// An op with none is one tpu-mesh does not implement (its lower stays null).
std::array<OpRules, kOps> index_rules() {
  std::array<OpRules, kOps> table{};
  std::array<bool, kOps> seen{};
  for (auto family : {embedding_rules, linear_rules, normalization_rules, attention_rules, pointwise_rules,
                      loss_rules, optimizer_rules, step_control_rules, mixture_of_experts_rules}) {
    for (const OpRules& rules : family()) {
      const auto i = static_cast<std::size_t>(rules.op);
      if (seen[i]) throw std::logic_error(fmt::format("tpu-mesh: op {} has two rule entries", describe(rules.op).name));
      if (rules.lower == nullptr) throw std::logic_error(fmt::format("tpu-mesh: op {} has no lowering", describe(rules.op).name));
      seen[i] = true;
      table[i] = rules;
    }
  }
  for (std::size_t i = 0; i < kOps; ++i) table[i].op = static_cast<OpKind>(i);
  return table;
}

}  // namespace

const OpRules& rules_of(OpKind op) {
  static const std::array<OpRules, kOps> table = index_rules();
  return table.at(static_cast<std::size_t>(op));
}

}  // namespace harness::tpu
