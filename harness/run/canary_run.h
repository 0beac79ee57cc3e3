// One canary run: model + engine + recorder, step by step, into a receipt.
// The CLI's `run` subcommand is a thin shell around run_canary().
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/engine.h"
#include "api/engine_settings.h"
#include "preset.h"

namespace harness::canary {
class Canary;
}

namespace harness::run {

// A user-facing problem with the request (bad flag value, unwritable path, ...): the CLI
// prints the message as one line and exits 2. Nothing has been written when it is thrown.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --out of a command that writes one file (a receipt, a pack): given, not a directory, not
// an existing file unless `force`, in an existing writable directory. Throws UsageError;
// `kind` names the file ("receipt") and `example` is the path its message suggests.
void check_output_file(const std::string& out, bool force, const std::string& kind, const std::string& example);

// What a run records beside its metrics (--trace, a matrix's `trace`, a recipe's "trace"):
// nothing more, or every op's output hashed and sketched per step (/trace, docs/bisect.md).
enum class TraceLevel { kNone, kOps };
// "none" or "ops"; throws UsageError "WHERE: 'TEXT' is not a trace level; use none or ops".
TraceLevel parse_trace_level(const std::string& text, const std::string& where = "--trace");
std::string to_string(TraceLevel level);

// Worker threads of a run: --threads 0..kMaxThreads, 0 = every hardware thread (the CLI,
// the nightly, calibrate, replay recipes and audit take them so).
inline constexpr int kMaxThreads = 1024;
// The threads a run of `requested` uses; throws UsageError (naming --threads) outside 0..kMaxThreads.
int worker_threads(int requested);
// `steps` when it is in 1..canary::kMaxSteps; throws UsageError (naming --steps) otherwise.
int checked_steps(int steps);

struct RunOptions {
  std::string canary = "tiny";  // a shipped canary's name or a canary file's path
  std::string engine = "cpu-ref";
  EngineSettings engine_settings;  // --features and the engine's own flags
  std::optional<int> steps;  // default: the canary's [train] steps
  int threads = 0;           // 0: all hardware threads
  std::optional<std::int64_t> seed;  // default: the canary's [train] seed
  std::string out;
  bool force = false;
  std::vector<int> dump_steps;
  bool record_batches = false;
  std::optional<std::string> inject_fault;
  TraceLevel trace = TraceLevel::kNone;
  int checkpoint_every = 0;    // --checkpoint-every K: the state at the start of steps K, 2K, ...
  // --perturb-init SEED: every initial weight moved one ulp (numerics/perturbation.h), for
  // calibrate --perturb; recorded as the manifest's init_perturbation_seed.
  std::optional<std::int64_t> perturb_init;
};

struct StepProgress {
  int step, steps;
  double loss;
  double elapsed_seconds;
};

struct RunSummary {
  std::string lane, receipt_path;
  int steps = 0;
  double first_loss = 0, last_loss = 0;
  double seconds = 0;  // wall time of the step loop, recording included
  int threads = 0;
};

// The seed of `options`' one-ulp perturbation of the initial weights, when it has one.
std::optional<std::uint64_t> init_perturbation(const RunOptions& options);

// The canary a run names (a shipped one or a canary file), or UsageError naming --canary.
canary::CanaryConfig load_run_canary(const std::string& canary);
// The engine's gate for `model` (its ops implemented, its table accepted: a mesh engine's
// shard plan must divide the model), or UsageError naming what stops it.
void check_engine_can_run(const std::string& engine, const EngineSettings& settings, const canary::Canary& model);

// Validates everything first (throws UsageError before creating any file), then runs.
RunSummary run_canary(const RunOptions& options, const std::function<void(const StepProgress&)>& on_step = {});

// Canonical lane name: "<canary name>/<engine>[@mesh][+feature...]", e.g. "tiny/tpu-mesh@2x2+tp".
std::string lane_name(const std::string& canary, const std::string& engine, const std::string& features);

// What replays a run: everything above but the output (out, force, dump_steps,
// record_batches), as the manifest's `run_options` JSON. A seeded engine's run records the
// seed it drew (Engine::reduction_seed) as its flag, so a replay draws the same orders.
// `options` as the run resolved them: `canary` the canary's spec (a file's absolute path)
// and `seed` set.
nlohmann::json replay_recipe(const RunOptions& options, const std::optional<Engine::ReductionSeed>& reduction_seed);
// The inverse; throws UsageError naming the key when the JSON is not a recipe.
RunOptions options_from_recipe(const nlohmann::json& recipe);

// Parses "S1,S2,..." (each 0..max_step); throws UsageError naming --dump-tensors.
std::vector<int> parse_step_list(const std::string& text, int max_step);

}  // namespace harness::run
