// Opens and validates a receipt for reading. Every problem is a ReceiptError whose
// message names the file and what is wrong with it, and how to fix it when that is known.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "receipt/hdf5_file.h"
#include "receipt/receipt_paths.h"

namespace harness::receipt {

struct ReceiptError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A checkpoint the receipt refers to: the state at the start of `step`.
struct CheckpointRef {
  int step = 0;
  std::string path;          // resolved against the receipt's directory
  std::string content_hash;  // xxh128:... of the file as it was written
};

// Why a receipt of schema major.minor cannot be read, and which side to upgrade; "" when
// it can (this harness's major, any minor: unknown content is ignored).
std::string schema_problem(std::int64_t major, std::int64_t minor);

class ReceiptReader {
 public:
  // Throws ReceiptError: missing file, not HDF5, unreadable (truncated), no /manifest,
  // another schema major version. An incomplete receipt opens; check complete().
  explicit ReceiptReader(const std::string& path);

  const std::string& path() const { return path_; }
  hid_t file() const { return file_; }
  std::int64_t schema_version() const { return schema_version_; }  // the major version
  std::int64_t schema_minor() const { return schema_minor_; }
  bool complete() const;
  std::int64_t steps_recorded() const;
  std::int64_t steps_planned() const { return manifest_int("steps_planned"); }

  std::string manifest_string(const std::string& name) const;
  std::int64_t manifest_int(const std::string& name) const;
  // Every manifest attribute rendered as text (for inspect and stack-line diffs).
  std::map<std::string, std::string> manifest_text() const;

  // A float64 series: paths::kLoss, kGradNorm or kLr (receipt_paths.h), or a described one.
  std::vector<double> f64(const std::string& path) const;
  std::vector<std::uint64_t> batch_hashes() const;
  std::vector<std::string> tensor_names() const;
  std::vector<std::uint64_t> hashes(const std::string& family) const;  // (N, K) row-major
  std::vector<CheckpointRef> checkpoints() const;  // in step order; empty when none

 private:
  [[noreturn]] void fail(const std::string& what) const;

  std::string path_;
  h5::Handle file_, manifest_;
  std::int64_t schema_version_ = 0, schema_minor_ = 0;
};

}  // namespace harness::receipt
