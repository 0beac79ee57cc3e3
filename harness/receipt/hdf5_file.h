// A thin RAII layer over the HDF5 C API: handles that close themselves, and the few
// typed operations receipts need (attributes, fixed and growing datasets).
// Every failure throws Hdf5Error naming the file, the object and HDF5's own reason
// (e.g. a Fletcher32 checksum mismatch); nothing here prints.
// What is written is the checksummed format of docs/receipt-schema.md ("File format"):
// HDF5 1.10 metadata, fixed-length UTF-8 strings, every dataset chunked with Fletcher32.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace harness::h5 {

struct Hdf5Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Silences HDF5's own error-stack printing; call once per process.
void silence_library_errors();
// Before any other HDF5 call: no H5close at exit. Every handle is closed by its owner; a
// file whose close failed (a write past a file size limit, a full disk) would be closed
// again at exit, where HDF5 1.10.8 crashes (H5F__close_cb) instead of giving up.
void skip_library_cleanup_at_exit();

class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer, const std::string& what);  // throws if id < 0
  // The same, naming the file that `where` (any object of it) belongs to in the error.
  Handle(hid_t id, Closer closer, hid_t where, const std::string& what);
  Handle(Handle&& other) noexcept : id_(std::exchange(other.id_, H5I_INVALID_HID)), closer_(other.closer_) {}
  Handle& operator=(Handle&& other) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  hid_t get() const { return id_; }
  operator hid_t() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// Fixed-length UTF-8 strings of `bytes` bytes, NUL-padded: the only strings receipts hold.
Handle fixed_string_type(std::size_t bytes);

Handle create_file(const std::string& path, bool overwrite);  // fails if it exists and !overwrite
// Read-only opens fall back to SWMR reading, so a receipt whose run is still writing it,
// or was killed while writing it, opens too.
Handle open_file(const std::string& path, bool writable);
// A finished receipt opened to add to it (`golden refresh` adds a golden's aten traces to its
// candidate): what it adds is written in the HDF5 1.10 format, as create_file's file.
Handle open_file_for_update(const std::string& path);
Handle create_group(hid_t parent, const std::string& name);
Handle open_group(hid_t parent, const std::string& name);
bool exists(hid_t parent, const std::string& path);  // every link of the path

// ---- attributes --------------------------------------------------------------------------
void write_attr(hid_t obj, const std::string& name, const std::string& value);
void write_attr(hid_t obj, const std::string& name, std::int64_t value);
void write_attr(hid_t obj, const std::string& name, double value);
std::string read_attr_string(hid_t obj, const std::string& name);  // fixed or (legacy) variable length
std::int64_t read_attr_int(hid_t obj, const std::string& name);
double read_attr_double(hid_t obj, const std::string& name);
enum class AttrKind { kString, kInteger, kFloat, kOther };
AttrKind attr_kind(hid_t obj, const std::string& name);
// Why attribute `name` is not one value (an array, an empty dataspace); "" when it is.
std::string attr_shape_problem(hid_t obj, const std::string& name);
bool has_attr(hid_t obj, const std::string& name);
std::vector<std::string> attr_names(hid_t obj);
// Every link in the file that is not a hard link (soft, external, user-defined), as
// "/path: is a soft link": H5Lvisit follows none of them.
std::vector<std::string> links_not_hard(hid_t file);

// ---- datasets -----------------------------------------------------------------------------
// A dataset that grows along its first dimension, one row (a sub-array of `row_shape`) at a time.
class GrowingDataset {
 public:
  GrowingDataset() = default;
  // deflate_level > 0: byte-shuffled and deflated chunks (zlib, in every HDF5 build).
  GrowingDataset(hid_t parent, const std::string& name, hid_t file_type, std::vector<hsize_t> row_shape,
                 hsize_t chunk_rows, int deflate_level = 0);
  // `row_count` rows back to back (one by default): a 1-D byte dataset grows by a blob.
  void append(const void* rows, hid_t memory_type, hsize_t row_count = 1);
  hsize_t rows() const { return rows_; }
  // For a file closed and opened again (a structural change once SWMR mode began): detach()
  // closes the dataset's handle and keeps its path and rows; attach() opens it in `file`.
  // Both do nothing for a dataset never created.
  void detach() { dataset_.reset(); }
  void attach(hid_t file);

 private:
  std::string path_;  // absolute, in its file
  Handle dataset_;
  std::vector<hsize_t> row_shape_;
  hsize_t rows_ = 0;
};

// deflate_level > 0: byte-shuffled and deflated chunks, as GrowingDataset's.
void write_dataset(hid_t parent, const std::string& name, hid_t file_type, hid_t memory_type,
                   const std::vector<hsize_t>& shape, const void* data, int deflate_level = 0);
void write_string_dataset(hid_t parent, const std::string& name, const std::vector<std::string>& values,
                          int deflate_level = 0);

std::vector<hsize_t> dataset_shape(hid_t parent, const std::string& path);
std::vector<double> read_f64(hid_t parent, const std::string& path);
std::vector<float> read_f32(hid_t parent, const std::string& path);
std::vector<std::uint64_t> read_u64(hid_t parent, const std::string& path);
std::vector<std::int32_t> read_i32(hid_t parent, const std::string& path);
std::vector<std::int64_t> read_i64(hid_t parent, const std::string& path);
std::vector<std::string> read_strings(hid_t parent, const std::string& path);  // fixed or (legacy) variable length

struct DatasetInfo {
  std::string path;
  std::vector<hsize_t> shape;
  std::string dtype;  // "float64", "uint64", "int32", "float32", "string", ...
};
std::vector<DatasetInfo> list_datasets(hid_t file);
std::vector<std::string> list_groups(hid_t file);  // "/manifest", "/steps", ... every group but the root

// How a dataset is stored, for `harness validate`.
struct DatasetLayout {
  bool chunked = false, checksummed = false, variable_length_string = false;
};
DatasetLayout dataset_layout(hid_t parent, const std::string& path);
// True for the HDF5 1.10 format (superblock version 3), whose metadata is checksummed.
bool uses_checksummed_format(hid_t file);

}  // namespace harness::h5
