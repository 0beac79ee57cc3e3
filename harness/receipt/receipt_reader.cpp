#include "receipt_reader.h"

#include <algorithm>
#include <charconv>
#include <filesystem>

#include <fmt/format.h>

#include "receipt/receipt_schema.h"

namespace harness::receipt {

void ReceiptReader::fail(const std::string& what) const { throw ReceiptError(fmt::format("{}: {}", path_, what)); }

ReceiptReader::ReceiptReader(const std::string& path) : path_(path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail("no such file");
  if (std::filesystem::is_directory(path, ec)) fail("is a directory, not a receipt");
  if (H5Fis_hdf5(path.c_str()) <= 0) fail("not an HDF5 file (give a receipt written by `harness run`)");
  try {
    file_ = h5::open_file(path, false);
  } catch (const h5::Hdf5Error&) {
    fail("HDF5 file cannot be opened (truncated or corrupt); rerun the job that wrote it");
  }
  if (!h5::exists(file_, "/manifest")) fail("no /manifest group: not a harness receipt");
  manifest_ = h5::open_group(file_, "/manifest");
  if (!h5::has_attr(manifest_, "schema_version")) fail("/manifest has no schema_version attribute: not a harness receipt");
  schema_version_ = h5::read_attr_int(manifest_, "schema_version");
  if (schema_version_ != kSchemaVersion) {
    fail(fmt::format("schema_version {} is not supported (this harness reads version {}); regenerate the receipt "
                     "with this harness",
                     schema_version_, kSchemaVersion));
  }
  for (const char* required : {"/steps/loss", "/steps/batch_hash", "/hashes/names"}) {
    if (!h5::exists(file_, required)) fail(fmt::format("missing dataset {}: receipt is damaged", required));
  }
}

bool ReceiptReader::complete() const { return manifest_int("complete") == 1; }

std::int64_t ReceiptReader::steps_recorded() const {
  return static_cast<std::int64_t>(h5::dataset_shape(file_, "/steps/loss").at(0));
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
    const h5::Handle attr(H5Aopen(manifest_, name.c_str(), H5P_DEFAULT), H5Aclose, "open attribute " + name);
    const h5::Handle type(H5Aget_type(attr), H5Tclose, "attribute type");
    switch (H5Tget_class(type)) {
      case H5T_STRING: out[name] = h5::read_attr_string(manifest_, name); break;
      case H5T_INTEGER: out[name] = std::to_string(h5::read_attr_int(manifest_, name)); break;
      case H5T_FLOAT: {
        double value = 0;
        H5Aread(attr, H5T_NATIVE_DOUBLE, &value);
        out[name] = fmt::format("{}", value);
        break;
      }
      default: out[name] = "<unsupported type>";
    }
  }
  return out;
}

std::vector<double> ReceiptReader::steps_f64(const std::string& name) const {
  const std::string path = "/steps/" + name;
  if (!h5::exists(file_, path)) fail("missing dataset " + path);
  return h5::read_f64(file_, path);
}

std::vector<std::uint64_t> ReceiptReader::batch_hashes() const { return h5::read_u64(file_, "/steps/batch_hash"); }

std::vector<std::string> ReceiptReader::tensor_names() const { return h5::read_strings(file_, "/hashes/names"); }

std::vector<std::uint64_t> ReceiptReader::hashes(const std::string& family) const {
  const std::string path = "/hashes/" + family;
  if (!h5::exists(file_, path)) fail("missing dataset " + path);
  return h5::read_u64(file_, path);
}

std::vector<CheckpointRef> ReceiptReader::checkpoints() const {
  std::vector<CheckpointRef> out;
  if (!h5::exists(file_, "checkpoints")) return out;
  const h5::Handle group = h5::open_group(file_, "checkpoints");
  const std::filesystem::path receipt_dir = std::filesystem::path(path_).parent_path();
  const std::string directory = h5::read_attr_string(group, "directory");
  for (const std::string& name : h5::attr_names(group)) {
    if (!name.starts_with("step_")) continue;
    CheckpointRef ref;
    const std::string digits = name.substr(5);
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), ref.step);
    if (ec != std::errc() || end != digits.data() + digits.size() || ref.step < 1) {
      fail(fmt::format("/checkpoints/{} does not name a step of 1 or more", name));
    }
    ref.path = (receipt_dir / directory / (name + ".h5")).string();
    ref.content_hash = h5::read_attr_string(group, name);
    out.push_back(std::move(ref));
  }
  std::sort(out.begin(), out.end(), [](const CheckpointRef& a, const CheckpointRef& b) { return a.step < b.step; });
  return out;
}

}  // namespace harness::receipt
