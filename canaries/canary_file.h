// Canary files: a canary is a TOML file (docs/canary-files.md has every key). The shipped
// canaries are such files next to this header; `--canary NAME` finds canaries/NAME.toml,
// `--canary PATH.toml` (or any spec with a '/') loads that file.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "preset.h"

namespace harness::canary {

// A run's steps: train.steps of a canary file, --steps, a matrix's steps, a replay recipe's.
inline constexpr int kMaxSteps = 1000000;

// A canary file or spec that cannot be used. what() is one line that names the file and
// the key ("canaries/x.toml: model.heads: 3 does not divide model.channels 128").
class CanaryFileError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Loads and validates one canary file. A token file (data.source = "tokens") is read,
// checked against model.vocab and hashed into the identity.
CanaryConfig load_canary_file(const std::filesystem::path& path);

// NAME (a shipped canary) or a path to a canary file.
CanaryConfig load_canary(std::string_view spec);
// Whether a spec names a file (it has a '/' or ends in .toml) rather than a shipped canary.
bool is_canary_path(std::string_view spec);

// The shipped canaries' names (the canary files of canaries/), sorted.
std::vector<std::string> shipped_canaries();

// The folder of the shipped canaries.
std::filesystem::path shipped_canary_dir();

}  // namespace harness::canary
