// libFuzzer target: a canary file (canaries/tiny.toml's format, docs/canary-files.md)
// through canary::load_canary, which throws canary::CanaryFileError for a file it cannot
// use (a bad token file included: its std::invalid_argument is rethrown as one). A canary
// that loads is turned into its identity (the receipt's `canary` JSON), as every run does.
// Anything else (another exception, a crash, a sanitizer report) is a finding.
// docs/testing.md, "Fuzzing".
//
// data.source = "tokens" reads data.path, relative to the canary file. The input's scratch
// folder holds two small token files for it (tokens.u16: 80 uint16 ids below 256;
// tokens.u32: 80 uint32 ids below 8), and the input itself is one too (canary.toml). The
// loader only reads, and only what data.path names: an input whose data.path leaves the
// scratch folder (absolute, "..", a NUL byte) is skipped unread, so that no input makes
// the fuzzer read /dev/zero, a FIFO or a file of the machine's.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "canary_file.h"
#include "fuzz_input_file.h"

namespace {

namespace fs = std::filesystem;

void write_file(const fs::path& path, const std::vector<unsigned char>& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) {
    std::perror("fuzz: writing a token file");
    std::abort();
  }
}

// The token files beside the input, written once per process.
void write_token_files(const fs::path& dir) {
  std::vector<unsigned char> u16, u32;
  for (unsigned i = 0; i < 80; ++i) {
    const unsigned wide = (i * 37) % 256, narrow = (i * 3) % 8;
    u16.insert(u16.end(), {static_cast<unsigned char>(wide), 0});
    u32.insert(u32.end(), {static_cast<unsigned char>(narrow), 0, 0, 0});
  }
  write_file(dir / "tokens.u16", u16);
  write_file(dir / "tokens.u32", u32);
}

// Whether the canary file at `path` reads nothing outside `dir`: data.path (when there is
// one) resolved as the loader resolves it (canary_file.cpp, read_data) stays inside. The
// file is parsed with the loader's parser; a file that does not parse is not read further
// by the loader either.
bool stays_inside(const fs::path& path, const fs::path& dir) {
  toml::table root;
  try {
    root = toml::parse_file(path.string());
  } catch (const toml::parse_error&) {
    return true;
  }
  const toml::node* node = root["data"]["path"].node();
  const std::optional<std::string> file = node ? node->value_exact<std::string>() : std::nullopt;
  if (!file) return true;  // absent, or not a string: refused before anything is read
  // A NUL ends the name the OS sees before the name the lexical check sees.
  if (file->find('\0') != std::string::npos) return false;
  const fs::path resolved = fs::absolute(path.parent_path() / *file).lexically_normal();
  const fs::path inside = resolved.lexically_relative(dir);
  return !inside.empty() && *inside.begin() != "..";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static harness::fuzz::InputFile file("canary.toml");
  static const fs::path dir = [] {
    const fs::path d = fs::path(file.write(nullptr, 0)).parent_path();
    write_token_files(d);
    return d;
  }();
  const std::string& path = file.write(data, size);
  if (!stays_inside(path, dir)) return -1;  // not run, and not kept in the corpus
  try {
    const harness::canary::CanaryConfig config = harness::canary::load_canary(path);
    (void)config.to_json().dump();
  } catch (const harness::canary::CanaryFileError&) {
  }
  return 0;
}
