// Each option of a run in every form it takes: the `harness run` flag with its help and
// check, the key of the replay recipe (the manifest's run_options) and the command-line
// words that set it. `harness run`'s command line (harness/cli/run_command.cpp),
// replay_recipe(), options_from_recipe() and run_command_words() read this one table, so
// an option added to it is taken, recorded, replayed and reproduced (the nightly report's
// commands) alike (tests/unit/run_options_test.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "canary_run.h"

namespace harness::run {

// A flag whose text is turned into the option once every flag is parsed (--trace,
// --inject-fault, --dump-tensors): `apply` throws UsageError naming the flag.
struct TextFlag {
  std::string_view default_text;  // what help shows ("none"); "" for none
  void (*apply)(const std::string& text, RunOptions& options);
};

// Where the command line puts the flag's value: the option itself (the parser converts
// and checks it), a switch, text applied later, or nothing here (the engines' own flags,
// which each engine describes: engines/registry.h).
using FlagTarget = std::variant<std::monostate, std::string& (*)(RunOptions&), int& (*)(RunOptions&),
                                std::optional<int>& (*)(RunOptions&), std::optional<std::int64_t>& (*)(RunOptions&),
                                bool& (*)(RunOptions&), TextFlag>;

// The check the command line makes of a value: a thread count 0..kMaxThreads, a seed.
enum class FlagCheck { kNone, kThreads, kSeed };

struct RunOptionField {
  std::string_view flag;  // "--threads"
  std::string_view help;  // its line in `harness run --help`
  FlagTarget target;
  FlagCheck check = FlagCheck::kNone;
  bool show_default = false;  // help shows the default value
  bool required = false;
  // "threads" in a recipe; "" for the options that say where the receipt goes, not what
  // ran (--out, --force, --dump-tensors, --record-batches): those have no recipe functions.
  std::string_view key = {};
  void (*write)(const RunOptions& options, nlohmann::json& recipe) = nullptr;
  // Throws UsageError naming the key, or nlohmann's exceptions for a missing or mistyped one.
  void (*read)(const nlohmann::json& recipe, RunOptions& options) = nullptr;
  // The words that set it, none where the option keeps its default.
  void (*words)(const RunOptions& options, std::vector<std::string>& out) = nullptr;

  bool recorded() const { return !key.empty(); }
};

// Every option of `harness run`, in the order its help lists them; the recorded ones in
// the order a recipe and the rerun command give them.
std::span<const RunOptionField> run_option_fields();

// `run ...` for `options`, without --out: the arguments after the harness's own path that
// rerun the run (each an argv item, unquoted).
std::vector<std::string> run_command_argv(const RunOptions& options);
// `harness run ...` for `options`, without --out: what reruns the run (shell-quoted words).
std::vector<std::string> run_command_words(const RunOptions& options);

// `word` as one shell word: as it is when it is safe, else single-quoted.
std::string shell_word(const std::string& word);

}  // namespace harness::run
