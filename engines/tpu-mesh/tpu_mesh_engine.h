// tpu-mesh: the compile-stable mesh engine. Op calls are traced into a Graph (lazy
// tensors); at the step boundary the graph is fingerprinted, looked up in the compile
// cache, compiled on a miss and executed SPMD on a simulated mesh of devices.
// A host read inside a step is a graph break: it executes what was traced so far, counts
// a HostSync and starts a new graph. docs/engines/tpu-mesh.md has the whole story.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "api/engine.h"
#include "compile_cache.h"
#include "compiler.h"
#include "executor.h"
#include "graph.h"
#include "mesh_config.h"

namespace harness::tpu {

// Per-step counters, named as torch_xla's metrics (recorded as /compile/<Name>).
struct CompileCounters {
  double compile_seconds = 0, execute_seconds = 0;
  std::int64_t uncached_compile = 0, cached_compile = 0;
  std::int64_t persistent_hit = 0, persistent_miss = 0, deserialize_failure = 0;
  std::int64_t host_sync = 0;
};

// A step runs one program in step mode, more after a graph break, and two or three (its
// roles, engines/tpu-mesh/compiler.h) in micro-step mode: each is a TracedProgram.
class TpuMeshEngine final : public Engine, public StepCompilation {
 public:
  explicit TpuMeshEngine(MeshConfig config);

  std::string_view name() const override { return "tpu-mesh"; }
  std::string lane_engine() const override { return config_.engine_label(); }
  std::string features() const override { return config_.canonical_features(); }
  std::vector<std::string> budget_features() const override { return config_.budget_features(); }
  std::map<std::string, AttributeValue> manifest_attributes() const override;
  std::vector<StepState> step_state() const override;
  void check_table(const TensorTable& table) const override;
  void bind(const TensorTable& table) override;

  void upload(TensorId id, std::span<const float> values) override;
  void upload_tokens(TensorId id, std::span<const std::int32_t> tokens) override;
  std::span<const float> read(TensorId id) override;

  void step_begin(int step) override;
  void step_end() override;

  void zero(TensorId id) override;
  // Every compute op of the boundary (engines/api/engine_ops.inc), each defined in tpu_mesh_engine.cpp.
#define HARNESS_ENGINE_OP(family, kind, member, parameters) void member parameters override;
#include "api/engine_ops.inc"
#undef HARNESS_ENGINE_OP
  bool implements(OpKind op) const override;  // the ops with rules (engines/tpu-mesh/ops/)
  void trace(const OpSite& site, TensorId tensor) override;
  EngineState save_state() const override;

  // What the last step traced and counted (for `harness audit` and the tests).
  const StepCompilation* step_compilation() const override { return this; }
  const std::vector<TracedProgram>& step_programs() const override { return segments_; }
  const std::vector<GraphBreak>& graph_breaks() const override { return breaks_; }
  const CompileCounters& counters() const { return counters_; }
  const MeshConfig& config() const { return config_; }

 private:
  // A traced tensor of this step: its op and, once the step has run, its value.
  struct TracedValue {
    std::string site;
    int layer = -1;
    Phase phase = Phase::Forward;
    TensorId tensor = kNoTensor;
    std::vector<float> value;  // held until its turn (or assembled from micro-batches)
    bool arrived = false;
  };

  void collect_trace(int slot, int micro_batch, std::span<const float> value);
  void assemble_micro_batch(TracedValue& traced, int micro_batch, std::span<const float> value);
  void deliver(const TracedValue& traced, std::span<const float> value);
  void deliver_arrived();
  void deliver_traces();  // the rest, to the sink, in the model's op order
  // One node of the step's graph, laid out as its op's description says: the operand count
  // of a fixed-operand op is checked when this compiles, the attributes when it runs.
  template <OpKind Op, std::size_t N>
  void record(const OpSite& site, const TensorId (&tensors)[N], std::vector<float> attrs = {}) {
    static_assert(!describe(Op).variadic() && N == describe(Op).operands.size(),
                  "the recorded operands do not match the op's description (api/op_description.h)");
    record_node(Op, site, std::vector<TensorId>(tensors, tensors + N), std::move(attrs));
  }
  void record_node(OpKind op, const OpSite& site, std::vector<TensorId> tensors, std::vector<float> attrs = {});
  bool pending_uses(TensorId id) const;  // whether a traced, not yet executed op uses it
  void cut_graph(const std::string& what, TensorId id);
  void flush();  // compile-or-lookup and execute the traced graph
  void execute(Graph graph, ProgramRole role, int runs);  // kept in segments_ afterwards
  std::shared_ptr<const Executable> lookup_or_compile(const Graph& graph, ProgramRole role,
                                                      const std::string& fingerprint);
  bool fits(const Executable& exe) const;
  void note_memory(const Executable& exe);

  MeshConfig config_;
  const TensorTable* table_ = nullptr;
  std::vector<PartitionSpec> specs_;
  std::string table_digest_;
  MeshExecutor executor_;
  CompileCache cache_;
  Graph pending_;
  bool in_step_ = false;
  CompileCounters counters_;
  std::vector<TracedProgram> segments_;
  std::vector<GraphBreak> breaks_;
  std::vector<TracedValue> traces_;  // by trace slot; the first traces_used_ are this step's
  std::size_t traces_used_ = 0, traces_delivered_ = 0;
  int batch_shards_ = 1;              // data shards of the batch dimension
  std::vector<std::int64_t> step_peak_bytes_;  // per MemoryCategory, then the total
};

}  // namespace harness::tpu
