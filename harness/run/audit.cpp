#include "audit.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <tbb/global_control.h>

#include "canary_file.h"
#include "data_source.h"
#include "canary_run.h"
#include "canary.h"
#include "preset.h"
#include "registry.h"

namespace harness::run {
namespace {

// Attributes compared by their bits: a double travels as two floats whose halves may be
// NaN patterns (RoPE's theta), and a NaN never equals itself.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

constexpr int kTracedSteps = 2;  // two steps: the least that shows what varies between steps

void find_graph_breaks(const std::vector<StepTrace>& steps, std::vector<AuditFinding>& out) {
  for (std::size_t s = 0; s < steps.size(); ++s) {
    for (const tpu::GraphBreak& b : steps[s].breaks) {
      const std::string what = b.what == "read" ? "host read of" : "upload of";
      out.push_back({"graph_break", static_cast<int>(s), b.after_site, b.tensor, {},
                     fmt::format("graph break at step {}: {} `{}` after op `{}` ({}); move it out of the step or "
                                 "keep the value on the device",
                                 s, what, b.tensor, b.after_site, to_string(b.after_phase))});
    }
  }
}

// The node that reads a tensor first after node `from` (to name where a constant is used).
const tpu::Node& first_reader(const tpu::Graph& graph, std::size_t from, TensorId tensor) {
  for (std::size_t i = from + 1; i < graph.nodes.size(); ++i) {
    const auto& t = graph.nodes[i].tensors;
    if (std::find(t.begin(), t.end(), tensor) != t.end()) return graph.nodes[i];
  }
  return graph.nodes[from];
}

void compare_graphs(const tpu::Graph& a, const tpu::Graph& b, int step, std::vector<AuditFinding>& out) {
  const std::size_t common = std::min(a.nodes.size(), b.nodes.size());
  for (std::size_t i = 0; i < common; ++i) {
    const tpu::Node& x = a.nodes[i];
    const tpu::Node& y = b.nodes[i];
    if (x.op != y.op || x.tensors != y.tensors || x.site != y.site) {
      out.push_back({"graph_change", step, y.site, {}, {},
                     fmt::format("the traced graph changes at step {}, node {}: `{}` {} became `{}` {} (shapes or "
                                 "control flow vary between steps)",
                                 step, i, x.site, tpu::to_string(x.op), y.site, tpu::to_string(y.op))});
      return;  // everything after the first change differs too
    }
    const bool attrs_differ = !same_bits(x.attrs, y.attrs);
    if (attrs_differ && x.op == tpu::OpKind::Constant) {
      const tpu::Node& reader = first_reader(b, i, y.tensors[0]);
      out.push_back({"varying_constant", step, reader.site, y.site, {x.attrs[0], y.attrs[0]},
                     fmt::format("constant `{}` is baked into the graph and varies: {} at step {}, {} at step {}; "
                                 "op `{}` ({}) reads it. Upload it into a 0-D device tensor instead",
                                 y.site, x.attrs[0], step - 1, y.attrs[0], step, reader.site, tpu::to_string(reader.op))});
    } else if (attrs_differ) {
      out.push_back({"varying_constant", step, y.site, {}, {},
                     fmt::format("op `{}` ({}) has attributes that vary between steps {} and {}", y.site,
                                 tpu::to_string(y.op), step - 1, step)});
    }
  }
  if (a.nodes.size() != b.nodes.size()) {
    out.push_back({"graph_change", step, {}, {}, {},
                   fmt::format("the traced graph has {} ops at step {} and {} at step {}", a.nodes.size(), step - 1,
                               b.nodes.size(), step)});
  }
}

}  // namespace

std::vector<AuditFinding> audit_findings(const std::vector<StepTrace>& steps) {
  std::vector<AuditFinding> findings;
  find_graph_breaks(steps, findings);
  for (std::size_t s = 1; s < steps.size(); ++s) {
    const auto& before = steps[s - 1].segments;
    const auto& now = steps[s].segments;
    if (before.size() != now.size()) {
      findings.push_back({"graph_change", static_cast<int>(s), {}, {}, {},
                          fmt::format("step {} runs {} graphs and step {} runs {}", s - 1, before.size(), s, now.size())});
      continue;
    }
    for (std::size_t g = 0; g < now.size(); ++g) compare_graphs(before[g].graph, now[g].graph, static_cast<int>(s), findings);
  }
  return findings;
}

AuditReport audit_canary(const AuditOptions& o) {
  canary::CanaryConfig config;
  std::unique_ptr<canary::DataSource> data;
  try {
    config = canary::load_canary(o.canary);
    data = canary::make_data_source(config);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("--canary: {}", e.what()));
  }
  if (o.engine != "tpu-mesh") {
    throw UsageError(fmt::format("--engine: audit traces compiled graphs, and only tpu-mesh compiles them (got '{}')",
                                 o.engine));
  }
  const int threads = worker_threads(o.threads);
  const std::unique_ptr<canary::Canary> canary_model = canary::make_canary(config);
  const canary::Canary& model = *canary_model;
  std::unique_ptr<Engine> engine;
  try {
    engine = make_engine(o.engine, o.engine_settings);
    engine->check_table(model.tensors());
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads));
  auto& mesh = static_cast<tpu::TpuMeshEngine&>(*engine);
  mesh.bind(model.tensors());
  model.upload_initial_parameters(mesh, static_cast<std::uint64_t>(o.seed.value_or(config.init_seed)));

  AuditReport report;
  report.lane = lane_name(config.name, mesh.lane_engine(), mesh.features());
  for (int step = 0; step < kTracedSteps; ++step) {
    model.train_step(mesh, step, data->batch(step));
    report.steps.push_back({mesh.step_segments(), mesh.graph_breaks()});
  }
  report.findings = audit_findings(report.steps);
  return report;
}

}  // namespace harness::run
