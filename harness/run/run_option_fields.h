// Each option of a run in every form it takes: the `harness run` flag, the key of the
// replay recipe (the manifest's run_options) and the command-line words that set it.
// replay_recipe(), options_from_recipe() and run_command_words() read this one table, so
// an option added to it is recorded, replayed and reproduced (the nightly report's
// commands) alike (tests/unit/run_options_test.cpp).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "canary_run.h"

namespace harness::run {

struct RunOptionField {
  std::string_view flag;  // "--threads"
  std::string_view key;   // "threads" in a recipe
  void (*write)(const RunOptions& options, nlohmann::json& recipe);
  // Throws UsageError naming the key, or nlohmann's exceptions for a missing or mistyped one.
  void (*read)(const nlohmann::json& recipe, RunOptions& options);
  // The words that set it, none where the option keeps its default.
  void (*words)(const RunOptions& options, std::vector<std::string>& out);
};

// Every option a recipe holds, in the order `harness run`'s command line gives them.
std::span<const RunOptionField> run_option_fields();

// `harness run ...` for `options`, without --out: what reruns the run (shell-quoted words).
std::vector<std::string> run_command_words(const RunOptions& options);

// `word` as one shell word: as it is when it is safe, else single-quoted.
std::string shell_word(const std::string& word);

}  // namespace harness::run
