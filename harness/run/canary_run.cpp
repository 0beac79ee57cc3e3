#include "canary_run.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <limits>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <tbb/global_control.h>

#include "canary.h"
#include "canary_file.h"
#include "data_source.h"
#include "interrupt.h"
#include "json_text.h"
#include "output_lock.h"
#include "receipt/budget_features.h"
#include "receipt/receipt_writer.h"
#include "full_receipt_schema.h"
#include "held_out_eval.h"
#include "run_option_fields.h"
#include "registry.h"
#include "run_setup.h"
#include "stack_info.h"
#include "checkpoint.h"
#include "file_io.h"
#include "op_trace.h"
#include "tensor_digest.h"

namespace harness::run {
namespace {

namespace fs = std::filesystem;

struct Validated {
  canary::CanaryConfig config;
  std::int64_t seed = 0;  // --seed, else the canary's
  std::shared_ptr<const canary::DataSource> data;
  std::optional<canary::FaultSpec> fault;
  int threads = 0;
};

void check_output_path(const RunOptions& o) {
  std::error_code ec;
  // A live writer's path: say whose, even with --force.
  if (fs::exists(o.out, ec) && !fs::is_directory(o.out, ec)) OutputLock::check_not_busy(o.out);
  check_output_file(o.out, o.force, "receipt", "tiny.h5");
}

// A receipt's checkpoints live in "<out>.ckpt/": a directory of this run's own. An old
// one is replaced only with --force, and then only its checkpoint files.
void check_checkpoint_dir(const RunOptions& o) {
  const fs::path dir = checkpoint_dir(o.out);
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  if (!fs::is_directory(dir, ec)) {
    throw UsageError(fmt::format("--checkpoint-every: '{}' exists and is not a directory; choose another --out", dir.string()));
  }
  if (!o.force) {
    throw UsageError(fmt::format("--checkpoint-every: '{}' exists; pass --force to replace its checkpoints or choose "
                                 "another --out",
                                 dir.string()));
  }
}

void prepare_checkpoint_dir(const std::string& dir) {
  fs::create_directories(dir);
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("step_") && (name.ends_with(".h5") || name.ends_with(".h5.partial"))) fs::remove(e.path());
  }
}

Validated validate(const RunOptions& o) {
  Validated v;
  v.config = load_run_canary(o.canary);
  try {
    v.data = canary::make_data_source(v.config);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("--canary: {}", e.what()));
  }
  if (o.steps) v.config.steps = checked_steps(*o.steps);
  v.threads = worker_threads(o.threads);
  v.seed = o.seed.value_or(v.config.init_seed);
  if (v.seed < 0) throw UsageError("--seed: must be between 0 and 9223372036854775807");
  if (o.perturb_init && *o.perturb_init < 0) throw UsageError("--perturb-init: must be between 0 and 9223372036854775807");
  const std::unique_ptr<canary::Canary> model = canary::make_canary(v.config);  // tensors and op names
  check_engine_can_run(o.engine, o.engine_settings, *model);
  if (o.inject_fault) {
    try {
      v.fault = canary::parse_fault_spec(*o.inject_fault, model->forward_op_names(), model->parameter_names());
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    if (v.fault->step >= v.config.steps) {
      throw UsageError(fmt::format("--inject-fault: step={} is past the last step ({})", v.fault->step, v.config.steps - 1));
    }
  }
  for (int s : o.dump_steps) {
    if (s < 0 || s > v.config.steps) {
      throw UsageError(fmt::format("--dump-tensors: step {} is outside 0..{}", s, v.config.steps));
    }
  }
  if (o.checkpoint_every < 0 || (o.checkpoint_every > 0 && o.checkpoint_every >= v.config.steps)) {
    throw UsageError(fmt::format("--checkpoint-every: must be between 1 and {} (steps - 1) to write a checkpoint; 0 is off",
                                 v.config.steps - 1));
  }
  check_output_path(o);
  if (o.checkpoint_every > 0) check_checkpoint_dir(o);
  return v;
}

receipt::Manifest make_manifest(const RunOptions& o, const Validated& v, const Engine& engine, const std::string& lane) {
  const StackInfo stack = collect_stack_info();
  receipt::Manifest m;
  m.lane = lane;
  m.engine = o.engine;
  m.features = engine.features();
  m.canary_json = v.config.to_json().dump();
  m.seed = v.seed;
  m.steps_planned = v.config.steps;
  m.threads = v.threads;
  m.created_utc = utc_timestamp();
  m.git_commit = stack.git_commit;
  m.toolchain = stack.toolchain;
  m.libraries = stack.libraries;
  m.host = stack.host;
  m.cpu = stack.cpu;
  m.extra["kernels"] = stack.kernels;
  m.extra["data_seed"] = static_cast<std::int64_t>(v.config.data_seed);
  m.extra["fault_injection"] = v.fault ? v.fault->to_string() : std::string("none");
  m.extra["trace"] = to_string(o.trace);
  if (o.perturb_init) m.extra["init_perturbation_seed"] = *o.perturb_init;  // absent: the canary's own weights
  // Declared by the engine: the verdict's budget (docs/budgets.md).
  m.extra["budget_features"] = receipt::BudgetFeatures(engine.budget_features()).to_string();
  const auto engine_attributes = engine.manifest_attributes();
  for (const auto& attribute : engine_attributes) m.extra[attribute.first] = attribute.second;
  // The recipe names what this run resolved: the canary's file or name and the seed.
  RunOptions resolved = o;
  resolved.canary = v.config.spec;
  resolved.seed = v.seed;
  m.extra["run_options"] = replay_recipe(resolved, engine.reduction_seed()).dump();
  return m;
}

std::vector<std::string> parameter_names(const canary::Canary& model) {
  std::vector<std::string> names;
  for (TensorId p : model.parameters()) names.push_back(model.tensors()[p].name);
  return names;
}

void dump_parameters(Engine& engine, const canary::Canary& model, receipt::ReceiptWriter& writer, int step) {
  for (TensorId p : model.parameters()) {
    const TensorDesc& d = model.tensors()[p];
    writer.dump_tensor(step, d.name, d.shape, engine.read(p));
  }
}

}  // namespace

std::string lane_name(const std::string& canary, const std::string& engine, const std::string& features) {
  return features.empty() ? canary + "/" + engine : canary + "/" + engine + "+" + features;
}

nlohmann::json replay_recipe(const RunOptions& o, const std::optional<Engine::ReductionSeed>& reduction_seed) {
  RunOptions recorded = o;
  if (reduction_seed) recorded.engine_settings.options[reduction_seed->flag] = std::to_string(reduction_seed->seed);
  nlohmann::json recipe = nlohmann::json::object();
  for (const RunOptionField& field : run_option_fields()) {
    if (field.recorded()) field.write(recorded, recipe);
  }
  return recipe;
}

TraceLevel parse_trace_level(const std::string& text, const std::string& where) {
  if (text == "none") return TraceLevel::kNone;
  if (text == "ops") return TraceLevel::kOps;
  throw UsageError(fmt::format("{}: '{}' is not a trace level; use none or ops", where, text));
}

std::string to_string(TraceLevel level) { return level == TraceLevel::kOps ? "ops" : "none"; }

int worker_threads(int requested) {
  if (requested < 0 || requested > kMaxThreads) {
    throw UsageError(fmt::format("--threads: must be in 0..{} (0 = all cores)", kMaxThreads));
  }
  return requested == 0 ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) : requested;
}

int checked_steps(int steps) {
  if (steps < 1 || steps > canary::kMaxSteps) throw UsageError(fmt::format("--steps: must be in 1..{}", canary::kMaxSteps));
  return steps;
}

RunOptions options_from_recipe(const nlohmann::json& recipe) {
  if (!recipe.is_object()) throw UsageError("run_options: not a replay recipe (not a JSON object)");
  RunOptions o;
  try {
    for (const RunOptionField& field : run_option_fields()) {
      if (field.recorded()) field.read(recipe, o);
    }
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("run_options: not a replay recipe ({})", json_error_text(e)));
  }
  return o;
}

std::vector<int> parse_step_list(const std::string& text, int max_step) {
  std::vector<int> steps;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    int value = -1;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || value < 0 || value > max_step) {
      throw UsageError(fmt::format("--dump-tensors: '{}' is not a step in 0..{} (want e.g. 0,50,100)", item, max_step));
    }
    steps.push_back(value);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

std::optional<std::uint64_t> init_perturbation(const RunOptions& options) {
  if (!options.perturb_init) return std::nullopt;
  return static_cast<std::uint64_t>(*options.perturb_init);
}

canary::CanaryConfig load_run_canary(const std::string& canary) {
  try {
    return canary::load_canary(canary);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("--canary: {}", e.what()));
  }
}

void check_engine_can_run(const std::string& engine_name, const EngineSettings& settings, const canary::Canary& model) {
  const canary::CanaryConfig& config = model.config();
  try {
    // The engine's own gate too (a mesh engine's shard plan must divide the model).
    const std::unique_ptr<Engine> engine = make_engine(engine_name, settings);
    if (const std::string why = canary::engine_cannot_run(*engine, model); !why.empty()) {
      throw UsageError(fmt::format("--engine: {} (canary {} is {})", why, config.name, config.architecture));
    }
    engine->check_table(model.tensors());
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

RunSummary run_canary(const RunOptions& o, const std::function<void(const StepProgress&)>& on_step) {
  const Validated v = validate(o);
  const OutputLock output_lock(o.out);  // before anything is written: a second writer is refused
  const InterruptGuard interrupts;
  const tbb::global_control threads(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(v.threads));

  const RunSetup setup = set_up_run(v.config, make_engine(o.engine, o.engine_settings),
                                    {v.fault, o.trace == TraceLevel::kOps});
  const canary::Canary& model = *setup.model;
  Engine* const engine = setup.engine.get();
  upload_initial_parameters(setup, static_cast<std::uint64_t>(v.seed), init_perturbation(o));
  OpTraceRecorder tracer(model.tensors());
  if (o.trace == TraceLevel::kOps) engine->set_trace_sink(&tracer);

  RunSummary summary;
  summary.lane = setup.lane;
  summary.receipt_path = o.out;
  summary.threads = v.threads;
  const std::string checkpoints = checkpoint_dir(o.out);
  if (o.checkpoint_every > 0) prepare_checkpoint_dir(checkpoints);  // before the receipt: a failure leaves no file
  receipt::ReceiptWriter writer(o.out, make_manifest(o, v, *engine, summary.lane), parameter_names(model), o.force,
                                o.record_batches, {v.config.batch_size, v.config.context_length + 1},
                                full_receipt_schema());
  if (o.checkpoint_every > 0) writer.declare_checkpoints(fs::path(checkpoints).filename().string(), o.checkpoint_every);
  const HeldOutEval held_out(model, *v.data);
  if (held_out.enabled()) writer.declare_eval(held_out.declaration());
  TraceSink* const run_sink = o.trace == TraceLevel::kOps ? &tracer : nullptr;

  const auto should_dump = [&](int step) {
    return std::binary_search(o.dump_steps.begin(), o.dump_steps.end(), step);
  };
  const auto start = std::chrono::steady_clock::now();
  const StepDigester digester(model);
  receipt::StepRecord record;
  for (int step = 0; step < v.config.steps; ++step) {
    if (should_dump(step)) dump_parameters(*engine, model, writer, step);
    if (o.checkpoint_every > 0 && step > 0 && step % o.checkpoint_every == 0) {
      const std::string path = (fs::path(checkpoints) / checkpoint_file_name(step)).string();
      save_checkpoint(path, capture_checkpoint(*engine, model, step, summary.lane, v.seed));
      writer.add_checkpoint(step, file_content_hash(path));
    }
    if (held_out.due(step)) held_out.evaluate(*engine, step, run_sink, writer);
    const TakenStep taken = take_step(setup, *v.data, step, digester, record);
    const canary::StepResult& result = taken.result;
    if (o.record_batches) writer.append_batch(taken.batch.tokens);
    std::vector<StepState> state = engine->step_state();
    for (StepState& more : model.step_state(*engine)) state.push_back(std::move(more));
    writer.append_state(state);
    if (o.trace == TraceLevel::kOps) {
      const receipt::TraceStep traced = tracer.finish_step();  // the first step fixes columns()
      writer.append_trace(tracer.columns(), traced);
    }
    writer.append_step(record);
    if (step == 0) summary.first_loss = result.loss;
    summary.last_loss = result.loss;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (on_step) on_step({step, v.config.steps, result.loss, elapsed});
    if (const int signal = pending_interrupt(); signal != 0 && step + 1 < v.config.steps) {
      throw Interrupted(signal, step + 1,
                        fmt::format("interrupted at step {}: {} holds {} steps (0-{}), complete = 0", step + 1, o.out,
                                    step + 1, step));
    }
  }
  if (should_dump(v.config.steps)) dump_parameters(*engine, model, writer, v.config.steps);
  if (held_out.due(v.config.steps)) held_out.evaluate(*engine, v.config.steps, run_sink, writer);
  writer.finish();
  summary.steps = v.config.steps;
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

void check_output_file(const std::string& out, bool force, const std::string& kind, const std::string& example) {
  if (out.empty()) throw UsageError(fmt::format("--out: a {} path is required (e.g. --out {})", kind, example));
  const std::filesystem::path path(out);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw UsageError(fmt::format("--out: '{}' is a directory; give a file path", out));
  if (std::filesystem::exists(path, ec) && !force) {
    throw UsageError(fmt::format("--out: '{}' exists; pass --force to overwrite it or choose another path", out));
  }
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  if (!std::filesystem::is_directory(dir, ec)) {
    throw UsageError(fmt::format("--out: directory '{}' does not exist; create it first", dir.string()));
  }
  if (access(dir.c_str(), W_OK) != 0) {
    throw UsageError(fmt::format("--out: directory '{}' is not writable; choose another path", dir.string()));
  }
}

}  // namespace harness::run
