// The receipt writer behind its C ABI (libcanary_harness_receipt, receipt/receipt_c_api.h)
// writes what the C++ writer writes, dataset for dataset and byte for byte, from the
// description's export read back; and bad calls are one-line errors that leave no file.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "full_receipt_schema.h"
#include "receipt/hdf5_file.h"
#include "receipt/receipt_c_api.h"
#include "receipt/receipt_schema.h"
#include "receipt/receipt_validator.h"
#include "receipt/receipt_writer.h"
#include "scratch_dir.h"

namespace harness::receipt {
namespace {

namespace fs = std::filesystem;

// ---- the description's export, read back ----

TEST(ReceiptDescription, ExportReadsBackToTheSameDescription) {
  for (const ReceiptSchema* schema : {&ReceiptSchema::core(), &run::full_receipt_schema()}) {
    const nlohmann::json exported = schema->to_json();
    EXPECT_EQ(ReceiptSchema::from_json(exported).to_json(), exported);
  }
}

std::string from_json_error(const nlohmann::json& description) {
  try {
    ReceiptSchema::from_json(description);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "read";
}

TEST(ReceiptDescription, AnUnreadableEntryIsRefusedByItsFieldAndPath) {
  const nlohmann::json good = run::full_receipt_schema().to_json();
  nlohmann::json bad = good;
  bad["datasets"][0]["dtype"] = "float128";
  const std::string path = good["datasets"][0]["path"].get<std::string>();
  EXPECT_NE(from_json_error(bad).find("dtype of \"" + path + "\" is \"float128\""), std::string::npos)
      << from_json_error(bad);
  bad = good;
  bad["attributes"][1]["kind"] = 3;
  EXPECT_NE(from_json_error(bad).find("kind of"), std::string::npos) << from_json_error(bad);
  bad = good;
  bad["schema_version"] = kSchemaVersion + 1;
  EXPECT_NE(from_json_error(bad).find("schema_version"), std::string::npos);
  bad = good;
  bad.erase("groups");
  EXPECT_NE(from_json_error(bad).find("receipt description:"), std::string::npos);
}

// ---- one receipt, written by both ----

constexpr int kSteps = 3, kTensors = 2, kColumns = 3, kRows = 2, kTokens = 4, kVocab = 5;
const std::vector<std::string> kNames = {"wte", "blocks.0.mlp.w"};

Manifest test_manifest() {
  Manifest m;
  m.lane = "python-canary";
  m.engine = "torch";
  m.canary_json = R"({"name":"own"})";
  m.created_utc = "2026-11-30T00:00:00Z";
  m.seed = 7;
  m.steps_planned = kSteps;
  m.threads = 1;
  m.extra = {{"budget_features", std::string("")}, {"device", std::string("cpu")}, {"learning_rate", 0.25}};
  return m;
}

// Step s's values: every field differs by step and by position, so a row or column that
// went to the wrong place shows.
StepRecord step_record(int s) {
  StepRecord r;
  r.loss = 2.5 - 0.1 * s;
  r.grad_norm = 1.0 + s;
  r.lr = 1e-3 * (s + 1);
  r.batch_hash = 0x9e3779b97f4a7c15ULL * static_cast<std::uint64_t>(s + 1);
  for (int f = 0; f < 4; ++f) {
    for (int k = 0; k < kTensors; ++k) r.hashes[f].push_back(static_cast<std::uint64_t>(1000 * s + 10 * f + k));
  }
  for (int f = 0; f < 2; ++f) {
    for (int k = 0; k < kTensors; ++k) {
      TensorSketch sketch;
      sketch.l2 = 0.5 * s + f + 0.125 * k;
      for (int i = 0; i < kSketchWidth; ++i) sketch.projection[static_cast<std::size_t>(i)] = s - i * 0.25 + f + k;
      r.sketches[static_cast<std::size_t>(f)].push_back(sketch);
    }
  }
  return r;
}

std::vector<std::int32_t> batch_tokens(int s) {
  std::vector<std::int32_t> tokens;
  for (int i = 0; i < kRows * (kTokens + 1); ++i) tokens.push_back((s + i) % kVocab);
  return tokens;
}

std::vector<TraceColumn> trace_columns() {
  return {{0, "blocks.0.attn", 0, "forward", "out", "activation"},
          {1, "blocks.0.mlp", 0, "forward", "out", "activation"},
          {2, "lm_head", -1, "backward", "grad", "gradient"}};
}

TraceStep trace_step(int s) {
  TraceStep t;
  for (int c = 0; c < kColumns; ++c) {
    t.hashes.push_back(static_cast<std::uint64_t>(77 * s + c));
    TensorSketch sketch;
    sketch.l2 = s + 0.5 * c;
    sketch.projection.fill(-1.0 * c - s);
    t.sketches.push_back(sketch);
  }
  return t;
}

StepState compile_state(int s) { return {"compile", {}, {{"UncachedCompile", {s == 0 ? 2.0 : 0.0}}, {"HostSync", {1.0}}}}; }

std::vector<std::int32_t> eval_targets() { return {1, 2, 3, 4, 0, 1, 2, 3}; }
std::vector<float> eval_logits(int s) {
  std::vector<float> logits(kRows * kTokens * kVocab);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i) * 0.5f - static_cast<float>(s);
  return logits;
}
std::vector<std::uint8_t> checkpoint_state(int s) { return std::vector<std::uint8_t>(100 + 37 * s, static_cast<std::uint8_t>(s + 1)); }
const std::vector<float> kDump = {1.5f, -2.0f, 0.25f, 8.0f, 3.0f, -1.0f};

// The C++ writer itself: what `harness run` would write of this run.
void write_with_the_writer(const std::string& path) {
  ReceiptWriter w(path, test_manifest(), kNames, false, true, {kRows, kTokens + 1}, run::full_receipt_schema());
  w.declare_held_checkpoints(2);
  w.declare_eval({2, 0xfeedULL, "held-out", kRows, kTokens, kVocab, eval_targets()});
  for (int s = 0; s < kSteps; ++s) {
    if (s % 2 == 0) w.add_held_checkpoint(s, checkpoint_state(s));
    w.append_batch(batch_tokens(s));
    w.append_state({compile_state(s)});
    w.append_trace(trace_columns(), trace_step(s));
    w.append_step(step_record(s));
    if (s % 2 == 0) w.add_eval(s, 3.0 - s, eval_logits(s), s == 0 ? 1.0 : 0.0);
  }
  w.dump_tensor(0, "wte", {2, 3}, kDump);
  w.finish();
}

// What a caller of another language passes: flat arrays and C strings.
struct CStrings {
  explicit CStrings(const std::vector<std::string>& values) {
    for (const std::string& v : values) pointers.push_back(v.c_str());
  }
  std::vector<const char*> pointers;
};

std::vector<canary_receipt_attribute> c_attributes(const ManifestAttributes& attributes) {
  std::vector<canary_receipt_attribute> out;
  for (const auto& [name, value] : attributes) {
    canary_receipt_attribute a{name.c_str(), 0, nullptr, 0, 0.0};
    if (const auto* text = std::get_if<std::string>(&value)) a.text = text->c_str();
    if (const auto* integer = std::get_if<std::int64_t>(&value)) a.kind = 1, a.integer = *integer;
    if (const auto* real = std::get_if<double>(&value)) a.kind = 2, a.real = *real;
    out.push_back(a);
  }
  return out;
}

class CWriter {
 public:
  explicit CWriter(const std::string& path) {
    const ManifestAttributes attributes = manifest_attributes(test_manifest());
    const std::vector<canary_receipt_attribute> c = c_attributes(attributes);
    const CStrings names(kNames);
    writer_ = canary_receipt_create(path.c_str(), 0, description().c_str(), c.size(), c.data(), names.pointers.size(),
                                    names.pointers.data(), kRows, kTokens + 1, error_, sizeof error_);
    EXPECT_NE(writer_, nullptr) << error_;
  }
  ~CWriter() { canary_receipt_close(writer_, 0); }
  static const std::string& description() {
    static const std::string text = run::full_receipt_schema().to_json().dump();
    return text;
  }
  // A call that must succeed.
  void ok(int status) { EXPECT_EQ(status, 0) << error_; }

  void append_step(int s) {
    const StepState state = compile_state(s);
    const std::vector<std::string> fields = {state.fields[0].first, state.fields[1].first};
    const CStrings field_names(fields);
    const double values[] = {state.fields[0].second[0], state.fields[1].second[0]};
    ok(canary_receipt_stage_state(writer_, "compile", 0, nullptr, 2, field_names.pointers.data(), values, error_,
                                  sizeof error_));
    stage_trace(s);
    const StepRecord r = step_record(s);
    std::vector<std::uint64_t> hashes;
    for (const auto& family : r.hashes) hashes.insert(hashes.end(), family.begin(), family.end());
    std::vector<double> l2, projection;
    for (const auto& family : r.sketches) split_sketches(family, l2, projection);
    const std::vector<std::int32_t> tokens = batch_tokens(s);
    ok(canary_receipt_append_step(writer_, r.loss, r.grad_norm, r.lr, r.batch_hash, hashes.data(), l2.data(),
                                  projection.data(), tokens.data(), error_, sizeof error_));
  }

  void stage_trace(int s) {
    const TraceStep t = trace_step(s);
    std::vector<double> l2, projection;
    split_sketches(t.sketches, l2, projection);
    if (s > 0) {  // the columns once, at the first step
      ok(canary_receipt_stage_trace(writer_, kColumns, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                    t.hashes.data(), l2.data(), projection.data(), error_, sizeof error_));
      return;
    }
    std::vector<std::int64_t> op_index, layer;
    std::vector<std::string> op, phase, tensor, kind;
    for (const TraceColumn& c : trace_columns()) {
      op_index.push_back(c.op_index), layer.push_back(c.layer), op.push_back(c.op), phase.push_back(c.phase);
      tensor.push_back(c.tensor), kind.push_back(c.kind);
    }
    const CStrings ops(op), phases(phase), tensors(tensor), kinds(kind);
    ok(canary_receipt_stage_trace(writer_, kColumns, op_index.data(), layer.data(), ops.pointers.data(),
                                  phases.pointers.data(), tensors.pointers.data(), kinds.pointers.data(),
                                  t.hashes.data(), l2.data(), projection.data(), error_, sizeof error_));
  }

  canary_receipt_writer* writer_ = nullptr;
  char error_[512] = "";
};

void write_through_the_c_api(const std::string& path) {
  CWriter c(path);
  ASSERT_NE(c.writer_, nullptr);
  c.ok(canary_receipt_declare_checkpoints(c.writer_, 2, c.error_, sizeof c.error_));
  const std::vector<std::int32_t> targets = eval_targets();
  c.ok(canary_receipt_declare_eval(c.writer_, 2, 0xfeedULL, "held-out", kRows, kTokens, kVocab, targets.data(),
                                   c.error_, sizeof c.error_));
  for (int s = 0; s < kSteps; ++s) {
    if (s % 2 == 0) {
      const std::vector<std::uint8_t> state = checkpoint_state(s);
      char hash[48];
      c.ok(canary_receipt_add_checkpoint(c.writer_, s, state.data(), state.size(), hash, sizeof hash, c.error_,
                                         sizeof c.error_));
      EXPECT_EQ(std::strlen(hash), 39u) << hash;
    }
    c.append_step(s);
    if (s % 2 == 0) {
      const std::vector<float> logits = eval_logits(s);
      c.ok(canary_receipt_add_eval(c.writer_, s, 3.0 - s, logits.data(), s == 0 ? 1.0 : 0.0, c.error_, sizeof c.error_));
    }
  }
  const std::int64_t shape[] = {2, 3};
  c.ok(canary_receipt_dump_tensor(c.writer_, 0, "wte", 2, shape, kDump.data(), c.error_, sizeof c.error_));
  c.ok(canary_receipt_finish(c.writer_, c.error_, sizeof c.error_));
}

// A dataset's stored bytes, in its own file type: equal bytes, equal values.
std::vector<char> stored_bytes(hid_t file, const std::string& path) {
  const h5::Handle dataset(H5Dopen2(file, path.c_str(), H5P_DEFAULT), H5Dclose, "open " + path);
  const h5::Handle type(H5Dget_type(dataset), H5Tclose, "type of " + path);
  const h5::Handle space(H5Dget_space(dataset), H5Sclose, "space of " + path);
  std::vector<char> bytes(static_cast<std::size_t>(H5Sget_simple_extent_npoints(space)) * H5Tget_size(type));
  if (!bytes.empty()) {
    EXPECT_GE(H5Dread(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()), 0) << path;
  }
  return bytes;
}

std::map<std::string, std::string> attributes_as_text(hid_t object) {
  std::map<std::string, std::string> out;
  for (const std::string& name : h5::attr_names(object)) {
    switch (h5::attr_kind(object, name)) {
      case h5::AttrKind::kString: out[name] = h5::read_attr_string(object, name); break;
      case h5::AttrKind::kInteger: out[name] = std::to_string(h5::read_attr_int(object, name)); break;
      default: out[name] = std::to_string(h5::read_attr_double(object, name)); break;
    }
  }
  return out;
}

TEST(ReceiptCApi, WritesWhatTheCppWriterWritesByteForByte) {
  h5::silence_library_errors();
  const testing::ScratchDir scratch;
  const std::string cpp = scratch.path("cpp.h5"), c = scratch.path("c.h5");
  write_with_the_writer(cpp);
  write_through_the_c_api(c);
  {
    const ValidationReport report = validate_receipt(c, run::full_receipt_schema());
    EXPECT_TRUE(report.valid()) << (report.problems.empty() ? "" : report.problems[0]);
  }

  const h5::Handle a = h5::open_file(cpp, false), b = h5::open_file(c, false);
  const std::vector<h5::DatasetInfo> datasets = h5::list_datasets(a);
  ASSERT_EQ(datasets.size(), h5::list_datasets(b).size());
  EXPECT_EQ(h5::list_groups(a), h5::list_groups(b));
  for (const h5::DatasetInfo& d : datasets) {
    EXPECT_EQ(h5::dataset_shape(b, d.path), d.shape) << d.path;
    EXPECT_EQ(stored_bytes(b, d.path), stored_bytes(a, d.path)) << d.path;
  }
  for (const std::string& group : h5::list_groups(a)) {
    const h5::Handle ga = h5::open_group(a, group), gb = h5::open_group(b, group);
    EXPECT_EQ(attributes_as_text(gb), attributes_as_text(ga)) << group;
  }
  // Values the test itself knows, so that two writers equally wrong would still fail.
  EXPECT_EQ(h5::read_f64(b, "/steps/loss"), (std::vector<double>{2.5, 2.4, 2.3}));
  EXPECT_EQ(h5::read_i64(b, "/checkpoints/offset"), (std::vector<std::int64_t>{0, 100}));
  EXPECT_EQ(h5::read_i64(b, "/checkpoints/length"), (std::vector<std::int64_t>{100, 174}));
  EXPECT_EQ(h5::read_f32(b, "/tensors/step_000000/wte"), kDump);
  EXPECT_EQ(h5::read_attr_int(h5::open_group(b, "/manifest"), "complete"), 1);
}

// A Python canary learns its vocabulary from the first logits: /eval is declared after
// steps, once the file is in SWMR mode, and the steps after it still append.
TEST(ReceiptCApi, AnEvaluationDeclaredAfterStepsIsWrittenAndStepsGoOn) {
  h5::silence_library_errors();
  const testing::ScratchDir scratch;
  const std::string path = scratch.path("late_eval.h5");
  {
    CWriter c(path);
    ASSERT_NE(c.writer_, nullptr);
    c.append_step(0);
    c.append_step(1);
    const std::vector<std::int32_t> targets = eval_targets();
    c.ok(canary_receipt_declare_eval(c.writer_, 2, 0xfeedULL, "held-out", kRows, kTokens, kVocab, targets.data(),
                                     c.error_, sizeof c.error_));
    const std::vector<float> logits = eval_logits(2);
    c.ok(canary_receipt_add_eval(c.writer_, 2, 1.5, logits.data(), 0.0, c.error_, sizeof c.error_));
    c.append_step(2);
    EXPECT_NE(canary_receipt_declare_eval(c.writer_, 2, 0xfeedULL, "again", kRows, kTokens, kVocab, targets.data(),
                                          c.error_, sizeof c.error_),
              0);
    EXPECT_NE(std::string(c.error_).find("declared once"), std::string::npos) << c.error_;
    c.ok(canary_receipt_finish(c.writer_, c.error_, sizeof c.error_));
  }
  const ValidationReport report = validate_receipt(path, run::full_receipt_schema());
  EXPECT_TRUE(report.valid()) << (report.problems.empty() ? "" : report.problems[0]);
  const h5::Handle file = h5::open_file(path, false);
  EXPECT_EQ(h5::read_f64(file, "/steps/loss"), (std::vector<double>{2.5, 2.4, 2.3}));
  EXPECT_EQ(h5::read_i64(file, "/eval/step"), (std::vector<std::int64_t>{2}));
  EXPECT_EQ(h5::read_f32(file, "/eval/logits"), eval_logits(2));
  EXPECT_EQ(h5::read_f64(file, "/compile/HostSync"), (std::vector<double>{1.0, 1.0, 1.0}));
}

// ---- bad calls ----

TEST(ReceiptCApi, BadCallsAreOneLineErrorsAndLeaveNoFile) {
  h5::silence_library_errors();
  const testing::ScratchDir scratch;
  char error[512] = "";
  const std::string description = CWriter::description();
  const CStrings names(kNames);
  // A manifest attribute of another kind than its description's.
  ManifestAttributes attributes = manifest_attributes(test_manifest());
  attributes.emplace_back("cpu_capability", std::int64_t{3});
  std::vector<canary_receipt_attribute> c = c_attributes(attributes);
  const std::string path = scratch.path("bad.h5");
  EXPECT_EQ(canary_receipt_create(path.c_str(), 0, description.c_str(), c.size(), c.data(), 2, names.pointers.data(),
                                  0, 0, error, sizeof error),
            nullptr);
  EXPECT_NE(std::string(error).find("cpu_capability"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(path));
  // One HDF5 refuses once the file exists (an attribute without a name): the file goes too.
  c.back().name = "";
  EXPECT_EQ(canary_receipt_create(path.c_str(), 0, description.c_str(), c.size(), c.data(), 2, names.pointers.data(),
                                  0, 0, error, sizeof error),
            nullptr);
  EXPECT_EQ(std::string(error).rfind(path, 0), 0u) << error;
  EXPECT_FALSE(fs::exists(path)) << "a create that failed part-way left its file";
  c.back().name = "cpu_capability";
  // A description this release cannot read.
  EXPECT_EQ(canary_receipt_create(path.c_str(), 0, "{\"schema_version\": 1}", 0, nullptr, 0, nullptr, 0, 0, error,
                                  sizeof error),
            nullptr);
  EXPECT_NE(std::string(error).find(path + ": receipt description"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(path));
  // Step state the description does not know: refused, the receipt keeps its steps.
  {
    CWriter w(path);
    const char* field = "x";
    const double value = 1;
    w.ok(canary_receipt_stage_state(w.writer_, "nowhere", 0, nullptr, 1, &field, &value, error, sizeof error));
    std::vector<std::uint64_t> hashes(4 * kTensors);
    std::vector<double> l2(2 * kTensors), projection(2 * kTensors * kSketchWidth);
    const std::vector<std::int32_t> tokens = batch_tokens(0);
    EXPECT_EQ(canary_receipt_append_step(w.writer_, 1, 1, 1, 1, hashes.data(), l2.data(), projection.data(),
                                         tokens.data(), error, sizeof error),
              1);
    EXPECT_NE(std::string(error).find("/nowhere/x is not in the receipt description"), std::string::npos) << error;
    EXPECT_EQ(std::string(error).find('\n'), std::string::npos) << error;
    // The staging went with the failed step: the next one is written.
    w.ok(canary_receipt_append_step(w.writer_, 1, 1, 1, 1, hashes.data(), l2.data(), projection.data(), tokens.data(),
                                    w.error_, sizeof w.error_));
    // No tokens for a receipt that records them.
    EXPECT_EQ(canary_receipt_append_step(w.writer_, 1, 1, 1, 1, hashes.data(), l2.data(), projection.data(), nullptr,
                                         error, sizeof error),
              1);
    EXPECT_NE(std::string(error).find("records batches"), std::string::npos) << error;
  }
  EXPECT_TRUE(fs::exists(path));  // closed unfinished: its flushed step stays
  // An existing file is refused, and kept.
  const auto before = fs::file_size(path);
  EXPECT_EQ(canary_receipt_create(path.c_str(), 0, description.c_str(), c.size() - 1, c.data(), 2,
                                  names.pointers.data(), 0, 0, error, sizeof error),
            nullptr);
  EXPECT_EQ(std::string(error).rfind(path, 0), 0u) << error;
  EXPECT_EQ(fs::file_size(path), before);
  // Discarded: gone.
  canary_receipt_writer* w = canary_receipt_create(path.c_str(), 1, description.c_str(), c.size() - 1, c.data(), 2,
                                                   names.pointers.data(), 0, 0, error, sizeof error);
  ASSERT_NE(w, nullptr) << error;
  canary_receipt_close(w, 1);
  EXPECT_FALSE(fs::exists(path));
}

}  // namespace
}  // namespace harness::receipt
