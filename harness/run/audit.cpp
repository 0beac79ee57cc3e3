#include "audit.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <tbb/global_control.h>

#include "canary_file.h"
#include "data_source.h"
#include "canary_run.h"
#include "canary.h"
#include "preset.h"
#include "registry.h"
#include "run_setup.h"

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
    for (const GraphBreak& b : steps[s].breaks) {
      const std::string what = b.what == "read" ? "host read of" : "upload of";
      out.push_back({"graph_break", static_cast<int>(s), b.after_site, b.tensor, {},
                     fmt::format("graph break at step {}: {} `{}` after op `{}` ({}); move it out of the step or "
                                 "keep the value on the device",
                                 s, what, b.tensor, b.after_site, to_string(b.after_phase))});
    }
  }
}

// The node that reads a tensor first after node `from` (to name where a constant is used).
const GraphNode& first_reader(const OpGraph& graph, std::size_t from, TensorId tensor) {
  for (std::size_t i = from + 1; i < graph.nodes.size(); ++i) {
    const auto& t = graph.nodes[i].tensors;
    if (std::find(t.begin(), t.end(), tensor) != t.end()) return graph.nodes[i];
  }
  return graph.nodes[from];
}

void compare_graphs(const OpGraph& a, const OpGraph& b, int step, std::vector<AuditFinding>& out) {
  const std::size_t common = std::min(a.nodes.size(), b.nodes.size());
  for (std::size_t i = 0; i < common; ++i) {
    const GraphNode& x = a.nodes[i];
    const GraphNode& y = b.nodes[i];
    if (x.op != y.op || x.tensors != y.tensors || x.site != y.site) {
      out.push_back({"graph_change", step, y.site, {}, {},
                     fmt::format("the traced graph changes at step {}, node {}: `{}` {} became `{}` {} (shapes or "
                                 "control flow vary between steps)",
                                 step, i, x.site, describe(x.op).name, y.site, describe(y.op).name)});
      return;  // everything after the first change differs too
    }
    const bool attrs_differ = !same_bits(x.attrs, y.attrs);
    if (attrs_differ && x.op == OpKind::Constant) {
      const GraphNode& reader = first_reader(b, i, y.tensors[0]);
      out.push_back({"varying_constant", step, reader.site, y.site, {x.attrs[0], y.attrs[0]},
                     fmt::format("constant `{}` is baked into the graph and varies: {} at step {}, {} at step {}; "
                                 "op `{}` ({}) reads it. Upload it into a 0-D device tensor instead",
                                 y.site, x.attrs[0], step - 1, y.attrs[0], step, reader.site, describe(reader.op).name)});
    } else if (attrs_differ) {
      out.push_back({"varying_constant", step, y.site, {}, {},
                     fmt::format("op `{}` ({}) has attributes that vary between steps {} and {}", y.site,
                                 describe(y.op).name, step - 1, step)});
    }
  }
  if (a.nodes.size() != b.nodes.size()) {
    out.push_back({"graph_change", step, {}, {}, {},
                   fmt::format("the traced graph has {} ops at step {} and {} at step {}", a.nodes.size(), step - 1,
                               b.nodes.size(), step)});
  }
}

// The engines `audit` can trace: those whose default configuration compiles its steps.
std::vector<std::string> compiling_engines() {
  std::vector<std::string> names;
  for (const std::string& name : engine_names()) {
    if (make_engine(name)->step_compilation() != nullptr) names.push_back(name);
  }
  return names;
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
  const int threads = worker_threads(o.threads);
  check_engine_can_run(o.engine, o.engine_settings, *canary::make_canary(config));
  std::unique_ptr<Engine> engine = make_engine(o.engine, o.engine_settings);
  if (engine->step_compilation() == nullptr) {
    throw UsageError(fmt::format("--engine: {} runs each op as it is called and compiles no graph to audit; choose an "
                                 "engine that compiles its steps ({})",
                                 o.engine, fmt::join(compiling_engines(), ", ")));
  }
  const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads));
  const RunSetup setup = set_up_run(config, std::move(engine));
  upload_initial_parameters(setup, static_cast<std::uint64_t>(o.seed.value_or(config.init_seed)));
  const StepCompilation& compiled = *setup.engine->step_compilation();

  AuditReport report;
  report.lane = setup.lane;
  for (int step = 0; step < kTracedSteps; ++step) {
    setup.model->train_step(*setup.engine, step, data->batch(step));
    report.steps.push_back({compiled.step_programs(), compiled.graph_breaks()});
  }
  report.findings = audit_findings(report.steps);
  return report;
}

}  // namespace harness::run
