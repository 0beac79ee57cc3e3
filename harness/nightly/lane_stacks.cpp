#include "lane_stacks.h"

#include <algorithm>
#include <iterator>
#include <stdexcept>

#include <fmt/format.h>

#include "canary_file.h"
#include "canary_run.h"
#include "registry.h"

namespace harness::nightly {
namespace {

// The name a PyTorch lane adds to its base: the device where it is not the CPU, bf16,
// compile, the distributed layout (canary_harness.runs.runner.lane_features writes the same).
std::vector<StackPart> torch_name_parts() {
  return {{"+{device}", {{"device", "*"}}, {{"device", "cpu"}}},
          {"+bf16", {{"precision", "bf16"}}, {}},
          {"+compile", {{"compile", "true"}}, {}},
          {"+{layout}", {{"layout", "*"}}, {}}};
}

// The budget features of a PyTorch lane: its device's torch (but where `device_separates_not`
// holds), bf16, compile, the layout.
std::vector<StackPart> torch_budget_parts(const StackCondition& device_separates_not) {
  return {{"torch-{device}", {{"device", "*"}}, device_separates_not},
          {"torch-bf16", {{"precision", "bf16"}}, {}},
          {"torch-compile", {{"compile", "true"}}, {}},
          {"torch-{layout}", {{"layout", "*"}}, {}}};
}

// The options a torch lane's examples combine.
std::map<std::string, std::vector<std::string>> torch_example_values() {
  return {{"release", {"", "@2.9"}},
          {"device", {"cpu", "cuda", "xla"}},
          {"precision", {"fp32", "bf16"}},
          {"compile", {"", "true"}},
          {"layout", {"", "ddp"}}};
}

// The flags a PyTorch lane's command takes from the stack's options, in this order.
std::vector<StackPart> torch_flag_arguments() {
  return {{"--compile", {{"compile", "true"}}, {}},
          {"--versioned", {{"release", "*"}}, {}},
          {"--layout {layout}", {{"layout", "*"}}, {}}};
}

// The keys of a PyTorch lane, what each means (the device's type and index, the precision,
// another interpreter's torch, torch.compile): the two torch stacks share them.
LaneKey device_key() {
  return {.key = "device",
          .what = "the torch device the lane trains on (cuda:N: that GPU)",
          .kind = LaneKeyKind::kChoice,
          .values = {"cpu", "cuda", "cuda:N", "xla"},
          .default_value = "cpu"};
}
LaneKey precision_key() {
  return {.key = "precision", .what = "fp32, or bf16 autocast", .kind = LaneKeyKind::kChoice, .values = {"fp32", "bf16"},
          .default_value = "fp32"};
}
LaneKey torch_python_key() {
  return {.key = "python",
          .what = "another interpreter (.venv/bin/python): its torch names the lane @MAJOR.MINOR beside Debian's",
          .kind = LaneKeyKind::kInterpreter};
}
LaneKey compile_key() { return {.key = "compile", .what = "torch.compile the step (inductor)", .kind = LaneKeyKind::kSwitch}; }

// The restart gate on a lane whose run can stop and go on (docs/nightly.md, "The restart
// gate"): a harness engine's lane (its checkpoints) and a Python canary's (its save and load).
LaneKey resume_at_key() {
  return {.key = "resume-at",
          .what = "the restart gate: stop after step K, checkpoint, go on in a new process, bitwise equal from K+1",
          .kind = LaneKeyKind::kCount,
          .min = 0,
          .max = canary::kMaxSteps - 2,
          .job_only = true};
}

std::vector<LaneKey> torch_pack_keys() {
  return {device_key(),
          precision_key(),
          torch_python_key(),
          compile_key(),
          {.key = "layout",
           .what = "the distributed layout: two processes over gloo (DDP or FSDP)",
           .kind = LaneKeyKind::kChoice,
           .values = {"ddp", "fsdp"},
           .only_with = {{"device", "cpu"}},
           .only_with_why = "a layout runs on the CPU (gloo)"},
          {.key = "budget-features",
           .what = "the budget features the lane declares, given to be checked ('+'-joined)",
           .kind = LaneKeyKind::kDeclared}};
}

std::vector<LaneKey> torch_canary_keys() {
  return {device_key(),
          precision_key(),
          {.key = "threads",
           .what = "torch's CPU threads, pinned (torch's CPU bits depend on the count)",
           .kind = LaneKeyKind::kCount,
           .default_value = "1",
           .min = 1,
           .max = run::kMaxThreads},
          torch_python_key(),
          compile_key(),
          resume_at_key()};
}

// A jax lane's: the interpreter that has JAX; the plans the JAX module runs (tpu-mesh's but
// ep) and the matmul precisions, as choices the module reads too; the mesh, read by
// tpu-mesh's own flag (the JAX lane runs tpu-mesh's layouts).
std::vector<LaneKey> jax_keys() {
  return {{.key = "python",
           .what = "the interpreter that has JAX (python = \"../.venv/bin/python\", made by scripts/python-env.sh)",
           .kind = LaneKeyKind::kInterpreter,
           .required = true},
          {.key = "mesh", .what = "the mesh of virtual XLA CPU devices, DxM", .kind = LaneKeyKind::kEngineFlag, .engine = "tpu-mesh"},
          {.key = "shard-plan",
           .what = "how the mesh shards the canary: data parallel, tensor parallel or ZeRO-3",
           .kind = LaneKeyKind::kChoice,
           .values = {"dp", "tp", "zero3"},
           .default_value = "dp"},
          {.key = "precision",
           .what = "the matmul operands' precision",
           .kind = LaneKeyKind::kChoice,
           .values = {"fp32", "bf16"},
           .default_value = "fp32"}};
}

// The lane's receipt: the last two words of every stack's command (the job fills {out}).
StackPart out_argument() { return {"--out {out}", {}, {}}; }

std::vector<StackPart> torch_pack_arguments() {
  std::vector<StackPart> args{{"--pack {pack} --device {device}{device_index} --precision {precision}", {}, {}}};
  for (StackPart& flag : torch_flag_arguments()) args.push_back(std::move(flag));
  args.push_back(out_argument());
  return args;
}

std::vector<StackPart> torch_canary_arguments() {
  std::vector<StackPart> args{
      {"run {canary_spec} --device {device}{device_index} --precision {precision} --threads {threads} --steps {steps}",
       {},
       {}}};
  for (StackPart& flag : torch_flag_arguments()) args.push_back(std::move(flag));
  args.push_back({"--seed {seed}", {{"seeded", "true"}}, {}});
  args.push_back({"--trace {trace}", {{"trace", "*"}}, {}});
  args.push_back(out_argument());
  return args;
}

// A Python canary's: its own flags both ways, on fewer devices and precisions than
// torch_example_values (which the pack's lanes cover with the same name parts).
std::map<std::string, std::vector<std::string>> torch_canary_example_values() {
  std::map<std::string, std::vector<std::string>> values = torch_example_values();
  values["device"] = {"cpu", "cuda"};
  values["precision"] = {"fp32"};
  values["canary_spec"] = {"model.py:make_canary"};
  values["threads"] = {"1"};
  values["seeded"] = {"", "true"};
  values["trace"] = {"", "ops"};
  return values;
}

// A torch lane on torch_xla's device records the compiler's own counters (/compile:
// canary_harness.xla.device.XlaStepCounters).
StackPart xla_compile_record() { return {"/compile", {{"device", "xla"}}, {}}; }

// Every stack's command takes a regression as `--inject-fault kind=...` (lane_args.py).
constexpr const char* kFaultFlag = "--inject-fault";

std::vector<LaneStack> make_stacks() {
  std::vector<LaneStack> stacks;
  // A built-in canary's pack trained by the package's model of its architecture, judged
  // against cpu-ref: the device's torch separates it even on the CPU (torch-cpu), but under
  // bf16 on the CPU, where torch-bf16 holds both.
  stacks.push_back({"torch-pack",
                    "the PyTorch lane of a built-in canary's pack (docs/python.md)",
                    "torch",
                    "canary_harness.lane",
                    "{canary}/torch{release}",
                    torch_name_parts(),
                    torch_budget_parts({{"device", "cpu"}, {"precision", "bf16"}}),
                    torch_pack_arguments(),
                    kFaultFlag,
                    "--threads",  // the job's thread count
                    kPackCanaries,
                    torch_pack_keys(),
                    {xla_compile_record()},
                    torch_example_values()});
  // A team's Python canary, judged against its own fp32 eager one-process CPU run: the CPU
  // itself separates nothing.
  stacks.push_back({"torch-canary",
                    "a Python canary's lane (docs/own-model.md)",
                    "torch",
                    "canary_harness",
                    "{canary}/torch{release}",
                    torch_name_parts(),
                    torch_budget_parts({{"device", "cpu"}}),
                    torch_canary_arguments(),
                    kFaultFlag,
                    "",  // the lane pins its own (--threads {threads}): torch's CPU bits depend on it
                    kPythonCanaries,
                    torch_canary_keys(),
                    {xla_compile_record(), {"/trace", {{"trace", "*"}}, {}}},
                    torch_canary_example_values()});
  // A built-in canary in JAX on a mesh of XLA devices: XLA's kernels (jax), bf16 matmul
  // operands (jax-bf16), and on more than one device the mesh's reduction splits, judged
  // under tpu-mesh's own entries.
  stacks.push_back({"jax",
                    "the JAX lane of a built-in canary's pack (docs/xla.md)",
                    "jax",
                    "canary_harness.jax",
                    "{canary}/jax@{mesh}+{shard_plan}",
                    {{"+bf16", {{"precision", "bf16"}}, {}}},
                    {{"jax", {}, {}},
                     {"jax-bf16", {{"precision", "bf16"}}, {}},
                     {"mesh-{precision}", {{"mesh", "*"}}, {{"mesh", "1x1"}}}},
                    {{"--pack {pack} --mesh {mesh} --shard-plan {shard_plan} --precision {precision}", {}, {}},
                     out_argument()},
                    kFaultFlag,
                    "",  // XLA's CPU client sizes its own pool
                    kPackCanaries,
                    jax_keys(),
                    {{"/compile", {}, {}}},  // XLA's own counters, every run
                    {{"mesh", {"1x1", "2x2"}}, {"shard_plan", {"dp", "zero3"}}, {"precision", {"fp32", "bf16"}}}});
  return stacks;
}

bool holds(const StackCondition& condition, const StackOptions& options) {
  return std::all_of(condition.begin(), condition.end(), [&](const auto& item) {
    const auto found = options.find(item.first);
    const bool set = found != options.end() && !found->second.empty();
    return item.second == "*" ? set : set && found->second == item.second;
  });
}

bool taken(const StackPart& part, const StackOptions& options) {
  return holds(part.when, options) && (part.unless.empty() || !holds(part.unless, options));
}

// The texts of the parts taken under `options`, filled, in order.
std::vector<std::string> taken_texts(const std::vector<StackPart>& parts, const StackOptions& options) {
  std::vector<std::string> texts;
  for (const StackPart& part : parts) {
    if (taken(part, options)) texts.push_back(fill_options(part.text, options));
  }
  return texts;
}

}  // namespace

std::string fill_options(const std::string& text, const StackOptions& options) {
  std::string out;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t open = text.find('{', at);
    if (open == std::string::npos) return out + text.substr(at);
    const std::size_t close = text.find('}', open);
    if (close == std::string::npos) throw std::logic_error("lane stack text '" + text + "': an unclosed {");
    out += text.substr(at, open - at);
    const std::string placeholder = text.substr(open, close - open + 1);
    const auto value = options.find(placeholder.substr(1, placeholder.size() - 2));
    if (std::find(std::begin(kJobPlaceholders), std::end(kJobPlaceholders), placeholder) != std::end(kJobPlaceholders)) {
      out += placeholder;
    } else if (value != options.end()) {
      out += value->second;
    }
    at = close + 1;
  }
  return out;
}

namespace {

nlohmann::json condition_json(const StackCondition& c) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, value] : c) out[key] = value;
  return out;
}

nlohmann::json parts_json(const std::vector<StackPart>& parts) {
  nlohmann::json out = nlohmann::json::array();
  for (const StackPart& p : parts) {
    out.push_back({{"text", p.text}, {"when", condition_json(p.when)}, {"unless", condition_json(p.unless)}});
  }
  return out;
}

nlohmann::json keys_json(const std::vector<LaneKey>& keys) {
  nlohmann::json out = nlohmann::json::array();
  for (const LaneKey& k : keys) {
    nlohmann::json key{{"key", k.key}, {"what", k.what}, {"kind", to_string(k.kind)}, {"values", k.values},
                       {"default", k.default_value}, {"required", k.required}, {"engine", k.engine},
                       {"only_with", condition_json(k.only_with)}, {"only_with_why", k.only_with_why},
                       {"job_only", k.job_only}};
    if (k.kind == LaneKeyKind::kCount) key["range"] = {k.min, k.max};
    out.push_back(std::move(key));
  }
  return out;
}

// Every combination of the stack's example values, each with what the description makes of it.
nlohmann::json examples_json(const LaneStack& stack) {
  std::vector<StackOptions> combinations{{{"canary", "c"}}};
  for (const auto& [key, values] : stack.example_values) {
    std::vector<StackOptions> more;
    for (const StackOptions& base : combinations) {
      for (const std::string& value : values) {
        StackOptions o = base;
        o[key] = value;
        more.push_back(std::move(o));
      }
    }
    combinations = std::move(more);
  }
  nlohmann::json out = nlohmann::json::array();
  for (const StackOptions& o : combinations) {
    out.push_back({{"options", o},
                   {"lane", stack_lane_name(stack, o)},
                   {"budget_features", stack_budget_features(stack, o)},
                   {"records", stack_records(stack, o)},
                   {"command", stack_command(stack, o)}});
  }
  return out;
}

}  // namespace

const std::vector<LaneStack>& lane_stacks() {
  static const std::vector<LaneStack> stacks = make_stacks();
  return stacks;
}

const LaneStack& lane_stack(std::string_view id) {
  for (const LaneStack& s : lane_stacks()) {
    if (s.id == id) return s;
  }
  throw std::invalid_argument(fmt::format("no lane stack '{}'", id));
}

const LaneStack* find_lane_stack(std::string_view engine, std::string_view canaries) {
  for (const LaneStack& s : lane_stacks()) {
    if (s.engine == engine && s.canaries == canaries) return &s;
  }
  return nullptr;
}

std::vector<std::string> lane_stack_engines(std::string_view canaries) {
  std::vector<std::string> engines;
  for (const LaneStack& s : lane_stacks()) {
    if (s.canaries == canaries) engines.push_back(s.engine);
  }
  return engines;
}

std::string_view to_string(LaneKeyKind kind) {
  switch (kind) {
    case LaneKeyKind::kChoice: return "choice";
    case LaneKeyKind::kSwitch: return "switch";
    case LaneKeyKind::kCount: return "count";
    case LaneKeyKind::kInterpreter: return "interpreter";
    case LaneKeyKind::kEngineFlag: return "engine-flag";
    case LaneKeyKind::kDeclared: return "declared";
    case LaneKeyKind::kArgv: return "argv";
    case LaneKeyKind::kFeatures: return "budget-features";
    case LaneKeyKind::kLaneName: return "lane-name";
    case LaneKeyKind::kLaneId: return "lane-id";
    case LaneKeyKind::kHarnessFeatures: return "harness-features";
  }
  throw std::logic_error("a lane key kind without a name");
}

const LaneKey* find_lane_key(const std::vector<LaneKey>& keys, std::string_view key) {
  for (const LaneKey& k : keys) {
    if (k.key == key) return &k;
  }
  return nullptr;
}

const LaneKey* find_lane_key(const LaneStack& stack, std::string_view key) { return find_lane_key(stack.lane_keys, key); }

std::vector<std::string> lane_key_names(const std::vector<LaneKey>& keys) {
  std::vector<std::string> names;
  for (const LaneKey& k : keys) names.push_back(k.key);
  return names;
}

std::vector<std::string> lane_key_names(const LaneStack& stack) { return lane_key_names(stack.lane_keys); }

const std::vector<LaneKey>& harness_lane_keys() {
  static const std::vector<LaneKey> keys{
      {.key = "features",
       .what = "the engine's reduced precisions and their zones, as --features takes them (bf16, fp8=mlp_fc)",
       .kind = LaneKeyKind::kHarnessFeatures},
      {.key = "triage-with",
       .what = "the id of the lane's bf16-only twin, which triage switches FP8 units back to (an fp8 lane)",
       .kind = LaneKeyKind::kLaneId},
      {.key = "bias-repeats",
       .what = "runs under the lane's reduction seed and the next ones, tested for one-sided drift (a seeded lane)",
       .kind = LaneKeyKind::kCount,
       .min = 3,
       .max = 100},
      resume_at_key()};
  return keys;
}

const std::vector<LaneKey>& command_lane_keys() {
  static const std::vector<LaneKey> keys{
      {.key = "command",
       .what = "the program and its arguments (no shell); one argument holds {out}, the receipt it must write",
       .kind = LaneKeyKind::kArgv,
       .required = true},
      {.key = "budget-features",
       .what = "the budget features its receipt declares (e.g. budget-features = \"torch-cpu\")",
       .kind = LaneKeyKind::kFeatures,
       .required = true},
      {.key = "lane",
       .what = "the receipt's lane, CANARY/NAME: it names the golden",
       .kind = LaneKeyKind::kLaneName,
       .default_value = "{canary}/{id}"}};
  return keys;
}

std::string stack_lane_name(const LaneStack& stack, const StackOptions& options) {
  std::string name = fill_options(stack.name, options);
  for (const StackPart& part : stack.name_parts) {
    if (taken(part, options)) name += fill_options(part.text, options);
  }
  return name;
}

std::vector<std::string> stack_budget_features(const LaneStack& stack, const StackOptions& options) {
  return taken_texts(stack.budget_features, options);
}

std::vector<std::string> stack_records(const LaneStack& stack, const StackOptions& options) {
  return taken_texts(stack.records, options);
}

std::vector<std::string> stack_command(const LaneStack& stack, const StackOptions& options) {
  std::vector<std::string> argv{"-m", stack.module};
  for (const StackPart& part : stack.arguments) {
    if (!taken(part, options)) continue;
    for (std::size_t at = 0; at <= part.text.size();) {
      const std::size_t space = std::min(part.text.find(' ', at), part.text.size());
      argv.push_back(fill_options(part.text.substr(at, space - at), options));
      at = space + 1;
    }
  }
  return argv;
}

namespace {

// A harness engine's flags as the keys of its lanes: a switch, or a value its engine reads.
std::vector<LaneKey> engine_flag_keys(const std::string& engine) {
  std::vector<LaneKey> keys;
  for (const DescribedFlag& f : engine_flags()) {
    if (f.engine != engine) continue;
    keys.push_back({.key = std::string(f.flag.name),
                    .what = std::string(f.flag.help),
                    .kind = f.flag.is_switch ? LaneKeyKind::kSwitch : LaneKeyKind::kEngineFlag,
                    .engine = engine});
  }
  return keys;
}

// The lanes of the harness's own engines: each engine's flags, and the name and budget
// features a lane of it under its default settings has (canary "c").
nlohmann::json harness_lanes_json() {
  nlohmann::json engines = nlohmann::json::array();
  for (const std::string& name : engine_names()) {
    const auto engine = make_engine(name);
    engines.push_back({{"engine", name},
                       {"lane_keys", keys_json(engine_flag_keys(name))},
                       {"example",
                        {{"lane", run::lane_name("c", engine->lane_engine(), engine->features())},
                         {"budget_features", engine->budget_features()}}}});
  }
  return {{"what", "a harness engine's lane, run in the nightly's own process (docs/engine-boundary.md)"},
          {"canaries", kPackCanaries},
          {"name", "{canary}/{lane_engine}"},
          {"name_parts", parts_json({{"+{features}", {{"features", "*"}}, {}}})},
          {"budget_features", "its engine's own (Engine::budget_features, under the lane's features and flags)"},
          {"lane_keys", keys_json(harness_lane_keys())},
          {"engines", engines}};
}

nlohmann::json command_lanes_json() {
  return {{"what", "a team's own program, run as a child process on the job's canary pack (docs/nightly.md)"},
          {"canaries", kPackCanaries},
          {"name", "{lane}"},
          {"budget_features", "its budget-features key"},
          {"lane_keys", keys_json(command_lane_keys())}};
}

}  // namespace

nlohmann::json lane_stacks_json() {
  nlohmann::json stacks = nlohmann::json::array();
  for (const LaneStack& s : lane_stacks()) {
    stacks.push_back({{"id", s.id},
                      {"what", s.what},
                      {"engine", s.engine},
                      {"module", s.module},
                      {"name", s.name},
                      {"name_parts", parts_json(s.name_parts)},
                      {"budget_features", parts_json(s.budget_features)},
                      {"arguments", parts_json(s.arguments)},
                      {"fault_flag", s.fault_flag},
                      {"threads_flag", s.threads_flag},
                      {"canaries", s.canaries},
                      {"lane_keys", keys_json(s.lane_keys)},
                      {"records", parts_json(s.records)},
                      {"examples", examples_json(s)}});
  }
  return {{"job_placeholders", kJobPlaceholders},
          {"lane_stacks", stacks},
          {"harness_lanes", harness_lanes_json()},
          {"command_lanes", command_lanes_json()}};
}

}  // namespace harness::nightly
