#include "hdf5_file.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

namespace harness::h5 {
namespace {

// Legacy receipts (schema minor 0) hold variable-length strings; they are read, never written.
Handle variable_string_type() {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose, "string type");
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  return type;
}

// The innermost message HDF5 left on its error stack, e.g. "data error detected by
// Fletcher32 checksum": what actually went wrong, under the operation that failed.
std::string library_reason() {
  std::string reason;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD,
           [](unsigned n, const H5E_error2_t* e, void* out) -> herr_t {
             if (n == 0 && e->desc) *static_cast<std::string*>(out) = e->desc;
             return 0;
           },
           &reason);
  H5Eclear2(H5E_DEFAULT);
  return reason;
}

// The file an object belongs to, for messages ("" when the id does not say).
std::string file_name(hid_t object) {
  const ssize_t size = H5Fget_name(object, nullptr, 0);
  if (size <= 0) return "";
  std::string name(static_cast<std::size_t>(size) + 1, '\0');
  H5Fget_name(object, name.data(), name.size());
  name.resize(static_cast<std::size_t>(size));
  return name;
}

[[noreturn]] void fail(hid_t where, const std::string& what) {
  const std::string reason = library_reason();
  const std::string file = where >= 0 ? file_name(where) : "";
  throw Hdf5Error(fmt::format("{}HDF5 cannot {}{}", file.empty() ? "" : file + ": ", what,
                              reason.empty() ? "" : " (" + reason + ")"));
}

void check(herr_t status, hid_t where, const std::string& what) {
  if (status < 0) fail(where, what);
}

// Every dataset is chunked and checksummed (Fletcher32, the last filter, so it covers the
// bytes as stored): a flipped byte in raw data is a read error, never a wrong value.
Handle checksummed_layout(const std::vector<hsize_t>& chunk, int deflate_level, const std::string& name) {
  Handle props(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "dataset properties");
  check(H5Pset_chunk(props, static_cast<int>(chunk.size()), chunk.data()), -1, "chunk " + name);
  if (deflate_level > 0) {
    check(H5Pset_shuffle(props), -1, "shuffle filter for " + name);
    check(H5Pset_deflate(props, static_cast<unsigned>(deflate_level)), -1, "deflate filter for " + name);
  }
  check(H5Pset_fletcher32(props), -1, "checksum filter for " + name);
  return props;
}

// Chunks of at most about 1 MiB, whole rows of the leading dimension.
std::vector<hsize_t> chunk_for(const std::vector<hsize_t>& shape, std::size_t element_bytes) {
  std::vector<hsize_t> chunk(shape.begin(), shape.end());
  hsize_t row_bytes = element_bytes;
  for (std::size_t d = 1; d < shape.size(); ++d) row_bytes *= std::max<hsize_t>(1, shape[d]);
  const hsize_t rows = std::max<hsize_t>(1, (hsize_t{1} << 20) / std::max<hsize_t>(1, row_bytes));
  for (hsize_t& c : chunk) c = std::max<hsize_t>(1, c);
  chunk[0] = std::min(chunk[0], rows);
  return chunk;
}

// A dataset's shape is a number in the file, and a damaged or crafted one can declare far
// more elements than the file holds (a chunked dataset stores only the chunks written):
// reading it would allocate that much. Refused unless what the file stores could hold it
// under any compression a receipt uses (deflate gains at most about 1032x: 4096 leaves
// headroom); small datasets are always read.
void check_storage_holds(hid_t parent, hid_t dataset, const std::string& path, hsize_t elements, std::size_t bytes_each) {
  constexpr double kAlwaysRead = 64.0 * 1024 * 1024, kMostCompression = 4096;
  const double logical = static_cast<double>(elements) * static_cast<double>(bytes_each);
  if (logical <= kAlwaysRead) return;
  const double stored = static_cast<double>(H5Dget_storage_size(dataset));
  if (logical > kMostCompression * stored) {
    throw Hdf5Error(fmt::format("{}: {} declares {} elements ({:.3g} GB) but the file stores {} bytes of it: the "
                                "dataset is damaged",
                                file_name(parent), path, elements, logical / 1e9, static_cast<std::uint64_t>(stored)));
  }
}

template <typename T>
std::vector<T> read_numeric(hid_t parent, const std::string& path, hid_t memory_type) {
  const Handle dataset(H5Dopen2(parent, path.c_str(), H5P_DEFAULT), H5Dclose, parent, "open dataset " + path);
  const std::vector<hsize_t> shape = dataset_shape(parent, path);
  const hsize_t n = std::accumulate(shape.begin(), shape.end(), hsize_t{1}, std::multiplies<>());
  check_storage_holds(parent, dataset, path, n, sizeof(T));
  std::vector<T> values(n);
  if (n > 0) check(H5Dread(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), parent, "read " + path);
  return values;
}

std::string describe_type(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) return size == 8 ? "float64" : "float32";
  if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    return (is_signed ? "int" : "uint") + std::to_string(size * 8);
  }
  if (cls == H5T_STRING) return "string";
  return "other";
}

Handle scalar_space() { return Handle(H5Screate(H5S_SCALAR), H5Sclose, "dataspace"); }

// Attributes are rewritten by deleting and recreating them: a string's length is part
// of its fixed-length type, and `complete` goes from 0 to 1 in place.
Handle recreate_attr(hid_t obj, const std::string& name, hid_t file_type) {
  if (H5Aexists(obj, name.c_str()) > 0) check(H5Adelete(obj, name.c_str()), obj, "replace attribute " + name);
  return Handle(H5Acreate2(obj, name.c_str(), file_type, scalar_space(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose, obj,
                "create attribute " + name);
}

// HDF5 1.10.8 lists a group's or an object's names in name order (H5_ITER_INC) by first
// copying them into a table; when a name in a corrupt heap fails to decode, it frees the
// table's never-filled entries (uninitialised pointers): a crash on a damaged receipt
// (found by fuzz/fuzz_receipt; docs/testing.md). Native order walks the index instead and
// fails cleanly, so every listing here asks for native order and sorts the names after.
// Paths sort as H5Ovisit visits in name order: depth first, '/' before any other byte.
bool in_visit_order(const std::string& a, const std::string& b) {
  const auto rank = [](char c) { return c == '/' ? 0u : static_cast<unsigned>(static_cast<unsigned char>(c)) + 1u; };
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(),
                                      [&](char x, char y) { return rank(x) < rank(y); });
}

std::vector<std::string> unpack_fixed_strings(const std::vector<char>& buffer, std::size_t width, std::size_t n) {
  std::vector<std::string> values;
  values.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const char* begin = buffer.data() + i * width;
    values.emplace_back(begin, std::find(begin, begin + width, '\0'));
  }
  return values;
}

}  // namespace

// Fixed-length UTF-8 of `bytes` bytes (at least 1: HDF5 has no empty fixed string).
// Variable-length strings live in the global heap, which has no checksum: a flipped byte
// there crashes HDF5 itself, so nothing this harness writes uses them.
Handle fixed_string_type(std::size_t bytes) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose, "string type");
  if (H5Tset_size(type, std::max<std::size_t>(1, bytes)) < 0 || H5Tset_strpad(type, H5T_STR_NULLPAD) < 0 ||
      H5Tset_cset(type, H5T_CSET_UTF8) < 0) {
    throw Hdf5Error("HDF5: cannot make a string type");
  }
  return type;
}

void silence_library_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

void skip_library_cleanup_at_exit() { H5dont_atexit(); }

Handle::Handle(hid_t id, Closer closer, const std::string& what) : Handle(id, closer, H5I_INVALID_HID, what) {}

Handle::Handle(hid_t id, Closer closer, hid_t where, const std::string& what) : id_(id), closer_(closer) {
  if (id < 0) fail(where, what);
}

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = std::exchange(other.id_, H5I_INVALID_HID);
    closer_ = other.closer_;
  }
  return *this;
}

void Handle::reset() {
  if (id_ >= 0 && closer_) closer_(id_);
  id_ = H5I_INVALID_HID;
}

// The HDF5 1.10 file format: superblock version 3, checksummed object headers, B-trees
// and heaps. A flipped metadata byte is a read error instead of a crash or a silent
// fill value (docs/receipt-schema.md, "File format").
Handle create_file(const std::string& path, bool overwrite) {
  const Handle access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "file access properties");
  check(H5Pset_libver_bounds(access, H5F_LIBVER_V110, H5F_LIBVER_V110), -1, "set format bounds for " + path);
  return Handle(H5Fcreate(path.c_str(), overwrite ? H5F_ACC_TRUNC : H5F_ACC_EXCL, H5P_DEFAULT, access), H5Fclose,
                "create " + path);
}

Handle open_file(const std::string& path, bool writable) {
  hid_t id = H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT);
  std::string reason = id < 0 ? library_reason() : "";
  if (id < 0 && !writable) {
    // A 1.10-format file still open in SWMR mode (a live or killed run) opens only this way.
    // A SWMR reader re-reads metadata whose checksum fails, in case a live writer was midway,
    // sleeping 1 ns, 2 ns, 4 ns, ... between attempts: HDF5's default of 100 attempts never
    // ends on a corrupt file (found by fuzz/fuzz_receipt; docs/testing.md). 28 attempts wait
    // at most 2^28 ns (0.27 s) per damaged block, far longer than a writer's flush takes.
    const Handle access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "file access properties");
    check(H5Pset_metadata_read_attempts(access, 28), -1, "set the metadata read attempts");
    id = H5Fopen(path.c_str(), H5F_ACC_RDONLY | H5F_ACC_SWMR_READ, access);
    if (id < 0) library_reason();  // keep the first, more telling reason
  }
  if (id < 0) {
    throw Hdf5Error(fmt::format("{}: HDF5 cannot open the file{}", path, reason.empty() ? "" : " (" + reason + ")"));
  }
  return Handle(id, H5Fclose, "open " + path);
}

Handle open_file_for_update(const std::string& path) {
  const Handle access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "file access properties");
  check(H5Pset_libver_bounds(access, H5F_LIBVER_V110, H5F_LIBVER_V110), -1, "set format bounds for " + path);
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDWR, access);
  if (id < 0) {
    const std::string reason = library_reason();
    throw Hdf5Error(fmt::format("{}: HDF5 cannot open the file to add to it{}", path, reason.empty() ? "" : " (" + reason + ")"));
  }
  return Handle(id, H5Fclose, "open " + path);
}

Handle create_group(hid_t parent, const std::string& name) {
  return Handle(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose, parent,
                "create group " + name);
}

Handle open_group(hid_t parent, const std::string& name) {
  return Handle(H5Gopen2(parent, name.c_str(), H5P_DEFAULT), H5Gclose, parent, "open group " + name);
}

bool exists(hid_t parent, const std::string& path) {
  if (path.empty()) return false;
  std::string prefix;
  std::size_t start = path.front() == '/' ? 1 : 0;
  prefix = start ? "/" : "";
  while (start <= path.size()) {
    const std::size_t slash = path.find('/', start);
    prefix += path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    const htri_t found = H5Lexists(parent, prefix.c_str(), H5P_DEFAULT);
    if (found < 0) fail(parent, "look up " + prefix);  // a damaged link table, not an absent link
    if (found == 0) return false;
    if (slash == std::string::npos) break;
    prefix += "/";
    start = slash + 1;
  }
  return true;
}

void write_attr(hid_t obj, const std::string& name, const std::string& value) {
  const Handle type = fixed_string_type(value.size());
  const Handle attr = recreate_attr(obj, name, type);
  std::string padded = value;
  padded.resize(std::max<std::size_t>(1, value.size()), '\0');
  check(H5Awrite(attr, type, padded.data()), obj, "write attribute " + name);
}

void write_attr(hid_t obj, const std::string& name, std::int64_t value) {
  const Handle attr = recreate_attr(obj, name, H5T_STD_I64LE);
  check(H5Awrite(attr, H5T_NATIVE_INT64, &value), obj, "write attribute " + name);
}

void write_attr(hid_t obj, const std::string& name, double value) {
  const Handle attr = recreate_attr(obj, name, H5T_IEEE_F64LE);
  check(H5Awrite(attr, H5T_NATIVE_DOUBLE, &value), obj, "write attribute " + name);
}

bool has_attr(hid_t obj, const std::string& name) {
  const htri_t found = H5Aexists(obj, name.c_str());
  if (found < 0) fail(obj, "look up attribute " + name);
  return found > 0;
}

// Why attribute `name` is not one value ("" when it is): an array, or an empty dataspace.
std::string attr_shape_problem(hid_t obj, const std::string& name) {
  const Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, obj, "open attribute " + name);
  const Handle space(H5Aget_space(attr), H5Sclose, obj, "read the dataspace of attribute " + name);
  switch (H5Sget_simple_extent_type(space)) {
    case H5S_SCALAR: return "";
    case H5S_NULL: return "holds no value (an empty dataspace), where one value belongs";
    default: return fmt::format("is an array of {} values, where one value belongs", H5Sget_simple_extent_npoints(space));
  }
}

namespace {
// A manifest attribute is one value: an array would be read past the one value's buffer,
// an empty dataspace would leave it as it was. Refused before anything is read.
void check_scalar_attr(hid_t obj, const std::string& name) {
  const std::string problem = attr_shape_problem(obj, name);
  if (!problem.empty()) throw Hdf5Error(file_name(obj) + ": attribute " + name + " " + problem);
}
}  // namespace

std::string read_attr_string(hid_t obj, const std::string& name) {
  const Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, obj, "open attribute " + name);
  check_scalar_attr(obj, name);
  const Handle file_type(H5Aget_type(attr), H5Tclose, obj, "read the type of attribute " + name);
  if (H5Tget_class(file_type) != H5T_STRING) throw Hdf5Error(file_name(obj) + ": attribute " + name + " is not a string");
  if (H5Tis_variable_str(file_type) > 0) {  // legacy receipts
    const Handle type = variable_string_type();
    char* text = nullptr;
    check(H5Aread(attr, type, &text), obj, "read attribute " + name);
    std::string value = text ? text : "";
    H5free_memory(text);
    return value;
  }
  const size_t size = H5Tget_size(file_type);
  if (size == 0) fail(obj, "read the size of attribute " + name);
  std::vector<char> buffer(size, '\0');
  check(H5Aread(attr, file_type, buffer.data()), obj, "read attribute " + name);
  return unpack_fixed_strings(buffer, size, 1).front();
}

std::int64_t read_attr_int(hid_t obj, const std::string& name) {
  const Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, obj, "open attribute " + name);
  const Handle file_type(H5Aget_type(attr), H5Tclose, obj, "read the type of attribute " + name);
  if (H5Tget_class(file_type) != H5T_INTEGER) throw Hdf5Error(file_name(obj) + ": attribute " + name + " is not an integer");
  check_scalar_attr(obj, name);
  std::int64_t value = 0;
  check(H5Aread(attr, H5T_NATIVE_INT64, &value), obj, "read attribute " + name);
  return value;
}

double read_attr_double(hid_t obj, const std::string& name) {
  const Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, obj, "open attribute " + name);
  check_scalar_attr(obj, name);
  double value = 0;
  check(H5Aread(attr, H5T_NATIVE_DOUBLE, &value), obj, "read attribute " + name);
  return value;
}

AttrKind attr_kind(hid_t obj, const std::string& name) {
  const Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, obj, "open attribute " + name);
  const Handle type(H5Aget_type(attr), H5Tclose, obj, "read the type of attribute " + name);
  switch (H5Tget_class(type)) {
    case H5T_STRING: return AttrKind::kString;
    case H5T_INTEGER: return AttrKind::kInteger;
    case H5T_FLOAT: return AttrKind::kFloat;
    default: return AttrKind::kOther;
  }
}

std::vector<std::string> links_not_hard(hid_t file) {
  std::vector<std::string> found;
  const herr_t status = H5Lvisit(file, H5_INDEX_NAME, H5_ITER_NATIVE,
                                 [](hid_t, const char* name, const H5L_info_t* info, void* out) -> herr_t {
                                   if (info->type == H5L_TYPE_HARD) return 0;
                                   const char* kind = info->type == H5L_TYPE_SOFT       ? "a soft link"
                                                      : info->type == H5L_TYPE_EXTERNAL ? "an external link (to another file)"
                                                                                        : "a user-defined link";
                                   static_cast<std::vector<std::string>*>(out)->push_back(std::string("/") + name +
                                                                                          ": is " + kind);
                                   return 0;
                                 },
                                 &found);
  if (status < 0) fail(file, "list the links");
  return found;
}

std::vector<std::string> attr_names(hid_t obj) {
  std::vector<std::string> names;
  const herr_t status = H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr,
                                    [](hid_t, const char* name, const H5A_info_t*, void* out) -> herr_t {
                                      static_cast<std::vector<std::string>*>(out)->emplace_back(name);
                                      return 0;
                                    },
                                    &names);
  if (status < 0) fail(obj, "list attributes");
  std::sort(names.begin(), names.end());  // native order, then by name as strcmp orders (in_visit_order)
  return names;
}

GrowingDataset::GrowingDataset(hid_t parent, const std::string& name, hid_t file_type, std::vector<hsize_t> row_shape,
                               hsize_t chunk_rows, int deflate_level)
    : row_shape_(std::move(row_shape)) {
  std::vector<hsize_t> dims{0}, max_dims{H5S_UNLIMITED}, chunk{chunk_rows};
  for (hsize_t d : row_shape_) {
    dims.push_back(d);
    max_dims.push_back(d);
    chunk.push_back(std::max<hsize_t>(1, d));
  }
  const Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), max_dims.data()), H5Sclose,
                     "dataspace for " + name);
  const Handle props = checksummed_layout(chunk, deflate_level, name);
  dataset_ = Handle(H5Dcreate2(parent, name.c_str(), file_type, space, H5P_DEFAULT, props, H5P_DEFAULT), H5Dclose,
                    parent, "create dataset " + name);
  std::string path(static_cast<std::size_t>(std::max<ssize_t>(0, H5Iget_name(dataset_, nullptr, 0))), '\0');
  H5Iget_name(dataset_, path.data(), path.size() + 1);
  path_ = path;
}

void GrowingDataset::attach(hid_t file) {
  if (path_.empty()) return;
  dataset_ = Handle(H5Dopen2(file, path_.c_str(), H5P_DEFAULT), H5Dclose, file, "open dataset " + path_);
}

void GrowingDataset::append(const void* rows, hid_t memory_type, hsize_t row_count) {
  if (row_count == 0) return;  // HDF5 selects no empty hyperslab
  std::vector<hsize_t> dims{rows_ + row_count}, start{rows_}, count{row_count};
  for (hsize_t d : row_shape_) {
    dims.push_back(d);
    start.push_back(0);
    count.push_back(d);
  }
  check(H5Dset_extent(dataset_, dims.data()), dataset_, "extend a dataset");
  const Handle file_space(H5Dget_space(dataset_), H5Sclose, "file space");
  check(H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr), dataset_,
        "select a row");
  const Handle memory_space(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), H5Sclose,
                            "memory space");
  check(H5Dwrite(dataset_, memory_type, memory_space, file_space, H5P_DEFAULT, rows), dataset_, "append a row");
  rows_ += row_count;
}

void write_dataset(hid_t parent, const std::string& name, hid_t file_type, hid_t memory_type,
                   const std::vector<hsize_t>& shape, const void* data, int deflate_level) {
  if (shape.empty()) throw Hdf5Error("write_dataset " + name + ": a scalar cannot be chunked; give it shape {1}");
  const std::vector<hsize_t> chunk = chunk_for(shape, H5Tget_size(file_type));
  // A zero-length dimension is stored as growable, the only way HDF5 chunks an empty dataset.
  std::vector<hsize_t> max_dims(shape);
  for (hsize_t& d : max_dims) if (d == 0) d = H5S_UNLIMITED;
  const Handle space(H5Screate_simple(static_cast<int>(shape.size()), shape.data(), max_dims.data()), H5Sclose,
                     "dataspace for " + name);
  const Handle props = checksummed_layout(chunk, deflate_level, name);
  const Handle dataset(H5Dcreate2(parent, name.c_str(), file_type, space, H5P_DEFAULT, props, H5P_DEFAULT), H5Dclose,
                       parent, "create dataset " + name);
  check(H5Dwrite(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), parent, "write dataset " + name);
}

void write_string_dataset(hid_t parent, const std::string& name, const std::vector<std::string>& values,
                          int deflate_level) {
  std::size_t width = 1;
  for (const auto& v : values) width = std::max(width, v.size());
  std::vector<char> buffer(std::max<std::size_t>(1, values.size() * width), '\0');
  for (std::size_t i = 0; i < values.size(); ++i) std::copy(values[i].begin(), values[i].end(), buffer.begin() + i * width);
  const Handle type = fixed_string_type(width);
  write_dataset(parent, name, type, type, {values.size()}, buffer.data(), deflate_level);
}

std::vector<hsize_t> dataset_shape(hid_t parent, const std::string& path) {
  const Handle dataset(H5Dopen2(parent, path.c_str(), H5P_DEFAULT), H5Dclose, parent, "open dataset " + path);
  const Handle space(H5Dget_space(dataset), H5Sclose, parent, "read the dataspace of " + path);
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 0) fail(parent, "read the dataspace of " + path);
  std::vector<hsize_t> shape(static_cast<std::size_t>(rank));
  if (rank > 0 && H5Sget_simple_extent_dims(space, shape.data(), nullptr) < 0) fail(parent, "read the shape of " + path);
  return shape;
}

std::vector<double> read_f64(hid_t parent, const std::string& path) {
  return read_numeric<double>(parent, path, H5T_NATIVE_DOUBLE);
}
std::vector<float> read_f32(hid_t parent, const std::string& path) {
  return read_numeric<float>(parent, path, H5T_NATIVE_FLOAT);
}
std::vector<std::uint64_t> read_u64(hid_t parent, const std::string& path) {
  return read_numeric<std::uint64_t>(parent, path, H5T_NATIVE_UINT64);
}
std::vector<std::int32_t> read_i32(hid_t parent, const std::string& path) {
  return read_numeric<std::int32_t>(parent, path, H5T_NATIVE_INT32);
}

std::vector<std::int64_t> read_i64(hid_t parent, const std::string& path) {
  return read_numeric<std::int64_t>(parent, path, H5T_NATIVE_INT64);
}

std::vector<std::string> read_strings(hid_t parent, const std::string& path) {
  const Handle dataset(H5Dopen2(parent, path.c_str(), H5P_DEFAULT), H5Dclose, parent, "open dataset " + path);
  const Handle file_type(H5Dget_type(dataset), H5Tclose, parent, "read the type of " + path);
  if (H5Tget_class(file_type) != H5T_STRING) throw Hdf5Error(file_name(parent) + ": " + path + " is not a string list");
  const std::vector<hsize_t> shape = dataset_shape(parent, path);
  if (shape.size() > 1) throw Hdf5Error(file_name(parent) + ": " + path + " is not a 1-D string list");
  const std::size_t n = shape.empty() ? 1 : shape[0];
  if (H5Tis_variable_str(file_type) > 0) {  // legacy receipts
    check_storage_holds(parent, dataset, path, n, sizeof(char*));
    std::vector<char*> pointers(n, nullptr);
    const Handle type = variable_string_type();
    check(H5Dread(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, pointers.data()), parent, "read " + path);
    std::vector<std::string> values;
    for (char* p : pointers) {
      values.emplace_back(p ? p : "");
      H5free_memory(p);
    }
    return values;
  }
  const std::size_t width = H5Tget_size(file_type);
  if (width == 0) fail(parent, "read the string width of " + path);
  check_storage_holds(parent, dataset, path, n, width);
  std::vector<char> buffer(std::max<std::size_t>(1, n * width), '\0');
  if (n > 0) check(H5Dread(dataset, file_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer.data()), parent, "read " + path);
  return unpack_fixed_strings(buffer, width, n);
}

DatasetLayout dataset_layout(hid_t parent, const std::string& path) {
  const Handle dataset(H5Dopen2(parent, path.c_str(), H5P_DEFAULT), H5Dclose, parent, "open dataset " + path);
  const Handle props(H5Dget_create_plist(dataset), H5Pclose, parent, "read the layout of " + path);
  const Handle type(H5Dget_type(dataset), H5Tclose, parent, "read the type of " + path);
  DatasetLayout layout;
  layout.chunked = H5Pget_layout(props) == H5D_CHUNKED;
  const int filters = H5Pget_nfilters(props);
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0;
    size_t values = 0;
    if (H5Pget_filter2(props, static_cast<unsigned>(i), &flags, &values, nullptr, 0, nullptr, nullptr) ==
        H5Z_FILTER_FLETCHER32) {
      layout.checksummed = true;
    }
  }
  layout.variable_length_string = H5Tget_class(type) == H5T_STRING && H5Tis_variable_str(type) > 0;
  return layout;
}

std::vector<DatasetInfo> list_datasets(hid_t file) {
  // The visit only collects paths: nothing may throw through HDF5's C frames.
  std::vector<std::string> paths;
  const herr_t status = H5Ovisit(file, H5_INDEX_NAME, H5_ITER_NATIVE,
                                 [](hid_t, const char* name, const H5O_info_t* info, void* data) -> herr_t {
                                   if (info->type == H5O_TYPE_DATASET) {
                                     static_cast<std::vector<std::string>*>(data)->push_back(std::string("/") + name);
                                   }
                                   return 0;
                                 },
                                 &paths);
  if (status < 0) fail(file, "list the datasets");
  std::sort(paths.begin(), paths.end(), in_visit_order);  // native order, then by name (in_visit_order)
  std::vector<DatasetInfo> out;
  for (const std::string& path : paths) {
    const Handle dataset(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose, file, "open " + path);
    const Handle type(H5Dget_type(dataset), H5Tclose, file, "read the type of " + path);
    out.push_back({path, dataset_shape(file, path), describe_type(type)});
  }
  return out;
}

std::vector<std::string> list_groups(hid_t file) {
  std::vector<std::string> paths;
  const herr_t status = H5Ovisit(file, H5_INDEX_NAME, H5_ITER_NATIVE,
                                 [](hid_t, const char* name, const H5O_info_t* info, void* data) -> herr_t {
                                   if (info->type == H5O_TYPE_GROUP && std::string(name) != ".") {
                                     static_cast<std::vector<std::string>*>(data)->push_back(std::string("/") + name);
                                   }
                                   return 0;
                                 },
                                 &paths);
  if (status < 0) fail(file, "list the groups");
  std::sort(paths.begin(), paths.end(), in_visit_order);  // native order, then by name (in_visit_order)
  return paths;
}

bool uses_checksummed_format(hid_t file) {
  H5F_info2_t info{};
  if (H5Fget_info2(file, &info) < 0) fail(file, "read the superblock");
  return info.super.version >= 3;  // superblock 3: the 1.10 format, checksummed metadata and chunk indexes
}

}  // namespace harness::h5
