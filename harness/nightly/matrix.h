// The lane matrix of a nightly job (canaries/nightly.toml; docs/nightly.md is the reference):
// which lanes run, with which engine settings, and which lane is the reference the others
// are compared with.
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "canary_run.h"
#include "budgets.h"
#include "fault.h"
#include "file_io.h"

namespace harness::nightly {

// A matrix file (or a --lanes / --shard selection) that cannot be used: the message names
// the file or flag and the key.
struct MatrixError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct LaneSpec {
  std::string id;         // short, unique in the matrix: file names and report rows
  std::string lane;       // canonical lane name, e.g. "tiny/tpu-mesh@2x2+tp": the golden's path
  std::string engine;     // cpu-ref, accel, tpu-mesh; torch or command for an external lane
  EngineSettings settings;  // torch lanes: options device and precision
  // An external lane (engine torch, or a `command`): argv with the placeholders {pack},
  // {out}, {steps} and {seed}, run without a shell. Empty for the harness's own engines.
  std::vector<std::string> command;
  std::map<std::string, std::string> environment;  // set for the command: HARNESS_BIN (a Python stack: PYTHONPATH too)
  std::string why;        // what the lane guards (shown in reports)
  std::string triage_with;  // id of the bf16-only twin of an fp8 lane ("" when none)
  std::vector<std::string> budget_features;  // what its engine declares (Engine::budget_features)

  // A Python canary's lane (docs/own-model.md, "A nightly"): `python3 -m canary_harness run
  // FILE.py:NAME` on no pack, its torch threads pinned by the lane (their bits depend on it).
  bool python_canary = false;

  // bias-repeats = N (docs/nightly.md, "One-sided drift"): the lane runs N times, under its
  // noise seed S and S+1 .. S+N-1, and the nightly tests the N runs for one-sided drift from
  // the reference lane (check/drift_bias.h). 0: not tested. Only a seeded harness lane.
  int bias_repeats = 0;

  // resume-at = K (docs/nightly.md, "The restart gate"): the lane runs again, stops after
  // step K, checkpoints (a harness engine's checkpoint; a Python canary's own save), goes on
  // in a new process and must be bitwise equal to the uninterrupted run from K+1. -1: not gated.
  int resume_at = -1;

  bool declares(const std::string& budget_feature) const;
  // The flag that seeds the lane's reduction order when its engine declares one (a seeded
  // engine: each run draws an order, the flag replays one); "" otherwise.
  std::string reduction_seed_flag() const;
  bool external() const { return !command.empty(); }  // runs as a child process
  bool uses_pack() const;  // its command reads the job's canary pack ({pack})
  // The flag its command takes `harness power`'s regressions with, as its lane stack
  // describes it (LaneStack::fault_flag); "" for a command lane, whose program is the team's.
  std::string fault_flag;
  std::string threads_flag;  // LaneStack::threads_flag: how the job's thread count reaches it
  // The receipt groups its stack records under its options (LaneStack::records), which its
  // receipt must hold; none for the harness's engines and a team's command lane.
  std::vector<std::string> records;
  // The ladder can inject into it: a harness engine's lane, or a stack's command that takes a fault.
  bool takes_regressions() const { return !external() || !fault_flag.empty(); }
};

// The argv of an external lane with its placeholders filled in.
std::vector<std::string> expand_command(const LaneSpec& spec, const std::string& pack, const std::string& out, int steps,
                                        std::int64_t seed);

struct Matrix {
  std::string path;
  std::string content_hash;  // of the file: shards of one job must have run the same matrix
  std::string canary;       // how every lane loads it: a shipped name, a canary file's absolute path, or a
                            // Python canary's FILE.py:NAME (FILE absolute)
  std::string canary_name;  // its `name`: lane names and goldens use it
  bool python_canary = false;  // canary is FILE.py:NAME: every lane is a torch lane running it
  int steps = 0;
  std::int64_t seed = 0;
  std::string reference;     // id of the reference lane
  run::TraceLevel trace = run::TraceLevel::kNone;  // --trace of every lane
  // The negative control's faults to try in order (docs/nightly.md, "Negative controls"):
  // `control-fault`, or by default 1 ulp in each of the canary's first kControlFaultOps
  // forward ops (a Python canary's leaf modules) at the middle step. Empty: none.
  std::vector<canary::FaultSpec> control_faults;
  // A Python canary's parameters and, among them, its linear layers' weights, in registration
  // order (`describe`): what harness power may move, and moves by default. Empty otherwise.
  std::vector<std::string> python_parameters, python_linear_weights;
  std::vector<LaneSpec> lanes;

  const LaneSpec& lane(const std::string& id) const;  // throws MatrixError
  // The RunOptions that run `spec` into `out` with this matrix's canary, steps and seed.
  run::RunOptions run_options(const LaneSpec& spec, const std::string& out) const;
};

inline constexpr std::size_t kControlFaultOps = 3;

// Parses and validates: every key known, ids unique, lane names unique, every engine
// accepts its settings, the reference and every triage twin exist.
Matrix load_matrix(const std::string& path);

// Every triage-with pair against the budgets (check/bf16_first.h): the lane declares a
// feature triage explains, and its twin does not declare that one. MatrixError naming the
// matrix and the lane.
void check_triage_pairs(const Matrix& matrix, const check::Budgets& budgets);

// --lanes: a comma-separated list of lane ids or lane names; empty text selects every lane.
// Errors name `flag`.
std::vector<const LaneSpec*> select_lanes(const Matrix& matrix, const std::string& text, const std::string& flag = "--lanes");

// "a,b,c" -> {"a", "b", "c"} (an empty text gives one empty item); `separator` another than ','.
std::vector<std::string> split_list(const std::string& text, char separator = ',');

// --shard i/N: lanes k with k mod N == i, in matrix order (i in 0..N-1).
struct Shard {
  int index = 0, count = 1;
  bool whole() const { return count == 1; }
};
Shard parse_shard(const std::string& text);  // throws MatrixError naming --shard
std::vector<const LaneSpec*> shard_lanes(const Matrix& matrix, const Shard& shard);

}  // namespace harness::nightly
