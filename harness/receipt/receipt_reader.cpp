#include "receipt_reader.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <limits>

#include <fmt/format.h>

#include "receipt/receipt_paths.h"
#include "receipt/receipt_schema.h"

namespace harness::receipt {

std::string schema_problem(std::int64_t major, std::int64_t minor) {
  if (major > kSchemaVersion) {
    return fmt::format("schema {}.{} was written by a newer harness; this one reads schema major {}: upgrade the "
                       "harness that reads it",
                       major, minor, kSchemaVersion);
  }
  if (major < kSchemaVersion) {
    return fmt::format("schema {}.{} is older than this harness reads (major {}): re-record the receipt with this "
                       "harness, or read it with the harness that wrote it",
                       major, minor, kSchemaVersion);
  }
  if (minor < 0) return fmt::format("schema_minor {} is negative: the manifest is damaged", minor);
  return "";
}

void ReceiptReader::fail(const std::string& what) const { throw ReceiptError(fmt::format("{}: {}", path_, what)); }

ReceiptReader::ReceiptReader(const std::string& path) : path_(path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail("no such file");
  if (std::filesystem::is_directory(path, ec)) fail("is a directory, not a receipt");
  // A FIFO or a device would block HDF5's open (or read forever): only files are receipts.
  if (!std::filesystem::is_regular_file(path, ec)) fail("is not a regular file, not a receipt");
  if (H5Fis_hdf5(path.c_str()) <= 0) fail("not an HDF5 file (give a receipt written by `harness run`)");
  try {
    file_ = h5::open_file(path, false);
  } catch (const h5::Hdf5Error& e) {
    fail(fmt::format("cannot be opened: the file is truncated or corrupt ({}); restore it or rerun the job that "
                     "wrote it",
                     e.what()));
  }
  if (!h5::exists(file_, paths::kManifest)) fail("no /manifest group: not a harness receipt");
  manifest_ = h5::open_group(file_, paths::kManifest);
  if (!h5::has_attr(manifest_, "schema_version")) fail("/manifest has no schema_version attribute: not a harness receipt");
  schema_version_ = h5::read_attr_int(manifest_, "schema_version");
  schema_minor_ = h5::has_attr(manifest_, "schema_minor") ? h5::read_attr_int(manifest_, "schema_minor") : 0;
  if (const std::string problem = schema_problem(schema_version_, schema_minor_); !problem.empty()) fail(problem);
  for (const char* required : {paths::kLoss, paths::kBatchHash, paths::kTensorNames}) {
    if (!h5::exists(file_, required)) fail(fmt::format("missing dataset {}: receipt is damaged", required));
  }
}

bool ReceiptReader::complete() const { return manifest_int("complete") == 1; }

std::int64_t ReceiptReader::steps_recorded() const {
  return static_cast<std::int64_t>(h5::dataset_shape(file_, paths::kLoss).at(0));
}

std::string ReceiptReader::manifest_string(const std::string& name) const {
  if (!h5::has_attr(manifest_, name)) fail(fmt::format("/manifest has no attribute '{}'", name));
  return h5::read_attr_string(manifest_, name);
}

std::int64_t ReceiptReader::manifest_int(const std::string& name) const {
  if (!h5::has_attr(manifest_, name)) fail(fmt::format("/manifest has no attribute '{}'", name));
  return h5::read_attr_int(manifest_, name);
}

std::map<std::string, std::string> ReceiptReader::manifest_text() const {
  std::map<std::string, std::string> out;
  for (const std::string& name : h5::attr_names(manifest_)) {
    switch (h5::attr_kind(manifest_, name)) {
      case h5::AttrKind::kString: out[name] = h5::read_attr_string(manifest_, name); break;
      case h5::AttrKind::kInteger: out[name] = std::to_string(h5::read_attr_int(manifest_, name)); break;
      case h5::AttrKind::kFloat: out[name] = fmt::format("{}", h5::read_attr_double(manifest_, name)); break;
      default: out[name] = "<unsupported type>";
    }
  }
  return out;
}

std::vector<double> ReceiptReader::f64(const std::string& path) const {
  if (!h5::exists(file_, path)) fail("missing dataset " + path);
  return h5::read_f64(file_, path);
}

std::vector<std::uint64_t> ReceiptReader::batch_hashes() const { return h5::read_u64(file_, paths::kBatchHash); }

std::vector<std::string> ReceiptReader::tensor_names() const { return h5::read_strings(file_, paths::kTensorNames); }

std::vector<std::uint64_t> ReceiptReader::hashes(const std::string& family) const {
  const std::string path = paths::hashes(family);
  if (!h5::exists(file_, path)) fail("missing dataset " + path);
  return h5::read_u64(file_, path);
}

std::vector<CheckpointRef> ReceiptReader::checkpoints() const {
  std::vector<CheckpointRef> out;
  if (!h5::exists(file_, paths::kCheckpoints)) return out;
  const h5::Handle group = h5::open_group(file_, paths::kCheckpoints);
  if (h5::has_attr(group, "storage")) return out;  // held in the receipt: a Python canary's, replayed by Python
  const std::filesystem::path receipt_dir = std::filesystem::path(path_).parent_path();
  const std::string directory = h5::read_attr_string(group, "directory");
  const auto add = [&](std::int64_t step, std::string content_hash) {
    if (step < 1 || step > std::numeric_limits<int>::max()) {
      fail(fmt::format("/checkpoints names step {}; a checkpoint's step is 1..{}", step, std::numeric_limits<int>::max()));
    }
    const std::string name = fmt::format("step_{:06d}", step);
    out.push_back({static_cast<int>(step), (receipt_dir / directory / (name + ".h5")).string(), std::move(content_hash)});
  };
  if (h5::exists(file_, paths::kCheckpointStep)) {  // schema minor 1: rows of /checkpoints/step and content_hash
    const std::vector<std::int64_t> steps = h5::read_i64(file_, paths::kCheckpointStep);
    const std::vector<std::string> hashes = h5::read_strings(file_, paths::kCheckpointContentHash);
    if (steps.size() != hashes.size()) fail("/checkpoints/step and /checkpoints/content_hash differ in length");
    for (std::size_t i = 0; i < steps.size(); ++i) add(steps[i], hashes[i]);
  } else {  // schema minor 0: one attribute step_XXXXXX per checkpoint
    for (const std::string& name : h5::attr_names(group)) {
      if (!name.starts_with("step_")) continue;
      std::int64_t step = 0;
      const std::string digits = name.substr(5);
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
      if (ec != std::errc() || end != digits.data() + digits.size()) {
        fail(fmt::format("/checkpoints/{} does not name a step", name));
      }
      add(step, h5::read_attr_string(group, name));
    }
  }
  std::sort(out.begin(), out.end(), [](const CheckpointRef& a, const CheckpointRef& b) { return a.step < b.step; });
  return out;
}

}  // namespace harness::receipt
