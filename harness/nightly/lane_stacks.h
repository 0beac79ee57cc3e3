// The lane stacks that run as child processes, as descriptions (docs/lane-stacks.md): for
// each, the lane's name, the budget features it declares, its command line and what its
// receipts record, made from the options the lane is set up with. The one description the C++ matrix and the Python package both read: the
// package's copy is what `harness schema --lane-stacks` prints
// (python/canary_harness/cli/lane_stacks.json; python/tests/test_lane_stacks.py holds the two
// equal and the package's lanes to it).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace harness::nightly {

// The options a lane of a stack is set up with, as text: canary, release ("@2.9" for a
// versioned torch, "" otherwise), device (its type: cpu, cuda, xla), device_index (":1" of
// cuda:1, "" otherwise), precision, compile ("true" when on), layout, mesh, shard_plan; a
// Python canary's canary_spec (what `canary_harness run` loads), threads, seeded ("true":
// the job's {seed} is passed) and trace ("ops"). An option not set is absent (or "").
using StackOptions = std::map<std::string, std::string>;

// What the job fills in a lane's command when it runs it (never an option's name): the
// pack, the receipt to write, the steps and the seed.
inline constexpr const char* kJobPlaceholders[] = {"{pack}", "{out}", "{steps}", "{seed}"};

// Options that must all hold: each key's value, or "*" for any value set.
using StackCondition = std::map<std::string, std::string>;

// One piece of a lane's name, or one budget feature: `text` with {option} placeholders,
// taken when every option of `when` holds and not every one of `unless` does (an empty
// `unless` never excludes).
struct StackPart {
  std::string text;
  StackCondition when, unless;
};

// What kind of value a lane key takes, which says how the matrix reads it (read_lane_keys
// in matrix.cpp) and what the export tells the package.
enum class LaneKeyKind {
  kChoice,       // one of `values`; "cuda:N" stands for cuda with any device index
  kSwitch,       // present means on (true); its option is then "true"
  kCount,        // an integer in min..max
  kInterpreter,  // a Python interpreter's path (relative to the matrix file); the matrix's `python` stands in
  kEngineFlag,   // read by the flag of that name of `engine` (tpu-mesh's mesh)
  kDeclared,     // what the lane declares of itself, given to be checked: it must equal the description's
  kArgv,         // a program's argv (no shell), the job's placeholders filled when it runs
  kFeatures,     // budget features, '+'-joined: what the lane's receipt declares
  kLaneName,     // the lane's name, CANARY/NAME (it names the golden)
  kLaneId,       // the id of another lane of the matrix
  kHarnessFeatures,  // a harness engine's --features (bf16, fp8=..., its zones)
};
std::string_view to_string(LaneKeyKind kind);

// One key a matrix lane of the stack takes (nightly.toml: `device = "cuda"`): what it
// chooses, the values it takes, its default and where it may be given. The one place each
// key's meaning is written: the matrix reads lanes by it, the export carries it.
struct LaneKey {
  std::string key{};   // as the matrix writes it: "shard-plan"
  std::string what{};  // what it chooses, one line (the error for a missing required key ends with it)
  LaneKeyKind kind = LaneKeyKind::kChoice;
  std::vector<std::string> values{};  // kChoice: every value it takes
  std::string default_value{};        // taken when the lane gives none ("" for none)
  std::int64_t min = 0, max = 0;    // kCount: the range
  bool required = false;            // a lane must give it (an interpreter: or the matrix its `python`)
  std::string engine{};               // kEngineFlag: the engine whose flag reads it
  // It may be given only where these keys hold (layout: device = cpu), and why not elsewhere.
  StackCondition only_with{};
  std::string only_with_why{};
  // Read by the nightly job (resume-at: the restart gate it runs beside the lane), never
  // an option of the lane's own command.
  bool job_only = false;
};

struct LaneStack {
  std::string id;      // torch-pack, torch-canary, jax
  std::string what;    // one line: what runs
  std::string engine;  // the receipt's /manifest/engine
  std::string module;  // python -m MODULE runs it
  std::string name;    // the lane name's base, "{canary}/torch{release}"
  std::vector<StackPart> name_parts;       // appended to the base, in order
  std::vector<StackPart> budget_features;  // in the order the receipt declares them
  // The command after `python -m MODULE`, in order: each part's text is split at spaces
  // into words before its options are filled ("--layout {layout}" is two words, whatever
  // the value holds); the job's placeholders stay for the job (kJobPlaceholders).
  std::vector<StackPart> arguments;
  // The flag its command takes an injected regression with (`harness power`'s ladder,
  // python/canary_harness/runs/regressions.py), followed by the regression's text; "" for none.
  std::string fault_flag;
  // The flag its command takes the job's thread count with (`harness nightly --threads`),
  // where the lane does not pin its own; "" for none.
  std::string threads_flag;
  // Which canaries its lanes run: kPackCanaries (a built-in canary or canary file, from the
  // job's pack) or kPythonCanaries (a Python canary's own file). A matrix lane's `engine`
  // picks the stack of its canary's kind that has that engine (find_lane_stack).
  std::string canaries;
  // The keys a matrix lane of this stack takes besides id, engine and why (nightly.toml:
  // `device = "cuda"`, `mesh = "2x2"`), each with its meaning; the matrix checks a lane's
  // keys by them and its runner in matrix.cpp makes the stack's options of their values.
  std::vector<LaneKey> lane_keys;
  // What its lanes' receipts hold besides the core every receipt has (docs/receipt-schema.md):
  // each part a group's path ("/compile"), taken under its conditions. The nightly refuses a
  // lane's receipt that lacks one (lane_run.cpp). What a canary adds of its own (moe's
  // /routing, the held-out evaluation's /eval at the steps its [eval] names) is the
  // canary's, not the stack's.
  std::vector<StackPart> records;
  // Values of each option the export's examples combine (every combination, canary "c"):
  // the lane name, budget features and command this description gives for each, which the
  // Python package's reading of the description must give too.
  std::map<std::string, std::vector<std::string>> example_values;
};

inline constexpr const char* kPackCanaries = "pack";
inline constexpr const char* kPythonCanaries = "python";

const std::vector<LaneStack>& lane_stacks();
// The stack `id`; std::invalid_argument for none.
const LaneStack& lane_stack(std::string_view id);
// The stack whose lanes run `canaries` (kPackCanaries, kPythonCanaries) on `engine`;
// nullptr for none (a harness engine's lane, or a mistake the matrix names).
const LaneStack* find_lane_stack(std::string_view engine, std::string_view canaries);
// The engines of the stacks that run `canaries`, in the description's order.
std::vector<std::string> lane_stack_engines(std::string_view canaries);

// The lanes that run no stack, described as the stacks are (docs/lane-stacks.md): a harness
// engine's, run in the nightly's own process, named `{canary}/{lane engine}[+{features}]`
// and declaring its engine's budget features; and a team's command, named by its `lane` and
// declaring its `budget-features`. Their keys besides id, engine and why: the keys every
// harness engine's lane takes (its engine's flags besides, engines/registry.h), and a command
// lane's.
const std::vector<LaneKey>& harness_lane_keys();
const std::vector<LaneKey>& command_lane_keys();
// The key `key` of `keys`; nullptr for none.
const LaneKey* find_lane_key(const std::vector<LaneKey>& keys, std::string_view key);
std::vector<std::string> lane_key_names(const std::vector<LaneKey>& keys);

// The stack's key `key`; nullptr for none.
const LaneKey* find_lane_key(const LaneStack& stack, std::string_view key);
// The keys' names, in the description's order ("device, precision, ...").
std::vector<std::string> lane_key_names(const LaneStack& stack);

// `text` with each {option} replaced by the option's value ("" when not set); the job's
// placeholders (kJobPlaceholders) stay as written.
std::string fill_options(const std::string& text, const StackOptions& options);

// The lane's name and budget features under `options`.
std::string stack_lane_name(const LaneStack& stack, const StackOptions& options);
std::vector<std::string> stack_budget_features(const LaneStack& stack, const StackOptions& options);
// The receipt groups its lane writes under `options` (LaneStack::records).
std::vector<std::string> stack_records(const LaneStack& stack, const StackOptions& options);

// The lane's argv after the interpreter: "-m", the module, then the arguments' words.
std::vector<std::string> stack_command(const LaneStack& stack, const StackOptions& options);

// Every stack, with its examples, as `harness schema --lane-stacks` prints it.
nlohmann::json lane_stacks_json();

}  // namespace harness::nightly
