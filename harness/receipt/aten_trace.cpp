#include "aten_trace.h"

#include <stdexcept>

#include <fmt/format.h>

#include "receipt/hdf5_file.h"
#include "receipt/receipt_paths.h"
#include "receipt/receipt_schema.h"

namespace harness::receipt {
namespace {

namespace P = paths;

// Traces are megabytes of repeated names: deflated (with shuffle), as every HDF5 build can.
constexpr int kDeflate = 4;

// Every step's columns and digests, one after the other, as the datasets hold them.
struct FlatTraces {
  std::vector<std::int64_t> offset, length, op_index, layer;
  std::vector<std::string> op, phase, tensor, kind, site;
  std::vector<std::uint64_t> hashes;
  std::vector<double> l2, projection;
};

FlatTraces flatten(const std::vector<AtenTraceStep>& steps) {
  FlatTraces f;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const AtenTraceStep& step = steps[s];
    const std::size_t n = step.columns.size();
    if (step.hashes.size() != n || step.l2.size() != n || step.projection.size() != n * kSketchWidth ||
        (!step.sites.empty() && step.sites.size() != n)) {
      throw std::invalid_argument(fmt::format("the aten trace of step {} has {} columns but digests of another count", s, n));
    }
    f.offset.push_back(static_cast<std::int64_t>(f.op_index.size()));
    f.length.push_back(static_cast<std::int64_t>(n));
    for (std::size_t c = 0; c < n; ++c) {
      const TraceColumn& col = step.columns[c];
      f.op_index.push_back(col.op_index);
      f.layer.push_back(col.layer);
      f.op.push_back(col.op);
      f.phase.push_back(col.phase);
      f.tensor.push_back(col.tensor);
      f.kind.push_back(col.kind);
      f.site.push_back(step.sites.empty() ? "" : step.sites[c]);
    }
    f.hashes.insert(f.hashes.end(), step.hashes.begin(), step.hashes.end());
    f.l2.insert(f.l2.end(), step.l2.begin(), step.l2.end());
    f.projection.insert(f.projection.end(), step.projection.begin(), step.projection.end());
  }
  return f;
}

void write_i64(hid_t group, const char* path, const std::vector<std::int64_t>& values) {
  h5::write_dataset(group, P::leaf(path), H5T_STD_I64LE, H5T_NATIVE_INT64, {values.size()}, values.data(), kDeflate);
}

}  // namespace

void write_aten_traces(const std::string& path, const std::vector<AtenTraceStep>& steps) {
  const FlatTraces f = flatten(steps);
  const h5::Handle file = h5::open_file_for_update(path);
  const std::int64_t recorded = static_cast<std::int64_t>(h5::dataset_shape(file, P::kLoss).at(0));
  if (recorded != static_cast<std::int64_t>(steps.size())) {
    throw std::invalid_argument(fmt::format("{}: {} steps recorded but {} aten traces given", path, recorded, steps.size()));
  }
  const h5::Handle group = h5::create_group(file, P::leaf(P::kAtenTrace));
  h5::write_attr(group, "level", std::string("aten"));
  write_i64(group, P::kAtenTraceOffset, f.offset);
  write_i64(group, P::kAtenTraceLength, f.length);
  write_i64(group, P::kAtenTraceOpIndex, f.op_index);
  write_i64(group, P::kAtenTraceLayer, f.layer);
  const std::pair<const char*, const std::vector<std::string>*> strings[] = {
      {P::kAtenTraceOp, &f.op}, {P::kAtenTracePhase, &f.phase}, {P::kAtenTraceTensor, &f.tensor},
      {P::kAtenTraceKind, &f.kind}, {P::kAtenTraceSite, &f.site}};
  for (const auto& [name, values] : strings) h5::write_string_dataset(group, P::leaf(name), *values, kDeflate);
  const hsize_t n = f.hashes.size();
  h5::write_dataset(group, P::leaf(P::kAtenTraceHash), H5T_STD_U64LE, H5T_NATIVE_UINT64, {n}, f.hashes.data(), kDeflate);
  h5::write_dataset(group, P::leaf(P::kAtenTraceL2), H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {n}, f.l2.data(), kDeflate);
  h5::write_dataset(group, P::leaf(P::kAtenTraceProjection), H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                    {n, static_cast<hsize_t>(kSketchWidth)}, f.projection.data(), kDeflate);
}

bool has_aten_traces(const ReceiptReader& reader) { return h5::exists(reader.file(), P::kAtenTrace); }

AtenTraceStep read_aten_trace_step(const ReceiptReader& reader, int step) {
  const hid_t f = reader.file();
  const std::vector<std::int64_t> offset = h5::read_i64(f, P::kAtenTraceOffset), length = h5::read_i64(f, P::kAtenTraceLength);
  const std::vector<std::int64_t> op_index = h5::read_i64(f, P::kAtenTraceOpIndex), layer = h5::read_i64(f, P::kAtenTraceLayer);
  const std::vector<std::string> op = h5::read_strings(f, P::kAtenTraceOp), phase = h5::read_strings(f, P::kAtenTracePhase),
                                 tensor = h5::read_strings(f, P::kAtenTraceTensor), kind = h5::read_strings(f, P::kAtenTraceKind),
                                 site = h5::read_strings(f, P::kAtenTraceSite);
  const std::vector<std::uint64_t> hashes = h5::read_u64(f, P::kAtenTraceHash);
  const std::vector<double> l2 = h5::read_f64(f, P::kAtenTraceL2), projection = h5::read_f64(f, P::kAtenTraceProjection);
  const std::size_t total = op_index.size(), s = static_cast<std::size_t>(step);
  // Both numbers come from the file: compared one at a time, so that no sum of them overflows.
  const bool fits = s < offset.size() && s < length.size() && offset[s] >= 0 && length[s] >= 0 &&
                    static_cast<std::size_t>(offset[s]) <= total &&
                    static_cast<std::size_t>(length[s]) <= total - static_cast<std::size_t>(offset[s]);
  bool same_rows = projection.size() == total * kSketchWidth;
  for (std::size_t size : {layer.size(), op.size(), phase.size(), tensor.size(), kind.size(), site.size(), hashes.size(), l2.size()}) {
    same_rows = same_rows && size == total;
  }
  if (!fits || !same_rows) {
    throw ReceiptError(fmt::format("{}: /aten_trace holds no whole trace of step {}; the golden is damaged: refresh "
                                   "and approve it again", reader.path(), step));
  }
  const auto begin = static_cast<std::size_t>(offset[s]), count = static_cast<std::size_t>(length[s]);
  AtenTraceStep out;
  for (std::size_t c = begin; c < begin + count; ++c) {
    out.columns.push_back({static_cast<int>(op_index[c]), op[c], static_cast<int>(layer[c]), phase[c], tensor[c], kind[c]});
  }
  out.sites = rows(site, begin, count);
  out.hashes = rows(hashes, begin, count);
  out.l2 = rows(l2, begin, count);
  out.projection = rows(projection, begin, count, kSketchWidth);
  return out;
}

}  // namespace harness::receipt
