// Receipts: what a run writes can be read back, hashes can be recomputed from dumps,
// and every kind of bad file is a named error, never a crash.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "byte_stream.h"
#include "canary_run.h"
#include "file_io.h"
#include "numerics/philox.h"
#include "receipt/hdf5_file.h"
#include "receipt/receipt_reader.h"
#include "scratch_dir.h"
#include "tensor_digest.h"

namespace harness::receipt {
namespace {

namespace fs = std::filesystem;

class ReceiptFiles : public ::testing::Test {
 protected:
  void SetUp() override { h5::silence_library_errors(); }
  std::string path(const std::string& name) const { return scratch_.path(name); }

  std::string write_micro(const std::string& name, int steps, std::vector<int> dumps = {}) {
    run::RunOptions o;
    o.canary = "micro";
    o.steps = steps;
    o.out = path(name);
    o.dump_steps = std::move(dumps);
    o.record_batches = true;
    run::run_canary(o);
    return o.out;
  }

  static std::string error_of(const std::string& file) {
    try {
      ReceiptReader r(file);
    } catch (const ReceiptError& e) {
      return e.what();
    }
    return "opened";
  }

  harness::testing::ScratchDir scratch_;
};

TEST_F(ReceiptFiles, RoundTripsManifestStepsAndHashes) {
  const std::string file = write_micro("micro.h5", 5);
  const ReceiptReader r(file);
  EXPECT_TRUE(r.complete());
  EXPECT_EQ(r.steps_recorded(), 5);
  EXPECT_EQ(r.steps_planned(), 5);
  EXPECT_EQ(r.manifest_string("lane"), "micro/cpu-ref");
  EXPECT_EQ(r.manifest_string("engine"), "cpu-ref");
  EXPECT_EQ(r.manifest_int("seed"), 1337);
  EXPECT_NE(r.manifest_string("canary").find("\"preset\":\"micro\""), std::string::npos);
  for (const char* attr : {"created_utc", "git_commit", "toolchain", "libraries", "host", "cpu", "fault_injection"}) {
    EXPECT_FALSE(r.manifest_string(attr).empty()) << attr;
  }
  const auto names = r.tensor_names();
  EXPECT_EQ(names.front(), "wte");
  EXPECT_EQ(names.back(), "lnf.bias");
  EXPECT_EQ(r.hashes("params").size(), 5 * names.size());
  const auto loss = r.f64(harness::receipt::paths::kLoss);
  EXPECT_GT(loss.front(), 4.0);  // about ln 128 at init
  EXPECT_EQ(h5::dataset_shape(r.file(), "/batches/tokens"), (std::vector<hsize_t>{5, 2, 17}));
  EXPECT_EQ(h5::dataset_shape(r.file(), "/sketches/params_projection"), (std::vector<hsize_t>{5, names.size(), 16}));
}

// params_s is dumped at the start of step s; /hashes/params row s-1 hashes the same
// tensor (after step s-1's update). Recomputing it from the dump closes the loop.
TEST_F(ReceiptFiles, HashRecomputedFromDumpedTensorMatches) {
  const std::string file = write_micro("dump.h5", 4, {0, 3, 4});
  const ReceiptReader r(file);
  const auto names = r.tensor_names();
  const auto hashes = r.hashes("params");
  for (int step : {3, 4}) {
    for (std::size_t k = 0; k < names.size(); ++k) {
      const std::string dataset = "/tensors/step_00000" + std::to_string(step) + "/" + names[k];
      const std::vector<float> values = h5::read_f32(r.file(), dataset);
      EXPECT_EQ(run::tensor_hash(values), hashes[static_cast<std::size_t>(step - 1) * names.size() + k]) << dataset;
    }
  }
  EXPECT_TRUE(h5::exists(r.file(), "/tensors/step_000000/wte"));
  EXPECT_EQ(h5::dataset_shape(r.file(), "/tensors/step_000000/wte"), (std::vector<hsize_t>{128, 32}));
}

TEST_F(ReceiptFiles, BadFilesAreNamedErrors) {
  EXPECT_NE(error_of(path("missing.h5")).find("no such file"), std::string::npos);
  std::ofstream(path("text.h5")) << "not hdf5 at all\n";
  EXPECT_NE(error_of(path("text.h5")).find("not an HDF5 file"), std::string::npos);

  const std::string good = write_micro("good.h5", 3);
  const auto size = fs::file_size(good);
  fs::copy_file(good, path("truncated.h5"));
  fs::resize_file(path("truncated.h5"), size / 2);
  const std::string truncated = error_of(path("truncated.h5"));
  EXPECT_TRUE(truncated.find("truncated or corrupt") != std::string::npos ||
              truncated.find("not an HDF5 file") != std::string::npos || truncated.find("missing") != std::string::npos)
      << truncated;

  fs::copy_file(good, path("future.h5"));
  {
    const h5::Handle f = h5::open_file(path("future.h5"), true);
    const h5::Handle m = h5::open_group(f, "manifest");
    h5::write_attr(m, "schema_version", kSchemaVersion + 1);
  }
  const std::string future = error_of(path("future.h5"));
  EXPECT_NE(future.find("written by a newer harness"), std::string::npos) << future;
  EXPECT_NE(future.find("upgrade the harness"), std::string::npos) << future;

  fs::copy_file(good, path("ancient.h5"));
  {
    const h5::Handle f = h5::open_file(path("ancient.h5"), true);
    const h5::Handle m = h5::open_group(f, "manifest");
    h5::write_attr(m, "schema_version", kSchemaVersion - 1);
  }
  EXPECT_NE(error_of(path("ancient.h5")).find("re-record the receipt with this harness"), std::string::npos);

  {
    const h5::Handle f = h5::create_file(path("foreign.h5"), false);
    h5::create_group(f, "data");
  }
  EXPECT_NE(error_of(path("foreign.h5")).find("no /manifest group"), std::string::npos);
}

// Schema evolution: a newer minor adds content an older reader ignores.
TEST_F(ReceiptFiles, NewerMinorWithExtraContentIsRead) {
  const std::string good = write_micro("newer_minor.h5", 3);
  {
    const h5::Handle f = h5::open_file(good, true);
    const h5::Handle m = h5::open_group(f, "manifest");
    h5::write_attr(m, "schema_minor", kSchemaMinor + 5);
    h5::write_attr(m, "from_the_future", std::string("an attribute this harness does not know"));
    const h5::Handle extra = h5::create_group(f, "future_group");
    h5::write_string_dataset(extra, "names", {"a", "b"});
  }
  const ReceiptReader reader(good);
  EXPECT_EQ(reader.schema_version(), kSchemaVersion);
  EXPECT_EQ(reader.schema_minor(), kSchemaMinor + 5);
  EXPECT_EQ(reader.steps_recorded(), 3);
  EXPECT_EQ(reader.tensor_names().size(), reader.hashes("params").size() / 3);
}

// The file format of schema minor 1: HDF5 1.10 metadata, fixed-length strings, and a
// Fletcher32 checksum on every dataset.
TEST_F(ReceiptFiles, EveryDatasetIsChunkedAndChecksummed) {
  const std::string good = write_micro("format.h5", 2);
  const ReceiptReader reader(good);
  EXPECT_EQ(reader.schema_minor(), kSchemaMinor);
  EXPECT_TRUE(h5::uses_checksummed_format(reader.file()));
  const auto datasets = h5::list_datasets(reader.file());
  ASSERT_GT(datasets.size(), 10u);
  for (const h5::DatasetInfo& d : datasets) {
    const h5::DatasetLayout layout = h5::dataset_layout(reader.file(), d.path);
    EXPECT_TRUE(layout.chunked) << d.path;
    EXPECT_TRUE(layout.checksummed) << d.path;
    EXPECT_FALSE(layout.variable_length_string) << d.path;
  }
  const h5::Handle manifest = h5::open_group(reader.file(), "manifest");
  for (const std::string& name : h5::attr_names(manifest)) {
    const h5::Handle attr(H5Aopen(manifest, name.c_str(), H5P_DEFAULT), H5Aclose, "open " + name);
    const h5::Handle type(H5Aget_type(attr), H5Tclose, "type of " + name);
    EXPECT_FALSE(H5Tget_class(type) == H5T_STRING && H5Tis_variable_str(type) > 0) << name;
  }
}

TEST_F(ReceiptFiles, SketchSeparatesNearbyTensors) {
  std::vector<float> a(1000, 0.5f), b = a;
  b[777] += 1e-3f;
  const run::TensorSketcher sketch(a.size(), 1);
  const TensorSketch sa = sketch(a), sb = sketch(b);
  EXPECT_NE(run::tensor_hash(a), run::tensor_hash(b));
  EXPECT_NEAR(sb.l2 - sa.l2, 1e-3 * 0.5 / sa.l2, 1e-6);
  double moved = 0;
  for (int i = 0; i < kSketchWidth; ++i) moved += std::fabs(sb.projection[i] - sa.projection[i]);
  EXPECT_NEAR(moved, 1e-3, 1e-6);  // one block moved by 1e-3, into exactly one bucket
}

// The sketch as docs/receipt-schema.md spells it, one element at a time: four accumulators
// (element i to lane i % 4) per block and for the squares, combined (0 + 1) + (2 + 3).
TensorSketch reference_sketch(const std::vector<float>& values, std::uint64_t salt) {
  TensorSketch sketch;
  double squares[4] = {0, 0, 0, 0};
  for (std::size_t start = 0, block = 0; start < values.size(); start += kSketchBlock, ++block) {
    double sums[4] = {0, 0, 0, 0};
    for (std::size_t i = start; i < std::min(values.size(), start + kSketchBlock); ++i) {
      sums[i % 4] += values[i];
      squares[i % 4] += static_cast<double>(values[i]) * values[i];
    }
    const double block_sum = (sums[0] + sums[1]) + (sums[2] + sums[3]);
    const std::uint32_t draw = numerics::philox_at(salt, 0, block)[0];
    sketch.projection[draw % kSketchWidth] += (draw >> 31) ? -block_sum : block_sum;
  }
  sketch.l2 = std::sqrt((squares[0] + squares[1]) + (squares[2] + squares[3]));
  return sketch;
}

std::vector<float> sketch_test_values(std::size_t n, std::uint64_t stream) {
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t draw = numerics::philox_at(7, stream, i)[0];
    values[i] = std::ldexp(static_cast<float>(static_cast<std::int32_t>(draw)), static_cast<int>(draw % 61) - 60);
  }
  return values;
}

void expect_same_sketch(const TensorSketch& fast, const TensorSketch& reference, const std::string& what) {
  EXPECT_EQ(std::bit_cast<std::uint64_t>(fast.l2), std::bit_cast<std::uint64_t>(reference.l2)) << what;
  for (int b = 0; b < kSketchWidth; ++b) {
    EXPECT_EQ(std::bit_cast<std::uint64_t>(fast.projection[b]), std::bit_cast<std::uint64_t>(reference.projection[b]))
        << what << " bucket " << b;
  }
}

const std::size_t kSketchTestLengths[] = {0, 1, 3, 31, 32, 33, 100, 128, 1001};

// The recorder's sketch (whole blocks as vectors of four) is the reference bit for bit on
// every length around the block size, on values of every magnitude and sign.
TEST_F(ReceiptFiles, SketchIsTheElementByElementReferenceBitForBit) {
  for (std::size_t n : kSketchTestLengths) {
    const std::vector<float> values = sketch_test_values(n, 1);
    expect_same_sketch(run::TensorSketcher(n, 42)(values), reference_sketch(values, 42), std::to_string(n));
  }
}

// ---- docs/receipt-test-vectors.json: the digests as docs/receipt-schema.md ("Digests")
// specifies them, recomputed here with the functions the recorder uses and compared bit
// for bit (python/tests/test_vectors.py does the same with canary_harness). The inputs and
// the expected values are read from the file, so changing any expected value fails here.

class ReceiptVectors : public ::testing::Test {
 protected:
  static nlohmann::json load() {
    const std::string path = std::string(HARNESS_SOURCE_DIR) + "/docs/receipt-test-vectors.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read " + path);
    return nlohmann::json::parse(in);
  }

  static std::uint64_t hex(const nlohmann::json& text) { return std::stoull(text.get<std::string>(), nullptr, 16); }
  static std::string hex64(std::uint64_t v) { return fmt::format("0x{:016x}", v); }
  static std::string hex32(std::uint32_t v) { return fmt::format("0x{:08x}", v); }

  // A tensor vector's input: explicit float32 bit patterns, or the affine_mod rule.
  static std::vector<float> values_of(const nlohmann::json& spec) {
    std::vector<float> values;
    if (spec.contains("values_f32")) {
      for (const auto& bits : spec.at("values_f32")) values.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(hex(bits))));
      return values;
    }
    const nlohmann::json& rule = spec.at("generate");
    EXPECT_EQ(rule.at("rule").get<std::string>(), "affine_mod");
    const auto count = rule.at("count").get<std::int64_t>(), mul = rule.at("mul").get<std::int64_t>(),
               modulus = rule.at("modulus").get<std::int64_t>(), offset = rule.at("offset").get<std::int64_t>(),
               divisor = rule.at("divisor").get<std::int64_t>();
    for (std::int64_t i = 0; i < count; ++i) {
      const std::int64_t numerator = (i * mul) % modulus - offset;
      values.push_back(static_cast<float>(static_cast<double>(numerator) / static_cast<double>(divisor)));
    }
    return values;
  }

  // Bit for bit, except that an expected NaN matches any NaN (the schema does not pin the
  // sign or payload of a NaN that arithmetic produces; hashes cover input bytes exactly).
  static ::testing::AssertionResult same_f64(const nlohmann::json& expected_hex, double actual) {
    const double expected = std::bit_cast<double>(hex(expected_hex));
    if (std::isnan(expected) ? std::isnan(actual) : std::bit_cast<std::uint64_t>(actual) == hex(expected_hex)) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << hex64(std::bit_cast<std::uint64_t>(actual)) << " (" << actual
                                         << "), expected " << expected_hex.get<std::string>() << " (" << expected << ")";
  }
};

TEST_F(ReceiptVectors, FileHoldsEveryKindOfVector) {
  const nlohmann::json v = load();
  EXPECT_EQ(v.at("sketch").at("width").get<int>(), kSketchWidth);
  EXPECT_EQ(v.at("sketch").at("block").get<int>(), kSketchBlock);
  EXPECT_GE(v.at("philox").size(), 5u);
  EXPECT_GE(v.at("stream_id").size(), 4u);
  EXPECT_GE(v.at("tensors").size(), 10u);
  EXPECT_GE(v.at("batch_hash").size(), 2u);
  EXPECT_GE(v.at("content_hash").size(), 3u);
}

TEST_F(ReceiptVectors, PhiloxAndStreamIds) {
  const nlohmann::json v = load();
  for (const auto& spec : v.at("philox")) {
    numerics::PhiloxBlock out{};
    if (spec.contains("counter")) {
      numerics::PhiloxBlock counter{};
      std::array<std::uint32_t, 2> key{};
      for (int i = 0; i < 4; ++i) counter[i] = static_cast<std::uint32_t>(hex(spec.at("counter")[i]));
      for (int i = 0; i < 2; ++i) key[i] = static_cast<std::uint32_t>(hex(spec.at("key")[i]));
      out = numerics::philox4x32_10(counter, key);
    } else {
      out = numerics::philox_at(hex(spec.at("seed")), hex(spec.at("stream")), hex(spec.at("index")));
    }
    for (int i = 0; i < 4; ++i) EXPECT_EQ(hex32(out[i]), spec.at("output")[i].get<std::string>()) << spec.at("id") << " word " << i;
  }
  for (const auto& spec : v.at("stream_id")) {
    EXPECT_EQ(hex64(numerics::stream_id(spec.at("name").get<std::string>().c_str())), spec.at("fnv1a64").get<std::string>())
        << spec.at("name");
  }
}

TEST_F(ReceiptVectors, TensorHashesAndSketches) {
  const nlohmann::json v = load();
  for (const auto& spec : v.at("tensors")) {
    SCOPED_TRACE(spec.at("id").get<std::string>());
    const std::vector<float> values = values_of(spec);
    ASSERT_EQ(values.size(), spec.at("numel").get<std::size_t>());
    EXPECT_EQ(hex64(run::tensor_hash(values)), spec.at("hash").get<std::string>());
    const std::uint64_t salt = numerics::stream_id(spec.at("name").get<std::string>().c_str());
    EXPECT_EQ(hex64(salt), spec.at("salt").get<std::string>());
    for (const auto& d : spec.at("first_draws")) {
      const std::uint32_t draw = numerics::philox_at(salt, 0, d.at("block").get<std::uint64_t>())[0];
      EXPECT_EQ(hex32(draw), d.at("draw").get<std::string>());
      EXPECT_EQ(static_cast<int>(draw % kSketchWidth), d.at("bucket").get<int>());
      EXPECT_EQ((draw >> 31) == 1, d.at("negative").get<bool>());
    }
    const TensorSketch sketch = run::TensorSketcher(values.size(), salt)(values);
    EXPECT_TRUE(same_f64(spec.at("l2"), sketch.l2)) << "l2";
    ASSERT_EQ(spec.at("projection").size(), static_cast<std::size_t>(kSketchWidth));
    for (int b = 0; b < kSketchWidth; ++b) EXPECT_TRUE(same_f64(spec.at("projection")[b], sketch.projection[b])) << "projection " << b;
  }
}

TEST_F(ReceiptVectors, BatchAndContentHashes) {
  const nlohmann::json v = load();
  for (const auto& spec : v.at("batch_hash")) {
    canary::Batch batch;
    batch.batch_size = spec.at("shape")[0].get<int>();
    batch.context_length = spec.at("shape")[1].get<int>() - 1;
    batch.tokens = spec.at("tokens").get<std::vector<std::int32_t>>();
    ASSERT_EQ(batch.tokens.size(), static_cast<std::size_t>(batch.batch_size) * static_cast<std::size_t>(batch.context_length + 1));
    EXPECT_EQ(hex64(canary::batch_hash(batch)), spec.at("hash").get<std::string>()) << spec.at("id");
  }
  const harness::testing::ScratchDir scratch;
  for (const auto& spec : v.at("content_hash")) {
    std::string bytes;
    if (spec.contains("bytes_hex")) {
      const std::string text = spec.at("bytes_hex").get<std::string>();
      for (std::size_t i = 0; i + 1 < text.size(); i += 2) bytes.push_back(static_cast<char>(std::stoi(text.substr(i, 2), nullptr, 16)));
    } else {
      const nlohmann::json& rule = spec.at("generate");
      EXPECT_EQ(rule.at("rule").get<std::string>(), "byte_affine");
      for (std::int64_t i = 0; i < rule.at("count").get<std::int64_t>(); ++i) {
        bytes.push_back(static_cast<char>((i * rule.at("mul").get<std::int64_t>() + rule.at("add").get<std::int64_t>()) % 256));
      }
    }
    const std::string file = scratch.path("content.bin");
    std::ofstream(file, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    EXPECT_EQ(run::file_content_hash(file), spec.at("content_hash").get<std::string>()) << spec.at("id");
  }
}

}  // namespace
}  // namespace harness::receipt
