// `harness audit`: traces two training steps of a canary on an engine that compiles its
// steps (engines/api/step_compilation.h: tpu-mesh here) and
// reports what would make the compiled program unstable: graph breaks (host reads or
// uploads between traced ops), constants whose value differs between the two steps (a
// host scalar baked into the graph), and graphs whose structure differs between steps.
// A clean canary compiles once and replays the same program every step.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "api/engine_settings.h"
#include "api/step_compilation.h"

namespace harness::run {

struct AuditOptions {
  std::string canary = "tiny";
  std::string engine = "tpu-mesh";
  EngineSettings engine_settings;
  int threads = 0;
  std::optional<std::int64_t> seed;  // default: the canary's [train] seed
};

struct AuditFinding {
  std::string kind;  // "graph_break", "varying_constant", "graph_change"
  int step = 0;
  std::string op;      // the op site it concerns
  std::string tensor;  // the tensor read, uploaded or baked in
  std::vector<double> values;  // varying_constant: the value at each traced step
  std::string message;         // one line for people
};

// What one traced step produced: its graphs (more than one after a break) and breaks.
struct StepTrace {
  std::vector<TracedProgram> segments;
  std::vector<GraphBreak> breaks;
};

struct AuditReport {
  std::string lane;
  std::vector<StepTrace> steps;
  std::vector<AuditFinding> findings;
  bool clean() const { return findings.empty(); }
};

// Throws UsageError (canary_run.h) for bad options, before tracing anything.
AuditReport audit_canary(const AuditOptions& options);

// The findings of traced steps (exposed for tests: any trace, not only the canary's).
std::vector<AuditFinding> audit_findings(const std::vector<StepTrace>& steps);

}  // namespace harness::run
