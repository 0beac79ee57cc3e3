// Fault injection, for testing the harness itself and for measuring what a budget catches
// (`harness calibrate --power`, docs/budgets.md "Detection power"). One fault per run, named
// by `--inject-fault` and recorded in the receipt's recipe, so a faulted run replays:
//   step=K,op=NAME[,ulps=N]                   the first element of forward op NAME's output
//                                             moved N ulps up at step K (kind=nudge, the default)
//   kind=weight-scale,step=K,tensor=P,by=E    parameter P scaled by (1 + E) at the start of step K
//   kind=weight-ulps,tensor=P,ulps=N          the first element of parameter P moved N ulps up
//                                             in the initial weights
//   kind=lr-scale,step=K,by=E                 the learning rate times (1 + E) from step K on
//   kind=eps-scale,by=F                       AdamW's eps times F, every step
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace harness::canary {

enum class FaultKind { kNudge, kWeightScale, kWeightUlps, kLrScale, kEpsScale };

struct FaultSpec {
  FaultKind kind = FaultKind::kNudge;
  int step = 0;         // nudge, weight-scale: the step; lr-scale: the first step; else 0
  std::string op;       // nudge: the forward op
  std::string tensor;   // weight-scale, weight-ulps: the parameter
  std::int32_t ulps = 1;  // nudge, weight-ulps
  double by = 0;          // weight-scale, lr-scale: the relative change E; eps-scale: the factor F

  // Canonical text for the manifest and the recipe: "step=K,op=NAME,ulps=N" for a nudge (as
  // receipts have always recorded it), "kind=...,..." for the others, `by` in the shortest
  // form that reads back to the same double.
  std::string to_string() const;
};

// The kind's name in the text ("nudge", "weight-scale", ...).
std::string_view fault_kind_name(FaultKind kind);

// Parses the --inject-fault value; throws std::invalid_argument naming the bad field.
// `known_ops` (the model's forward op names) validates op=, `known_parameters` (its
// parameters' names) tensor=.
FaultSpec parse_fault_spec(std::string_view text, const std::vector<std::string>& known_ops,
                           const std::vector<std::string>& known_parameters = {});

}  // namespace harness::canary
