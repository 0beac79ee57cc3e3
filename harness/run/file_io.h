// Files written whole or not at all, and fingerprinted: goldens, reports, checkpoints.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>

namespace harness::run {

// A file that could not be written or read: the message names it.
struct FileError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Writes `text` to `path` through a temporary file in the same directory, flushed to disk
// and renamed over `path`: readers see the old content or the new, never a part.
void write_file_atomically(const std::string& path, const std::string& text);

// A copy of `from` at `to`, written as write_file_atomically writes (receipts are megabytes).
void copy_file_atomically(const std::string& from, const std::string& to);

// XXH3-128 of a file's bytes, as "xxh128:<32 hex digits>" (the digest `xxhsum -H2` prints).
std::string file_content_hash(const std::string& path);

// The whole file; "" when it does not exist. Throws FileError when it exists but cannot be read.
std::string read_file(const std::string& path);

// A fresh directory under the system's temporary one, removed with everything in it when
// the object goes: where a command's own runs write their receipts.
class TempDir {
 public:
  // "harness-<kind>-XXXXXX"; `what` names its use in the error when it cannot be made.
  TempDir(const std::string& kind, const std::string& what);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace harness::run
