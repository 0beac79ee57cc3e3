#include "receipt/receipt_c_api.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "receipt/hdf5_file.h"
#include "receipt/receipt_schema.h"
#include "receipt/receipt_writer.h"

using harness::StepState;
using harness::receipt::AttrValue;
using harness::receipt::ManifestAttributes;
using harness::receipt::ReceiptSchema;
using harness::receipt::ReceiptWriter;
using harness::receipt::TensorSketch;
using harness::receipt::TraceColumn;
using harness::receipt::TraceStep;
using harness::receipt::kSketchWidth;

struct canary_receipt_writer {
  std::string path;
  ReceiptSchema schema{harness::ReceiptEntries{}};  // before `writer`, which points at it
  std::unique_ptr<ReceiptWriter> writer;
  std::size_t tensors = 0, batch_values = 0;
  std::vector<StepState> staged_state;
  std::vector<TraceColumn> trace_columns;  // the first staged trace's
  std::optional<TraceStep> staged_trace;
  bool finished = false;
};

namespace {

// A C string the caller gave: NULL is refused by name, never dereferenced.
std::string text(const char* value, const char* what) {
  if (value == nullptr) throw std::invalid_argument(fmt::format("{} is NULL", what));
  return value;
}

std::vector<std::string> texts(const char* const* values, std::size_t count, const char* what) {
  if (count > 0 && values == nullptr) throw std::invalid_argument(fmt::format("{} is NULL", what));
  std::vector<std::string> out;
  for (std::size_t i = 0; i < count; ++i) out.push_back(text(values[i], what));
  return out;
}

template <class T>
const T* values_of(const T* values, std::size_t count, const char* what) {
  if (count > 0 && values == nullptr) throw std::invalid_argument(fmt::format("{} is NULL", what));
  return values;
}

ManifestAttributes attributes_of(const canary_receipt_attribute* given, std::size_t count) {
  ManifestAttributes out;
  values_of(given, count, "attributes");
  for (std::size_t i = 0; i < count; ++i) {
    const canary_receipt_attribute& a = given[i];
    const std::string name = text(a.name, "an attribute's name");
    switch (a.kind) {
      case 0: out.emplace_back(name, AttrValue(text(a.text, "a string attribute's text"))); break;
      case 1: out.emplace_back(name, AttrValue(a.integer)); break;
      case 2: out.emplace_back(name, AttrValue(a.real)); break;
      default: throw std::invalid_argument(fmt::format("attribute {} has kind {}, not 0, 1 or 2", name, a.kind));
    }
  }
  return out;
}

std::vector<TensorSketch> sketches_of(const double* l2, const double* projection, std::size_t count) {
  std::vector<TensorSketch> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    out[i].l2 = l2[i];
    std::copy_n(projection + i * kSketchWidth, kSketchWidth, out[i].projection.begin());
  }
  return out;
}

void write_error(char* error, std::size_t size, const std::string& message) {
  if (error == nullptr || size == 0) return;
  const std::size_t n = std::min(size - 1, message.size());
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

// Every call holds this: HDF5 is never entered from two threads at once through the C API,
// whether or not the HDF5 it links was built thread-safe.
std::mutex& hdf5_lock() {
  static std::mutex lock;
  return lock;
}

// Runs `body`, turning whatever it throws into the one-line message and a 1. HDF5's own
// printing is silenced per call: its error settings are per thread in a thread-safe build.
template <class Body>
int guarded(const std::string& path, char* error, std::size_t error_size, Body body) {
  const std::lock_guard<std::mutex> held(hdf5_lock());
  try {
    harness::h5::silence_library_errors();
    body();
    return 0;
  } catch (const std::exception& e) {
    const std::string message = e.what();
    // The writer's own messages name the receipt already; others get its path in front.
    write_error(error, error_size, message.rfind(path, 0) == 0 ? message : fmt::format("{}: {}", path, message));
  } catch (...) {
    write_error(error, error_size, path + ": an unknown error");
  }
  return 1;
}

// A call that writes: where its flush failed, the file is no receipt (ReceiptWriter's
// destructor removes a damaged file), so it goes at once and later calls are refused.
template <class Body>
int writing(canary_receipt_writer* w, char* error, std::size_t error_size, Body body) {
  return guarded(w->path, error, error_size, [&] {
    try {
      body();
    } catch (...) {
      if (w->writer && w->writer->damaged()) w->writer.reset();  // its destructor removes the file
      throw;
    }
  });
}

ReceiptWriter& open_writer(canary_receipt_writer* w) {
  if (!w->writer) throw std::logic_error("the receipt was removed after a failed write; run again");
  if (w->finished) throw std::logic_error("the receipt is finished; nothing more can be written");
  return *w->writer;
}

}  // namespace

extern "C" {

uint32_t canary_receipt_abi_version(void) { return CANARY_RECEIPT_ABI_VERSION; }
int64_t canary_receipt_schema_version(void) { return harness::receipt::kSchemaVersion; }
int64_t canary_receipt_schema_minor(void) { return harness::receipt::kSchemaMinor; }

canary_receipt_writer* canary_receipt_create(const char* path, int overwrite, const char* description,
                                             size_t attribute_count, const canary_receipt_attribute* attributes,
                                             size_t tensor_count, const char* const* tensor_names, int32_t batch_size,
                                             int32_t row_length, char* error, size_t error_size) {
  const std::string where = path ? path : "(no path)";
  canary_receipt_writer* created = nullptr;
  guarded(where, error, error_size, [&] {
    const std::string file = text(path, "path");
    ReceiptSchema schema = ReceiptSchema::from_json(nlohmann::json::parse(text(description, "description")));
    if (batch_size < 0 || row_length < 0 || (batch_size == 0) != (row_length == 0)) {
      throw std::invalid_argument(fmt::format("batch shape {} x {}: give two positive numbers, or 0 and 0", batch_size,
                                              row_length));
    }
    auto w = std::make_unique<canary_receipt_writer>();
    w->path = file;
    w->schema = std::move(schema);
    w->tensors = tensor_count;
    w->batch_values = static_cast<std::size_t>(batch_size) * static_cast<std::size_t>(row_length);
    w->writer = std::make_unique<ReceiptWriter>(file, attributes_of(attributes, attribute_count),
                                                texts(tensor_names, tensor_count, "tensor_names"), overwrite != 0,
                                                batch_size > 0, harness::receipt::BatchShape{batch_size, row_length},
                                                w->schema);
    created = w.release();
  });
  return created;
}

int canary_receipt_stage_state(canary_receipt_writer* w, const char* group, size_t column_count,
                               const char* const* columns, size_t field_count, const char* const* fields,
                               const double* values, char* error, size_t error_size) {
  return guarded(w->path, error, error_size, [&] {
    StepState state{text(group, "group"), texts(columns, column_count, "columns"), {}};
    const std::size_t width = std::max<std::size_t>(1, column_count);
    values_of(values, field_count * width, "values");
    const std::vector<std::string> names = texts(fields, field_count, "fields");
    for (std::size_t f = 0; f < field_count; ++f) {
      state.fields.emplace_back(names[f], std::vector<double>(values + f * width, values + (f + 1) * width));
    }
    w->staged_state.push_back(std::move(state));
  });
}

int canary_receipt_stage_trace(canary_receipt_writer* w, size_t column_count, const int64_t* op_index,
                               const int64_t* layer, const char* const* op, const char* const* phase,
                               const char* const* tensor, const char* const* kind, const uint64_t* hashes,
                               const double* l2, const double* projection, char* error, size_t error_size) {
  return guarded(w->path, error, error_size, [&] {
    if (op_index != nullptr) {
      if (!w->trace_columns.empty()) throw std::logic_error("the trace's columns are given once, at the first step");
      values_of(layer, column_count, "layer");
      const auto ops = texts(op, column_count, "op"), phases = texts(phase, column_count, "phase");
      const auto tensors = texts(tensor, column_count, "tensor"), kinds = texts(kind, column_count, "kind");
      for (std::size_t c = 0; c < column_count; ++c) {
        w->trace_columns.push_back({static_cast<int>(op_index[c]), ops[c], static_cast<int>(layer[c]), phases[c],
                                    tensors[c], kinds[c]});
      }
    }
    if (column_count == 0 || column_count != w->trace_columns.size()) {
      throw std::invalid_argument(fmt::format("a trace of {} columns; the first step traced {}", column_count,
                                              w->trace_columns.size()));
    }
    values_of(hashes, column_count, "hashes");
    values_of(l2, column_count, "l2");
    values_of(projection, column_count, "projection");
    w->staged_trace = TraceStep{std::vector<std::uint64_t>(hashes, hashes + column_count),
                                sketches_of(l2, projection, column_count)};
  });
}

int canary_receipt_append_step(canary_receipt_writer* w, double loss, double grad_norm, double lr, uint64_t batch_hash,
                               const uint64_t* hashes, const double* l2, const double* projection,
                               const int32_t* batch_tokens, char* error, size_t error_size) {
  const int status = writing(w, error, error_size, [&] {
    ReceiptWriter& writer = open_writer(w);
    const std::size_t K = w->tensors;
    values_of(hashes, 4 * K, "hashes");
    values_of(l2, 2 * K, "l2");
    values_of(projection, 2 * K, "projection");
    if ((batch_tokens != nullptr) != (w->batch_values > 0)) {
      throw std::invalid_argument(w->batch_values > 0 ? "this receipt records batches: give the step's tokens"
                                                      : "this receipt records no batches: give no tokens");
    }
    harness::receipt::StepRecord record;
    record.loss = loss;
    record.grad_norm = grad_norm;
    record.lr = lr;
    record.batch_hash = batch_hash;
    for (std::size_t f = 0; f < 4; ++f) record.hashes[f].assign(hashes + f * K, hashes + (f + 1) * K);
    for (std::size_t f = 0; f < 2; ++f) record.sketches[f] = sketches_of(l2 + f * K, projection + f * K * kSketchWidth, K);
    // What can be refused (state groups or traced ops that changed) before any row; then
    // the batch and the step's rows, and the step's flush.
    if (!w->staged_state.empty()) writer.append_state(w->staged_state);
    if (w->staged_trace) writer.append_trace(w->trace_columns, *w->staged_trace);
    if (batch_tokens != nullptr) writer.append_batch({batch_tokens, w->batch_values});
    writer.append_step(record);
  });
  w->staged_state.clear();  // a step that failed takes its staging with it
  w->staged_trace.reset();
  return status;
}

int canary_receipt_declare_checkpoints(canary_receipt_writer* w, int64_t every, char* error, size_t error_size) {
  return writing(w, error, error_size, [&] { open_writer(w).declare_held_checkpoints(static_cast<int>(every)); });
}

int canary_receipt_add_checkpoint(canary_receipt_writer* w, int64_t step, const uint8_t* state, size_t length,
                                  char* content_hash, size_t content_hash_size, char* error, size_t error_size) {
  return writing(w, error, error_size, [&] {
    values_of(state, length, "state");
    constexpr std::size_t kHashBytes = 40;  // "xxh128:", 32 hex digits and the NUL
    if (content_hash == nullptr || content_hash_size < kHashBytes) {
      throw std::invalid_argument(fmt::format("content_hash holds {} bytes; give {}", content_hash_size, kHashBytes));
    }
    const std::string hash = open_writer(w).add_held_checkpoint(static_cast<int>(step), {state, length});
    write_error(content_hash, content_hash_size, hash);
  });
}

int canary_receipt_declare_eval(canary_receipt_writer* w, int64_t every, uint64_t held_out_hash, const char* source,
                                int32_t rows, int32_t tokens, int32_t vocab, const int32_t* targets, char* error,
                                size_t error_size) {
  return writing(w, error, error_size, [&] {
    if (rows <= 0 || tokens <= 0 || vocab <= 0) {
      throw std::invalid_argument(fmt::format("/eval of {} rows, {} tokens, vocabulary {}: give positive sizes", rows,
                                              tokens, vocab));
    }
    const std::size_t n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(tokens);
    values_of(targets, n, "targets");
    harness::receipt::EvalDeclaration eval{static_cast<int>(every), held_out_hash, text(source, "source"), rows, tokens,
                                           vocab, std::vector<std::int32_t>(targets, targets + n)};
    open_writer(w).declare_eval(eval);
  });
}

int canary_receipt_add_eval(canary_receipt_writer* w, int64_t step, double loss, const float* logits, double compiles,
                            char* error, size_t error_size) {
  return writing(w, error, error_size, [&] {
    ReceiptWriter& writer = open_writer(w);
    const std::size_t n = writer.eval_logits_size();
    writer.add_eval(static_cast<int>(step), loss, {values_of(logits, n, "logits"), n}, compiles);
  });
}

int canary_receipt_dump_tensor(canary_receipt_writer* w, int64_t step, const char* name, size_t rank,
                               const int64_t* shape, const float* values, char* error, size_t error_size) {
  return guarded(w->path, error, error_size, [&] {
    values_of(shape, rank, "shape");
    std::vector<std::int64_t> dims(shape, shape + rank);
    std::size_t n = 1;
    for (std::int64_t d : dims) {
      if (d < 0) throw std::invalid_argument(fmt::format("tensor {} has a negative dimension", text(name, "name")));
      n *= static_cast<std::size_t>(d);
    }
    open_writer(w).dump_tensor(static_cast<int>(step), text(name, "name"), dims, {values_of(values, n, "values"), n});
  });
}

int canary_receipt_finish(canary_receipt_writer* w, char* error, size_t error_size) {
  return writing(w, error, error_size, [&] {
    open_writer(w).finish();
    w->finished = true;
  });
}

void canary_receipt_close(canary_receipt_writer* w, int discard) {
  if (w == nullptr) return;
  const std::lock_guard<std::mutex> held(hdf5_lock());
  try {
    harness::h5::silence_library_errors();
    w->writer.reset();  // flushed steps stay (complete = 0); a damaged file goes
    if (discard != 0) std::remove(w->path.c_str());
  } catch (...) {  // a close is never refused: what HDF5 could not close is gone with the writer
  }
  delete w;
}

}  // extern "C"
