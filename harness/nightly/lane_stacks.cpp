#include "lane_stacks.h"

#include <algorithm>
#include <iterator>
#include <stdexcept>

#include <fmt/format.h>

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
                    {"device", "precision", "python", "compile", "layout"},
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
                    {"device", "precision", "threads", "python", "compile"},
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
                    {"python", "mesh", "shard-plan", "precision"},
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

std::string filled(const std::string& text, const StackOptions& options);

// The texts of the parts taken under `options`, filled, in order.
std::vector<std::string> taken_texts(const std::vector<StackPart>& parts, const StackOptions& options) {
  std::vector<std::string> texts;
  for (const StackPart& part : parts) {
    if (taken(part, options)) texts.push_back(filled(part.text, options));
  }
  return texts;
}

// `text` with each {option} replaced by the option's value ("" when not set); the job's
// placeholders (kJobPlaceholders) stay as written.
std::string filled(const std::string& text, const StackOptions& options) {
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

std::string stack_lane_name(const LaneStack& stack, const StackOptions& options) {
  std::string name = filled(stack.name, options);
  for (const StackPart& part : stack.name_parts) {
    if (taken(part, options)) name += filled(part.text, options);
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
      argv.push_back(filled(part.text.substr(at, space - at), options));
      at = space + 1;
    }
  }
  return argv;
}

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
                      {"lane_keys", s.lane_keys},
                      {"records", parts_json(s.records)},
                      {"examples", examples_json(s)}});
  }
  return {{"job_placeholders", kJobPlaceholders}, {"lane_stacks", stacks}};
}

}  // namespace harness::nightly
