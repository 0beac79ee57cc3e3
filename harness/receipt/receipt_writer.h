// Writes a receipt as the run goes: the manifest first, then one row per step in every
// per-step dataset, flushed after each step, so a run killed at step k leaves a readable
// receipt of its first k steps with manifest attribute complete = 0.
//
// After the first step the file is in HDF5's single-writer/multiple-reader mode (SWMR):
// readers may open it while the run writes, and a killed run's file stays readable (a
// 1.10-format file written any other way is refused by readers until it is closed).
// SWMR forbids new objects and attributes, so everything a step writes exists by then:
// /trace and engine state groups are created in step 0, /checkpoints when declared, and
// tensor dumps wait in memory until finish() reopens the file in normal mode.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "api/engine.h"
#include "receipt/digest.h"
#include "receipt/hdf5_file.h"
#include "receipt/receipt_schema.h"

namespace harness::receipt {

using AttrValue = AttributeValue;  // string, int64 or float64 (engines/api/engine.h)

struct Manifest {
  std::string lane, engine, features, canary_json, created_utc, git_commit, toolchain, libraries, host, cpu;
  std::int64_t seed = 0;  // the CLI accepts 0 .. 2^63-1
  std::int64_t steps_planned = 0;
  std::int64_t threads = 0;
  std::map<std::string, AttrValue> extra;  // engine settings, fault injection, ...
};

// The manifest's attributes in the order they are written, as a writer of another language
// gives them (receipt_c_api.h); manifest_attributes() gives a Manifest's, the schema
// version and complete = 0 among them.
using ManifestAttributes = std::vector<std::pair<std::string, AttrValue>>;
ManifestAttributes manifest_attributes(const Manifest& manifest);

// A checkpoint's content hash: "xxh128:" and the 32 hex digits of its XXH3-128 (high half
// first, xxHash's canonical order), as checkpoint files and /checkpoints/content_hash hold it.
std::string content_hash_text(std::uint64_t high64, std::uint64_t low64);

struct StepRecord {
  double loss = 0, grad_norm = 0, lr = 0;
  std::uint64_t batch_hash = 0;
  std::array<std::vector<std::uint64_t>, 4> hashes;  // kHashFamilies x K
  std::array<std::vector<TensorSketch>, 2> sketches;  // kSketchFamilies x K
};

// One traced op output (`--trace ops`): a column of /trace. op_index numbers the traced
// ops of a step in execution order; an op with several outputs has one column for each.
struct TraceColumn {
  int op_index = 0;
  std::string op;  // the op's site, e.g. "blocks.2.attn.proj"
  int layer = -1;
  std::string phase, tensor, kind;  // phase: forward/backward/optimizer; kind: the tensor's
  bool operator==(const TraceColumn&) const = default;
};
// One step of /trace: per column, the hash and sketch of the output's value.
struct TraceStep {
  std::vector<std::uint64_t> hashes;
  std::vector<TensorSketch> sketches;
};

// Sketches as the receipt stores them: the L2 norms, and the projections back to back.
void split_sketches(const std::vector<TensorSketch>& sketches, std::vector<double>& l2, std::vector<double>& projection);

struct BatchShape {
  int batch_size = 0, row_length = 0;
};

// /eval (docs/logit-kl.md): what every evaluation of a run shares.
struct EvalDeclaration {
  int every = 0;
  std::uint64_t held_out_hash = 0;  // canary::batch_hash of the held-out batch
  std::string source;               // where the held-out batch comes from
  int rows = 0, tokens = 0, vocab = 0;
  std::vector<std::int32_t> targets;  // (rows, tokens): the recorded rows' next tokens
};

class ReceiptWriter {
 public:
  // Creates `path` (refusing an existing file unless overwrite) and writes the manifest.
  // `schema` is what the writer may write: a manifest attribute it describes must have its
  // described type, and every engine state group and field must be described (an engine
  // describes its own: engines/registry.h); std::logic_error otherwise, before any file.
  ReceiptWriter(const std::string& path, const Manifest& manifest, const std::vector<std::string>& tensor_names,
                bool overwrite, bool record_batches, BatchShape batch_shape,
                const ReceiptSchema& schema = ReceiptSchema::core());
  // The same from the manifest's attributes themselves (every one checked as above).
  ReceiptWriter(const std::string& path, const ManifestAttributes& manifest, const std::vector<std::string>& tensor_names,
                bool overwrite, bool record_batches, BatchShape batch_shape, const ReceiptSchema& schema);
  // Removes the file when a flush failed (it is no receipt then); otherwise closes it, and
  // a writer destroyed before finish() leaves its flushed steps with complete = 0.
  ~ReceiptWriter();
  ReceiptWriter(const ReceiptWriter&) = delete;
  ReceiptWriter& operator=(const ReceiptWriter&) = delete;

  // Engine state of the step (e.g. /fp8 amax and scale), written before append_step(),
  // which flushes both. The groups are created on the first call; later calls must name
  // the same groups, columns and fields.
  void append_state(const std::vector<StepState>& states);
  void append_step(const StepRecord& record);
  void append_batch(std::span<const std::int32_t> tokens);
  // One step of op traces, written before append_step(). The first call creates /trace
  // with `columns`; later calls must pass the same columns.
  void append_trace(const std::vector<TraceColumn>& columns, const TraceStep& step);
  // /tensors/step_XXXXXX/<name> as float32 with the tensor's shape, written by finish()
  // (a killed run leaves no dumps).
  void dump_tensor(int step, const std::string& name, const std::vector<std::int64_t>& shape,
                   std::span<const float> values);
  // /checkpoints: the directory (relative to the receipt's) and `every`; call before the
  // first step. Then, per checkpoint, a row of /checkpoints/step and /checkpoints/content_hash
  // (its file's content hash), flushed at once.
  void declare_checkpoints(const std::string& directory, int every);
  void add_checkpoint(int step, const std::string& content_hash);
  // /checkpoints held in the receipt itself (storage = "receipt": a Python canary's state,
  // docs/receipt-schema.md): declared before the first step; then per checkpoint its bytes
  // appended to /checkpoints/state and a row of step, offset, length and content hash,
  // flushed at once. Returns the content hash.
  void declare_held_checkpoints(int every);
  std::string add_held_checkpoint(int step, std::span<const std::uint8_t> state);
  // /eval: declared before the first evaluation (after steps too: a Python canary learns
  // the vocabulary from its first logits); then one row per evaluation (the logits of the
  // declared rows, (rows, tokens, vocab)), flushed at once.
  void declare_eval(const EvalDeclaration& eval);
  // `compiles`: the programs the evaluation compiled (0 for an eager engine).
  void add_eval(int step, double loss, std::span<const float> logits, double compiles);
  std::size_t eval_logits_size() const { return eval_logits_size_; }  // rows x tokens x vocab once declared
  void finish();  // dumps written, complete = 1, file closed
  bool damaged() const { return damaged_; }  // a flush failed: the destructor removes the file
  void flush();

 private:
  struct Dump {
    std::string group, name;
    std::vector<hsize_t> shape;
    std::vector<float> values;
  };
  void write_layout(const ManifestAttributes& manifest, const std::vector<std::string>& tensor_names,
                    bool record_batches, BatchShape batch_shape);
  void create_trace_group(const std::vector<TraceColumn>& columns);
  void start_swmr();
  void leave_swmr();  // SWMR mode allows no new object: the file closed and opened again
  std::vector<h5::GrowingDataset*> growing_datasets();
  void close();

  void check_described(const std::vector<StepState>& states) const;

  const ReceiptSchema* schema_;
  bool swmr_ = false, finished_ = false, damaged_ = false;
  std::vector<Dump> pending_dumps_;
  h5::GrowingDataset checkpoint_step_, checkpoint_hash_;
  h5::GrowingDataset checkpoint_offset_, checkpoint_length_, checkpoint_state_;  // held in the receipt
  h5::GrowingDataset eval_step_, eval_loss_, eval_logits_, eval_compiles_;
  std::size_t eval_logits_size_ = 0;
  std::string path_;
  h5::Handle file_, manifest_;
  std::size_t tensor_count_;
  h5::GrowingDataset loss_, grad_norm_, lr_, batch_hash_, batches_;
  std::array<h5::GrowingDataset, 4> hashes_;
  std::array<h5::GrowingDataset, 2> sketch_l2_, sketch_projection_;
  std::vector<std::vector<h5::GrowingDataset>> state_fields_;  // [group][field]
  bool trace_started_ = false;
  std::size_t trace_columns_ = 0;
  h5::GrowingDataset trace_hash_, trace_l2_, trace_projection_;
};

}  // namespace harness::receipt
