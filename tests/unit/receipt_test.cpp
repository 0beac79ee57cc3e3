// Receipts: what a run writes can be read back, hashes can be recomputed from dumps,
// and every kind of bad file is a named error, never a crash.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "canary_run.h"
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
  const auto loss = r.steps_f64("loss");
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
    h5::write_attr(m, "schema_version", std::int64_t{99});
  }
  EXPECT_NE(error_of(path("future.h5")).find("schema_version 99 is not supported"), std::string::npos);

  {
    const h5::Handle f = h5::create_file(path("foreign.h5"), false);
    h5::create_group(f, "data");
  }
  EXPECT_NE(error_of(path("foreign.h5")).find("no /manifest group"), std::string::npos);
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

}  // namespace
}  // namespace harness::receipt
