#include "hdf5_file.h"

#include <numeric>

namespace harness::h5 {
namespace {

Handle string_type() {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose, "string type");
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  return type;
}

void check(herr_t status, const std::string& what) {
  if (status < 0) throw Hdf5Error(what);
}

template <typename T>
std::vector<T> read_numeric(hid_t parent, const std::string& path, hid_t memory_type) {
  Handle dataset(H5Dopen2(parent, path.c_str(), H5P_DEFAULT), H5Dclose, "open dataset " + path);
  const std::vector<hsize_t> shape = dataset_shape(parent, path);
  const hsize_t n = std::accumulate(shape.begin(), shape.end(), hsize_t{1}, std::multiplies<>());
  std::vector<T> values(n);
  if (n > 0) check(H5Dread(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), "read " + path);
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

}  // namespace

void silence_library_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

Handle::Handle(hid_t id, Closer closer, const std::string& what) : id_(id), closer_(closer) {
  if (id < 0) throw Hdf5Error("HDF5: cannot " + what);
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

Handle create_file(const std::string& path, bool overwrite) {
  return Handle(H5Fcreate(path.c_str(), overwrite ? H5F_ACC_TRUNC : H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT), H5Fclose,
                "create " + path);
}

Handle open_file(const std::string& path, bool writable) {
  return Handle(H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose,
                "open " + path);
}

Handle create_group(hid_t parent, const std::string& name) {
  return Handle(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose,
                "create group " + name);
}

Handle open_group(hid_t parent, const std::string& name) {
  return Handle(H5Gopen2(parent, name.c_str(), H5P_DEFAULT), H5Gclose, "open group " + name);
}

bool exists(hid_t parent, const std::string& path) {
  std::string prefix;
  std::size_t start = path.front() == '/' ? 1 : 0;
  prefix = start ? "/" : "";
  while (start <= path.size()) {
    const std::size_t slash = path.find('/', start);
    prefix += path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (H5Lexists(parent, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (slash == std::string::npos) break;
    prefix += "/";
    start = slash + 1;
  }
  return true;
}

void write_attr(hid_t obj, const std::string& name, const std::string& value) {
  const Handle type = string_type();
  const Handle space(H5Screate(H5S_SCALAR), H5Sclose, "dataspace");
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  const Handle attr(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                    "create attribute " + name);
  const char* text = value.c_str();
  check(H5Awrite(attr, type, &text), "write attribute " + name);
}

namespace {
void write_scalar_attr(hid_t obj, const std::string& name, hid_t file_type, hid_t memory_type, const void* value) {
  const Handle space(H5Screate(H5S_SCALAR), H5Sclose, "dataspace");
  if (H5Aexists(obj, name.c_str()) > 0) {
    const Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, "open attribute " + name);
    check(H5Awrite(attr, memory_type, value), "write attribute " + name);
    return;
  }
  const Handle attr(H5Acreate2(obj, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
                    "create attribute " + name);
  check(H5Awrite(attr, memory_type, value), "write attribute " + name);
}
}  // namespace

void write_attr(hid_t obj, const std::string& name, std::int64_t value) {
  write_scalar_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void write_attr(hid_t obj, const std::string& name, double value) {
  write_scalar_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

bool has_attr(hid_t obj, const std::string& name) { return H5Aexists(obj, name.c_str()) > 0; }

std::string read_attr_string(hid_t obj, const std::string& name) {
  const Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, "open attribute " + name);
  const Handle file_type(H5Aget_type(attr), H5Tclose, "attribute type " + name);
  if (H5Tget_class(file_type) != H5T_STRING) throw Hdf5Error("attribute " + name + " is not a string");
  if (H5Tis_variable_str(file_type) > 0) {
    const Handle type = string_type();
    char* text = nullptr;
    check(H5Aread(attr, type, &text), "read attribute " + name);
    std::string value = text ? text : "";
    H5free_memory(text);
    return value;
  }
  const size_t size = H5Tget_size(file_type);
  std::string value(size, '\0');
  check(H5Aread(attr, file_type, value.data()), "read attribute " + name);
  return value.substr(0, value.find('\0'));
}

std::int64_t read_attr_int(hid_t obj, const std::string& name) {
  const Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, "open attribute " + name);
  const Handle file_type(H5Aget_type(attr), H5Tclose, "attribute type " + name);
  if (H5Tget_class(file_type) != H5T_INTEGER) throw Hdf5Error("attribute " + name + " is not an integer");
  std::int64_t value = 0;
  check(H5Aread(attr, H5T_NATIVE_INT64, &value), "read attribute " + name);
  return value;
}

std::vector<std::string> attr_names(hid_t obj) {
  std::vector<std::string> names;
  H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, nullptr,
              [](hid_t, const char* name, const H5A_info_t*, void* out) -> herr_t {
                static_cast<std::vector<std::string>*>(out)->emplace_back(name);
                return 0;
              },
              &names);
  return names;
}

GrowingDataset::GrowingDataset(hid_t parent, const std::string& name, hid_t file_type, std::vector<hsize_t> row_shape,
                               hsize_t chunk_rows, int deflate_level)
    : row_shape_(std::move(row_shape)) {
  std::vector<hsize_t> dims{0}, max_dims{H5S_UNLIMITED}, chunk{chunk_rows};
  for (hsize_t d : row_shape_) {
    dims.push_back(d);
    max_dims.push_back(d);
    chunk.push_back(d);
  }
  const Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), max_dims.data()), H5Sclose,
                     "dataspace for " + name);
  const Handle props(H5Pcreate(H5P_DATASET_CREATE), H5Pclose, "dataset properties");
  check(H5Pset_chunk(props, static_cast<int>(chunk.size()), chunk.data()), "chunking for " + name);
  if (deflate_level > 0) {
    check(H5Pset_shuffle(props), "shuffle filter for " + name);
    check(H5Pset_deflate(props, static_cast<unsigned>(deflate_level)), "deflate filter for " + name);
  }
  dataset_ = Handle(H5Dcreate2(parent, name.c_str(), file_type, space, H5P_DEFAULT, props, H5P_DEFAULT), H5Dclose,
                    "create dataset " + name);
}

void GrowingDataset::append(const void* row, hid_t memory_type) {
  std::vector<hsize_t> dims{rows_ + 1}, start{rows_}, count{1};
  for (hsize_t d : row_shape_) {
    dims.push_back(d);
    start.push_back(0);
    count.push_back(d);
  }
  check(H5Dset_extent(dataset_, dims.data()), "extend dataset");
  const Handle file_space(H5Dget_space(dataset_), H5Sclose, "file space");
  check(H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr), "select row");
  const Handle memory_space(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), H5Sclose,
                            "memory space");
  check(H5Dwrite(dataset_, memory_type, memory_space, file_space, H5P_DEFAULT, row), "append row");
  ++rows_;
}

void write_dataset(hid_t parent, const std::string& name, hid_t file_type, hid_t memory_type,
                   const std::vector<hsize_t>& shape, const void* data) {
  const Handle space(shape.empty() ? H5Screate(H5S_SCALAR)
                                   : H5Screate_simple(static_cast<int>(shape.size()), shape.data(), nullptr),
                     H5Sclose, "dataspace for " + name);
  const Handle dataset(H5Dcreate2(parent, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                       H5Dclose, "create dataset " + name);
  check(H5Dwrite(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "write dataset " + name);
}

void write_string_dataset(hid_t parent, const std::string& name, const std::vector<std::string>& values) {
  std::vector<const char*> pointers;
  for (const auto& v : values) pointers.push_back(v.c_str());
  const Handle type = string_type();
  write_dataset(parent, name, type, type, {values.size()}, pointers.data());
}

std::vector<hsize_t> dataset_shape(hid_t parent, const std::string& path) {
  const Handle dataset(H5Dopen2(parent, path.c_str(), H5P_DEFAULT), H5Dclose, "open dataset " + path);
  const Handle space(H5Dget_space(dataset), H5Sclose, "dataspace of " + path);
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank < 0) throw Hdf5Error("dataspace of " + path);
  std::vector<hsize_t> shape(static_cast<std::size_t>(rank));
  H5Sget_simple_extent_dims(space, shape.data(), nullptr);
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
  const Handle dataset(H5Dopen2(parent, path.c_str(), H5P_DEFAULT), H5Dclose, "open dataset " + path);
  const std::vector<hsize_t> shape = dataset_shape(parent, path);
  const hsize_t n = shape.empty() ? 1 : shape[0];
  std::vector<char*> pointers(n, nullptr);
  const Handle type = string_type();
  check(H5Dread(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, pointers.data()), "read " + path);
  std::vector<std::string> values;
  for (char* p : pointers) {
    values.emplace_back(p ? p : "");
    H5free_memory(p);
  }
  return values;
}

std::vector<DatasetInfo> list_datasets(hid_t file) {
  std::vector<DatasetInfo> out;
  struct Context {
    hid_t file;
    std::vector<DatasetInfo>* out;
  } context{file, &out};
  H5Ovisit(file, H5_INDEX_NAME, H5_ITER_INC,
           [](hid_t, const char* name, const H5O_info_t* info, void* data) -> herr_t {
             if (info->type != H5O_TYPE_DATASET) return 0;
             auto* ctx = static_cast<Context*>(data);
             const std::string path = std::string("/") + name;
             const Handle dataset(H5Dopen2(ctx->file, path.c_str(), H5P_DEFAULT), H5Dclose, "open " + path);
             const Handle type(H5Dget_type(dataset), H5Tclose, "type of " + path);
             ctx->out->push_back({path, dataset_shape(ctx->file, path), describe_type(type)});
             return 0;
           },
           &context);
  return out;
}

}  // namespace harness::h5
