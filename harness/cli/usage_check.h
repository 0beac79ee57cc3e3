// A first look at the command line before CLI11 parses it, so that a typo gets the answer
// a person needs: `harness rnu` names `rnu` and suggests `run`; `--ouput` names itself and
// suggests `--out`, instead of CLI11's "--out is required" or "arguments were not expected".
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace harness::cli {

// The one-line problem with `args` (argv without the program name), or nullopt when every
// subcommand and flag exists; CLI11 then parses and checks values and required flags.
std::optional<std::string> usage_problem(CLI::App& app, const std::vector<std::string>& args);

// --seed's check, on the text before CLI11 converts it: a decimal integer in
// 0..9223372036854775807 (CLI11's conversion would clamp a larger one silently).
CLI::Validator seed_check();

// Edit distance between two names (insertions, deletions, substitutions, transpositions).
std::size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace harness::cli
