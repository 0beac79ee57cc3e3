// One scratch file per fuzzer process: the APIs under test take a path, so each input is
// written there before the call. The file lives in a private directory under $TMPDIR
// (never in the checkout) and is removed when the process exits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace harness::fuzz {

class InputFile {
 public:
  explicit InputFile(const std::string& name) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/harness-fuzz-XXXXXX";
    if (!mkdtemp(pattern.data())) {
      std::perror("fuzz: mkdtemp");
      std::abort();
    }
    dir_ = pattern;
    path_ = dir_ + "/" + name;
  }
  ~InputFile() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  // Replaces the file's content with the input's bytes; returns its path.
  const std::string& write(const std::uint8_t* data, std::size_t size) {
    std::FILE* f = std::fopen(path_.c_str(), "wb");
    if (!f || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
      std::perror("fuzz: writing the input file");
      std::abort();
    }
    return path_;
  }

 private:
  std::string dir_, path_;
};

}  // namespace harness::fuzz
