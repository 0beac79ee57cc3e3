#include "receipt_validator.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "receipt/budget_features.h"
#include "receipt/hdf5_file.h"
#include "receipt/receipt_paths.h"
#include "receipt/receipt_reader.h"
#include "receipt/receipt_schema.h"

namespace harness::receipt {
namespace {

namespace paths = receipt::paths;

using Shape = std::vector<hsize_t>;

// Errors thrown by the reader and the HDF5 layer name the file first; the report does
// that once, for every problem.
std::string without_path(const std::string& message, const std::string& path) {
  const std::string prefix = path + ": ";
  return message.starts_with(prefix) ? message.substr(prefix.size()) : message;
}
using h5::AttrKind;

// Whether `text` is valid UTF-8: nlohmann::json's serialiser checks every sequence (and
// throws type_error 316 on a bad one), so the check is the library's, not a second decoder.
bool is_utf8(const std::string& text) {
  try {
    (void)nlohmann::json(text).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

AttrKind attr_kind_of(ReceiptValue kind) {
  switch (kind) {
    case ReceiptValue::kString: return AttrKind::kString;
    case ReceiptValue::kInteger: return AttrKind::kInteger;
    case ReceiptValue::kFloat: return AttrKind::kFloat;
  }
  return AttrKind::kOther;
}

// The group part of a dataset's or attribute's path: "/trace/hash" -> "/trace".
std::string parent_of(const std::string& path) { return path.substr(0, path.rfind('/')); }

const char* kind_name(AttrKind kind) {
  switch (kind) {
    case AttrKind::kString: return "a string";
    case AttrKind::kInteger: return "an integer";
    case AttrKind::kFloat: return "a float";
    default: return "of another type";
  }
}

class Validator {
 public:
  Validator(ValidationReport& report, hid_t file, const ReceiptSchema& schema)
      : r_(report), file_(file), file_name_(report.path), schema_(schema) {}

  void run() {
    check_links();
    for (const auto& d : h5::list_datasets(file_)) datasets_[d.path] = d;
    read_manifest();
    check_group_attributes();
    check_described_datasets();
    check_steps();
    check_hash_names();
    check_sketch_constants();
    check_trace();
    check_aten_trace();
    check_checkpoints();
    check_file_format();
    read_every_dataset();
    list_unknown_content();
  }

 private:
  void problem(const std::string& where, const std::string& what) { r_.problems.push_back(where + ": " + what); }

  // A receipt holds its data itself: a soft or external link would judge (or approve as a
  // golden) bytes that its content hash does not cover, or another file's.
  void check_links() {
    for (const std::string& link : h5::links_not_hard(file_)) {
      const auto colon = link.find(": ");
      problem(link.substr(0, colon), link.substr(colon + 2) + ", where a receipt holds its data itself");
    }
  }

  void read_manifest() {
    const h5::Handle manifest = h5::open_group(file_, paths::kManifest);
    std::set<std::string> present, misshapen;
    for (const std::string& name : h5::attr_names(manifest)) {
      const std::string shape_problem = h5::attr_shape_problem(manifest, name);
      if (shape_problem.empty()) {
        present.insert(name);
      } else {  // named once here; not read below (it would be read past its one value)
        problem(paths::manifest_attribute(name), shape_problem);
        misshapen.insert(name);
      }
    }
    check_attributes(paths::kManifest, manifest, present, misshapen);
    for (const std::string& name : present) {
      if (!schema_.attribute(paths::kManifest, name)) r_.unknown.push_back("/manifest attribute " + name);
      if (h5::attr_kind(manifest, name) == AttrKind::kString && !is_utf8(h5::read_attr_string(manifest, name))) {
        problem(paths::manifest_attribute(name), "is not valid UTF-8 (the schema's strings are UTF-8)");
      }
    }
    check_manifest_values(manifest, present);
  }

  // The described attributes of `group`: the required ones there, each of its kind.
  void check_attributes(const std::string& group, hid_t handle, const std::set<std::string>& present,
                        const std::set<std::string>& misshapen = {}) {
    std::map<std::string, const ReceiptAttribute*> described;  // by name: problems in name order
    for (const ReceiptAttribute& a : schema_.entries().attributes) {
      if (parent_of(a.path) == group) described[a.path.substr(group.size() + 1)] = &a;
    }
    for (const auto& [name, attribute] : described) {
      if (misshapen.count(name)) continue;
      const AttrKind kind = attr_kind_of(attribute->kind);
      if (!present.count(name)) {
        if (required(attribute->presence, attribute->since_minor)) {
          problem(group, fmt::format("missing attribute '{}' ({})", name, kind_name(kind)));
        }
      } else if (h5::attr_kind(handle, name) != kind) {
        problem(group + "/" + name, fmt::format("must be {}", kind_name(kind)));
      }
    }
  }

  // Attributes of the other described groups that are there.
  void check_group_attributes() {
    for (const ReceiptGroup& g : schema_.entries().groups) {
      if (g.path == paths::kManifest || !h5::exists(file_, g.path)) continue;
      const h5::Handle group = h5::open_group(file_, g.path.substr(1));
      std::set<std::string> present;
      for (const std::string& name : h5::attr_names(group)) {
        if (h5::attr_shape_problem(group, name).empty()) present.insert(name);
      }
      check_attributes(g.path, group, present);
    }
  }

  void check_manifest_values(hid_t manifest, const std::set<std::string>& present) {
    if (present.count("canary") && h5::attr_kind(manifest, "canary") == AttrKind::kString) {
      const std::string canary = h5::read_attr_string(manifest, "canary");
      const auto parsed = nlohmann::json::parse(canary, nullptr, false);
      if (parsed.is_discarded() || !parsed.is_object()) {
        problem(paths::manifest_attribute("canary"), "must be the canary as a JSON object");
      }
    }
    if (present.count("budget_features") && h5::attr_kind(manifest, "budget_features") == AttrKind::kString) {
      check_budget_features(h5::read_attr_string(manifest, "budget_features"));
    }
    if (const auto complete = integer(manifest, "complete")) {
      complete_ = *complete;
      if (complete_ != 0 && complete_ != 1) {
        problem(paths::manifest_attribute("complete"), fmt::format("{} is neither 0 nor 1", complete_));
      }
    }
    if (const auto planned = integer(manifest, "steps_planned")) {
      steps_planned_ = *planned;
      if (steps_planned_ < 0) problem(paths::manifest_attribute("steps_planned"), "is negative");
    }
    for (const char* name : {"seed", "data_seed", "threads", "init_perturbation_seed"}) {  // seeds are int64 >= 0; threads 0 = all cores
      if (const auto value = integer(manifest, name); value && *value < 0) {
        problem(paths::manifest_attribute(name), fmt::format("{} is negative", *value));
      }
    }
    for (const char* name : {"lane", "engine"}) {  // a lane names its golden and budget entries
      if (present.count(name) && h5::attr_kind(manifest, name) == AttrKind::kString &&
          h5::read_attr_string(manifest, name).empty()) {
        problem(paths::manifest_attribute(name), "is empty");
      }
    }
  }

  // "" (none) or feature names joined with '+': none empty, none twice (docs/budgets.md).
  void check_budget_features(const std::string& text) {
    try {
      BudgetFeatures::parse(text);
    } catch (const std::invalid_argument& e) {
      problem(paths::manifest_attribute("budget_features"), e.what());
    }
  }

  std::optional<std::int64_t> integer(hid_t group, const std::string& name) {
    if (!h5::has_attr(group, name) || h5::attr_kind(group, name) != AttrKind::kInteger) return std::nullopt;
    if (!h5::attr_shape_problem(group, name).empty()) return std::nullopt;  // /manifest's are named in read_manifest
    return h5::read_attr_int(group, name);
  }

  // The columns' contents, as bisect reads them (docs/receipt-schema.md, "/trace"): the
  // level, op indices counting from 0 that never go back, layers from -1, and the known
  // phases and kinds. Only where the datasets have the right type and length (expect() named the rest).
  void check_trace_columns(hsize_t columns) {
    try {
      check_trace_contents(columns);
    } catch (const h5::Hdf5Error&) {
      // A column that cannot be read: read_every_dataset() names it.
    }
  }

  void check_trace_contents(hsize_t columns) {
    const h5::Handle trace = h5::open_group(file_, paths::kTrace);
    check_level(trace, paths::kTrace, "ops");
    if (fits(paths::kTraceOpIndex, "int64", columns)) check_op_indices(paths::kTraceOpIndex, {{0, columns}});
    if (fits(paths::kTraceLayer, "int64", columns)) check_layers(paths::kTraceLayer);
    check_known(paths::kTracePhase, columns, {"forward", "backward", "optimizer"});
    check_known(paths::kTraceKind, columns, {"activation", "activation_grad", "gradient", "parameter", "scalar"});
  }

  // A group's `level` attribute, where it is one string (a missing one is named with the attributes).
  void check_level(hid_t group, const std::string& path, const std::string& level) {
    if (h5::has_attr(group, "level") && h5::attr_shape_problem(group, "level").empty() &&
        h5::attr_kind(group, "level") == AttrKind::kString && h5::read_attr_string(group, "level") != level) {
      problem(path, fmt::format("attribute level must be the string \"{}\"", level));
    }
  }

  // A 1-D dataset of this type and length (expect() named any other).
  bool fits(const std::string& path, const char* dtype, hsize_t length) const {
    const auto it = datasets_.find(path);
    return it != datasets_.end() && it->second.dtype == dtype && it->second.shape == Shape{length};
  }

  // Within each step's rows (begin, count): op indices count the ops from 0, never go back,
  // and never pass the row's place (outputs of one op share its index).
  void check_op_indices(const std::string& path, const std::vector<std::pair<hsize_t, hsize_t>>& steps) {
    const std::vector<std::int64_t> index = h5::read_i64(file_, path);
    for (const auto& [begin, count] : steps) {
      for (hsize_t i = begin; i < begin + count; ++i) {
        const auto place = static_cast<std::int64_t>(i - begin);
        const bool in_order = index[i] >= 0 && index[i] <= place && (i == begin || index[i] >= index[i - 1]);
        if (!in_order) {
          problem(path, fmt::format("[{}] is {}: op indices count the ops from 0, never go back and never pass the column",
                                    i, index[i]));
          return;
        }
      }
    }
  }

  void check_layers(const std::string& path) {
    const std::vector<std::int64_t> layers = h5::read_i64(file_, path);
    const auto bad = std::find_if(layers.begin(), layers.end(), [](std::int64_t l) { return l < -1 || l > 1 << 20; });
    if (bad != layers.end()) {
      problem(path, fmt::format("[{}] is {}: a block index, or -1 outside the blocks", bad - layers.begin(), *bad));
    }
  }

  void check_known(const std::string& path, hsize_t columns, const std::set<std::string>& allowed) {
    if (!fits(path, "string", columns)) return;
    const std::vector<std::string> entries = h5::read_strings(file_, path);
    const auto bad = std::find_if(entries.begin(), entries.end(), [&](const std::string& e) { return !allowed.count(e); });
    if (bad != entries.end()) {
      problem(path, fmt::format("[{}] is '{}', not one of {}", bad - entries.begin(), *bad, fmt::join(allowed, ", ")));
    }
  }

  // A golden's aten traces (docs/receipt-schema.md, "/aten_trace"): each step's rows follow
  // the last's, together they are every row, and each step's columns read as /trace's do.
  void check_aten_trace() {
    if (!h5::exists(file_, paths::kAtenTrace)) return;
    try {
      check_aten_trace_contents(length_of(paths::kAtenTraceOpIndex, 0));
    } catch (const h5::Hdf5Error&) {
      // A dataset that cannot be read: read_every_dataset() names it.
    }
  }

  void check_aten_trace_contents(hsize_t columns) {
    const h5::Handle group = h5::open_group(file_, paths::kAtenTrace);
    check_level(group, paths::kAtenTrace, "aten");
    check_known(paths::kAtenTracePhase, columns, {"forward", "backward", "optimizer"});
    check_known(paths::kAtenTraceKind, columns,
                {"activation", "activation_grad", "gradient", "parameter", "scalar", "state"});
    if (fits(paths::kAtenTraceLayer, "int64", columns)) check_layers(paths::kAtenTraceLayer);
    if (!fits(paths::kAtenTraceOffset, "int64", steps_) || !fits(paths::kAtenTraceLength, "int64", steps_)) return;
    const std::vector<std::int64_t> offset = h5::read_i64(file_, paths::kAtenTraceOffset);
    const std::vector<std::int64_t> length = h5::read_i64(file_, paths::kAtenTraceLength);
    std::vector<std::pair<hsize_t, hsize_t>> steps;
    std::int64_t next = 0;
    for (std::size_t s = 0; s < offset.size(); ++s) {
      if (offset[s] != next || length[s] < 0) {
        problem(paths::kAtenTraceOffset,
                fmt::format("[{}] is {} with length {}: each step's rows start where the last step's end ({})", s,
                            offset[s], length[s], next));
        return;
      }
      // Compared with the rows left, never added first: a length from the file may be any int64.
      if (static_cast<hsize_t>(length[s]) > columns - static_cast<hsize_t>(next)) {
        problem(paths::kAtenTraceLength,
                fmt::format("[{}] is {}: past the {} rows the datasets hold", s, length[s], columns));
        return;
      }
      steps.emplace_back(static_cast<hsize_t>(next), static_cast<hsize_t>(length[s]));
      next += length[s];
    }
    if (static_cast<hsize_t>(next) != columns) {
      problem(paths::kAtenTraceLength, fmt::format("the steps' rows add up to {}, but the datasets hold {}", next, columns));
      return;
    }
    if (fits(paths::kAtenTraceOpIndex, "int64", columns)) check_op_indices(paths::kAtenTraceOpIndex, steps);
  }

  // A dataset of the given element type and shape; `shape` entries of 0 match any length.
  bool expect(const std::string& path, const std::string& dtype, const Shape& shape) {
    if (!h5::exists(file_, path)) {
      problem(path, "missing");
      return false;
    }
    const auto found = datasets_.find(path);
    if (found == datasets_.end()) {
      problem(path, "is not a dataset");
      return false;
    }
    const h5::DatasetInfo& d = found->second;
    bool ok = true;
    if (d.dtype != dtype) {
      problem(path, fmt::format("is {}, must be {}", d.dtype, dtype));
      ok = false;
    }
    const bool shape_ok = d.shape.size() == shape.size() &&
                          std::equal(shape.begin(), shape.end(), d.shape.begin(),
                                     [](hsize_t want, hsize_t have) { return want == kAny || want == have; });
    if (!shape_ok) {
      problem(path, fmt::format("has shape ({}), must be ({})", fmt::join(d.shape, ", "), describe(shape)));
      ok = false;
    }
    return ok;
  }

  static std::string describe(const Shape& shape) {
    std::vector<std::string> dims;
    for (hsize_t d : shape) dims.push_back(d == kAny ? "any" : std::to_string(d));
    return fmt::format("{}", fmt::join(dims, ", "));
  }

  // Every described dataset where the receipt has it, and every required one of a group
  // that is there (or must be), in its type and shape.
  void check_described_datasets() {
    steps_ = length_of(paths::kLoss, 0);
    tensors_ = length_of(paths::kTensorNames, 0);
    r_.steps = static_cast<std::int64_t>(steps_);
    r_.tensors = static_cast<std::int64_t>(tensors_);
    for (const ReceiptDataset& d : schema_.entries().datasets) {
      if (d.path.find('*') != std::string::npos) {
        for (const auto& [path, info] : datasets_) {
          if (schema_.dataset(path) == &d) expect(path, std::string(to_string(d.dtype)), shape_of(d, info));
        }
        continue;
      }
      const ReceiptGroup* group = schema_.group(parent_of(d.path));
      const bool group_there = h5::exists(file_, parent_of(d.path)) || (group && group->presence == Presence::kRequired);
      const auto found = datasets_.find(d.path);
      const bool wanted = required(d.presence, d.since_minor) ? group_there : found != datasets_.end();
      if (wanted) {
        expect(d.path, std::string(to_string(d.dtype)), shape_of(d, found != datasets_.end() ? found->second : h5::DatasetInfo{}));
      }
    }
  }

  // Required of this receipt: a required entry its minor already has.
  bool required(Presence presence, int since_minor) const {
    return presence == Presence::kRequired && r_.schema_minor >= since_minor;
  }

  // The first dimension of a 1-D dataset, `otherwise` when it is not there as one.
  hsize_t length_of(const std::string& path, hsize_t otherwise) const {
    const auto it = datasets_.find(path);
    return it != datasets_.end() && it->second.shape.size() == 1 ? it->second.shape[0] : otherwise;
  }

  Shape shape_of(const ReceiptDataset& d, const h5::DatasetInfo& info) const {
    if (d.any_rank) return Shape(info.shape.size(), kAny);
    Shape shape;
    for (ReceiptDim dim : d.shape) {
      switch (dim) {
        case ReceiptDim::kSteps: shape.push_back(steps_); break;
        case ReceiptDim::kTensors: shape.push_back(tensors_); break;
        case ReceiptDim::kSketchWidth: shape.push_back(kSketchWidth); break;
        case ReceiptDim::kColumns: shape.push_back(length_of(d.columns, kAny)); break;
        case ReceiptDim::kAny: shape.push_back(kAny); break;
      }
    }
    return shape;
  }

  void check_steps() {
    if (steps_planned_ >= 0 && static_cast<std::int64_t>(steps_) > steps_planned_) {
      problem(paths::kLoss, fmt::format("{} steps recorded, more than the {} planned", steps_, steps_planned_));
    }
    if (complete_ == 1 && static_cast<std::int64_t>(steps_) != steps_planned_) {
      problem(paths::manifest_attribute("complete"),
              fmt::format("is 1 but {} of {} planned steps are recorded", steps_, steps_planned_));
    }
  }

  void check_hash_names() {
    const auto names_info = datasets_.find(paths::kTensorNames);
    if (names_info == datasets_.end() || names_info->second.dtype != "string" || names_info->second.shape.size() != 1) {
      return;  // expect() named it
    }
    const std::vector<std::string> names = h5::read_strings(file_, paths::kTensorNames);
    if (names.empty()) problem(paths::kTensorNames, "is empty: a receipt hashes at least one tensor");
    std::set<std::string> seen;
    for (const std::string& name : names) {
      if (name.empty()) problem(paths::kTensorNames, "holds an empty name");
      if (!is_utf8(name)) problem(paths::kTensorNames, "holds a name that is not valid UTF-8");
      if (!seen.insert(name).second) problem(paths::kTensorNames, fmt::format("names '{}' twice", name));
    }
  }

  void check_sketch_constants() {
    if (!h5::exists(file_, paths::kSketches)) return;
    const h5::Handle sketches = h5::open_group(file_, paths::kSketches);
    for (const auto& [name, value] : {std::pair<const char*, int>{"width", kSketchWidth}, {"block", kSketchBlock}}) {
      const auto given = integer(sketches, name);
      if (given && *given != value) problem(fmt::format("{}/{}", paths::kSketches, name), fmt::format("must be {}", value));
    }
  }

  void check_trace() {
    if (h5::exists(file_, paths::kTrace)) check_trace_columns(length_of(paths::kTraceOpIndex, 0));
  }

  // Beside the receipt (`directory`), or held in it (`storage` = "receipt": a Python canary's).
  void check_checkpoints() {
    if (!h5::exists(file_, paths::kCheckpoints)) return;
    const h5::Handle group = h5::open_group(file_, paths::kCheckpoints);
    const bool held = h5::has_attr(group, "storage");
    if (!held && !h5::has_attr(group, "directory")) problem(paths::kCheckpoints, "missing attribute 'directory'");
    if (held && h5::attr_kind(group, "storage") == AttrKind::kString &&
        h5::read_attr_string(group, "storage") != kCheckpointsInReceipt) {
      problem(paths::kCheckpoints, fmt::format("attribute 'storage' is not '{}'", kCheckpointsInReceipt));
    }
    if (!datasets_.count(paths::kCheckpointStep)) return;
    std::vector<std::string> rows{paths::kCheckpointContentHash};
    if (held) rows.insert(rows.end(), {paths::kCheckpointOffset, paths::kCheckpointLength, paths::kCheckpointState});
    for (const std::string& path : rows) {
      if (!h5::exists(file_, path)) problem(path, "missing");
    }
  }

  // Schema minor 1 on: the checksummed HDF5 1.10 format, fixed-length strings, Fletcher32.
  void check_file_format() {
    if (r_.schema_minor < 1) {
      r_.legacy_format = true;
      return;
    }
    if (!h5::uses_checksummed_format(file_)) {
      problem("file format", "superblock older than HDF5 1.10's: metadata has no checksums (write with libver v110)");
    }
    for (const auto& [path, info] : datasets_) {
      const h5::DatasetLayout layout = h5::dataset_layout(file_, path);
      if (!layout.chunked || !layout.checksummed) problem(path, "has no Fletcher32 checksum (chunk it, fletcher32=True)");
      if (layout.variable_length_string) problem(path, "holds variable-length strings: use fixed-length UTF-8");
    }
    for (const std::string& group : groups_with_root()) {
      const h5::Handle g = h5::open_group(file_, group);
      for (const std::string& name : h5::attr_names(g)) {
        const h5::Handle attr(H5Aopen(g, name.c_str(), H5P_DEFAULT), H5Aclose, g, "open attribute " + name);
        const h5::Handle type(H5Aget_type(attr), H5Tclose, g, "read the type of attribute " + name);
        if (H5Tget_class(type) == H5T_STRING && H5Tis_variable_str(type) > 0) {
          problem(group + " attribute " + name, "is a variable-length string: use fixed-length UTF-8");
        }
      }
    }
  }

  std::vector<std::string> groups_with_root() {
    std::vector<std::string> groups{"/"};
    for (const std::string& g : h5::list_groups(file_)) groups.push_back(g);
    return groups;
  }

  // Reading every byte is what makes the checksums speak: a corrupt chunk is named here.
  void read_every_dataset() {
    for (const auto& [path, info] : datasets_) {
      try {
        if (info.dtype == "string") {
          h5::read_strings(file_, path);
        } else if (info.dtype == "float64" || info.dtype == "float32") {
          h5::read_f64(file_, path);
        } else if (info.dtype.starts_with("uint") || info.dtype.starts_with("int")) {
          h5::read_u64(file_, path);
        } else {
          problem(path, "has an element type no receipt uses");
        }
      } catch (const h5::Hdf5Error& e) {
        problem(path, fmt::format("unreadable ({})", without_path(e.what(), file_name_)));
      }
    }
  }

  // Groups the description does not name (top level), and undescribed datasets in the groups it does.
  void list_unknown_content() {
    for (const std::string& group : h5::list_groups(file_)) {
      if (group.find('/', 1) == std::string::npos && !schema_.group(group)) r_.unknown.push_back("group " + group);
    }
    for (const auto& [path, info] : datasets_) {
      const std::string root = path.substr(0, path.find('/', 1));
      if (schema_.group(root) && !schema_.dataset(path)) r_.unknown.push_back("dataset " + path);
    }
  }

  static constexpr hsize_t kAny = ~hsize_t{0};
  ValidationReport& r_;
  hid_t file_;
  std::string file_name_;
  const ReceiptSchema& schema_;
  std::map<std::string, h5::DatasetInfo> datasets_;
  hsize_t steps_ = 0, tensors_ = 0;
  std::int64_t steps_planned_ = -1, complete_ = -1;
};

}  // namespace

nlohmann::json ValidationReport::to_json() const {
  return {{"schema_version", 1},
          {"path", path},
          {"valid", valid()},
          {"receipt_schema", schema_major < 0 ? nlohmann::json(nullptr) : nlohmann::json(fmt::format("{}.{}", schema_major, schema_minor))},
          {"legacy_format", legacy_format},
          {"steps", steps},
          {"tensors", tensors},
          {"problems", problems},
          {"unknown", unknown}};
}

ValidationReport validate_receipt(const std::string& path, const ReceiptSchema& schema) {
  ValidationReport report;
  report.path = path;
  std::optional<ReceiptReader> reader;
  try {
    reader.emplace(path);  // opens the file and checks the schema version
  } catch (const std::exception& e) {
    report.problems.push_back(without_path(e.what(), path));
    return report;
  }
  report.schema_major = reader->schema_version();
  report.schema_minor = reader->schema_minor();
  try {
    Validator(report, reader->file(), schema).run();
  } catch (const std::exception& e) {  // damage deep enough to stop the walk
    report.problems.push_back(without_path(e.what(), path));
  }
  return report;
}

void require_valid_receipt(const std::string& path, const ReceiptSchema& schema) {
  const ValidationReport report = validate_receipt(path, schema);
  if (report.valid()) return;
  const std::size_t more = report.problems.size() - 1;
  throw ReceiptError(fmt::format("{}: {}{}", path, report.problems.front(),
                                 more ? fmt::format(" (and {} more: harness validate {})", more, path) : ""));
}

}  // namespace harness::receipt
