// The compilation cache: executables by graph fingerprint, in memory and (with
// --compile-cache DIR) on disk, one file per fingerprint.
//
// A file holds a header (magic, format version, payload size, XXH3-64 of the payload)
// and the executable serialised with cereal's portable binary archive. A file that fails
// any check (truncated, flipped bits, another format version, another fingerprint) is
// counted as a deserialize failure, deleted and recompiled: never trusted, never a crash.
// Files are written to a temporary name and renamed, so readers never see half a file.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "program.h"

namespace harness::tpu {

enum class CacheSource { Memory, Disk, Miss };

struct CacheLookup {
  std::shared_ptr<const Executable> executable;  // null on a miss
  CacheSource source = CacheSource::Miss;
  bool disk_miss = false;           // the persistent cache was asked and had no entry
  bool deserialize_failure = false;  // the persistent cache had an entry it could not trust
};

class CompileCache {
 public:
  // An empty dir: in-memory only. A dir that cannot be created or written: in-memory
  // only, with one warning on stderr.
  explicit CompileCache(std::string dir = {});

  // `fits` (when given) must accept a program loaded from disk, or the entry is treated
  // like a corrupt one: the engine checks that it was compiled for its mesh and tensors.
  CacheLookup find(const std::string& fingerprint, const std::function<bool(const Executable&)>& fits = {});
  std::shared_ptr<const Executable> insert(Executable executable);
  bool persistent() const { return !dir_.empty(); }
  std::string entry_path(const std::string& fingerprint) const;

 private:
  std::shared_ptr<const Executable> load(const std::string& fingerprint, const std::function<bool(const Executable&)>& fits,
                                         bool& failed);
  void store(const Executable& executable);
  void disable_persistence(const std::string& why);

  std::string dir_;
  std::map<std::string, std::shared_ptr<const Executable>> memory_;
};

}  // namespace harness::tpu
