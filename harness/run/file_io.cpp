#include "file_io.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "receipt/receipt_writer.h"
#include "receipt/xxh3_dispatch.h"

namespace harness::run {

namespace fs = std::filesystem;

TempDir::TempDir(const std::string& kind, const std::string& what) {
  std::string pattern = (fs::temp_directory_path() / ("harness-" + kind + "-XXXXXX")).string();
  if (!mkdtemp(pattern.data())) throw FileError(fmt::format("cannot create a temporary directory for {}", what));
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string temp = path + ".partial";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw FileError(fmt::format("{}: cannot write (check the directory's permissions)", temp));
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) {
      ::close(fd);
      fs::remove(temp);
      throw FileError(fmt::format("{}: write failed (disk full?)", temp));
    }
    done += static_cast<std::size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced) {
    fs::remove(temp);
    throw FileError(fmt::format("{}: fsync failed", temp));
  }
  fs::rename(temp, path);
}

void copy_file_atomically(const std::string& from, const std::string& to) { write_file_atomically(to, read_file(from)); }

std::string file_content_hash(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FileError(fmt::format("{}: cannot read the file to hash it", path));
  const std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> owner(XXH3_createState(), XXH3_freeState);
  XXH3_state_t* state = owner.get();
  XXH3_128bits_reset(state);
  std::vector<char> buffer(1 << 16);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    XXH3_128bits_update(state, buffer.data(), static_cast<std::size_t>(in.gcount()));
  }
  const XXH128_hash_t digest = XXH3_128bits_digest(state);
  return receipt::content_hash_text(digest.high64, digest.low64);
}

std::string read_file(const std::string& path) {
  if (!fs::exists(path)) return "";
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  if (!in || !(out << in.rdbuf())) throw FileError(fmt::format("{}: cannot read it (check its permissions)", path));
  return out.str();
}

}  // namespace harness::run
