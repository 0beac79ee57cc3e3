// `harness audit`: is the canary compile-stable on an engine that compiles its steps
// (tpu-mesh)? Exit 0 clean, 1 findings,
// 2 bad usage. docs/cli.md documents the --json keys.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "audit.h"
#include "canary_run.h"
#include "commands.h"
#include "usage_check.h"
#include "json_text.h"
#include "thread_flag.h"

namespace harness::cli {
namespace {

struct AuditFlags {
  run::AuditOptions options;
  EngineFlagValues engine_flags;
  bool json = false;
};

nlohmann::json to_json(const run::AuditReport& report) {
  nlohmann::json j;
  j["lane"] = report.lane;
  j["clean"] = report.clean();
  j["steps"] = nlohmann::json::array();
  for (std::size_t s = 0; s < report.steps.size(); ++s) {
    nlohmann::json graphs = nlohmann::json::array();
    for (const auto& segment : report.steps[s].segments) {
      graphs.push_back({{"fingerprint", segment.fingerprint},
                        {"program", segment.part},
                        {"ops", segment.graph.nodes.size()}});
    }
    j["steps"].push_back({{"step", s}, {"graphs", graphs}});
  }
  j["findings"] = nlohmann::json::array();
  for (const auto& f : report.findings) {
    j["findings"].push_back({{"kind", f.kind}, {"step", f.step}, {"op", f.op}, {"tensor", f.tensor},
                             {"values", f.values}, {"message", f.message}});
  }
  return j;
}

void print_human(const run::AuditReport& report) {
  fmt::print("lane        {}\n", report.lane);
  for (std::size_t s = 0; s < report.steps.size(); ++s) {
    const auto& segments = report.steps[s].segments;
    fmt::print("step {}      {} graph{}", s, segments.size(), segments.size() == 1 ? "" : "s");
    for (const auto& segment : segments) {
      fmt::print("  {} {} ({} ops)", segment.part, segment.fingerprint.substr(0, 16),
                 segment.graph.nodes.size());
    }
    fmt::print("\n");
  }
  if (report.clean()) {
    fmt::print("clean       no graph breaks, no varying constants, the same graph every step\n");
    return;
  }
  for (const auto& f : report.findings) fmt::print("FINDING     {}\n", f.message);
}

int audit_action(AuditFlags& f) {
  run::AuditOptions o = f.options;
  apply_engine_flags(f.engine_flags, o.engine_settings);
  const run::AuditReport report = run::audit_canary(o);
  if (f.json) {
    fmt::print("{}\n", run::json_text(to_json(report)));
  } else {
    print_human(report);
  }
  return report.clean() ? kExitPass : kExitCheckFailed;
}

}  // namespace

void add_audit_command(CLI::App& app, CommandRegistry& commands) {
  auto flags = std::make_shared<AuditFlags>();
  CLI::App* audit = app.add_subcommand("audit", "Trace two steps on an engine that compiles them (tpu-mesh) and report compile-stability traps");
  audit->add_option("--canary", flags->options.canary, "Canary: a shipped one's name (canaries/NAME.toml) or a canary file's path")->capture_default_str();
  audit->add_option("--engine", flags->options.engine, "Engine: one that compiles its steps")->capture_default_str();
  add_threads_flag(*audit, flags->options.threads, "Worker threads (0 = all cores)");
  audit->add_option("--seed", flags->options.seed, "Initialisation seed (default: the canary's [train] seed)")
      ->check(seed_check());
  audit->add_flag("--json", flags->json, "Machine-readable report");
  add_engine_flags(*audit, flags->engine_flags);
  commands.add(audit, [flags] { return audit_action(*flags); });
}

}  // namespace harness::cli
