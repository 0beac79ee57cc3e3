// A scratch folder of its own for a test that writes receipts. ctest runs every test as
// its own process, in parallel, so a fixed name under /tmp would let two tests write
// the same HDF5 file at once (HDF5 refuses the lock, or reads a half-written file).
#pragma once

#include <atomic>
#include <filesystem>
#include <string>

#include <unistd.h>

namespace harness::testing {

class ScratchDir {
 public:
  // One folder per instance (pid and a count): a test's own ScratchDir, removed when it
  // ends, must not take another's files with it when one process runs many tests.
  ScratchDir()
      : dir_(std::filesystem::temp_directory_path() /
             ("harness_test_" + std::to_string(::getpid()) + "_" + std::to_string(next_instance()))) {
    std::filesystem::create_directories(dir_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  static int next_instance() {
    static std::atomic<int> count{0};
    return count++;
  }

  std::filesystem::path dir_;
};

}  // namespace harness::testing
