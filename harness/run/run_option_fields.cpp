#include "run_option_fields.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <limits>

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
  out.push_back(shell_word(value));
}

// Engine flags as given; a switch is the flag alone (engines/api/engine_settings.h).
void engine_option_words(const RunOptions& o, std::vector<std::string>& out) {
  for (const auto& [flag, value] : o.engine_settings.options) {
    const DescribedFlag* described = find_engine_flag(flag);
    out.push_back("--" + flag);
    if (described == nullptr || !described->flag.is_switch) out.push_back(shell_word(value));
  }
}

constexpr RunOptionField kFields[] = {
    {"--canary", "canary", [](const RunOptions& o, json& r) { r["canary"] = o.canary; },
     [](const json& r, RunOptions& o) { o.canary = r.at("canary").get<std::string>(); },
     [](const RunOptions& o, std::vector<std::string>& w) { flag_and_value(w, "--canary", o.canary); }},
    {"--engine", "engine", [](const RunOptions& o, json& r) { r["engine"] = o.engine; },
     [](const json& r, RunOptions& o) { o.engine = r.at("engine").get<std::string>(); },
     [](const RunOptions& o, std::vector<std::string>& w) { flag_and_value(w, "--engine", o.engine); }},
    {"--features", "features", [](const RunOptions& o, json& r) { r["features"] = o.engine_settings.features; },
     [](const json& r, RunOptions& o) { o.engine_settings.features = r.at("features").get<std::string>(); },
     [](const RunOptions& o, std::vector<std::string>& w) {
       if (!o.engine_settings.features.empty()) flag_and_value(w, "--features", o.engine_settings.features);
     }},
    {"--<engine flag>", "engine_options", [](const RunOptions& o, json& r) { r["engine_options"] = o.engine_settings.options; },
     [](const json& r, RunOptions& o) {
       o.engine_settings.options = r.at("engine_options").get<std::map<std::string, std::string>>();
     },
     engine_option_words},
    {"--seed", "seed", [](const RunOptions& o, json& r) { r["seed"] = o.seed.value(); },  // resolved by the run
     [](const json& r, RunOptions& o) { o.seed = recipe_integer(r, "seed", 0, kInt64Max); },
     [](const RunOptions& o, std::vector<std::string>& w) {
       if (o.seed) flag_and_value(w, "--seed", std::to_string(*o.seed));
     }},
    {"--steps", "steps",
     [](const RunOptions& o, json& r) {
       if (o.steps) r["steps"] = *o.steps;
     },
     [](const json& r, RunOptions& o) {
       if (r.contains("steps")) o.steps = static_cast<int>(recipe_integer(r, "steps", 1, canary::kMaxSteps));
     },
     [](const RunOptions& o, std::vector<std::string>& w) {
       if (o.steps) flag_and_value(w, "--steps", std::to_string(*o.steps));
     }},
    {"--threads", "threads", [](const RunOptions& o, json& r) { r["threads"] = o.threads; },
     [](const json& r, RunOptions& o) { o.threads = static_cast<int>(recipe_integer(r, "threads", 0, kMaxThreads)); },
     [](const RunOptions& o, std::vector<std::string>& w) {
       if (o.threads != 0) flag_and_value(w, "--threads", std::to_string(o.threads));
     }},
    {"--perturb-init", "perturb_init",
     [](const RunOptions& o, json& r) {
       if (o.perturb_init) r["perturb_init"] = *o.perturb_init;
     },
     [](const json& r, RunOptions& o) {
       if (r.contains("perturb_init")) o.perturb_init = recipe_integer(r, "perturb_init", 0, kInt64Max);
     },
     [](const RunOptions& o, std::vector<std::string>& w) {
       if (o.perturb_init) flag_and_value(w, "--perturb-init", std::to_string(*o.perturb_init));
     }},
    {"--inject-fault", "inject_fault",
     [](const RunOptions& o, json& r) { r["inject_fault"] = o.inject_fault ? json(*o.inject_fault) : json(nullptr); },
     [](const json& r, RunOptions& o) {
       if (!r.at("inject_fault").is_null()) o.inject_fault = r.at("inject_fault").get<std::string>();
     },
     [](const RunOptions& o, std::vector<std::string>& w) {
       if (o.inject_fault) flag_and_value(w, "--inject-fault", *o.inject_fault);
     }},
    {"--trace", "trace", [](const RunOptions& o, json& r) { r["trace"] = to_string(o.trace); },
     [](const json& r, RunOptions& o) {
       o.trace = parse_trace_level(r.at("trace").get<std::string>(), "run_options: key 'trace'");
     },
     [](const RunOptions& o, std::vector<std::string>& w) {
       if (o.trace != TraceLevel::kNone) flag_and_value(w, "--trace", to_string(o.trace));
     }},
    {"--checkpoint-every", "checkpoint_every", [](const RunOptions& o, json& r) { r["checkpoint_every"] = o.checkpoint_every; },
     [](const json& r, RunOptions& o) {
       o.checkpoint_every = static_cast<int>(recipe_integer(r, "checkpoint_every", 0, std::numeric_limits<int>::max()));
     },
     [](const RunOptions& o, std::vector<std::string>& w) {
       if (o.checkpoint_every > 0) flag_and_value(w, "--checkpoint-every", std::to_string(o.checkpoint_every));
     }},
};

}  // namespace

std::span<const RunOptionField> run_option_fields() { return kFields; }

std::vector<std::string> run_command_words(const RunOptions& options) {
  std::vector<std::string> words{"harness", "run"};
  for (const RunOptionField& field : kFields) field.words(options, words);
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
