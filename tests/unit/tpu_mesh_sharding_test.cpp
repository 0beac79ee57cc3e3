// Shardings and the compiled program of tpu-mesh: blocks partition every tensor, the plan
// gate rejects what does not divide, and the compiler inserts exactly the collectives a
// plan needs (none on one device) with a buffer plan that never overlaps live buffers.
#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <stdexcept>

#include <gtest/gtest.h>

#include "canary_file.h"
#include "byte_stream.h"
#include "compiler.h"
#include "gpt2/gpt2.h"
#include "op_rules.h"
#include "preset.h"
#include "sharding.h"
#include "tpu_mesh_engine.h"

namespace harness::tpu {
namespace {

const Mesh kMeshes[] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}, {4, 2}, {2, 4}};

std::vector<PartitionSpec> sample_specs(std::size_t rank) {
  std::vector<PartitionSpec> specs{PartitionSpec::replicated(rank)};
  for (std::size_t d = 0; d < rank; ++d) {
    for (Axis axis : {Axis::Data, Axis::Model}) {
      for (int groups : {1, 3}) {
        PartitionSpec s = PartitionSpec::replicated(rank);
        s.dims[d] = {axis, groups};
        specs.push_back(s);
        if (rank > 1) {  // both axes at once, on two dimensions
          PartitionSpec both = s;
          both.dims[(d + 1) % rank] = {axis == Axis::Data ? Axis::Model : Axis::Data, 1};
          specs.push_back(both);
        }
      }
    }
  }
  return specs;
}

bool divides(const std::vector<std::int64_t>& shape, const PartitionSpec& spec, const Mesh& mesh) {
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] % (axis_size(mesh, spec.dims[d].axis) * spec.dims[d].groups) != 0) return false;
  }
  return true;
}

// Every element lands on exactly the devices that should hold it, and assembling the
// blocks of the distinct owners gives the tensor back.
TEST(TpuMeshSharding, BlocksPartitionAndReassembleEveryTensor) {
  const std::vector<std::vector<std::int64_t>> shapes{{24}, {24, 12}, {8, 24}, {4, 6, 24}};
  for (const Mesh& mesh : kMeshes) {
    for (const auto& shape : shapes) {
      const std::int64_t numel = std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
      std::vector<float> global(static_cast<std::size_t>(numel));
      std::iota(global.begin(), global.end(), 0.0f);
      for (const PartitionSpec& spec : sample_specs(shape.size())) {
        if (!divides(shape, spec, mesh)) continue;  // the plan gate rejects those (below)
        const PartitionSpec eff = effective(spec, mesh);
        std::vector<float> assembled(global.size(), -1.0f);
        std::vector<int> times_owned(global.size(), 0);
        for (int d = 0; d < mesh.devices(); ++d) {
          std::vector<float> block(static_cast<std::size_t>(local_numel(shape, spec, mesh)));
          copy_block_from_global(shape, spec, mesh, d, global.data(), block.data());
          if (!owns_distinct_block(eff, mesh, d)) continue;
          copy_block_to_global(shape, spec, mesh, d, block.data(), assembled.data());
          for (float v : block) ++times_owned[static_cast<std::size_t>(v)];
        }
        EXPECT_EQ(assembled, global) << spec.to_string() << " on " << mesh.to_string();
        EXPECT_TRUE(std::all_of(times_owned.begin(), times_owned.end(), [](int n) { return n == 1; }))
            << spec.to_string() << " on " << mesh.to_string();
      }
    }
  }
}

// qkv's output dimension [q | k | v] split per group: model device 1 of 2 holds the
// second half of q, of k and of v.
TEST(TpuMeshSharding, GroupedDimensionGivesEachDeviceItsSliceOfEveryGroup) {
  const std::vector<std::int64_t> shape{12};
  std::vector<float> global(12);
  std::iota(global.begin(), global.end(), 0.0f);
  PartitionSpec spec{{{Axis::Model, 3}}};
  std::vector<float> block(6);
  copy_block_from_global(shape, spec, Mesh{1, 2}, 1, global.data(), block.data());
  EXPECT_EQ(block, (std::vector<float>{2, 3, 6, 7, 10, 11}));
}

TEST(TpuMeshSharding, PlanGateRejectsWhatDoesNotDivide) {
  const canary::Gpt2Canary tiny(canary::load_canary("tiny"));  // B=8, NH=4
  MeshConfig c;
  c.plan = ShardPlan::TensorParallel;
  c.mesh = {1, 3};
  EXPECT_THROW(validate_plan(tiny.tensors(), plan_shardings(tiny.tensors(), c), c), std::invalid_argument);
  c.plan = ShardPlan::DataParallel;
  c.mesh = {3, 1};  // the batch of 8 sequences does not split three ways
  try {
    validate_plan(tiny.tensors(), plan_shardings(tiny.tensors(), c), c);
    FAIL() << "3x1 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("inputs dimension 0 has size 8"), std::string::npos) << e.what();
  }
  c.mesh = {4, 2};
  for (ShardPlan plan : {ShardPlan::DataParallel, ShardPlan::TensorParallel, ShardPlan::Zero3}) {
    c.plan = plan;
    EXPECT_NO_THROW(validate_plan(tiny.tensors(), plan_shardings(tiny.tensors(), c), c));
  }
}

// Traces one training step of `preset` on the config and compiles it.
struct TracedStep {
  canary::Gpt2Canary model;
  Executable exe;
  Graph graph;
};

TracedStep trace_and_compile(const std::string& preset, const MeshConfig& config) {
  TracedStep t{canary::Gpt2Canary(canary::load_canary(preset)), {}, {}};
  TpuMeshEngine engine(config);
  engine.bind(t.model.tensors());
  t.model.upload_initial_parameters(engine, 1);
  t.model.train_step(engine, 0, canary::ByteStream(t.model.config()).batch(0));
  EXPECT_EQ(engine.step_programs().size(), 1u);
  t.graph = engine.step_programs().front().graph;
  t.exe = compile(t.graph, t.model.tensors(), config, plan_shardings(t.model.tensors(), config), "test");
  return t;
}

int count(const Executable& exe, InstrKind kind, Axis axis, const Graph& graph, const std::string& site_suffix = "",
          Phase phase = Phase::Forward) {
  int n = 0;
  for (const Instr& in : exe.instrs) {
    if (in.op() != kind || in.mesh_axis() != axis) continue;
    const Node& node = graph.nodes[static_cast<std::size_t>(in.node)];
    if (!site_suffix.empty() && (!node.site.ends_with(site_suffix) || node.phase != phase)) continue;
    ++n;
  }
  return n;
}

MeshConfig mesh_config(Mesh mesh, ShardPlan plan, Precision precision = Precision::Fp32) {
  MeshConfig c;
  c.mesh = mesh;
  c.plan = plan;
  c.precision = precision;
  return c;
}

// Micro-batching runs forward and backward before the optimizer: a graph in which a forward
// op reads what an earlier optimizer op wrote cannot be cut that way, and says so.
// Each op's semantics are one entry of its family (engines/tpu-mesh/ops/), found under its
// own kind; the ops with one are what the engine implements: every core and llama op.
TEST(TpuMeshCompiler, EveryCoreAndLlamaOpHasOneRuleEntryWithALowering) {
  const TpuMeshEngine engine(MeshConfig{});
  for (const OpDescription& d : kOpDescriptions) {
    SCOPED_TRACE(std::string(d.name));
    const OpRules& rules = rules_of(d.kind);
    EXPECT_EQ(rules.op, d.kind);
    EXPECT_EQ(rules.lower != nullptr, engine.implements(d.kind));
    if (d.family != OpFamily::MixtureOfExperts) {
      EXPECT_NE(rules.lower, nullptr);
    }
  }
}

TEST(TpuMeshCompiler, PhaseSplitRefusesToReorderADependency) {
  const TracedStep t = trace_and_compile("micro", mesh_config({1, 1}, ShardPlan::DataParallel));
  const PhaseSplit split = split_phases(t.graph);
  EXPECT_EQ(split.gradients.nodes.size() + split.optimizer.nodes.size(), t.graph.nodes.size());
  for (const Node& n : split.optimizer.nodes) EXPECT_EQ(n.phase, Phase::Optimizer);
  Graph reordered = t.graph;
  const auto update = std::find_if(reordered.nodes.begin(), reordered.nodes.end(),
                                   [](const Node& n) { return n.op == OpKind::AdamW; });
  ASSERT_NE(update, reordered.nodes.end());
  const Node moved = *update;  // an update of a parameter, traced before the forward reads it
  reordered.nodes.erase(update);
  reordered.nodes.insert(reordered.nodes.begin(), moved);
  try {
    split_phases(reordered);
    FAIL() << "a reordering split was accepted";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("reads a value the optimizer wrote"), std::string::npos) << e.what();
  }
}

TEST(TpuMeshCompiler, OneDeviceProgramHasNoCollectivesOnAnyPlan) {
  for (ShardPlan plan : {ShardPlan::DataParallel, ShardPlan::TensorParallel, ShardPlan::Zero3}) {
    const TracedStep t = trace_and_compile("micro", mesh_config({1, 1}, plan));
    for (const Instr& in : t.exe.instrs) {
      EXPECT_FALSE(in.is_collective() && in.op() != InstrKind::LossMean && in.op() != InstrKind::GlobalNorm)
          << to_string(plan) << ": instruction " << in.kind;
      EXPECT_EQ(in.mesh_axis(), Axis::None);
    }
  }
}

TEST(TpuMeshCompiler, TensorParallelAllReducesAfterRowParallelAndColumnParallelBackward) {
  const TracedStep t = trace_and_compile("micro", mesh_config({1, 2}, ShardPlan::TensorParallel));
  const int layers = t.model.config().layers;
  // forward: one all-reduce over `model` after each row-parallel linear
  EXPECT_EQ(count(t.exe, InstrKind::AllReduce, Axis::Model, t.graph, "attn.proj"), layers);
  EXPECT_EQ(count(t.exe, InstrKind::AllReduce, Axis::Model, t.graph, "mlp.proj"), layers);
  EXPECT_EQ(count(t.exe, InstrKind::AllReduce, Axis::Model, t.graph, "attn.qkv"), 0);
  // backward: the input gradient of each column-parallel linear is a partial sum
  EXPECT_EQ(count(t.exe, InstrKind::AllReduce, Axis::Model, t.graph, "attn.qkv", Phase::Backward), layers);
  EXPECT_EQ(count(t.exe, InstrKind::AllReduce, Axis::Model, t.graph, "mlp.fc", Phase::Backward), layers);
  EXPECT_EQ(count(t.exe, InstrKind::AllReduce, Axis::Model, t.graph), 4 * layers);
  EXPECT_EQ(count(t.exe, InstrKind::AllReduce, Axis::Data, t.graph), 0);  // no data axis on 1x2
}

TEST(TpuMeshCompiler, DataParallelAllReducesEveryGradientContribution) {
  const TracedStep t = trace_and_compile("micro", mesh_config({2, 1}, ShardPlan::DataParallel));
  int contributions = 0;  // gradient operands written by backward ops
  for (const Node& n : t.graph.nodes) {
    if (n.phase != Phase::Backward) continue;
    for (TensorId out : outputs_of(n)) contributions += out != kNoTensor && t.model.tensors()[out].kind == TensorKind::Gradient;
  }
  EXPECT_EQ(count(t.exe, InstrKind::AllReduce, Axis::Data, t.graph), contributions);
  EXPECT_EQ(count(t.exe, InstrKind::AllReduce, Axis::Model, t.graph), 0);
  EXPECT_EQ(count(t.exe, InstrKind::ReduceScatter, Axis::Data, t.graph), 0);
}

TEST(TpuMeshCompiler, Zero3GathersParametersPerPhaseAndReduceScattersGradients) {
  const TracedStep t = trace_and_compile("micro", mesh_config({2, 1}, ShardPlan::Zero3));
  EXPECT_EQ(count(t.exe, InstrKind::AllReduce, Axis::Data, t.graph), 0);
  EXPECT_GT(count(t.exe, InstrKind::ReduceScatter, Axis::Data, t.graph), 0);
  // Each parameter is gathered in forward and again in backward where backward reads it.
  for (TensorId p : t.model.parameters()) {
    int gathers = 0;
    for (const Instr& in : t.exe.instrs) {
      gathers += in.op() == InstrKind::AllGather && t.exe.buffers[static_cast<std::size_t>(t.exe.buffers_of(in)[1])].tensor == p;
    }
    EXPECT_GE(gathers, 1) << t.model.tensors()[p].name;
    EXPECT_LE(gathers, 2) << t.model.tensors()[p].name;
  }
}

// Two transient buffers alive at the same time never share memory, and reuse happens.
TEST(TpuMeshCompiler, BufferPlanNeverOverlapsLiveBuffers) {
  for (ShardPlan plan : {ShardPlan::DataParallel, ShardPlan::TensorParallel, ShardPlan::Zero3}) {
    const TracedStep t = trace_and_compile("micro", mesh_config({2, 2}, plan, Precision::Bf16));
    std::int64_t transient_total = 0;
    const auto& b = t.exe.buffers;
    for (std::size_t i = 0; i < b.size(); ++i) {
      if (b[i].persistent || b[i].first_use < 0) continue;
      transient_total += b[i].numel;
      EXPECT_LE(b[i].offset + b[i].numel, t.exe.slab_numel);
      for (std::size_t j = i + 1; j < b.size(); ++j) {
        if (b[j].persistent || b[j].first_use < 0) continue;
        const bool live_together = b[i].first_use <= b[j].last_use && b[j].first_use <= b[i].last_use;
        const bool share_memory = b[i].offset < b[j].offset + b[j].numel && b[j].offset < b[i].offset + b[i].numel;
        EXPECT_FALSE(live_together && share_memory) << t.exe.name_of(b[i]) << " and " << t.exe.name_of(b[j]);
      }
    }
    EXPECT_LT(t.exe.slab_numel, transient_total) << "no buffer reuse under " << to_string(plan);
  }
}

TEST(TpuMeshCompiler, CompilingTheSameGraphTwiceGivesTheSameProgram) {
  const MeshConfig c = mesh_config({2, 2}, ShardPlan::TensorParallel);
  const TracedStep t = trace_and_compile("micro", c);
  const Executable again = compile(t.graph, t.model.tensors(), c, plan_shardings(t.model.tensors(), c), "test");
  ASSERT_EQ(again.instrs.size(), t.exe.instrs.size());
  EXPECT_EQ(std::memcmp(again.instrs.data(), t.exe.instrs.data(), again.instrs.size() * sizeof(Instr)), 0);
  EXPECT_EQ(again.operand_buffers, t.exe.operand_buffers);
  EXPECT_EQ(again.operand_dims, t.exe.operand_dims);
  EXPECT_EQ(again.operand_attrs, t.exe.operand_attrs);
  EXPECT_EQ(again.spec_dims, t.exe.spec_dims);
  EXPECT_TRUE(again.well_formed());
  for (std::size_t i = 0; i < again.buffers.size(); ++i) EXPECT_EQ(again.buffers[i].offset, t.exe.buffers[i].offset);
  EXPECT_EQ(again.peak_total_bytes, t.exe.peak_total_bytes);
}

TEST(TpuMeshCompiler, FingerprintIgnoresValuesButNotShapesPlansOrConstants) {
  const MeshConfig c = mesh_config({2, 1}, ShardPlan::DataParallel);
  const TracedStep t = trace_and_compile("micro", c);
  const std::string digest = table_digest(t.model.tensors());
  const std::string fp = fingerprint(t.graph, digest, c.fingerprint_flags());
  EXPECT_EQ(fp, fingerprint(t.graph, digest, c.fingerprint_flags()));
  EXPECT_NE(fp, fingerprint(t.graph, digest, mesh_config({2, 1}, ShardPlan::Zero3).fingerprint_flags()));
  EXPECT_NE(fp, fingerprint(t.graph, table_digest(canary::Gpt2Canary(canary::load_canary("tiny")).tensors()),
                            c.fingerprint_flags()));
  Graph leaked = t.graph;
  leaked.nodes.insert(leaked.nodes.begin(), Node{OpKind::Constant, "lr", -1, Phase::Optimizer, {0}, {1e-3f}});
  Graph leaked_next = leaked;
  leaked_next.nodes.front().attrs[0] = 2e-3f;
  EXPECT_NE(fingerprint(leaked, digest, c.fingerprint_flags()), fingerprint(leaked_next, digest, c.fingerprint_flags()));
  MeshConfig cached_elsewhere = c;
  cached_elsewhere.compile_cache_dir = "/somewhere/else";  // a debug setting: same program
  EXPECT_EQ(fp, fingerprint(t.graph, digest, cached_elsewhere.fingerprint_flags()));
}

// A host read between traced ops executes what was traced so far and counts a HostSync.
TEST(TpuMeshEngine, HostReadInsideAStepIsAGraphBreak) {
  const canary::Gpt2Canary model(canary::load_canary("micro"));
  TpuMeshEngine engine(mesh_config({2, 1}, ShardPlan::DataParallel));
  engine.bind(model.tensors());
  model.upload_initial_parameters(engine, 1);
  const TensorTable& table = model.tensors();
  const TensorId grad = table.of_kind(TensorKind::Gradient).front();
  const TensorId wte = table.find("wte", TensorKind::Parameter);
  engine.step_begin(0);
  engine.zero(grad);
  const std::span<const float> before = engine.read(wte);  // inside the step: a sync point
  EXPECT_EQ(before.size(), static_cast<std::size_t>(table[wte].numel()));
  engine.zero(grad);
  engine.step_end();
  EXPECT_EQ(engine.counters().host_sync, 1);
  ASSERT_EQ(engine.graph_breaks().size(), 1u);
  EXPECT_EQ(engine.graph_breaks()[0].what, "read");
  EXPECT_EQ(engine.graph_breaks()[0].tensor, "wte");
  EXPECT_EQ(engine.graph_breaks()[0].after_site, table[grad].name);
  EXPECT_EQ(engine.step_programs().size(), 2u);
  EXPECT_THROW(engine.read(table.find("lnf.out", TensorKind::Activation)), std::logic_error);
}

}  // namespace
}  // namespace harness::tpu

namespace harness::tpu {
namespace {

// A value produced before a graph break and used after it would be read from another
// program's memory: the compiler refuses, naming the tensor, instead of reading it stale.
TEST(TpuMeshEngine, ValueCarriedAcrossAGraphBreakIsRefusedNotReadStale) {
  const canary::Gpt2Canary model(canary::load_canary("micro"));
  const TensorTable& table = model.tensors();
  TpuMeshEngine engine(mesh_config({2, 1}, ShardPlan::DataParallel));
  engine.bind(table);
  model.upload_initial_parameters(engine, 1);
  const TensorId fc = table.find("blocks.0.mlp.fc.out", TensorKind::Activation);
  const TensorId gelu = table.find("blocks.0.mlp.gelu.out", TensorKind::Activation);
  const TensorId d_fc = table.find("blocks.0.mlp.fc.out", TensorKind::ActivationGrad);
  const TensorId d_gelu = table.find("blocks.0.mlp.gelu.out", TensorKind::ActivationGrad);
  const OpSite forward{"blocks.0.mlp.gelu", 0, Phase::Forward}, backward{"blocks.0.mlp.gelu", 0, Phase::Backward};
  engine.step_begin(0);
  for (TensorId id : {fc, d_fc, d_gelu}) engine.zero(id);
  engine.gelu_forward(forward, gelu, fc);
  (void)engine.read(table.find("loss", TensorKind::Scalar));  // the break: runs what is traced
  engine.gelu_backward(backward, d_fc, fc, d_gelu);
  try {
    engine.step_end();
    FAIL() << "a value from before the break was read";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("blocks.0.mlp.fc.out"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("graph break"), std::string::npos) << e.what();
  }
}

// The structural checks a program from disk passes before it runs: each mutation of a
// well-formed program is caught.
TEST(TpuMeshCompiler, WellFormedRejectsEveryMalformedProgram) {
  const TracedStep t = trace_and_compile("micro", mesh_config({2, 2}, ShardPlan::Zero3));
  ASSERT_TRUE(t.exe.well_formed());
  auto find = [&](InstrKind kind) {
    return static_cast<std::size_t>(std::find_if(t.exe.instrs.begin(), t.exe.instrs.end(),
                                                 [&](const Instr& in) { return in.op() == kind; }) -
                                    t.exe.instrs.begin());
  };
  std::vector<std::pair<std::string, std::function<void(Executable&)>>> mutations{
      {"unknown kind", [&](Executable& e) { e.instrs[0].kind = 99; }},
      {"buffer out of range", [&](Executable& e) { e.operand_buffers[0] = static_cast<std::int32_t>(e.buffers.size()); }},
      {"absent operand where one is required",
       [&](Executable& e) { e.operand_buffers[static_cast<std::size_t>(e.instrs[find(InstrKind::AdamW)].buffers_at)] = -1; }},
      {"attribute missing", [&](Executable& e) { e.instrs[find(InstrKind::AdamW)].attrs_count = 3; }},
      {"spec missing", [&](Executable& e) { e.instrs[find(InstrKind::AllGather)].specs_count = 0; }},
      {"groups zero", [&](Executable& e) { e.spec_dims[1] = 0; }},
      {"dims past the pool", [&](Executable& e) { e.instrs.back().dims_at = static_cast<std::int32_t>(e.operand_dims.size()); }},
      {"fill longer than its buffer",
       [&](Executable& e) { e.operand_dims[static_cast<std::size_t>(e.instrs[find(InstrKind::Fill)].dims_at)] += 1 << 30; }},
      {"transient past the slab", [&](Executable& e) {
         for (BufferInfo& b : e.buffers) {
           if (!b.persistent && b.first_use >= 0) b.offset = e.slab_numel;
         }
       }},
      {"negative slab", [&](Executable& e) { e.slab_numel = -1; }},
  };
  for (auto& [what, mutate] : mutations) {
    Executable broken = t.exe;
    mutate(broken);
    EXPECT_FALSE(broken.well_formed()) << what;
  }
}

}  // namespace
}  // namespace harness::tpu
