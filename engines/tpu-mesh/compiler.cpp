#include "compiler.h"

#include <algorithm>

#include <fmt/format.h>

#include "op_rules.h"

namespace harness::tpu {
namespace {

constexpr std::int64_t kSlabAlignment = 16;  // floats: 64-byte aligned buffer starts

// Whether the forward and backward nodes may all run before the optimizer nodes (once per
// micro-batch): none of them reads a value an earlier optimizer node wrote. The one
// optimizer node traced early is a leaked scalar's Constant, which only the update reads.
void check_phases_separable(const Graph& graph) {
  std::vector<TensorId> optimizer_outputs;
  for (const Node& n : graph.nodes) {
    if (n.phase == Phase::Optimizer) {
      for (TensorId id : outputs_of(n)) optimizer_outputs.push_back(id);
      continue;
    }
    for (TensorId id : n.tensors) {
      if (id != kNoTensor && std::find(optimizer_outputs.begin(), optimizer_outputs.end(), id) != optimizer_outputs.end()) {
        throw CompileError(fmt::format("tpu-mesh compile: {} ({}) reads a value the optimizer wrote earlier in the "
                                       "step; micro-batches cannot split this step",
                                       n.site, to_string(n.op)));
      }
    }
  }
}

class Compiler {
 public:
  Compiler(const Graph& graph, const TensorTable& table, const MeshConfig& config, const std::vector<PartitionSpec>& plan,
           ProgramRole role)
      : graph_(graph), table_(table), role_(role), micro_batches_(config.grad_accum), c_(table, config, plan),
        exe_(c_.executable()) {}

  Executable run(const std::string& fingerprint) {
    exe_.format_version = kProgramFormatVersion;
    exe_.fingerprint = fingerprint;
    exe_.mesh_data = c_.mesh().data;
    exe_.mesh_model = c_.mesh().model;
    exe_.micro_batches = micro_batches_;
    for (const Node& n : graph_.nodes) verify(n);
    check_values_are_graph_local();
    propagate();
    for (const TensorDesc& t : table_.all()) {
      if (is_device_data(t.kind)) c_.buffer(static_cast<TensorId>(&t - table_.all().data()));
    }
    if (role_ == ProgramRole::Step && micro_batches_ > 1) {
      lower_unrolled_micro_batches();
    } else {
      c_.set_micro_batch(role_ == ProgramRole::Step ? kWholeBuffer : kRunMicroBatch, role_ == ProgramRole::GradAccumulate);
      lower_nodes([](const Node&) { return true; });
    }
    plan_buffers();
    return std::move(exe_);
  }

 private:
  // ---- pass 1: verification ------------------------------------------------------------
  // The node's layout against its op's description: operand and attribute counts, and a
  // tensor wherever one is not optional; then what each op needs of the shapes.
  void verify_layout(const Node& n) const {
    if (static_cast<std::size_t>(n.op) >= kOpDescriptions.size()) c_.reject(n, "unknown op");
    const OpDescription& d = describe(n.op);
    if (!d.takes(n.tensors.size())) {
      c_.reject(n, fmt::format("{} operands where the op takes {}{}", n.tensors.size(), d.operands.size(),
                               d.variadic() ? " or more" : ""));
    }
    if (n.attrs.size() != d.node_attribute_floats()) {
      c_.reject(n, fmt::format("{} attribute values where the op takes {}", n.attrs.size(), d.node_attribute_floats()));
    }
    for (std::size_t i = 0; i < d.operands.size(); ++i) {
      if (n.tensors[i] == kNoTensor && !d.operands[i].optional) {
        c_.reject(n, fmt::format("operand {} is not optional", d.operands[i].name));
      }
    }
    for (TensorId id : n.tensors) {
      if (id != kNoTensor && (id < 0 || static_cast<std::size_t>(id) >= table_.size())) c_.reject(n, "unknown tensor");
    }
  }

  void verify(const Node& n) const {
    verify_layout(n);
    for (TensorId id : n.tensors) {
      if (id == kNoTensor) continue;
      const bool tokens = table_[id].kind == TensorKind::Input;
      if (!tokens && table_[id].dtype != DType::F32) c_.reject(n, fmt::format("{} must be f32", table_[id].name));
    }
    if (const auto check = rules_of(n.op).check_shapes) check(c_, n);
  }

  // Activations and their gradients live in the graph's own transient buffers: a graph
  // may read one (or accumulate into one, as backward ops do) only after writing it.
  // A graph break between a producer and its consumer would carry a value across
  // programs, which this compiler does not do: it refuses rather than read stale memory.
  void check_values_are_graph_local() const {
    std::vector<bool> written(table_.size(), false);
    for (const Node& n : graph_.nodes) {
      const std::vector<TensorId> outputs = outputs_of(n), overwritten = overwritten_by(n);
      for (TensorId id : n.tensors) {
        if (id == kNoTensor) continue;
        const TensorKind kind = table_[id].kind;
        if (kind != TensorKind::Activation && kind != TensorKind::ActivationGrad) continue;
        const bool overwrites = n.phase == Phase::Forward &&
                                std::find(overwritten.begin(), overwritten.end(), id) != overwritten.end();
        if (!overwrites && !written[static_cast<std::size_t>(id)]) {
          c_.reject(n, fmt::format("reads {} {} that this graph did not write; a graph break (a host read or upload "
                                   "inside the step) separates it from its producer. Move the read out of the step",
                                   to_string(kind), table_[id].name));
        }
      }
      for (TensorId id : outputs) {
        if (id != kNoTensor) written[static_cast<std::size_t>(id)] = true;
      }
    }
  }

  // ---- pass 2: sharding propagation ------------------------------------------------------
  void propagate() {
    for (const Node& n : graph_.nodes) {
      if (const auto rule = rules_of(n.op).propagate) rule(c_, n);
    }
    for (TensorId g : table_.of_kind(TensorKind::ActivationGrad)) {
      if (const TensorId act = table_[g].mirrors; act != kNoTensor) c_.spec_of(g) = c_.spec_of(act);
    }
  }

  // ---- pass 3: lowering ------------------------------------------------------------------
  template <typename Keep>
  void lower_nodes(Keep keep) {
    for (std::size_t i = 0; i < graph_.nodes.size(); ++i) {
      const Node& n = graph_.nodes[i];
      if (!keep(n)) continue;
      c_.begin_node(static_cast<int>(i), n);
      rules_of(n.op).lower(c_, n);
    }
  }
  // One program for a step of K micro-batches: forward and backward once per micro-batch
  // (each reading its fixed slice of the inputs, the later ones adding to the gradients
  // and the loss), then the optimizer once. The same kernels in the same order as the
  // micro-step programs, so both modes give the same bits.
  void lower_unrolled_micro_batches() {
    check_phases_separable(graph_);
    for (int k = 0; k < micro_batches_; ++k) {
      c_.set_micro_batch(k, k > 0);
      lower_nodes([](const Node& n) { return n.phase != Phase::Optimizer; });
    }
    c_.set_micro_batch(kWholeBuffer, false);
    lower_nodes([](const Node& n) { return n.phase == Phase::Optimizer; });
  }

  // ---- pass 4: buffer planning -----------------------------------------------------------
  void plan_buffers() {
    for (std::size_t i = 0; i < exe_.instrs.size(); ++i) {
      for (std::int32_t b : exe_.buffers_of(exe_.instrs[i])) {
        if (b < 0) continue;
        BufferInfo& info = exe_.buffers[static_cast<std::size_t>(b)];
        if (info.first_use < 0) info.first_use = static_cast<std::int32_t>(i);
        info.last_use = static_cast<std::int32_t>(i);
      }
    }
    assign_offsets();
    measure_peaks();
  }

  static std::int64_t aligned(std::int64_t n) { return (n + kSlabAlignment - 1) / kSlabAlignment * kSlabAlignment; }
  static bool lives_overlap(const BufferInfo& a, const BufferInfo& b) {
    return a.first_use <= b.last_use && b.first_use <= a.last_use;
  }

  // Greedy first fit, largest buffers first: each goes to the lowest offset that no
  // buffer alive at the same time occupies.
  void assign_offsets() {
    std::vector<int> order;
    for (std::size_t b = 0; b < exe_.buffers.size(); ++b) {
      if (!exe_.buffers[b].persistent && exe_.buffers[b].first_use >= 0) order.push_back(static_cast<int>(b));
    }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return exe_.buffers[a].numel > exe_.buffers[b].numel; });
    std::vector<int> placed;
    for (int b : order) {
      BufferInfo& info = exe_.buffers[static_cast<std::size_t>(b)];
      std::vector<std::pair<std::int64_t, std::int64_t>> taken;
      for (int p : placed) {
        const BufferInfo& other = exe_.buffers[static_cast<std::size_t>(p)];
        if (lives_overlap(info, other)) taken.emplace_back(other.offset, other.offset + aligned(other.numel));
      }
      std::sort(taken.begin(), taken.end());
      std::int64_t offset = 0;
      for (const auto& [begin, end] : taken) {
        if (offset + aligned(info.numel) <= begin) break;
        offset = std::max(offset, end);
      }
      info.offset = offset;
      exe_.slab_numel = std::max(exe_.slab_numel, offset + aligned(info.numel));
      placed.push_back(b);
    }
  }

  void measure_peaks() {
    std::vector<std::int64_t> persistent(kMemoryCategories, 0);
    for (const BufferInfo& b : exe_.buffers) {
      if (b.persistent && b.micro_slice == kWholeBuffer) persistent[static_cast<std::size_t>(b.category)] += b.numel * 4;
    }
    exe_.peak_bytes = persistent;
    std::int64_t persistent_total = 0;
    for (std::int64_t bytes : persistent) persistent_total += bytes;
    exe_.peak_total_bytes = persistent_total;
    for (std::size_t i = 0; i < exe_.instrs.size(); ++i) {
      std::vector<std::int64_t> live = persistent;
      for (const BufferInfo& b : exe_.buffers) {
        if (!b.persistent && b.first_use >= 0 && b.first_use <= static_cast<int>(i) && static_cast<int>(i) <= b.last_use) {
          live[static_cast<std::size_t>(b.category)] += b.numel * 4;
        }
      }
      std::int64_t total = 0;
      for (int c = 0; c < kMemoryCategories; ++c) {
        exe_.peak_bytes[static_cast<std::size_t>(c)] = std::max(exe_.peak_bytes[static_cast<std::size_t>(c)], live[static_cast<std::size_t>(c)]);
        total += live[static_cast<std::size_t>(c)];
      }
      exe_.peak_total_bytes = std::max(exe_.peak_total_bytes, total);
    }
  }

  const Graph& graph_;
  const TensorTable& table_;
  const ProgramRole role_;
  const int micro_batches_;
  Compilation c_;
  Executable& exe_;  // c_'s, finished by pass 4
};

}  // namespace

const char* to_string(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::Parameters: return "parameters";
    case MemoryCategory::Gradients: return "gradients";
    case MemoryCategory::OptimizerState: return "optimizer_state";
    case MemoryCategory::Activations: return "activations";
    case MemoryCategory::Temporaries: return "temporaries";
  }
  return "?";
}

std::string_view to_string(ProgramRole role) {
  switch (role) {
    case ProgramRole::Step: return "step";
    case ProgramRole::GradCreate: return "grad-create";
    case ProgramRole::GradAccumulate: return "grad-accumulate";
    case ProgramRole::Optimizer: return "optimizer";
  }
  return "?";
}

Executable compile(const Graph& graph, const TensorTable& table, const MeshConfig& config,
                   const std::vector<PartitionSpec>& plan, const std::string& fingerprint, ProgramRole role) {
  return Compiler(graph, table, config, plan, role).run(fingerprint);
}

PhaseSplit split_phases(const Graph& graph) {
  check_phases_separable(graph);
  PhaseSplit split;
  for (const Node& n : graph.nodes) (n.phase == Phase::Optimizer ? split.optimizer : split.gradients).nodes.push_back(n);
  return split;
}

}  // namespace harness::tpu
