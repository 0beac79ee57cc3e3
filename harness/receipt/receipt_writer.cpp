#include "receipt_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "receipt/receipt_paths.h"
#include "receipt/xxh3_dispatch.h"

namespace harness::receipt {
namespace {
constexpr std::size_t kContentHashWidth = 64;  // "xxh128:" and 32 hex digits, with room
// Held checkpoints (a Python canary's): the hash exactly, and the state in 1 MiB chunks.
constexpr std::size_t kHeldContentHashWidth = 39;
constexpr hsize_t kHeldStateChunkBytes = hsize_t{1} << 20;

// The receipt reopened for writing after its SWMR phase. A reader that opens the file at
// that moment (`harness inspect --follow`, h5py) holds HDF5's file lock for the length of
// its open, and the reopen fails with "unable to lock file": wait that out, for a bounded
// time, rather than fail a run whose every step is already recorded.
// `swmr_again`: opened with the 1.10 format's bounds, which SWMR mode needs.
h5::Handle reopen_for_writing(const std::string& path, bool swmr_again = false) {
  using clock = std::chrono::steady_clock;
  const auto give_up = clock::now() + std::chrono::seconds(10);
  for (;;) {
    try {
      return swmr_again ? h5::open_file_for_update(path) : h5::open_file(path, true);
    } catch (const h5::Hdf5Error&) {
      if (clock::now() > give_up) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

// A damaged file's close flushes again and fails as the write did, and HDF5 1.10.8 then
// crashes at exit closing it once more (in a process that did not skip the library's exit
// cleanup, as a Python interpreter using the C API): its descriptor is pointed at /dev/null
// first, so that what HDF5 still writes goes nowhere and the close succeeds.
void write_nowhere(hid_t file) {
  void* handle = nullptr;
  if (H5Fget_vfd_handle(file, H5P_DEFAULT, &handle) < 0 || handle == nullptr) return;
  const int null = ::open("/dev/null", O_RDWR);
  if (null < 0) return;
  ::dup2(null, *static_cast<int*>(handle));
  ::close(null);
}

ReceiptValue value_kind(const AttrValue& value) {
  if (std::holds_alternative<std::string>(value)) return ReceiptValue::kString;
  return std::holds_alternative<std::int64_t>(value) ? ReceiptValue::kInteger : ReceiptValue::kFloat;
}

// Attributes the description gives another type: a writer's bug, refused before the file exists.
void check_attribute_kinds(const ManifestAttributes& manifest, const ReceiptSchema& schema) {
  for (const auto& [name, value] : manifest) {
    const ReceiptAttribute* described = schema.attribute(paths::kManifest, name);
    if (described && described->kind != value_kind(value)) {
      throw std::logic_error(fmt::format("receipt: /manifest/{} is {} in the receipt description, given {}", name,
                                         to_string(described->kind), to_string(value_kind(value))));
    }
  }
}
}  // namespace

ManifestAttributes manifest_attributes(const Manifest& m) {
  ManifestAttributes out{{"schema_version", kSchemaVersion},
                         {"schema_minor", kSchemaMinor},
                         {"lane", m.lane},
                         {"engine", m.engine},
                         {"features", m.features},
                         {"canary", m.canary_json},
                         {"seed", m.seed},
                         {"steps_planned", m.steps_planned},
                         {"threads", m.threads},
                         {"complete", std::int64_t{0}},
                         {"created_utc", m.created_utc},
                         {"git_commit", m.git_commit},
                         {"toolchain", m.toolchain},
                         {"libraries", m.libraries},
                         {"host", m.host},
                         {"cpu", m.cpu}};
  out.insert(out.end(), m.extra.begin(), m.extra.end());
  return out;
}

std::string content_hash_text(std::uint64_t high64, std::uint64_t low64) {
  return fmt::format("xxh128:{:016x}{:016x}", high64, low64);
}

ReceiptWriter::ReceiptWriter(const std::string& path, const Manifest& m, const std::vector<std::string>& tensor_names,
                             bool overwrite, bool record_batches, BatchShape batch_shape, const ReceiptSchema& schema)
    : ReceiptWriter(path, manifest_attributes(m), tensor_names, overwrite, record_batches, batch_shape, schema) {}

ReceiptWriter::ReceiptWriter(const std::string& path, const ManifestAttributes& manifest,
                             const std::vector<std::string>& tensor_names, bool overwrite, bool record_batches,
                             BatchShape batch_shape, const ReceiptSchema& schema)
    : schema_(&schema), path_(path), tensor_count_(tensor_names.size()) {
  check_attribute_kinds(manifest, schema);
  file_ = h5::create_file(path, overwrite);
  try {
    write_layout(manifest, tensor_names, record_batches, batch_shape);
  } catch (...) {  // no half-made receipt: the file goes with the error
    if (damaged_) write_nowhere(file_);  // a failed flush: its close would fail the same way
    close();
    std::error_code ignored;
    std::filesystem::remove(path_, ignored);
    throw;
  }
}

// The manifest and every dataset a step appends to, flushed.
void ReceiptWriter::write_layout(const ManifestAttributes& manifest, const std::vector<std::string>& tensor_names,
                                 bool record_batches, BatchShape batch_shape) {
  manifest_ = h5::create_group(file_, paths::kManifest);
  for (const auto& entry : manifest) {  // (no structured binding: Clang 14 cannot capture one)
    std::visit([&](const auto& v) { h5::write_attr(manifest_, entry.first, v); }, entry.second);
  }

  h5::create_group(file_, paths::kSteps);
  constexpr hsize_t kChunk = 128;
  loss_ = h5::GrowingDataset(file_, paths::kLoss, H5T_IEEE_F64LE, {}, kChunk);
  grad_norm_ = h5::GrowingDataset(file_, paths::kGradNorm, H5T_IEEE_F64LE, {}, kChunk);
  lr_ = h5::GrowingDataset(file_, paths::kLr, H5T_IEEE_F64LE, {}, kChunk);
  batch_hash_ = h5::GrowingDataset(file_, paths::kBatchHash, H5T_STD_U64LE, {}, kChunk);

  h5::create_group(file_, paths::kHashes);
  h5::write_string_dataset(file_, paths::kTensorNames, tensor_names);
  const hsize_t K = tensor_names.size();
  constexpr hsize_t kRowChunk = 16;
  for (std::size_t f = 0; f < 4; ++f) {
    hashes_[f] = h5::GrowingDataset(file_, paths::hashes(kHashFamilies[f]), H5T_STD_U64LE, {K}, kRowChunk);
  }
  const h5::Handle sketches = h5::create_group(file_, paths::kSketches);
  h5::write_attr(sketches, "method", std::string(kSketchMethod));
  h5::write_attr(sketches, "width", std::int64_t{kSketchWidth});
  h5::write_attr(sketches, "block", std::int64_t{kSketchBlock});
  for (std::size_t f = 0; f < 2; ++f) {
    const char* family = kSketchFamilies[f];
    sketch_l2_[f] = h5::GrowingDataset(file_, paths::sketch_l2(family), H5T_IEEE_F64LE, {K}, kRowChunk);
    sketch_projection_[f] =
        h5::GrowingDataset(file_, paths::sketch_projection(family), H5T_IEEE_F64LE, {K, kSketchWidth}, kRowChunk);
  }
  if (record_batches) {
    h5::create_group(file_, paths::kBatches);
    batches_ = h5::GrowingDataset(file_, paths::kBatchTokens, H5T_STD_I32LE,
                                  {static_cast<hsize_t>(batch_shape.batch_size), static_cast<hsize_t>(batch_shape.row_length)},
                                  kRowChunk);
  }
  flush();
}

void split_sketches(const std::vector<TensorSketch>& sketches, std::vector<double>& l2, std::vector<double>& projection) {
  for (const TensorSketch& s : sketches) {
    l2.push_back(s.l2);
    projection.insert(projection.end(), s.projection.begin(), s.projection.end());
  }
}

void ReceiptWriter::append_step(const StepRecord& r) {
  loss_.append(&r.loss, H5T_NATIVE_DOUBLE);
  grad_norm_.append(&r.grad_norm, H5T_NATIVE_DOUBLE);
  lr_.append(&r.lr, H5T_NATIVE_DOUBLE);
  batch_hash_.append(&r.batch_hash, H5T_NATIVE_UINT64);
  for (std::size_t f = 0; f < 4; ++f) {
    if (r.hashes[f].size() != tensor_count_) throw h5::Hdf5Error("append_step: wrong number of hashes");
    hashes_[f].append(r.hashes[f].data(), H5T_NATIVE_UINT64);
  }
  for (std::size_t f = 0; f < 2; ++f) {
    std::vector<double> l2, projection;
    split_sketches(r.sketches[f], l2, projection);
    sketch_l2_[f].append(l2.data(), H5T_NATIVE_DOUBLE);
    sketch_projection_[f].append(projection.data(), H5T_NATIVE_DOUBLE);
  }
  flush();
  if (!swmr_) start_swmr();
}

// Engine state goes only where the description says an engine writes it.
void ReceiptWriter::check_described(const std::vector<StepState>& states) const {
  for (const StepState& state : states) {
    const std::string group = "/" + state.group;
    std::vector<std::string> state_paths;
    if (!state.columns.empty()) state_paths.push_back(group + "/names");
    for (const auto& field : state.fields) state_paths.push_back(group + "/" + field.first);
    for (const std::string& path : state_paths) {
      if (!schema_->group(group) || !schema_->dataset(path)) {
        throw std::logic_error(fmt::format("receipt: step state {} is not in the receipt description; describe it "
                                           "with the engine's receipt entries (engines/registry.h) or the "
                                           "architecture's (canaries/architecture.h)",
                                           path));
      }
    }
  }
}

void ReceiptWriter::append_state(const std::vector<StepState>& states) {
  if (state_fields_.empty()) {
    check_described(states);
    for (const StepState& state : states) {
      const h5::Handle group = h5::create_group(file_, state.group);
      // No columns: one value per step, a 1-D dataset (e.g. /compile/UncachedCompile).
      std::vector<hsize_t> row_shape;
      if (!state.columns.empty()) {
        h5::write_string_dataset(group, "names", state.columns);
        row_shape.push_back(state.columns.size());
      }
      std::vector<h5::GrowingDataset> fields;
      for (const auto& field : state.fields) fields.emplace_back(group, field.first, H5T_IEEE_F64LE, row_shape, 16);
      state_fields_.push_back(std::move(fields));
    }
  }
  if (states.size() != state_fields_.size()) throw h5::Hdf5Error("append_state: the engine's state groups changed");
  for (std::size_t g = 0; g < states.size(); ++g) {
    if (states[g].fields.size() != state_fields_[g].size()) throw h5::Hdf5Error("append_state: fields changed");
    for (std::size_t f = 0; f < states[g].fields.size(); ++f) {
      const std::vector<double>& row = states[g].fields[f].second;
      if (row.size() != std::max<std::size_t>(1, states[g].columns.size())) {
        throw h5::Hdf5Error("append_state: wrong number of columns");
      }
      state_fields_[g][f].append(row.data(), H5T_NATIVE_DOUBLE);
    }
  }
}

void ReceiptWriter::append_trace(const std::vector<TraceColumn>& columns, const TraceStep& step) {
  if (!trace_started_) create_trace_group(columns);
  if (columns.size() != trace_columns_ || step.hashes.size() != trace_columns_ || step.sketches.size() != trace_columns_) {
    throw h5::Hdf5Error("append_trace: the traced ops changed");
  }
  std::vector<double> l2, projection;
  split_sketches(step.sketches, l2, projection);
  trace_hash_.append(step.hashes.data(), H5T_NATIVE_UINT64);
  trace_l2_.append(l2.data(), H5T_NATIVE_DOUBLE);
  trace_projection_.append(projection.data(), H5T_NATIVE_DOUBLE);
}

// The op identities once (R columns), then per step one row of R hashes and sketches.
void ReceiptWriter::create_trace_group(const std::vector<TraceColumn>& columns) {
  const h5::Handle trace = h5::create_group(file_, paths::kTrace);
  h5::write_attr(trace, "level", std::string("ops"));
  std::vector<std::int64_t> op_index, layer;
  std::vector<std::string> op, phase, tensor, kind;
  for (const TraceColumn& c : columns) {
    op_index.push_back(c.op_index);
    layer.push_back(c.layer);
    op.push_back(c.op);
    phase.push_back(c.phase);
    tensor.push_back(c.tensor);
    kind.push_back(c.kind);
  }
  const std::vector<hsize_t> dims{columns.size()};
  h5::write_dataset(file_, paths::kTraceOpIndex, H5T_STD_I64LE, H5T_NATIVE_INT64, dims, op_index.data());
  h5::write_dataset(file_, paths::kTraceLayer, H5T_STD_I64LE, H5T_NATIVE_INT64, dims, layer.data());
  h5::write_string_dataset(file_, paths::kTraceOp, op);
  h5::write_string_dataset(file_, paths::kTracePhase, phase);
  h5::write_string_dataset(file_, paths::kTraceTensor, tensor);
  h5::write_string_dataset(file_, paths::kTraceKind, kind);
  const hsize_t R = columns.size();
  // One row per chunk, compressed: a chunk is written once (rows are flushed one by one,
  // and a chunk rewritten as it fills would leave dead space behind). Shuffle + deflate
  // halves the sketches; hashes are random bits and stay as they are.
  trace_hash_ = h5::GrowingDataset(file_, paths::kTraceHash, H5T_STD_U64LE, {R}, 1);
  trace_l2_ = h5::GrowingDataset(file_, paths::kTraceL2, H5T_IEEE_F64LE, {R}, 1, 4);
  trace_projection_ = h5::GrowingDataset(file_, paths::kTraceProjection, H5T_IEEE_F64LE, {R, kSketchWidth}, 1, 4);
  trace_columns_ = columns.size();
  trace_started_ = true;
}

void ReceiptWriter::append_batch(std::span<const std::int32_t> tokens) { batches_.append(tokens.data(), H5T_NATIVE_INT32); }

void ReceiptWriter::dump_tensor(int step, const std::string& name, const std::vector<std::int64_t>& shape,
                                std::span<const float> values) {
  pending_dumps_.push_back({fmt::format("step_{:06d}", step), name, std::vector<hsize_t>(shape.begin(), shape.end()),
                            std::vector<float>(values.begin(), values.end())});
}

void ReceiptWriter::declare_checkpoints(const std::string& directory, int every) {
  if (swmr_) throw h5::Hdf5Error(path_ + ": checkpoints must be declared before the first step");
  const h5::Handle group = h5::create_group(file_, paths::kCheckpoints);
  h5::write_attr(group, "directory", directory);
  h5::write_attr(group, "every", std::int64_t{every});
  checkpoint_step_ = h5::GrowingDataset(file_, paths::kCheckpointStep, H5T_STD_I64LE, {}, 16);
  checkpoint_hash_ =
      h5::GrowingDataset(file_, paths::kCheckpointContentHash, h5::fixed_string_type(kContentHashWidth), {}, 16);
  flush();
}

void ReceiptWriter::add_checkpoint(int step, const std::string& content_hash) {
  if (content_hash.size() > kContentHashWidth) throw h5::Hdf5Error(path_ + ": checkpoint content hash too long");
  std::string padded = content_hash;
  padded.resize(kContentHashWidth, '\0');
  const std::int64_t row = step;
  checkpoint_step_.append(&row, H5T_NATIVE_INT64);
  const h5::Handle type = h5::fixed_string_type(kContentHashWidth);
  checkpoint_hash_.append(padded.data(), type);
  flush();
}

void ReceiptWriter::declare_held_checkpoints(int every) {
  if (swmr_) throw h5::Hdf5Error(path_ + ": checkpoints must be declared before the first step");
  const h5::Handle group = h5::create_group(file_, paths::kCheckpoints);
  h5::write_attr(group, "every", std::int64_t{every});
  h5::write_attr(group, "storage", std::string(kCheckpointsInReceipt));
  checkpoint_step_ = h5::GrowingDataset(file_, paths::kCheckpointStep, H5T_STD_I64LE, {}, 128);
  checkpoint_offset_ = h5::GrowingDataset(file_, paths::kCheckpointOffset, H5T_STD_I64LE, {}, 128);
  checkpoint_length_ = h5::GrowingDataset(file_, paths::kCheckpointLength, H5T_STD_I64LE, {}, 128);
  checkpoint_hash_ =
      h5::GrowingDataset(file_, paths::kCheckpointContentHash, h5::fixed_string_type(kHeldContentHashWidth), {}, 128);
  checkpoint_state_ = h5::GrowingDataset(file_, paths::kCheckpointState, H5T_STD_U8LE, {}, kHeldStateChunkBytes);
  flush();
}

std::string ReceiptWriter::add_held_checkpoint(int step, std::span<const std::uint8_t> state) {
  const XXH128_hash_t digest = XXH3_128bits(state.data(), state.size());
  const std::string hash = content_hash_text(digest.high64, digest.low64);
  const std::int64_t row[] = {step, static_cast<std::int64_t>(checkpoint_state_.rows()),
                              static_cast<std::int64_t>(state.size())};
  checkpoint_state_.append(state.data(), H5T_NATIVE_UINT8, state.size());
  checkpoint_step_.append(&row[0], H5T_NATIVE_INT64);
  checkpoint_offset_.append(&row[1], H5T_NATIVE_INT64);
  checkpoint_length_.append(&row[2], H5T_NATIVE_INT64);
  const h5::Handle type = h5::fixed_string_type(kHeldContentHashWidth);
  checkpoint_hash_.append(hash.data(), type);
  flush();
  return hash;
}

void ReceiptWriter::declare_eval(const EvalDeclaration& eval) {
  if (eval_logits_size_ > 0) throw std::logic_error(path_ + ": the evaluation is declared once");
  const bool resume_swmr = swmr_;
  if (swmr_) leave_swmr();
  const auto rows = static_cast<hsize_t>(eval.rows), tokens = static_cast<hsize_t>(eval.tokens);
  if (eval.targets.size() != rows * tokens) throw std::logic_error("declare_eval: targets are not (rows, tokens)");
  const h5::Handle group = h5::create_group(file_, paths::kEval);
  h5::write_attr(group, "every", std::int64_t{eval.every});
  h5::write_attr(group, "held_out_hash", fmt::format("{:016x}", eval.held_out_hash));
  h5::write_attr(group, "source", eval.source);
  h5::write_dataset(file_, paths::kEvalTargets, H5T_STD_I32LE, H5T_NATIVE_INT32, {rows, tokens}, eval.targets.data());
  eval_step_ = h5::GrowingDataset(file_, paths::kEvalStep, H5T_STD_I64LE, {}, 16);
  eval_loss_ = h5::GrowingDataset(file_, paths::kEvalLoss, H5T_IEEE_F64LE, {}, 16);
  eval_compiles_ = h5::GrowingDataset(file_, paths::kEvalCompiles, H5T_IEEE_F64LE, {}, 16);
  eval_logits_ = h5::GrowingDataset(file_, paths::kEvalLogits, H5T_IEEE_F32LE,
                                    {rows, tokens, static_cast<hsize_t>(eval.vocab)}, 1);
  eval_logits_size_ = static_cast<std::size_t>(rows * tokens * static_cast<hsize_t>(eval.vocab));
  flush();
  if (resume_swmr) start_swmr();
}

void ReceiptWriter::add_eval(int step, double loss, std::span<const float> logits, double compiles) {
  if (logits.size() != eval_logits_size_) {
    throw std::logic_error("add_eval: logits are not the declared (rows, tokens, vocab)");
  }
  const std::int64_t row = step;
  eval_step_.append(&row, H5T_NATIVE_INT64);
  eval_loss_.append(&loss, H5T_NATIVE_DOUBLE);
  eval_logits_.append(logits.data(), H5T_NATIVE_FLOAT);
  eval_compiles_.append(&compiles, H5T_NATIVE_DOUBLE);
  flush();
}

// Once the first step's groups exist: from here on the file only grows.
void ReceiptWriter::start_swmr() {
  if (H5Fstart_swmr_write(file_) < 0) throw h5::Hdf5Error(path_ + ": HDF5 cannot start single-writer/multiple-reader mode");
  swmr_ = true;
}

std::vector<h5::GrowingDataset*> ReceiptWriter::growing_datasets() {
  std::vector<h5::GrowingDataset*> out = {&loss_, &grad_norm_, &lr_, &batch_hash_, &batches_, &trace_hash_, &trace_l2_,
                                          &trace_projection_, &checkpoint_step_, &checkpoint_hash_, &checkpoint_offset_,
                                          &checkpoint_length_, &checkpoint_state_, &eval_step_, &eval_loss_,
                                          &eval_logits_, &eval_compiles_};
  for (auto* family : {&hashes_[0], &hashes_[1], &hashes_[2], &hashes_[3], &sketch_l2_[0], &sketch_l2_[1],
                       &sketch_projection_[0], &sketch_projection_[1]}) {
    out.push_back(family);
  }
  for (auto& group : state_fields_) {
    for (auto& field : group) out.push_back(&field);
  }
  return out;
}

void ReceiptWriter::leave_swmr() {
  for (h5::GrowingDataset* d : growing_datasets()) d->detach();
  manifest_.reset();
  file_.reset();
  file_ = reopen_for_writing(path_, true);
  manifest_ = h5::open_group(file_, paths::kManifest);
  for (h5::GrowingDataset* d : growing_datasets()) d->attach(file_);
  swmr_ = false;
}

void ReceiptWriter::close() {
  for (h5::GrowingDataset* d : growing_datasets()) *d = h5::GrowingDataset();
  state_fields_.clear();
  manifest_.reset();
  file_.reset();
}

// SWMR mode ends only with the file: close it, and reopen it to add what SWMR forbids.
void ReceiptWriter::finish() {
  close();
  file_ = reopen_for_writing(path_);
  if (!pending_dumps_.empty()) {
    const h5::Handle tensors = h5::create_group(file_, paths::kTensors);
    for (const Dump& d : pending_dumps_) {
      const h5::Handle group = h5::exists(tensors, d.group) ? h5::open_group(tensors, d.group) : h5::create_group(tensors, d.group);
      h5::write_dataset(group, d.name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, d.shape, d.values.data());
    }
    pending_dumps_.clear();
  }
  manifest_ = h5::open_group(file_, paths::kManifest);
  h5::write_attr(manifest_, "complete", std::int64_t{1});
  flush();
  manifest_.reset();
  file_.reset();
  finished_ = true;
}

void ReceiptWriter::flush() {
  if (!file_.valid()) return;
  errno = 0;
  if (H5Fflush(file_, H5F_SCOPE_GLOBAL) < 0) {
    // Part of the flush may have reached the file (a full disk, a file size limit): its
    // metadata no longer describes it, so what it holds is not a receipt any reader can
    // trust. The destructor removes it.
    const int error = errno;
    damaged_ = true;
    throw h5::Hdf5Error(fmt::format("{}: HDF5 cannot flush the receipt{}; the damaged file is removed: free space (or "
                                    "raise the file size limit) and run again",
                                    path_, error != 0 ? fmt::format(" ({})", std::strerror(error)) : ""));
  }
}

ReceiptWriter::~ReceiptWriter() {
  if (!damaged_) return;
  if (file_.valid()) write_nowhere(file_);
  close();  // its errors are ignored: the file is going
  std::error_code ignored;
  std::filesystem::remove(path_, ignored);
}

}  // namespace harness::receipt
