// The op descriptions (engines/api/op_description.h) against what the engines do: every
// node a traced step of either architecture records fits its op's description, the
// compiler refuses a node that does not (naming the op and what is wrong), and the
// descriptions follow the accumulation convention of engines/api/engine.h. The Engine
// interface itself is held to the descriptions at compile time (engines/api/engine.cpp).
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "api/op_description.h"
#include "canary.h"
#include "canary_file.h"
#include "compiler.h"
#include "data_source.h"
#include "exact_gelu_canary.h"
#include "instructions.h"
#include "sharding.h"
#include "tpu_mesh_engine.h"

namespace harness::tpu {
namespace {

// Operands are found by name at compile time: a renamed or removed operand is a build error.
static_assert(operand_index(OpKind::RmsNormForward, "weight") == 3);
static_assert(operand_index(OpKind::AdamW, "m") == 2);
static_assert(describe(OpKind::RopeForward).node_attribute_floats() == 3);  // head size, theta as two halves
static_assert(describe(OpKind::AdamW).node_attribute_floats() == 4);

struct Traced {
  std::unique_ptr<canary::Canary> model;
  Graph graph;
  MeshConfig config;
};

// One training step of a shipped canary on a one-device mesh, traced (not compiled).
Traced trace_step(const std::string& canary_name) {
  Traced t{canary::make_canary(canary::load_canary(canary_name)), {}, {}};
  TpuMeshEngine engine(t.config);
  engine.bind(t.model->tensors());
  t.model->upload_initial_parameters(engine, 1);
  t.model->train_step(engine, 0, canary::make_data_source(t.model->config())->batch(0));
  for (const auto& segment : engine.step_programs()) {
    t.graph.nodes.insert(t.graph.nodes.end(), segment.graph.nodes.begin(), segment.graph.nodes.end());
  }
  return t;
}

void expect_refused(const Traced& t, const Graph& graph, const std::string& op, const std::string& what) {
  try {
    compile(graph, t.model->tensors(), t.config, plan_shardings(t.model->tensors(), t.config), "test");
    ADD_FAILURE() << op << ": a node with " << what << " compiled";
  } catch (const CompileError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("(" + op + ")"), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
  }
}

// Each architecture's step_ops() (what an engine must implement to run it) is what its
// traced step calls: no op missing (an engine lacking it would fail mid-step), none extra.
TEST(OpDescription, EachArchitectureDeclaresTheOpsItsStepCalls) {
  for (const std::string canary_name : {"micro", "llama-tiny", "moe-tiny", testing::micro_with_exact_gelu().c_str()}) {
    const Traced t = trace_step(canary_name);
    std::set<OpKind> called;
    for (const Node& n : t.graph.nodes) called.insert(n.op);
    const std::vector<OpKind> declared = t.model->step_ops();
    EXPECT_EQ(std::set<OpKind>(declared.begin(), declared.end()), called) << canary_name;
    EXPECT_EQ(std::set<OpKind>(declared.begin(), declared.end()).size(), declared.size()) << canary_name << ": twice";
  }
}

TEST(OpDescription, EveryTracedNodeOfEveryArchitectureFitsItsDescription) {
  std::set<OpKind> seen;
  for (const std::string canary_name : {"micro", "llama-tiny", "moe-tiny", testing::micro_with_exact_gelu().c_str()}) {
    const Traced t = trace_step(canary_name);
    ASSERT_FALSE(t.graph.nodes.empty()) << canary_name;
    for (const Node& n : t.graph.nodes) {
      const OpDescription& d = describe(n.op);
      EXPECT_TRUE(d.takes(n.tensors.size())) << canary_name << " " << n.site << " (" << d.name << ")";
      EXPECT_EQ(n.attrs.size(), d.node_attribute_floats()) << canary_name << " " << n.site << " (" << d.name << ")";
      for (std::size_t i = 0; i < d.operands.size(); ++i) {
        EXPECT_TRUE(d.operands[i].optional || n.tensors[i] != kNoTensor) << n.site << " " << d.operands[i].name;
      }
      seen.insert(n.op);
    }
  }
  // A training step calls every op of the boundary that tpu-mesh records, except those of
  // traces and faults (nudge_ulps, trace: tested with the op traces) and the leaked-scalar
  // constant.
  const TpuMeshEngine mesh(MeshConfig{});
  for (const OpDescription& d : kOpDescriptions) {
    const bool step_op =
        d.engine_call && d.kind != OpKind::Trace && d.kind != OpKind::NudgeUlps && mesh.implements(d.kind);
    EXPECT_EQ(seen.count(d.kind), step_op ? 1u : 0u) << d.name;
  }
}

// Backward ops add into their gradient outputs and forward ops overwrite theirs
// (engines/api/engine.h): the descriptions say so for every node of a real step, by its phase.
TEST(OpDescription, WrittenOperandsFollowTheAccumulationConvention) {
  for (const std::string canary_name : {"micro", "llama-tiny", "moe-tiny", testing::micro_with_exact_gelu().c_str()}) {
    const Traced t = trace_step(canary_name);
    for (const Node& n : t.graph.nodes) {
      const OpDescription& d = describe(n.op);
      for (std::size_t i = 0; i < n.tensors.size(); ++i) {
        // The optimizer's nodes have their own rule (checked below), and a fault nudges in place.
        if (!d.writes(i) || n.op == OpKind::NudgeUlps || n.phase == Phase::Optimizer) continue;
        const Access expected = n.phase == Phase::Forward ? Access::Write : Access::Accumulate;
        EXPECT_EQ(static_cast<int>(d.access(i)), static_cast<int>(expected))
            << canary_name << " " << n.site << " (" << d.name << ") operand " << i;
      }
    }
  }
  // The optimizer updates in place what it writes, except the norm it computes.
  EXPECT_EQ(describe(OpKind::AdamW).access(operand_index(OpKind::AdamW, "param")), Access::Accumulate);
  EXPECT_EQ(describe(OpKind::ClipByNorm).access(1), Access::Accumulate);
  EXPECT_EQ(describe(OpKind::GlobalNorm).access(operand_index(OpKind::GlobalNorm, "norm")), Access::Write);
}

TEST(OpDescription, CompilerRefusesANodeThatDoesNotFitNamingTheOpAndTheProblem) {
  const Traced t = trace_step("micro");
  std::set<OpKind> tried;
  for (std::size_t k = 0; k < t.graph.nodes.size(); ++k) {
    const Node& n = t.graph.nodes[k];
    if (!tried.insert(n.op).second) continue;  // one node of each op
    const OpDescription& d = describe(n.op);
    const std::string op(d.name);
    if (!d.variadic()) {
      Graph fewer = t.graph;
      fewer.nodes[k].tensors.pop_back();
      expect_refused(t, fewer, op, "operands where the op takes");
      Graph more = t.graph;
      more.nodes[k].tensors.push_back(n.tensors.front());
      expect_refused(t, more, op, "operands where the op takes");
    }
    Graph extra_attribute = t.graph;
    extra_attribute.nodes[k].attrs.push_back(1.0f);
    expect_refused(t, extra_attribute, op, "attribute values where the op takes");
    for (std::size_t i = 0; i < d.operands.size(); ++i) {
      if (d.operands[i].optional) continue;
      Graph missing = t.graph;
      missing.nodes[k].tensors[i] = kNoTensor;
      expect_refused(t, missing, op, "operand " + std::string(d.operands[i].name) + " is not optional");
      break;
    }
  }
  EXPECT_GE(tried.size(), 15u);
}

// The instruction table (engines/tpu-mesh/instructions.cpp) is the executor's only dispatch:
// every kernel kind has its kernel there, and a collective or Trace (which combine devices,
// run by the executor itself) has none; a kind past the table is refused, never run.
TEST(InstructionTable, EveryKernelKindHasItsKernelAndNoCollectiveHasOne) {
  for (std::int32_t k = 0; k <= static_cast<std::int32_t>(InstrKind::kLastKind); ++k) {
    Instr in;
    in.kind = k;
    const bool combines_devices = in.is_collective() || in.op() == InstrKind::Trace;
    EXPECT_EQ(instruction(in.op()).kernel == nullptr, combines_devices) << k;
    EXPECT_EQ(instruction(in.op()).kind, in.op()) << k;
  }
  EXPECT_FALSE(known_instruction(static_cast<std::int32_t>(InstrKind::kLastKind) + 1));
  EXPECT_FALSE(known_instruction(-1));
  EXPECT_THROW(instruction(static_cast<InstrKind>(static_cast<int>(InstrKind::kLastKind) + 1)), std::logic_error);
}

}  // namespace
}  // namespace harness::tpu
