#include "receipt_schema.h"

#include <stdexcept>

#include <fmt/format.h>

#include "receipt/receipt_paths.h"

namespace harness::receipt {
namespace {

using D = ReceiptDim;
using T = ReceiptDtype;
using V = ReceiptValue;
namespace P = paths;
constexpr Presence kRequired = Presence::kRequired;
constexpr Presence kOptional = Presence::kOptional;

const char* const kEveryWriter = "every writer";
const char* const kPythonLanes = "canary_harness (the PyTorch lane, its Recorder and Python canaries)";

ReceiptAttribute manifest(const std::string& name, V kind, Presence presence, std::string meaning, int since = 0,
                          std::string writer = kEveryWriter) {
  return {std::string(P::kManifest) + "/" + name, kind, presence, since, std::move(writer), std::move(meaning)};
}

void add_manifest(ReceiptEntries& e) {
  e.groups.push_back({P::kManifest, kRequired, 0, kEveryWriter, "the run's identity and settings, as attributes"});
  e.attributes.insert(e.attributes.end(), {
      manifest("schema_version", V::kInteger, kRequired, "the schema's major version"),
      manifest("schema_minor", V::kInteger, kOptional, "the schema's minor version (absent in 1.0 receipts)", 1),
      manifest("lane", V::kString, kRequired, "canonical lane name: <canary>/<engine>[@mesh][+features]"),
      manifest("engine", V::kString, kRequired, "the engine (or stack) that ran the canary"),
      manifest("features", V::kString, kRequired, "canonical engine features (empty for cpu-ref)"),
      manifest("budget_features", V::kString, kOptional,
               "the budget entries that separate the run from the bitwise reference, joined with '+'", 2),
      manifest("canary", V::kString, kRequired, "the canary's identity as a JSON object"),
      manifest("seed", V::kInteger, kRequired, "initialisation seed (0 .. 2^63-1)"),
      manifest("steps_planned", V::kInteger, kRequired, "steps the run was asked for"),
      manifest("threads", V::kInteger, kRequired, "worker threads (0: every core)"),
      manifest("complete", V::kInteger, kRequired, "1 when every planned step was recorded, else 0"),
      manifest("created_utc", V::kString, kRequired, "ISO 8601"),
      manifest("git_commit", V::kString, kRequired, "the writer's commit (-dirty with local changes)"),
      manifest("toolchain", V::kString, kRequired, "compiler, version, build type and numerics flags"),
      manifest("libraries", V::kString, kRequired, "library versions"),
      manifest("host", V::kString, kRequired, "host name"),
      manifest("cpu", V::kString, kRequired, "CPU model"),
      manifest("kernels", V::kString, kOptional, "kernel choices that could matter"),
      manifest("cpu_capability", V::kString, kOptional,
               "the CPU kernels' ISA torch's ATen dispatched to, as torch names it (AVX2, AVX512, DEFAULT; 1.13: NO AVX)",
               6, kPythonLanes),
      manifest("data_seed", V::kInteger, kOptional, "seed of the byte stream"),
      manifest("fault_injection", V::kString, kOptional, "none, or step=K,op=NAME,ulps=N"),
      manifest("init_perturbation_seed", V::kInteger, kOptional, "the seed of a one-ulp move of every initial weight",
               0, "harness run --perturb-init"),
      manifest("trace", V::kString, kOptional, "none or ops"),
      manifest("run_options", V::kString, kOptional, "JSON: the recipe harness replay runs again"),
      manifest("device", V::kString, kOptional, "the torch or JAX device", 0, kPythonLanes),
      manifest("precision", V::kString, kOptional, "fp32 or bf16", 0, kPythonLanes),
      manifest("autocast", V::kString, kOptional, "none or bfloat16", 0, kPythonLanes),
      manifest("deterministic", V::kInteger, kOptional, "1 when torch's deterministic algorithms were on", 0,
               kPythonLanes),
      manifest("pack", V::kString, kOptional, "the canary pack's file the run trained from", 0, kPythonLanes),
      manifest("pack_git_commit", V::kString, kOptional, "the commit that exported the pack", 0, kPythonLanes),
      manifest("audit", V::kInteger, kOptional, "1 when the step was audited for recompiles", 0, kPythonLanes),
      manifest("compile", V::kString, kOptional, "the torch.compile backend", 0, kPythonLanes),
      manifest("layout", V::kString, kOptional, "ddp or fsdp: trained on several processes", 0, kPythonLanes),
      manifest("nproc", V::kInteger, kOptional, "the processes of a ddp or fsdp layout", 0, kPythonLanes),
  });
}

void add_steps_hashes_sketches(ReceiptEntries& e) {
  e.groups.push_back({P::kSteps, kRequired, 0, kEveryWriter, "one row per step"});
  e.datasets.insert(e.datasets.end(), {
      {P::kLoss, T::kFloat64, {D::kSteps}, false, "", kRequired, 0, kEveryWriter, "the loss of batch s on params_s"},
      {P::kGradNorm, T::kFloat64, {D::kSteps}, false, "", kRequired, 0, kEveryWriter,
       "global L2 norm of step s's gradients, before clipping"},
      {P::kLr, T::kFloat64, {D::kSteps}, false, "", kRequired, 0, kEveryWriter, "the learning rate of step s"},
      {P::kBatchHash, T::kUint64, {D::kSteps}, false, "", kRequired, 0, kEveryWriter,
       "XXH3-64 of batch s's int32 tokens"},
  });
  e.groups.push_back({P::kHashes, kRequired, 0, kEveryWriter, "per step, one XXH3-64 per tensor and family"});
  e.datasets.push_back({P::kTensorNames, T::kString, {D::kAny}, false, "", kRequired, 0, kEveryWriter,
                        "the hashed tensors, in canonical order"});
  for (const char* family : kHashFamilies) {
    e.datasets.push_back({P::hashes(family), T::kUint64, {D::kSteps, D::kTensors}, false, "", kRequired,
                          0, kEveryWriter, fmt::format("the {} after step s", family)});
  }
  e.groups.push_back({P::kSketches, kRequired, 0, kEveryWriter, "per step, a value sketch per tensor"});
  e.attributes.insert(e.attributes.end(), {
      {"/sketches/method", V::kString, kOptional, 0, kEveryWriter, kSketchMethod},
      {"/sketches/width", V::kInteger, kRequired, 0, kEveryWriter, "buckets of the count sketch"},
      {"/sketches/block", V::kInteger, kRequired, 0, kEveryWriter, "elements per sketched block"},
  });
  for (const char* family : kSketchFamilies) {
    e.datasets.push_back({P::sketch_l2(family), T::kFloat64, {D::kSteps, D::kTensors}, false, "",
                          kRequired, 0, kEveryWriter, fmt::format("L2 norm of each of the {}", family)});
    e.datasets.push_back({P::sketch_projection(family), T::kFloat64,
                          {D::kSteps, D::kTensors, D::kSketchWidth}, false, "", kRequired, 0, kEveryWriter,
                          fmt::format("count sketch of each of the {}", family)});
  }
}

void add_trace(ReceiptEntries& e) {
  const char* const writer = "--trace ops";
  e.groups.push_back({P::kTrace, kOptional, 0, writer, "per step, the hash and sketch of every traced op output"});
  e.attributes.push_back({"/trace/level", V::kString, kRequired, 0, writer, "ops"});
  e.datasets.push_back({P::kTraceOpIndex, T::kInt64, {D::kAny}, false, "", kRequired, 0, writer,
                        "the op's place among the step's traced ops"});
  e.datasets.push_back({P::kTraceLayer, T::kInt64, {D::kColumns}, false, P::kTraceOpIndex, kRequired, 0, writer,
                        "block index, -1 outside the blocks"});
  for (const char* path : {P::kTraceOp, P::kTracePhase, P::kTraceTensor, P::kTraceKind}) {
    e.datasets.push_back({path, T::kString, {D::kColumns}, false, P::kTraceOpIndex, kRequired, 0, writer,
                          fmt::format("each column's {}", P::leaf(path))});
  }
  e.datasets.insert(e.datasets.end(), {
      {P::kTraceHash, T::kUint64, {D::kSteps, D::kColumns}, false, P::kTraceOpIndex, kRequired, 0, writer,
       "XXH3-64 of each traced output"},
      {P::kTraceL2, T::kFloat64, {D::kSteps, D::kColumns}, false, P::kTraceOpIndex, kRequired, 0, writer,
       "L2 norm of each traced output"},
      {P::kTraceProjection, T::kFloat64, {D::kSteps, D::kColumns, D::kSketchWidth}, false, P::kTraceOpIndex, kRequired,
       0, writer, "count sketch of each traced output"},
  });
}

// A golden's aten traces (docs/bisect.md): a step's aten ops change between steps (an
// optimizer's first step makes its state), so each step is a run of rows of flat datasets.
void add_aten_trace(ReceiptEntries& e) {
  const char* const writer = "harness golden refresh (a Python canary's candidate)";
  constexpr int since = 5;
  e.groups.push_back({P::kAtenTrace, kOptional, since, writer,
                      "per step, the hash and sketch of every aten op output, traced by a replay at refresh"});
  e.attributes.push_back({"/aten_trace/level", V::kString, kRequired, since, writer, "aten"});
  e.datasets.insert(e.datasets.end(), {
      {P::kAtenTraceOffset, T::kInt64, {D::kSteps}, false, "", kRequired, since, writer,
       "step s's first row in the datasets below"},
      {P::kAtenTraceLength, T::kInt64, {D::kSteps}, false, "", kRequired, since, writer, "step s's rows"},
      {P::kAtenTraceOpIndex, T::kInt64, {D::kAny}, false, "", kRequired, since, writer,
       "each row's op's place among its step's traced ops"},
      {P::kAtenTraceLayer, T::kInt64, {D::kColumns}, false, P::kAtenTraceOpIndex, kRequired, since, writer,
       "block index, -1 outside the blocks"},
  });
  for (const char* path : {P::kAtenTraceOp, P::kAtenTracePhase, P::kAtenTraceTensor, P::kAtenTraceKind, P::kAtenTraceSite}) {
    e.datasets.push_back({path, T::kString, {D::kColumns}, false, P::kAtenTraceOpIndex, kRequired, since, writer,
                          fmt::format("each row's {}", P::leaf(path))});
  }
  e.datasets.insert(e.datasets.end(), {
      {P::kAtenTraceHash, T::kUint64, {D::kColumns}, false, P::kAtenTraceOpIndex, kRequired, since, writer,
       "XXH3-64 of each traced output"},
      {P::kAtenTraceL2, T::kFloat64, {D::kColumns}, false, P::kAtenTraceOpIndex, kRequired, since, writer,
       "L2 norm of each traced output"},
      {P::kAtenTraceProjection, T::kFloat64, {D::kColumns, D::kSketchWidth}, false, P::kAtenTraceOpIndex, kRequired,
       since, writer, "count sketch of each traced output"},
  });
}

void add_options(ReceiptEntries& e) {
  e.groups.push_back({P::kBatches, kOptional, 0, "--record-batches", "every batch's tokens"});
  e.datasets.push_back({P::kBatchTokens, T::kInt32, {D::kSteps, D::kAny, D::kAny}, false, "", kRequired, 0,
                        "--record-batches", "batch s's tokens (B, T+1)"});
  e.groups.push_back({P::kTensors, kOptional, 0, "--dump-tensors", "parameters at the start of chosen steps"});
  e.datasets.push_back({"/tensors/*/*", T::kFloat32, {}, true, "", kOptional, 0, "--dump-tensors",
                        "step_XXXXXX/<name>: the tensor's values in its shape"});
  const char* const checkpoints = "--checkpoint-every";
  e.groups.push_back({P::kCheckpoints, kOptional, 0, checkpoints, "the run's checkpoints, beside or in the receipt"});
  e.attributes.insert(e.attributes.end(), {
      {"/checkpoints/directory", V::kString, kOptional, 0, checkpoints, "where the checkpoint files are"},
      {"/checkpoints/every", V::kInteger, kOptional, 0, checkpoints, "steps between checkpoints"},
      {"/checkpoints/storage", V::kString, kOptional, 3, checkpoints, "receipt: the checkpoints are held in the receipt"},
  });
  e.datasets.insert(e.datasets.end(), {
      {P::kCheckpointStep, T::kInt64, {D::kAny}, false, "", kOptional, 0, checkpoints, "each checkpoint's step"},
      {P::kCheckpointContentHash, T::kString, {D::kColumns}, false, P::kCheckpointStep, kOptional, 0, checkpoints,
       "each checkpoint's xxh128 content hash"},
      {P::kCheckpointOffset, T::kInt64, {D::kColumns}, false, P::kCheckpointStep, kOptional, 3, checkpoints,
       "each held checkpoint's first byte in state"},
      {P::kCheckpointLength, T::kInt64, {D::kColumns}, false, P::kCheckpointStep, kOptional, 3, checkpoints,
       "each held checkpoint's length in state"},
      {P::kCheckpointState, T::kUint8, {D::kAny}, false, "", kOptional, 3, checkpoints,
       "the held checkpoints' bytes, one after the other"},
  });
  const char* const compiled = "canary_harness (its Recorder with audit=True, the XLA and JAX lanes)";
  e.groups.push_back({P::kCompile, kOptional, 0, compiled, "per step, the compiler's counters"});
  const std::vector<ReceiptDataset> counters = compile_counters(compiled);
  e.datasets.insert(e.datasets.end(), counters.begin(), counters.end());
}

// The held-out evaluation (docs/logit-kl.md).
void add_eval(ReceiptEntries& e) {
  const char* const writer = "a canary's [eval] every (harness run); a Python canary's eval_batch";
  e.groups.push_back({P::kEval, kOptional, 4, writer, "every few steps, the logits of a fixed held-out batch"});
  e.attributes.insert(e.attributes.end(), {
      {"/eval/every", V::kInteger, kRequired, 4, writer, "steps between evaluations"},
      {"/eval/held_out_hash", V::kString, kRequired, 4, writer,
       "XXH3-64 of the held-out batch's int32 tokens (16 hex digits): the evaluations compared must share it"},
      {"/eval/source", V::kString, kRequired, 4, writer, "where the held-out batch comes from"},
  });
  e.datasets.insert(e.datasets.end(), {
      {P::kEvalStep, T::kInt64, {D::kAny}, false, "", kRequired, 4, writer,
       "each evaluation's step: it evaluates the parameters at the start of that step"},
      {P::kEvalLoss, T::kFloat64, {D::kColumns}, false, P::kEvalStep, kRequired, 4, writer,
       "each evaluation's mean loss over the whole held-out batch"},
      {P::kEvalLogits, T::kFloat32, {D::kColumns, D::kAny, D::kAny, D::kAny}, false, P::kEvalStep, kRequired, 4, writer,
       "each evaluation's logits (rows, T, V) of the held-out batch's first rows, as the forward computed them"},
      {P::kEvalTargets, T::kInt32, {D::kAny, D::kAny}, false, "", kRequired, 4, writer,
       "the recorded rows' next tokens (rows, T)"},
      {P::kEvalCompiles, T::kFloat64, {D::kColumns}, false, P::kEvalStep, kOptional, 4, writer,
       "programs each evaluation compiled (found in no cache): its forward-only program, once"},
  });
}

ReceiptEntries make_core() {
  ReceiptEntries e;
  add_manifest(e);
  add_steps_hashes_sketches(e);
  add_trace(e);
  add_aten_trace(e);
  add_options(e);
  add_eval(e);
  return e;
}

std::string joined_writers(const std::string& a, const std::string& b) {
  return a == b || a.find(b) != std::string::npos ? a : a + "; " + b;
}

template <class Entry, class Same>
void merge_into(std::vector<Entry>& into, const Entry& entry, Same same) {
  for (Entry& known : into) {
    if (known.path != entry.path) continue;
    if (!same(known, entry)) {
      throw std::logic_error(fmt::format("the receipt description gives {} two ways ({}; {})", entry.path, known.writer,
                                         entry.writer));
    }
    known.writer = joined_writers(known.writer, entry.writer);
    return;
  }
  into.push_back(entry);
}

nlohmann::json shape_json(const ReceiptDataset& d) {
  if (d.any_rank) return nullptr;
  nlohmann::json dims = nlohmann::json::array();
  for (ReceiptDim dim : d.shape) dims.push_back(to_string(dim));
  return dims;
}

std::string_view presence_word(Presence p) { return p == Presence::kRequired ? "required" : "optional"; }
// An enum's word in the export: presence_word's for Presence, to_string's for the others.
std::string_view word(Presence p) { return presence_word(p); }
template <class Enum>
std::string_view word(Enum value) {
  return receipt::to_string(value);
}

// An exported entry's field read back: the word to_string gives one of `values`.
template <class Enum, std::size_t N>
Enum parse_word(const nlohmann::json& text, const nlohmann::json& entry, const char* field, const Enum (&values)[N]) {
  for (Enum value : values) {
    if (text.is_string() && text.get<std::string>() == word(value)) return value;
  }
  throw std::invalid_argument(fmt::format("receipt description: {} of {} is {}, not a word this release knows", field,
                                          entry.at("path").dump(), text.dump()));
}
template <class Enum, std::size_t N>
Enum from_word(const nlohmann::json& entry, const char* field, const Enum (&values)[N]) {
  return parse_word(entry.at(field), entry, field, values);
}

constexpr Presence kPresences[] = {Presence::kOptional, Presence::kRequired};
constexpr ReceiptDtype kDtypes[] = {T::kFloat64, T::kFloat32, T::kUint64, T::kInt64, T::kInt32, T::kUint8, T::kString};
constexpr ReceiptDim kDims[] = {D::kSteps, D::kTensors, D::kSketchWidth, D::kColumns, D::kAny};
constexpr ReceiptValue kKinds[] = {V::kString, V::kInteger, V::kFloat};
constexpr CounterGate kGates[] = {CounterGate::kNone, CounterGate::kCompilesAfterWarmup, CounterGate::kHostSyncs,
                                  CounterGate::kPeakBytes};
constexpr DecisionRecord kDecisions[] = {DecisionRecord::kNone, DecisionRecord::kHash, DecisionRecord::kCount};
constexpr AttributeRole kRoles[] = {AttributeRole::kNone, AttributeRole::kReductionOrder, AttributeRole::kReductionSeed};

ReceiptGroup group_from_json(const nlohmann::json& g) {
  return {g.at("path").get<std::string>(), from_word(g, "presence", kPresences), g.at("since_minor").get<int>(),
          g.at("writer").get<std::string>(), g.at("meaning").get<std::string>()};
}

ReceiptDataset dataset_from_json(const nlohmann::json& d) {
  ReceiptDataset out;
  out.path = d.at("path").get<std::string>();
  out.dtype = from_word(d, "dtype", kDtypes);
  const nlohmann::json& shape = d.at("shape");
  out.any_rank = shape.is_null();
  if (!out.any_rank) {
    for (const nlohmann::json& dim : shape) out.shape.push_back(parse_word(dim, d, "shape", kDims));
  }
  if (!d.at("columns").is_null()) out.columns = d.at("columns").get<std::string>();
  out.presence = from_word(d, "presence", kPresences);
  out.since_minor = d.at("since_minor").get<int>();
  out.writer = d.at("writer").get<std::string>();
  out.meaning = d.at("meaning").get<std::string>();
  out.gate = from_word(d, "gate", kGates);
  out.decision = from_word(d, "decision", kDecisions);
  return out;
}

ReceiptAttribute attribute_from_json(const nlohmann::json& a) {
  return {a.at("path").get<std::string>(), from_word(a, "kind", kKinds),      from_word(a, "presence", kPresences),
          a.at("since_minor").get<int>(),  a.at("writer").get<std::string>(), a.at("meaning").get<std::string>(),
          from_word(a, "role", kRoles)};
}

}  // namespace

std::string_view to_string(ReceiptDtype dtype) {
  switch (dtype) {
    case T::kFloat64: return "float64";
    case T::kFloat32: return "float32";
    case T::kUint64: return "uint64";
    case T::kInt64: return "int64";
    case T::kInt32: return "int32";
    case T::kUint8: return "uint8";
    case T::kString: return "string";
  }
  return "?";
}

std::string_view to_string(ReceiptValue kind) {
  switch (kind) {
    case V::kString: return "string";
    case V::kInteger: return "integer";
    case V::kFloat: return "float";
  }
  return "?";
}

std::string_view to_string(ReceiptDim dim) {
  switch (dim) {
    case D::kSteps: return "steps";
    case D::kTensors: return "tensors";
    case D::kSketchWidth: return "sketch_width";
    case D::kColumns: return "columns";
    case D::kAny: return "any";
  }
  return "?";
}

std::string_view to_string(CounterGate gate) {
  switch (gate) {
    case CounterGate::kNone: return "none";
    case CounterGate::kCompilesAfterWarmup: return "compiles_after_warmup";
    case CounterGate::kHostSyncs: return "host_syncs";
    case CounterGate::kPeakBytes: return "peak_bytes";
  }
  return "?";
}

std::string_view to_string(DecisionRecord decision) {
  switch (decision) {
    case DecisionRecord::kNone: return "none";
    case DecisionRecord::kHash: return "hash";
    case DecisionRecord::kCount: return "count";
  }
  return "?";
}

std::string_view to_string(AttributeRole role) {
  switch (role) {
    case AttributeRole::kNone: return "none";
    case AttributeRole::kReductionOrder: return "reduction_order";
    case AttributeRole::kReductionSeed: return "reduction_seed";
  }
  return "?";
}

const ReceiptEntries& core_receipt_entries() {
  static const ReceiptEntries entries = make_core();
  return entries;
}

ReceiptSchema::ReceiptSchema(const ReceiptEntries& entries) {
  for (const ReceiptGroup& g : entries.groups) {
    merge_into(entries_.groups, g, [](const ReceiptGroup& a, const ReceiptGroup& b) { return a.presence == b.presence; });
  }
  for (const ReceiptDataset& d : entries.datasets) {
    merge_into(entries_.datasets, d, [](const ReceiptDataset& a, const ReceiptDataset& b) {
      return a.dtype == b.dtype && a.shape == b.shape && a.any_rank == b.any_rank && a.columns == b.columns &&
             a.presence == b.presence && a.gate == b.gate && a.decision == b.decision;
    });
  }
  for (const ReceiptAttribute& a : entries.attributes) {
    merge_into(entries_.attributes, a,
               [](const ReceiptAttribute& x, const ReceiptAttribute& y) {
                 return x.kind == y.kind && x.presence == y.presence && x.role == y.role;
               });
  }
}

const ReceiptSchema& ReceiptSchema::core() {
  static const ReceiptSchema schema(core_receipt_entries());
  return schema;
}

bool path_matches(std::string_view pattern, std::string_view path) {
  for (;;) {
    const std::size_t p = pattern.find('/', 1), q = path.find('/', 1);
    const std::string_view head = pattern.substr(0, p), got = path.substr(0, q);
    if (head != "/*" && head != got) return false;
    if (got.size() < 2) return false;  // "/*" matches a name, never an empty one
    if (p == std::string_view::npos || q == std::string_view::npos) return p == q;
    pattern.remove_prefix(p);
    path.remove_prefix(q);
  }
}

const ReceiptGroup* ReceiptSchema::group(std::string_view path) const {
  for (const ReceiptGroup& g : entries_.groups) {
    if (g.path == path) return &g;
  }
  return nullptr;
}

const ReceiptDataset* ReceiptSchema::dataset(std::string_view path) const {
  for (const ReceiptDataset& d : entries_.datasets) {
    if (d.path == path) return &d;
  }
  for (const ReceiptDataset& d : entries_.datasets) {
    if (d.path.find('*') != std::string::npos && path_matches(d.path, path)) return &d;
  }
  return nullptr;
}

const ReceiptAttribute* ReceiptSchema::attribute(std::string_view group, std::string_view name) const {
  const std::string path = fmt::format("{}/{}", group, name);
  for (const ReceiptAttribute& a : entries_.attributes) {
    if (a.path == path) return &a;
  }
  return nullptr;
}

nlohmann::json ReceiptSchema::to_json() const {
  nlohmann::json groups = nlohmann::json::array(), datasets = nlohmann::json::array(),
                 attributes = nlohmann::json::array();
  for (const ReceiptGroup& g : entries_.groups) {
    groups.push_back({{"path", g.path}, {"presence", presence_word(g.presence)}, {"since_minor", g.since_minor},
                      {"writer", g.writer}, {"meaning", g.meaning}});
  }
  for (const ReceiptDataset& d : entries_.datasets) {
    datasets.push_back({{"path", d.path}, {"dtype", to_string(d.dtype)}, {"shape", shape_json(d)},
                        {"columns", d.columns.empty() ? nlohmann::json(nullptr) : nlohmann::json(d.columns)},
                        {"presence", presence_word(d.presence)}, {"since_minor", d.since_minor}, {"writer", d.writer},
                        {"meaning", d.meaning}, {"gate", to_string(d.gate)}, {"decision", to_string(d.decision)}});
  }
  for (const ReceiptAttribute& a : entries_.attributes) {
    attributes.push_back({{"path", a.path}, {"kind", to_string(a.kind)}, {"presence", presence_word(a.presence)},
                          {"since_minor", a.since_minor}, {"writer", a.writer}, {"meaning", a.meaning},
                          {"role", to_string(a.role)}});
  }
  std::vector<std::string> hash_families(std::begin(kHashFamilies), std::end(kHashFamilies));
  std::vector<std::string> sketch_families(std::begin(kSketchFamilies), std::end(kSketchFamilies));
  nlohmann::json named_paths = nlohmann::json::object();
  for (const auto& [name, path] : P::named()) named_paths[std::string(name)] = std::string(path);
  return {{"schema_version", kSchemaVersion},
          {"schema_minor", kSchemaMinor},
          {"constants",
           {{"sketch_width", kSketchWidth},
            {"sketch_block", kSketchBlock},
            {"sketch_method", kSketchMethod},
            {"hash_families", hash_families},
            {"sketch_families", sketch_families},
            {"checkpoints_in_receipt", kCheckpointsInReceipt},
            {"paths", named_paths}}},
          {"groups", groups},
          {"datasets", datasets},
          {"attributes", attributes}};
}

ReceiptSchema ReceiptSchema::from_json(const nlohmann::json& description) {
  try {
    if (description.at("schema_version").get<std::int64_t>() != kSchemaVersion) {
      throw std::invalid_argument(fmt::format("receipt description: schema_version {}; this release writes {}",
                                              description.at("schema_version").dump(), kSchemaVersion));
    }
    ReceiptEntries entries;
    for (const nlohmann::json& g : description.at("groups")) entries.groups.push_back(group_from_json(g));
    for (const nlohmann::json& d : description.at("datasets")) entries.datasets.push_back(dataset_from_json(d));
    for (const nlohmann::json& a : description.at("attributes")) entries.attributes.push_back(attribute_from_json(a));
    return ReceiptSchema(entries);
  } catch (const nlohmann::json::exception& e) {  // a missing field or one of another type
    throw std::invalid_argument(fmt::format("receipt description: {}", e.what()));
  }
}

}  // namespace harness::receipt
