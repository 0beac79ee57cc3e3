#include "run_option_fields.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "canary_file.h"
#include "registry.h"

namespace harness::run {
namespace {

using json = nlohmann::json;
constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

// Recipe key `key`: an integer (not a float, not one past int64) in lo..hi, as the run's
// own flags allow; a UsageError names the key otherwise.
std::int64_t recipe_integer(const json& recipe, std::string_view key, std::int64_t lo, std::int64_t hi) {
  const json& value = recipe.at(std::string(key));
  const bool integral = value.is_number_integer() &&
                        !(value.is_number_unsigned() && value.get<std::uint64_t>() > static_cast<std::uint64_t>(hi));
  if (!integral || value.get<std::int64_t>() < lo || value.get<std::int64_t>() > hi) {
    throw UsageError(fmt::format("run_options: key '{}' is {}, not an integer in {}..{}", key, value.dump(), lo, hi));
  }
  return value.get<std::int64_t>();
}

void flag_and_value(std::vector<std::string>& out, std::string_view flag, const std::string& value) {
  out.emplace_back(flag);
  out.push_back(value);
}

// Engine flags as given; a switch is the flag alone (engines/api/engine_settings.h).
void engine_option_words(const RunOptions& o, std::vector<std::string>& out) {
  for (const auto& [flag, value] : o.engine_settings.options) {
    const DescribedFlag* described = find_engine_flag(flag);
    out.push_back("--" + flag);
    if (described == nullptr || !described->flag.is_switch) out.push_back(value);
  }
}

// --dump-tensors: the steps of the run it names (its canary's steps unless --steps).
void apply_dump_steps(const std::string& text, RunOptions& o) {
  if (text.empty()) return;
  int max_step = 0;
  try {
    max_step = o.steps.value_or(canary::load_canary(o.canary).steps);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("--canary: {}", e.what()));
  }
  o.dump_steps = parse_step_list(text, max_step);
}

constexpr RunOptionField kFields[] = {
    {.flag = "--canary",
     .help = "Canary: a shipped one's name (canaries/NAME.toml) or a canary file's path",
     .target = +[](RunOptions& o) -> std::string& { return o.canary; },
     .show_default = true,
     .key = "canary",
     .write = [](const RunOptions& o, json& r) { r["canary"] = o.canary; },
     .read = [](const json& r, RunOptions& o) { o.canary = r.at("canary").get<std::string>(); },
     .words = [](const RunOptions& o, std::vector<std::string>& w) { flag_and_value(w, "--canary", o.canary); }},
    {.flag = "--engine",
     .help = "Engine (cpu-ref, accel, tpu-mesh)",
     .target = +[](RunOptions& o) -> std::string& { return o.engine; },
     .show_default = true,
     .key = "engine",
     .write = [](const RunOptions& o, json& r) { r["engine"] = o.engine; },
     .read = [](const json& r, RunOptions& o) { o.engine = r.at("engine").get<std::string>(); },
     .words = [](const RunOptions& o, std::vector<std::string>& w) { flag_and_value(w, "--engine", o.engine); }},
    {.flag = "--features",
     .help = "accel features: bf16[,fp8=ZONES] with zones qkv, attn_proj, mlp_fc, mlp_proj, all",
     .target = +[](RunOptions& o) -> std::string& { return o.engine_settings.features; },
     .key = "features",
     .write = [](const RunOptions& o, json& r) { r["features"] = o.engine_settings.features; },
     .read = [](const json& r, RunOptions& o) { o.engine_settings.features = r.at("features").get<std::string>(); },
     .words =
         [](const RunOptions& o, std::vector<std::string>& w) {
           if (!o.engine_settings.features.empty()) flag_and_value(w, "--features", o.engine_settings.features);
         }},
    {.flag = "--<engine flag>",
     .help = "each engine's own flags, as the engine describes them",
     .target = std::monostate{},
     .key = "engine_options",
     .write = [](const RunOptions& o, json& r) { r["engine_options"] = o.engine_settings.options; },
     .read =
         [](const json& r, RunOptions& o) {
           o.engine_settings.options = r.at("engine_options").get<std::map<std::string, std::string>>();
         },
     .words = engine_option_words},
    {.flag = "--seed",
     .help = "Initialisation seed (default: the canary's [train] seed)",
     .target = +[](RunOptions& o) -> std::optional<std::int64_t>& { return o.seed; },
     .check = FlagCheck::kSeed,
     .key = "seed",
     .write = [](const RunOptions& o, json& r) { r["seed"] = o.seed.value(); },  // resolved by the run
     .read = [](const json& r, RunOptions& o) { o.seed = recipe_integer(r, "seed", 0, kInt64Max); },
     .words =
         [](const RunOptions& o, std::vector<std::string>& w) {
           if (o.seed) flag_and_value(w, "--seed", std::to_string(*o.seed));
         }},
    {.flag = "--steps",
     .help = "Number of steps (default: the preset's)",
     .target = +[](RunOptions& o) -> std::optional<int>& { return o.steps; },
     .key = "steps",
     .write =
         [](const RunOptions& o, json& r) {
           if (o.steps) r["steps"] = *o.steps;
         },
     .read =
         [](const json& r, RunOptions& o) {
           if (r.contains("steps")) o.steps = static_cast<int>(recipe_integer(r, "steps", 1, canary::kMaxSteps));
         },
     .words =
         [](const RunOptions& o, std::vector<std::string>& w) {
           if (o.steps) flag_and_value(w, "--steps", std::to_string(*o.steps));
         }},
    {.flag = "--threads",
     .help = "Worker threads (0 = all cores)",
     .target = +[](RunOptions& o) -> int& { return o.threads; },
     .check = FlagCheck::kThreads,
     .show_default = true,
     .key = "threads",
     .write = [](const RunOptions& o, json& r) { r["threads"] = o.threads; },
     .read =
         [](const json& r, RunOptions& o) {
           o.threads = static_cast<int>(recipe_integer(r, "threads", 0, kMaxThreads));
         },
     .words =
         [](const RunOptions& o, std::vector<std::string>& w) {
           if (o.threads != 0) flag_and_value(w, "--threads", std::to_string(o.threads));
         }},
    {.flag = "--perturb-init",
     .help = "SEED: move every initial weight one ulp, up or down as SEED draws (what calibrate --perturb runs)",
     .target = +[](RunOptions& o) -> std::optional<std::int64_t>& { return o.perturb_init; },
     .check = FlagCheck::kSeed,
     .key = "perturb_init",
     .write =
         [](const RunOptions& o, json& r) {
           if (o.perturb_init) r["perturb_init"] = *o.perturb_init;
         },
     .read =
         [](const json& r, RunOptions& o) {
           if (r.contains("perturb_init")) o.perturb_init = recipe_integer(r, "perturb_init", 0, kInt64Max);
         },
     .words =
         [](const RunOptions& o, std::vector<std::string>& w) {
           if (o.perturb_init) flag_and_value(w, "--perturb-init", std::to_string(*o.perturb_init));
         }},
    {.flag = "--out",
     .help = "Receipt path (.h5)",
     .target = +[](RunOptions& o) -> std::string& { return o.out; },
     .required = true},
    {.flag = "--force",
     .help = "Overwrite an existing receipt",
     .target = +[](RunOptions& o) -> bool& { return o.force; }},
    {.flag = "--dump-tensors",
     .help = "Steps whose parameters to dump, e.g. 0,50,100",
     .target = TextFlag{"", apply_dump_steps}},
    {.flag = "--record-batches",
     .help = "Record every batch's tokens",
     .target = +[](RunOptions& o) -> bool& { return o.record_batches; }},
    {.flag = "--inject-fault",
     .help = "step=K,op=NAME[,ulps=N]: perturb an op's output",
     .target = TextFlag{"",
                        [](const std::string& text, RunOptions& o) {
                          if (!text.empty()) o.inject_fault = text;
                        }},
     .key = "inject_fault",
     .write =
         [](const RunOptions& o, json& r) {
           r["inject_fault"] = o.inject_fault ? json(*o.inject_fault) : json(nullptr);
         },
     .read =
         [](const json& r, RunOptions& o) {
           if (!r.at("inject_fault").is_null()) o.inject_fault = r.at("inject_fault").get<std::string>();
         },
     .words =
         [](const RunOptions& o, std::vector<std::string>& w) {
           if (o.inject_fault) flag_and_value(w, "--inject-fault", *o.inject_fault);
         }},
    {.flag = "--trace",
     .help = "ops: record every op's output (hash and sketch) per step into /trace, for bisect",
     .target = TextFlag{"none", [](const std::string& text, RunOptions& o) { o.trace = parse_trace_level(text); }},
     .show_default = true,
     .key = "trace",
     .write = [](const RunOptions& o, json& r) { r["trace"] = to_string(o.trace); },
     .read =
         [](const json& r, RunOptions& o) {
           o.trace = parse_trace_level(r.at("trace").get<std::string>(), "run_options: key 'trace'");
         },
     .words =
         [](const RunOptions& o, std::vector<std::string>& w) {
           if (o.trace != TraceLevel::kNone) flag_and_value(w, "--trace", to_string(o.trace));
         }},
    {.flag = "--checkpoint-every",
     .help = "K: save the full state at the start of steps K, 2K, ... into <out>.ckpt/, for harness replay",
     .target = +[](RunOptions& o) -> int& { return o.checkpoint_every; },
     .key = "checkpoint_every",
     .write = [](const RunOptions& o, json& r) { r["checkpoint_every"] = o.checkpoint_every; },
     .read =
         [](const json& r, RunOptions& o) {
           constexpr int kIntMax = std::numeric_limits<int>::max();
           o.checkpoint_every = static_cast<int>(recipe_integer(r, "checkpoint_every", 0, kIntMax));
         },
     .words =
         [](const RunOptions& o, std::vector<std::string>& w) {
           if (o.checkpoint_every > 0) flag_and_value(w, "--checkpoint-every", std::to_string(o.checkpoint_every));
         }},
};

}  // namespace

std::span<const RunOptionField> run_option_fields() { return kFields; }

std::vector<std::string> run_command_argv(const RunOptions& options) {
  std::vector<std::string> argv{"run"};
  for (const RunOptionField& field : kFields) {
    if (field.recorded()) field.words(options, argv);
  }
  return argv;
}

std::vector<std::string> run_command_words(const RunOptions& options) {
  std::vector<std::string> words{"harness"};
  for (const std::string& word : run_command_argv(options)) words.push_back(shell_word(word));
  return words;
}

std::string shell_word(const std::string& word) {
  const bool plain = !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("-_.,=/:+@%", c) != nullptr;
  });
  if (plain) return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace harness::run
