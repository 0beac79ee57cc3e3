// What an engine that compiles its steps shows of the last one: the programs it traced and
// ran (more than one after a graph break), and what cut them. `harness audit` reads it from
// any engine that has it (Engine::step_compilation()); an engine that runs each op as it is
// called has none, and nothing to audit.
#pragma once

#include <string>
#include <vector>

#include "engine.h"

namespace harness {

// One op call as a traced node. Its operands are the tensor ids of the Engine call in the
// op description's order (kNoTensor where optional); its attributes, the description's,
// each as node_floats() floats. Values never enter a graph, except a Constant node's.
struct GraphNode {
  OpKind op = OpKind::Zero;
  std::string site;  // the model op's name, e.g. "blocks.2.attn.proj"
  int layer = -1;
  Phase phase = Phase::Forward;
  std::vector<TensorId> tensors;
  std::vector<float> attrs;
};

struct OpGraph {
  std::vector<GraphNode> nodes;
};

// One program a step ran: its graph, the fingerprint its compile cache keys it by, and
// what part of the step it is (e.g. "step"; "grad-create" in micro-step mode).
struct TracedProgram {
  OpGraph graph;
  std::string fingerprint;
  std::string part = "step";
};

// Something that cut a step's graph: a host read of a device value, or an upload of a
// tensor that traced, not yet executed ops use.
struct GraphBreak {
  std::string what;        // "read" or "upload"
  std::string tensor;      // the tensor read or uploaded
  std::string after_site;  // the last traced op before it
  Phase after_phase = Phase::Forward;
};

class StepCompilation {
 public:
  virtual ~StepCompilation() = default;
  virtual const std::vector<TracedProgram>& step_programs() const = 0;
  virtual const std::vector<GraphBreak>& graph_breaks() const = 0;
};

}  // namespace harness
