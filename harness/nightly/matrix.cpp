#include "matrix.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <nlohmann/json.hpp>

#include "bf16_first.h"
#include "canary.h"
#include "canary_file.h"
#include "lane_stacks.h"
#include "child_process.h"
#include "mesh_config.h"
#include "preset.h"
#include "python_canary.h"
#include "receipt/budget_features.h"
#include "registry.h"

namespace harness::nightly {
namespace {

inline constexpr std::int64_t kMatrixSchemaVersion = 1;
// What runs a Python lane where neither the matrix nor the lane names an interpreter
// (`python = PATH`): Debian's python3, with this checkout's package.
inline constexpr const char* kPython = "/usr/bin/python3";

#ifndef HARNESS_SOURCE_DIR
#define HARNESS_SOURCE_DIR "."
#endif

bool is_engine_flag(const std::string& key) { return find_engine_flag(key) != nullptr; }
// The keys every lane takes, whatever runs it: its id, its engine (none for a command) and why.
bool is_common_key(const std::string& key) { return key == "id" || key == "engine" || key == "why"; }

// The lane's name, budget features and command (run by `python`), as its stack's
// description makes them from `options`.
void from_stack(const LaneStack& stack, const StackOptions& options, const std::string& python, LaneSpec& spec) {
  spec.lane = stack_lane_name(stack, options);
  spec.budget_features = stack_budget_features(stack, options);
  spec.command = {python};
  for (std::string& word : stack_command(stack, options)) spec.command.push_back(std::move(word));
  spec.fault_flag = stack.fault_flag;
  spec.threads_flag = stack.threads_flag;
  spec.records = stack_records(stack, options);
}

class Parser {
 public:
  explicit Parser(std::string path) : path_(std::move(path)) {}

  Matrix parse() {
    toml::table root;
    try {
      root = toml::parse_file(path_);
    } catch (const toml::parse_error& e) {
      fail(fmt::format("line {}: {}", e.source().begin.line, e.description()));
    }
    for (auto&& [key, node] : root) {
      static const std::set<std::string> known{"schema_version", "canary", "steps",         "seed",  "reference",
                                               "trace",          "python", "control-fault", "lanes"};
      if (!known.count(std::string(key.str()))) {
        fail(fmt::format("{}: unknown key (allowed: {})", key.str(), fmt::join(known, ", ")));
      }
    }
    const auto version = root["schema_version"].value<std::int64_t>();
    if (version != kMatrixSchemaVersion) {
      fail(fmt::format("schema_version: must be {}, the version this harness reads", kMatrixSchemaVersion));
    }
    Matrix m;
    m.path = path_;
    m.content_hash = run::file_content_hash(path_);
    m.canary = text(root, "canary", "canary", true);
    // python = PATH: the interpreter of every Python lane that names none, and the one that
    // reads a Python canary.
    if (root.contains("python")) matrix_python_ = interpreter(text(root, "python", "python", true), "python");
    if (is_python_canary_spec(m.canary)) return parse_python_canary(root, std::move(m));
    try {
      // A canary file's path is relative to the matrix file, like any path in it.
      const canary::CanaryConfig config = canary::load_canary(
          canary::is_canary_path(m.canary) ? (std::filesystem::path(path_).parent_path() / m.canary).string() : m.canary);
      m.canary = config.spec;
      m.canary_name = config.name;
      canary_model_ = canary::make_canary(config);
    } catch (const std::invalid_argument& e) {
      fail(fmt::format("canary: {}", e.what()));
    }
    m.steps = static_cast<int>(integer(root, "steps", 1, canary::kMaxSteps));
    m.seed = integer(root, "seed", 0, std::numeric_limits<std::int64_t>::max());
    m.trace = trace_level(root, "");
    const std::vector<std::string>& ops = canary_model_->forward_op_names();
    m.control_faults = control_faults(root, m.steps, ops, ops);
    return with_lanes(root, std::move(m));
  }

 private:
  Matrix with_lanes(const toml::table& root, Matrix m) {
    m.reference = text(root, "reference", "reference", true);
    const toml::array* lanes = root["lanes"].as_array();
    if (!lanes || lanes->empty()) fail("lanes: missing; give at least one [[lanes]] table");
    for (std::size_t i = 0; i < lanes->size(); ++i) m.lanes.push_back(lane(m, (*lanes)[i], i));
    check_references(m);
    return m;
  }

  // `control-fault`: the negative control's --inject-fault value, an op of `ops`; by default
  // 1 ulp in each of the first kControlFaultOps of `first_choices` (the forward's first ops;
  // a Python canary's first leaf modules) at the middle step, a recorded step of every run.
  std::vector<canary::FaultSpec> control_faults(const toml::table& root, int steps, const std::vector<std::string>& ops,
                                                const std::vector<std::string>& first_choices) const {
    const std::string given = text(root, "control-fault", "control-fault", false);
    if (given.empty()) {
      std::vector<canary::FaultSpec> faults;
      for (std::size_t i = 0; i < std::min(kControlFaultOps, first_choices.size()); ++i) {
        canary::FaultSpec fault;
        fault.step = steps / 2;
        fault.op = first_choices[i];
        faults.push_back(fault);
      }
      return faults;
    }
    try {
      const canary::FaultSpec fault = canary::parse_fault_spec(given, ops);
      if (fault.kind != canary::FaultKind::kNudge) {  // the control names the op its fault moved
        fail(fmt::format("control-fault: '{}' is not an op's nudge; give step=K,op=NAME[,ulps=N]", given));
      }
      if (fault.step >= steps) {
        fail(fmt::format("control-fault: step {} is past the matrix's {} steps", fault.step, steps));
      }
      return {fault};
    } catch (const std::invalid_argument& e) {
      fail(fmt::format("control-fault: {}", e.what()));
    }
  }

  // `trace`: none (the default) or ops; `which` says whose levels these are, in the error.
  run::TraceLevel trace_level(const toml::table& root, const std::string& which) const {
    const std::string level = text(root, "trace", "trace", false);
    try {
      return level.empty() ? run::TraceLevel::kNone : run::parse_trace_level(level, "trace");
    } catch (const run::UsageError&) {
      fail(fmt::format("trace: '{}' is not a trace level{}; use none or ops", level, which));
    }
  }

  static bool is_python_canary_spec(const std::string& spec) {
    const std::size_t colon = spec.rfind(':');
    return colon != std::string::npos && colon >= 3 && spec.compare(colon - 3, 3, ".py") == 0;
  }

  // canary = "FILE.py:NAME" (FILE relative to the matrix file): the team's own model. Its
  // name, steps and seed come from the canary itself (`python3 -m canary_harness describe`);
  // `steps` may shorten its run, `seed` replace its seed; `trace = "ops"` records module op
  // traces (bisect of untraced lanes replays them with aten traces).
  Matrix parse_python_canary(const toml::table& root, Matrix m) {
    const std::size_t colon = m.canary.rfind(':');
    const std::filesystem::path file = std::filesystem::absolute(std::filesystem::path(path_).parent_path() /
                                                                 m.canary.substr(0, colon));
    m.canary = file.lexically_normal().string() + m.canary.substr(colon);
    python_canary_spec_ = m.canary;
    m.python_canary = true;
    const auto [python, key] = reading_interpreter(root);
    const nlohmann::json& described = describe_python_canary(m.canary, python, key);
    m.canary_name = described.at("name").get<std::string>();
    const int canary_steps = described.at("steps").get<int>();
    m.steps = root.contains("steps") ? static_cast<int>(integer(root, "steps", 1, canary_steps)) : canary_steps;
    python_seed_given_ = root.contains("seed");
    m.seed = python_seed_given_ ? integer(root, "seed", 0, std::numeric_limits<std::int64_t>::max())
                                : described.at("seed").get<std::int64_t>();
    m.trace = trace_level(root, " of a Python canary's lanes (aten traces come from bisect's replay)");
    const auto modules = described.value("modules", std::vector<std::string>{});
    const auto leaves = described.value("leaf_modules", std::vector<std::string>{});
    m.control_faults = control_faults(root, m.steps, modules, leaves);
    m.python_parameters = described.value("parameters", std::vector<std::string>{});
    m.python_linear_weights = described.value("linear_weights", std::vector<std::string>{});
    return with_lanes(root, std::move(m));
  }

  // The interpreter that reads a Python canary (`describe`), and the key that names it: the
  // matrix's `python`, else the reference lane's, else Debian's (the key is then `canary`).
  std::pair<std::string, std::string> reading_interpreter(const toml::table& root) const {
    if (!matrix_python_.empty()) return {matrix_python_, "python"};
    const auto reference = root["reference"].value<std::string>();
    if (const toml::array* lanes = root["lanes"].as_array(); lanes && reference) {
      for (std::size_t i = 0; i < lanes->size(); ++i) {
        const toml::table* t = (*lanes)[i].as_table();
        if (!t || (*t)["id"].value<std::string>() != reference || !t->contains("python")) continue;
        const std::string key = fmt::format("lanes[{}] ({}).python", i, *reference);
        return {interpreter(text(*t, "python", key, true), key), key};
      }
    }
    return {kPython, "canary"};
  }

  // The torch a torch lane runs: Debian's python3, or `python = PATH` of the lane or else of
  // the matrix (named in the lane as @MAJOR.MINOR, passed --versioned), eager or
  // `compile = true`, in one process or `layout = "ddp"` / `"fsdp"` (two, over gloo).
  struct TorchStack {
    std::string python = kPython;
    std::string release;  // "@2.9" for another interpreter, "" for Debian's
    bool compiled = false;
    std::string layout;   // "", "ddp" or "fsdp"
    // What its lane stack's name, budget features and command are made from (lane_stacks.h).
    // `device`: as the lane gives it (cuda:1): its type and index are options of their own.
    StackOptions options(const std::string& canary, const std::string& device, const std::string& precision) const {
      const std::string type = device.substr(0, device.find(':'));
      return {{"canary", canary},       {"release", release},       {"device", type},
              {"device_index", device.substr(type.size())}, {"precision", precision},
              {"compile", compiled ? "true" : ""}, {"layout", layout}};
    }
  };

  // `at`: the lane ("lanes[0] (fp32)"), whose `python` is its own, else the matrix's.
  TorchStack torch_stack(std::map<std::string, std::string>& options, const std::string& at) const {
    TorchStack stack;
    stack.compiled = options.count("compile") > 0;
    if (options.count("layout")) stack.layout = options["layout"];
    const std::string key = options.count("python") ? at + ".python" : "python";
    const std::string python = options.count("python") ? interpreter(options["python"], key) : matrix_python_;
    if (!python.empty()) {
      stack.python = python;
      stack.release = "@" + torch_release(stack.python, key);
    }
    return stack;
  }

  // An interpreter named by `key` (`python`, `lanes[0] (fp32).python`): PATH as written when
  // absolute, else relative to the matrix file's directory; it must exist and not be a
  // directory (one that cannot be started is said by the first command that starts it).
  std::string interpreter(const std::string& path, const std::string& key) const {
    std::filesystem::path p(path);
    if (p.is_relative()) p = std::filesystem::absolute(std::filesystem::path(path_).parent_path() / p);
    p = p.lexically_normal();
    std::error_code ec;
    if (!std::filesystem::exists(p, ec)) {
      fail(fmt::format("{}: '{}' does not exist (make .venv/ with scripts/python-env.sh)", key, p.string()));
    }
    if (std::filesystem::is_directory(p, ec)) {
      fail(fmt::format("{}: '{}' is a directory (name the interpreter, e.g. .venv/bin/python)", key, p.string()));
    }
    return p.string();
  }

  // MAJOR.MINOR of the torch that `python` imports (what `--versioned` names the lane with),
  // asked once per interpreter and matrix: importing torch takes seconds. A Python canary's
  // matrix has it from the canary's description under that interpreter.
  std::string torch_release(const std::string& python, const std::string& key) const {
    if (const auto known = releases_.find(python); known != releases_.end()) return known->second;
    if (python_canary_spec_.empty()) return releases_[python] = probe_torch_release(python, key);
    const nlohmann::json& described = describe_python_canary(python_canary_spec_, python, key);
    const std::string version = described.value("torch", "");
    const std::string release = release_of(version);
    if (release.empty()) fail(fmt::format("{}: {} imports a torch of no version ('{}')", key, python, version));
    return releases_[python] = release;
  }

  // "2.9.0+cpu" -> "2.9"; "" when it is no version.
  static std::string release_of(const std::string& version) {
    const std::size_t first = version.find('.');
    const std::size_t second = first == std::string::npos ? first : version.find_first_not_of("0123456789", first + 1);
    if (first == std::string::npos || first == 0 || second == first + 1) return "";
    return version.substr(0, second);
  }

  std::string probe_torch_release(const std::string& python, const std::string& key) const {
    run::ChildResult child;
    try {  // not a canary: the one line it prints is torch's version
      child = run::run_child({python, "-c", "import torch; print(torch.__version__)"}, {}, run::ChildOutput::kCapture,
                             run::ChildOutput::kCapture);
    } catch (const run::ChildProcessError& e) {
      fail(fmt::format("{}: {}", key, e.what()));
    }
    const std::string release = release_of(child.stdout_text.substr(0, child.stdout_text.find_first_of("\n")));
    if (!child.exited_zero() || release.empty()) {
      fail(fmt::format("{}: {} cannot import torch ({})", key, python,
                       child.exited_zero() ? "no version" : run::last_line(child.stderr_tail)));
    }
    return release;
  }

  // `python -m canary_harness describe FILE.py:NAME --json-out PATH` under `python` (named by
  // `key`), once per interpreter: the canary's name, steps, seed, modules and the torch that
  // interpreter imports. Its stdout is the canary's own (a model that prints while it is
  // built), never read. Every interpreter a lane runs reads it: one that cannot load it
  // (torch, transformers, canary_harness missing) is the matrix's error, naming the key.
  const nlohmann::json& describe_python_canary(const std::string& spec, const std::string& python,
                                               const std::string& key) const {
    if (const auto known = described_.find(python); known != described_.end()) return known->second;
    const std::vector<std::string> argv{python, "-m", "canary_harness", "describe", spec};
    run::PythonJsonResult described;
    try {
      described = run::run_python_for_json(argv, run::python_package_environment());
    } catch (const std::exception& e) {  // it cannot start, or its result cannot be read
      fail(fmt::format("{}: {}", key, e.what()));
    }
    const run::ChildResult& child = described.child;
    if (!child.exited_zero()) {
      const std::string line = run::last_line(child.stderr_tail);
      // Another interpreter may load it where this one lacks what it imports: the package
      // itself did not start (an unhandled exit 1 with no result: canary_harness, numpy or h5py
      // missing or built for another numpy), or describe's result says the canary's imports
      // failed. Decided from the exit status and the result, never from the message's words.
      const nlohmann::json& result = described.result;
      const bool missing = (child.exit_code() == 1 && result.is_discarded()) ||
                           (result.is_object() && result.contains("error") && result["error"].is_object() &&
                            result["error"].value("kind", "") == "missing_module");
      const std::string why = line.empty() ? fmt::format("`{}` {}", run::command_line(argv), child.how()) : line;
      if (key != "canary") fail(fmt::format("{}: {} cannot load {}: {}", key, python, spec, why));
      fail(missing ? fmt::format("canary: {} cannot load it ({}); name the interpreter that can with python = \"PATH\" "
                                 "(e.g. \"../.venv/bin/python\"), in the matrix or the reference lane", python, why)
                   : fmt::format("canary: {}", why));
    }
    const nlohmann::json& j = described.result;
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string() || !j.contains("steps") ||
        !j["steps"].is_number_integer() || !j.contains("seed") || !j["seed"].is_number_integer()) {
      fail(fmt::format("{}: `{}` did not write the canary's name, steps and seed", key, run::command_line(argv)));
    }
    if (!described_.empty() && described_.begin()->second.at("name") != j["name"]) {
      fail(fmt::format("{}: under {} the canary is named {}, under {} {}", key, python, j["name"].get<std::string>(),
                       described_.begin()->first, described_.begin()->second.at("name").get<std::string>()));
    }
    return described_[python] = j;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw MatrixError(fmt::format("{}: {}", path_, what)); }

  std::string text(const toml::table& t, const char* key, const std::string& where, bool required) const {
    const auto v = t[key].value<std::string>();
    if ((!v && (required || t.contains(key))) || (v && v->empty() && required)) {
      fail(fmt::format("{}: must be a non-empty string", where));
    }
    return v.value_or("");
  }

  std::int64_t integer(const toml::table& t, const char* key, std::int64_t lo, std::int64_t hi) const {
    const auto v = t[key].value<std::int64_t>();
    if (!v || *v < lo || *v > hi) fail(fmt::format("{}: must be an integer in {}..{}", key, lo, hi));
    return *v;
  }

  // An engine flag's value as the command line would give it.
  std::string flag_value(const toml::node& node, const std::string& where) const {
    if (const auto s = node.value<std::string>()) return *s;
    if (const auto i = node.value<std::int64_t>(); i && node.is_integer()) return std::to_string(*i);
    if (const auto b = node.value<bool>(); b && node.is_boolean()) {
      if (*b) return "1";
      fail(fmt::format("{}: a switch is on (true) or absent", where));
    }
    fail(fmt::format("{}: must be a string or an integer", where));
  }

  LaneSpec lane(const Matrix& m, const toml::node& node, std::size_t index) {
    const std::string where = fmt::format("lanes[{}]", index);
    const toml::table* t = node.as_table();
    if (!t) fail(fmt::format("{}: must be a table ([[lanes]])", where));
    LaneSpec spec;
    spec.id = text(*t, "id", where + ".id", true);
    const std::string at = fmt::format("lanes[{}] ({})", index, spec.id);
    if (spec.id.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-_.") != std::string::npos) {
      fail(fmt::format("{}.id: use lower-case letters, digits, '-', '_' and '.' (it names files)", at));
    }
    const bool has_command = t->contains("command");
    spec.engine = text(*t, "engine", at + ".engine", !has_command);
    spec.settings.features = text(*t, "features", at + ".features", false);
    spec.why = text(*t, "why", at + ".why", false);
    spec.triage_with = text(*t, "triage-with", at + ".triage-with", false);
    if (m.python_canary) return python_canary_lane(m, *t, std::move(spec), at, has_command);
    // A lane stack's engine (lane_stacks.h) runs as a child process; a command is its own.
    if (const LaneStack* stack = find_lane_stack(spec.engine, kPackCanaries); stack && !has_command) {
      return stack_lane(m, *t, *stack, std::move(spec), at);
    }
    if (has_command) return command_lane(m, *t, std::move(spec), at);
    for (const LaneKey& key : command_lane_keys()) {
      if (t->contains(key.key)) {
        fail(fmt::format("{}.{}: only an external lane (engine = {} or a command) takes it; engine {} declares its own",
                         at, key.key, engine_choices(kPackCanaries), spec.engine));
      }
    }
    for (auto&& [key, value] : *t) {  // the keys of harness_lane_keys() are read above, in bias_repeats and resume_at
      const std::string k(key.str());
      if (is_engine_flag(k)) {
        spec.settings.options[k] = flag_value(value, at + "." + k);
      } else if (!is_common_key(k) && !find_lane_key(harness_lane_keys(), k)) {
        fail(fmt::format("{}.{}: unknown key (allowed: id, engine, why, {} and the engine's flags, e.g. mesh, noise-seed)",
                         at, k, fmt::join(lane_key_names(harness_lane_keys()), ", ")));
      }
    }
    try {
      const auto engine = make_engine(spec.engine, spec.settings);
      if (const std::string why = canary::engine_cannot_run(*engine, *canary_model_); !why.empty()) {
        fail(fmt::format("{}: {} (canary {})", at, why, m.canary_name));
      }
      spec.lane = run::lane_name(m.canary_name, engine->lane_engine(), engine->features());
      spec.budget_features = engine->budget_features();
      spec.bias_repeats = bias_repeats(*t, spec, at);
      const bool replayable = engine->reduction_order() != Engine::ReductionOrder::kRacy;
      spec.resume_at = resume_at(*t, m, at, replayable ? "" : "its reductions are racy, so no run repeats it");
    } catch (const std::invalid_argument& e) {
      fail(fmt::format("{}: {}", at, e.what()));
    }
    return spec;
  }

  // bias-repeats = N: only for a lane whose engine sums in an order its seed flag sets, and
  // that sets it (the repeats take the next seeds: every one replayable).
  int bias_repeats(const toml::table& t, const LaneSpec& spec, const std::string& at) const {
    if (!t.contains("bias-repeats")) return 0;
    const LaneKey& described = *find_lane_key(harness_lane_keys(), "bias-repeats");
    const auto n = t["bias-repeats"].value<std::int64_t>();
    if (!n || !t["bias-repeats"].is_integer() || *n < described.min || *n > described.max) {
      fail(fmt::format("{}.bias-repeats: must be an integer in {}..{} (the sign test alone needs 9 or more for one "
                       "window)", at, described.min, described.max));
    }
    const std::string flag = spec.reduction_seed_flag();
    if (flag.empty()) {
      fail(fmt::format("{}.bias-repeats: engine {} sums in a fixed order, so its repeats would be one run; test a lane "
                       "with a seeded order (accel)", at, spec.engine));
    }
    const auto given = spec.settings.options.find(flag);
    if (given == spec.settings.options.end()) {
      fail(fmt::format("{}.bias-repeats: set the lane's {}: the repeats run under it and the seeds after it", at, flag));
    }
    if (std::stoll(given->second) > std::numeric_limits<std::int64_t>::max() - *n) {
      fail(fmt::format("{}.{}: too large for {} repeats after it", at, flag, *n));
    }
    return static_cast<int>(*n);
  }

  // resume-at = K: a step the run goes on after (0..steps-2), on a lane that can stop and go
  // on; `why_not` says why this one cannot ("" when it can).
  int resume_at(const toml::table& t, const Matrix& m, const std::string& at, const std::string& why_not) const {
    if (!t.contains("resume-at")) return -1;
    const auto k = t["resume-at"].value<std::int64_t>();
    if (!k || !t["resume-at"].is_integer() || *k < 0 || *k > m.steps - 2) {
      fail(fmt::format("{}.resume-at: must be an integer in 0..{}, the last step before the stop (the run goes on "
                       "after it, within its {} steps)", at, m.steps - 2, m.steps));
    }
    if (!why_not.empty()) fail(fmt::format("{}.resume-at: {}; drop resume-at", at, why_not));
    return static_cast<int>(*k);
  }

  // Why a Python canary's lane cannot carry the restart gate ("" when it can): the gate
  // (`canary_harness resume-check`) runs the canary on the CPU, in the lane's precision and
  // compiled where the lane is, with its own save and load (a Python canary's lane is one
  // process: it takes no layout).
  static std::string python_gate_refusal(const nlohmann::json& described, const std::map<std::string, std::string>& options) {
    if (!described.value("checkpoints", false)) {
      return "the canary gives no save and load; return Canary(..., save=save, load=load), the checkpointing its "
             "training code does (docs/own-model.md, \"The restart gate\")";
    }
    const auto option = [&](const char* key) { return options.count(key) ? options.at(key) : std::string(); };
    if (option("device") != "cpu") {
      return "the gate runs the canary on the CPU (resume-check); give it to a lane on the CPU";
    }
    return "";
  }

  // budget-features = "a+b": feature names joined with '+', each once (receipt::BudgetFeatures).
  std::vector<std::string> feature_list(const toml::table& t, const std::string& where) const {
    const std::string text_value = text(t, "budget-features", where, true);
    try {
      return receipt::BudgetFeatures::parse(text_value).names();
    } catch (const std::invalid_argument& e) {
      fail(fmt::format("{}: {} (e.g. \"torch-cpu\")", where, e.what()));
    }
  }

  // The engines of the stacks that run `canaries`, quoted for a message: "torch", "jax".
  static std::string engine_choices(const char* canaries) {
    std::vector<std::string> quoted;
    for (const std::string& engine : lane_stack_engines(canaries)) quoted.push_back(fmt::format("\"{}\"", engine));
    return fmt::format("{}", fmt::join(quoted, ", "));
  }

  // A lane of a stack that runs a built-in canary's pack: its runner, which reads the keys the
  // description gives it (LaneStack::lane_keys). A new stack is its entry and its runner here.
  LaneSpec stack_lane(const Matrix& m, const toml::table& t, const LaneStack& stack, LaneSpec spec,
                      const std::string& at) const {
    if (stack.id == "torch-pack") return torch_pack_lane(m, t, stack, std::move(spec), at);
    if (stack.id == "jax") return jax_lane(m, t, stack, std::move(spec), at);
    throw std::logic_error(fmt::format("lane stack {} has no runner in matrix.cpp", stack.id));
  }

  // engine = "torch": the PyTorch lane of the job's pack (python -m canary_harness.lane), its
  // keys, name and features the stack's.
  LaneSpec torch_pack_lane(const Matrix& m, const toml::table& t, const LaneStack& stack, LaneSpec spec,
                           const std::string& at) const {
    read_lane_keys(t, stack, spec, at);
    std::map<std::string, std::string>& options = spec.settings.options;
    // python = "PATH": its own golden beside Debian's torch lane (the name says which torch)
    const TorchStack torch = torch_stack(options, at);
    from_stack(stack, torch.options(m.canary_name, options["device"], options["precision"]), torch.python, spec);
    if (t.contains("budget-features") && feature_list(t, at + ".budget-features") != spec.budget_features) {
      fail(fmt::format("{}.budget-features: the torch lane on {} in {} declares {}; drop the key or make it that", at,
                       options["device"], options["precision"], receipt::BudgetFeatures(spec.budget_features).to_string()));
    }
    spec.environment = run::python_package_environment();
    return spec;
  }

  // command = [...]: a team's own program, run as a child process on the job's canary pack;
  // it writes a receipt at {out} and declares its budget features.
  LaneSpec command_lane(const Matrix& m, const toml::table& t, LaneSpec spec, const std::string& at) const {
    if (const LaneStack* stack = find_lane_stack(spec.engine, kPackCanaries)) {
      fail(fmt::format("{}.command: a {} lane's command is its stack's own (python -m {})", at, stack->engine, stack->module));
    }
    if (!spec.engine.empty()) {
      fail(fmt::format("{}.engine: a command lane names no engine (the command is the engine); drop engine, or drop "
                       "command for engine = {}", at, engine_choices(kPackCanaries)));
    }
    if (!spec.settings.features.empty()) {
      fail(fmt::format("{}.features: an external lane takes no harness features; declare what it runs with budget-features", at));
    }
    if (!spec.triage_with.empty()) fail(fmt::format("{}.triage-with: triage explains the harness's fp8 lanes only", at));
    for (auto&& [key, value] : t) {
      const std::string k(key.str());
      if (!is_common_key(k) && !find_lane_key(command_lane_keys(), k)) {
        fail(fmt::format("{}.{}: unknown key of a command lane (allowed: id, engine, why, {})", at, k,
                         fmt::join(lane_key_names(command_lane_keys()), ", ")));
      }
    }
    spec.engine = "command";
    spec.environment = run::harness_environment();  // the package, where the command uses it, finds our libraries
    const toml::array* argv = t["command"].as_array();
    const std::string where = at + ".command";
    if (!argv || argv->empty()) fail(fmt::format("{}: must be a non-empty array of strings (argv, no shell)", where));
    for (std::size_t i = 0; i < argv->size(); ++i) {
      const auto item = (*argv)[i].value<std::string>();
      if (!item || !(*argv)[i].is_string() || item->empty()) {
        fail(fmt::format("{}[{}]: must be a non-empty string", where, i));
      }
      for (std::size_t open = item->find('{'); open != std::string::npos; open = item->find('{', open + 1)) {
        const std::size_t close = item->find('}', open);
        const std::string placeholder = item->substr(open, close == std::string::npos ? std::string::npos : close - open + 1);
        if (std::find(std::begin(kJobPlaceholders), std::end(kJobPlaceholders), placeholder) == std::end(kJobPlaceholders)) {
          fail(fmt::format("{}[{}]: '{}' is not a placeholder (allowed: {})", where, i, placeholder,
                           fmt::join(kJobPlaceholders, ", ")));
        }
      }
      spec.command.push_back(*item);
    }
    if (std::none_of(spec.command.begin(), spec.command.end(), [](const std::string& a) { return a.find("{out}") != std::string::npos; })) {
      fail(fmt::format("{}: no argument holds {{out}}, the receipt the command must write", where));
    }
    for (const LaneKey& key : command_lane_keys()) {
      if (key.required && !t.contains(key.key)) fail(fmt::format("{}.{}: missing; a command lane names {}", at, key.key, key.what));
    }
    spec.budget_features = feature_list(t, at + ".budget-features");
    spec.lane = text(t, "lane", at + ".lane", false);
    if (spec.lane.empty()) {
      spec.lane = fill_options(find_lane_key(command_lane_keys(), "lane")->default_value,
                               {{"canary", m.canary_name}, {"id", spec.id}});
    }
    if (spec.lane.rfind(m.canary_name + "/", 0) != 0 || spec.lane.size() == m.canary_name.size() + 1 ||
        spec.lane.find("..") != std::string::npos) {
      fail(fmt::format("{}.lane: '{}' must be {}/NAME (the receipt's lane; it names the golden)", at, spec.lane,
                       m.canary_name));
    }
    return spec;
  }

  // engine = "jax" (flags python, mesh, shard-plan, precision): the canary in JAX
  // (python -m canary_harness.jax, docs/xla.md) on mesh's virtual CPU devices under the
  // shard plan's NamedShardings, trained from the job's pack. Its name and budget features
  // are the module's own (canary_harness.jax._lane and budget_features).
  LaneSpec jax_lane(const Matrix& m, const toml::table& t, const LaneStack& stack, LaneSpec spec,
                    const std::string& at) const {
    read_lane_keys(t, stack, spec, at);
    const std::string python = spec.settings.options.count("python") ? spec.settings.options["python"] : matrix_python_;
    EngineSettings layout;  // read by tpu-mesh's own rules: the mesh, plans and precisions are its
    for (const char* flag : {"mesh", "shard-plan", "precision"}) {
      if (spec.settings.options.count(flag)) layout.options[flag] = spec.settings.options[flag];
    }
    tpu::MeshConfig config;
    try {
      config = tpu::parse_mesh_config(layout);
    } catch (const std::invalid_argument& e) {
      fail(fmt::format("{}: {}", at, e.what()));
    }
    const std::string mesh = config.mesh.to_string(), plan = tpu::to_string(config.plan);
    const std::string precision = tpu::to_string(config.precision);
    const StackOptions options{{"canary", m.canary_name}, {"mesh", mesh}, {"shard_plan", plan}, {"precision", precision}};
    from_stack(stack, options, python, spec);
    spec.environment = run::python_package_environment();
    return spec;
  }

  // The keys of a stack's lane, read by their descriptions (LaneStack::lane_keys), into the
  // lane's options: id, engine and why besides, no harness features, no triage; each value
  // as its kind takes it, defaults filled in, a required key missing and a key given where
  // its `only_with` does not hold refused naming the key.
  void read_lane_keys(const toml::table& t, const LaneStack& stack, LaneSpec& spec, const std::string& at) const {
    const std::string kind = fmt::format("a {} lane", stack.id);
    if (!spec.settings.features.empty()) {
      fail(fmt::format("{}.features: {} takes no harness features; its keys say what it runs ({})", at, kind,
                       fmt::join(lane_key_names(stack), ", ")));
    }
    if (!spec.triage_with.empty()) fail(fmt::format("{}.triage-with: triage explains the harness's fp8 lanes only", at));
    std::map<std::string, std::string>& options = spec.settings.options;
    for (auto&& [key, value] : t) {
      const std::string k(key.str());
      if (is_common_key(k)) continue;
      const LaneKey* described = find_lane_key(stack, k);
      if (!described) {
        fail(fmt::format("{}.{}: unknown key of {} (allowed: id, engine, why, {})", at, k, kind,
                         fmt::join(lane_key_names(stack), ", ")));
      }
      if (described->kind != LaneKeyKind::kDeclared) options[k] = lane_key_value(*described, value, at + "." + k);
    }
    for (const LaneKey& k : stack.lane_keys) {
      if (!options.count(k.key) && !k.default_value.empty()) options[k.key] = k.default_value;
      const bool stood_in = k.kind == LaneKeyKind::kInterpreter && !matrix_python_.empty();
      if (k.required && !options.count(k.key) && !stood_in) {
        fail(fmt::format("{}.{}: missing; {} names {}, or the matrix does", at, k.key, kind, k.what));
      }
      if (!t.contains(k.key) || k.only_with.empty()) continue;
      std::vector<std::string> others;
      for (const auto& [other, wanted] : k.only_with) {
        others.push_back(other);
        if (options.count(other) && options[other] == wanted) others.pop_back();
      }
      if (!others.empty()) fail(fmt::format("{}.{}: {}; drop {} or {}", at, k.key, k.only_with_why, fmt::join(others, ", "), k.key));
    }
  }

  // A lane key's value as its kind takes it (LaneKey): a choice among its values, a switch,
  // a count in its range, an interpreter that exists; an engine's flag as the engine reads it.
  std::string lane_key_value(const LaneKey& k, const toml::node& node, const std::string& where) const {
    const std::string value = flag_value(node, where);
    switch (k.kind) {
      case LaneKeyKind::kChoice:
        if (!is_choice(k, value)) fail(fmt::format("{}: '{}' is not {}", where, value, or_list(k.values)));
        return value;
      case LaneKeyKind::kCount: {
        std::int64_t n = 0;
        const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
        if (ec != std::errc() || end != value.data() + value.size() || n < k.min || n > k.max) {
          fail(fmt::format("{}: '{}' is not in {}..{}: {}", where, value, k.min, k.max, k.what));
        }
        return value;
      }
      case LaneKeyKind::kInterpreter: return interpreter(value, where);
      case LaneKeyKind::kSwitch:  // flag_value refused false: present means on
      case LaneKeyKind::kEngineFlag:
      case LaneKeyKind::kDeclared:
      case LaneKeyKind::kArgv:  // the kinds below are a harness or a command lane's, read where those are
      case LaneKeyKind::kFeatures:
      case LaneKeyKind::kLaneName:
      case LaneKeyKind::kLaneId:
      case LaneKeyKind::kHarnessFeatures: return value;
    }
    throw std::logic_error("a lane key of no kind");
  }

  // `value` is one of the key's values, where "NAME:N" stands for NAME:0, NAME:1, ...
  static bool is_choice(const LaneKey& k, const std::string& value) {
    return std::any_of(k.values.begin(), k.values.end(), [&](const std::string& choice) {
      if (choice == value) return true;
      const std::size_t colon = choice.find(':');
      if (colon == std::string::npos || choice.substr(colon) != ":N" || value.compare(0, colon + 1, choice, 0, colon + 1) != 0) {
        return false;
      }
      const std::string index = value.substr(colon + 1);
      return !index.empty() && index.find_first_not_of("0123456789") == std::string::npos;
    });
  }

  // "a, b or c"
  static std::string or_list(const std::vector<std::string>& values) {
    if (values.size() < 2) return fmt::format("{}", fmt::join(values, ""));
    return fmt::format("{} or {}", fmt::join(values.begin(), values.end() - 1, ", "), values.back());
  }

  // A lane of a Python canary's matrix: engine = "torch" with device, precision, threads
  // (default 1: torch's CPU bits depend on it, so the lane pins it), python (another
  // interpreter, named in the lane as @RELEASE) and compile. Its lane name and budget
  // features are the run's own (canary_harness.runs.runner):
  // NAME/torch[@RELEASE][+DEVICE][+bf16][+compile], torch-DEVICE (not cpu), torch-bf16 and
  // torch-compile; the fp32 CPU lane is the canary's bitwise reference.
  LaneSpec python_canary_lane(const Matrix& m, const toml::table& t, LaneSpec spec, const std::string& at,
                              bool has_command) const {
    const LaneStack* stack = find_lane_stack(spec.engine, kPythonCanaries);
    if (has_command || !stack) {
      fail(fmt::format("{}: a Python canary's lanes are engine = {} (the harness's engines and commands run built-in "
                       "canaries and canary files)", at, engine_choices(kPythonCanaries)));
    }
    read_lane_keys(t, *stack, spec, at);
    const std::string device = spec.settings.options["device"], precision = spec.settings.options["precision"];
    const std::string threads = spec.settings.options["threads"];
    spec.python_canary = true;
    const TorchStack torch = torch_stack(spec.settings.options, at);
    const nlohmann::json& described = describe_python_canary(m.canary, torch.python, at + ".python");  // this lane's interpreter loads it too
    spec.settings.options.erase("resume-at");  // the gate's, not the run's: read below
    spec.resume_at = resume_at(t, m, at, python_gate_refusal(described, spec.settings.options));
    StackOptions options = torch.options(m.canary_name, device, precision);
    options.insert({{"canary_spec", m.canary},
                    {"threads", threads},
                    {"seeded", python_seed_given_ ? "true" : ""},
                    {"trace", m.trace == run::TraceLevel::kOps ? "ops" : ""}});
    from_stack(*stack, options, torch.python, spec);
    spec.environment = run::python_package_environment();
    return spec;
  }

  void check_references(const Matrix& m) const {
    std::set<std::string> ids, names;
    for (const LaneSpec& l : m.lanes) {
      if (!ids.insert(l.id).second) fail(fmt::format("lanes: id '{}' appears twice", l.id));
      if (!names.insert(l.lane).second) {
        fail(fmt::format("lanes ({}): lane {} appears twice; two lanes of one name would share a golden", l.id, l.lane));
      }
    }
    if (!ids.count(m.reference)) fail(fmt::format("reference: '{}' is not the id of a lane", m.reference));
    if (m.lane(m.reference).bias_repeats > 0) {
      fail(fmt::format("lanes ({}).bias-repeats: the reference lane is what the repeats are judged against; give it to "
                       "another lane", m.reference));
    }
    for (const LaneSpec& l : m.lanes) {  // what the twins declare: check_triage_pairs, with the budgets
      if (!l.triage_with.empty() && !ids.count(l.triage_with)) {
        fail(fmt::format("lanes ({}).triage-with: '{}' is not a lane id", l.id, l.triage_with));
      }
    }
  }

  std::string path_;
  std::unique_ptr<canary::Canary> canary_model_;  // the matrix's canary: which ops its lanes' engines must run
  bool python_seed_given_ = false;  // a Python canary's matrix replaces its seed: lanes pass --seed
  std::string matrix_python_;       // `python`: absolute; "" when the matrix names none
  std::string python_canary_spec_;  // FILE.py:NAME (FILE absolute) of a Python canary's matrix
  mutable std::map<std::string, std::string> releases_;  // interpreter -> its torch's MAJOR.MINOR
  mutable std::map<std::string, nlohmann::json> described_;  // interpreter -> the Python canary as it reads it
};

}  // namespace

bool LaneSpec::uses_pack() const {
  return std::any_of(command.begin(), command.end(), [](const std::string& a) { return a.find("{pack}") != std::string::npos; });
}

bool LaneSpec::declares(const std::string& budget_feature) const {
  return std::find(budget_features.begin(), budget_features.end(), budget_feature) != budget_features.end();
}

void check_triage_pairs(const Matrix& matrix, const check::Budgets& budgets) {
  for (const LaneSpec& l : matrix.lanes) {
    if (l.triage_with.empty()) continue;
    const auto features = check::triaged_features({l.budget_features.begin(), l.budget_features.end()}, budgets);
    if (features.empty()) {
      throw MatrixError(fmt::format("{}: lanes ({}).triage-with: the lane declares no budget feature triage explains "
                                    "(an entry of {} with triage_twin, as [fp8])",
                                    matrix.path, l.id, budgets.path));
    }
    const LaneSpec& twin = matrix.lane(l.triage_with);
    if (!check::feature_the_twin_lacks(features, {twin.budget_features.begin(), twin.budget_features.end()})) {
      throw MatrixError(fmt::format("{}: lanes ({}).triage-with: '{}' declares {} itself; name the {} twin", matrix.path,
                                    l.id, l.triage_with, features.front().name, features.front().twin));
    }
  }
}

std::string LaneSpec::reduction_seed_flag() const {
  if (external()) return "";  // torch and command lanes: no harness engine, no seed
  const auto seed = make_engine(engine, settings)->reduction_seed();
  return seed ? seed->flag : "";
}

std::vector<std::string> expand_command(const LaneSpec& spec, const std::string& pack, const std::string& out, int steps,
                                        std::int64_t seed) {
  const std::pair<const char*, std::string> values[] = {
      {"{pack}", pack}, {"{out}", out}, {"{steps}", std::to_string(steps)}, {"{seed}", std::to_string(seed)}};
  std::vector<std::string> argv;
  for (const std::string& item : spec.command) {
    std::string expanded;
    for (std::size_t i = 0; i < item.size();) {
      bool replaced = false;
      for (const auto& [placeholder, value] : values) {
        if (item.compare(i, std::strlen(placeholder), placeholder) == 0) {
          expanded += value;
          i += std::strlen(placeholder);
          replaced = true;
          break;
        }
      }
      if (!replaced) expanded += item[i++];
    }
    argv.push_back(std::move(expanded));
  }
  return argv;
}

const LaneSpec& Matrix::lane(const std::string& id) const {
  for (const LaneSpec& l : lanes) {
    if (l.id == id) return l;
  }
  throw MatrixError(fmt::format("{}: no lane '{}'", path, id));
}

run::RunOptions Matrix::run_options(const LaneSpec& spec, const std::string& out) const {
  run::RunOptions o;
  o.canary = canary;
  o.engine = spec.engine;
  o.engine_settings = spec.settings;
  o.steps = steps;
  o.seed = seed;
  o.trace = trace;
  o.out = out;
  return o;
}

Matrix load_matrix(const std::string& path) {
  std::ifstream probe(path);
  if (!probe) throw MatrixError(fmt::format("{}: cannot read the matrix file; give one with --matrix", path));
  return Parser(path).parse();
}

std::vector<const LaneSpec*> select_lanes(const Matrix& matrix, const std::string& text, const std::string& flag) {
  std::vector<const LaneSpec*> selected;
  if (text.empty()) {
    for (const LaneSpec& l : matrix.lanes) selected.push_back(&l);
    return selected;
  }
  for (const std::string& item : split_list(text)) {
    const auto it = std::find_if(matrix.lanes.begin(), matrix.lanes.end(),
                                 [&](const LaneSpec& l) { return l.id == item || l.lane == item; });
    if (it == matrix.lanes.end()) {
      std::vector<std::string> ids;
      for (const LaneSpec& l : matrix.lanes) ids.push_back(l.id);
      throw MatrixError(fmt::format("{}: '{}' is not a lane of {} (lanes: {})", flag, item, matrix.path, fmt::join(ids, ", ")));
    }
    if (std::find(selected.begin(), selected.end(), &*it) == selected.end()) selected.push_back(&*it);
  }
  return selected;
}

std::vector<std::string> split_list(const std::string& text, char separator) {
  std::vector<std::string> items;
  std::size_t start = 0;
  for (std::size_t comma = text.find(separator); comma != std::string::npos; comma = text.find(separator, start)) {
    items.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  items.push_back(text.substr(start));
  return items;
}

Shard parse_shard(const std::string& text) {
  Shard s;
  const auto slash = text.find('/');
  auto number = [](const std::string& part, int& out) {
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), out);
    return !part.empty() && ec == std::errc() && end == part.data() + part.size();
  };
  if (slash == std::string::npos || !number(text.substr(0, slash), s.index) || !number(text.substr(slash + 1), s.count) ||
      s.count < 1 || s.count > 1000 || s.index < 0 || s.index >= s.count) {
    throw MatrixError(fmt::format("--shard: '{}' is not i/N with 0 <= i < N (e.g. 0/2 and 1/2)", text));
  }
  return s;
}

std::vector<const LaneSpec*> shard_lanes(const Matrix& matrix, const Shard& shard) {
  std::vector<const LaneSpec*> lanes;
  for (std::size_t k = 0; k < matrix.lanes.size(); ++k) {
    if (static_cast<int>(k % static_cast<std::size_t>(shard.count)) == shard.index) lanes.push_back(&matrix.lanes[k]);
  }
  return lanes;
}

}  // namespace harness::nightly
