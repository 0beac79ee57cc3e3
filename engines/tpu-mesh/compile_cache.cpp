#include "compile_cache.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <cereal/archives/portable_binary.hpp>
#include <fmt/format.h>
#include <xxhash.h>

namespace harness::tpu {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'H', 'T', 'P', 'U', 'E', 'X', 'E', '\0'};

struct Header {
  char magic[8];
  std::uint32_t format_version;
  std::uint32_t reserved;
  std::uint64_t payload_size;
  std::uint64_t payload_checksum;
};

// Reads a byte range in place (cereal reads from a std::istream).
struct MemoryBuffer : std::streambuf {
  MemoryBuffer(const char* data, std::size_t size) {
    char* begin = const_cast<char*>(data);  // get area only: never written
    setg(begin, begin, begin + size);
  }
};

std::string serialise(const Executable& exe) {
  std::ostringstream out(std::ios::binary);
  {
    cereal::PortableBinaryOutputArchive archive(out);
    archive(exe);
  }
  return out.str();
}

}  // namespace

CompileCache::CompileCache(std::string dir) : dir_(std::move(dir)) {
  if (dir_.empty()) return;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_) || access(dir_.c_str(), W_OK) != 0) {
    disable_persistence(ec ? ec.message() : "not a writable directory");
  }
}

void CompileCache::disable_persistence(const std::string& why) {
  fmt::print(stderr, "warning: --compile-cache {}: {}; running without a persistent compile cache\n", dir_, why);
  dir_.clear();
}

std::string CompileCache::entry_path(const std::string& fingerprint) const {
  return (fs::path(dir_) / (fingerprint + ".tpuexe")).string();
}

CacheLookup CompileCache::find(const std::string& fingerprint, const std::function<bool(const Executable&)>& fits) {
  CacheLookup lookup;
  if (auto it = memory_.find(fingerprint); it != memory_.end()) {
    lookup.executable = it->second;
    lookup.source = CacheSource::Memory;
    return lookup;
  }
  if (!persistent()) return lookup;
  bool failed = false;
  lookup.executable = load(fingerprint, fits, failed);
  if (lookup.executable) {
    lookup.source = CacheSource::Disk;
    memory_[fingerprint] = lookup.executable;
  } else {
    lookup.deserialize_failure = failed;
    lookup.disk_miss = !failed;
  }
  return lookup;
}

std::shared_ptr<const Executable> CompileCache::load(const std::string& fingerprint,
                                                     const std::function<bool(const Executable&)>& fits, bool& failed) {
  const std::string path = entry_path(fingerprint);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return nullptr;
  std::string bytes(static_cast<std::size_t>(std::max<std::streamoff>(0, in.tellg())), '\0');
  in.seekg(0);
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  auto reject = [&]() -> std::shared_ptr<const Executable> {
    failed = true;
    std::error_code ec;
    fs::remove(path, ec);  // evicted: the recompiled executable replaces it
    return nullptr;
  };
  Header h{};
  if (bytes.size() < sizeof h) return reject();
  std::memcpy(&h, bytes.data(), sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 || h.format_version != kProgramFormatVersion ||
      h.payload_size != bytes.size() - sizeof h ||
      XXH3_64bits(bytes.data() + sizeof h, h.payload_size) != h.payload_checksum) {
    return reject();
  }
  auto exe = std::make_shared<Executable>();
  try {
    MemoryBuffer buffer(bytes.data() + sizeof h, h.payload_size);
    std::istream payload(&buffer);
    cereal::PortableBinaryInputArchive archive(payload);
    archive(*exe);
  } catch (const std::exception&) {
    return reject();
  }
  if (exe->fingerprint != fingerprint || exe->format_version != kProgramFormatVersion || !exe->well_formed() ||
      (fits && !fits(*exe))) {
    return reject();
  }
  return exe;
}

std::shared_ptr<const Executable> CompileCache::insert(Executable executable) {
  auto shared = std::make_shared<const Executable>(std::move(executable));
  memory_[shared->fingerprint] = shared;
  if (persistent()) store(*shared);
  return shared;
}

void CompileCache::store(const Executable& exe) {
  const std::string payload = serialise(exe);
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.format_version = kProgramFormatVersion;
  h.payload_size = payload.size();
  h.payload_checksum = XXH3_64bits(payload.data(), payload.size());
  const std::string path = entry_path(exe.fingerprint);
  const std::string temp = fmt::format("{}.tmp.{}", path, getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&h), sizeof h);
    out.write(payload.data(), static_cast<std::streamsize>(payload.size()));
    if (!out.flush()) {
      std::error_code ec;
      fs::remove(temp, ec);
      disable_persistence("writing a cache entry failed");
      return;
    }
  }
  std::error_code ec;
  fs::rename(temp, path, ec);
  if (ec) {
    fs::remove(temp, ec);
    disable_persistence("renaming a cache entry into place failed");
  }
}

}  // namespace harness::tpu
