// The cpu-ref determinism contract, as far as one process can test it: bitwise
// identical receipts across thread counts and repeated runs. (Compilers, build types
// and ISAs are covered by scripts/determinism-matrix.sh, which CI runs.)
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "canary_run.h"
#include "receipt/receipt_reader.h"

namespace harness::run {
namespace {

namespace fs = std::filesystem;

struct ReceiptBits {
  std::vector<double> loss, grad_norm;
  std::vector<std::uint64_t> batches, params, grads, m, v;
  bool operator==(const ReceiptBits&) const = default;
};

ReceiptBits run_and_read(const std::string& canary, int steps, int threads, const std::string& tag) {
  const fs::path path = fs::temp_directory_path() / ("determinism_" + tag + ".h5");
  RunOptions o;
  o.canary = canary;
  o.steps = steps;
  o.threads = threads;
  o.out = path.string();
  o.force = true;
  run_canary(o);
  const receipt::ReceiptReader r(path.string());
  ReceiptBits bits{r.steps_f64("loss"), r.steps_f64("grad_norm"), r.batch_hashes(), r.hashes("params"),
                   r.hashes("grads"), r.hashes("adam_m"), r.hashes("adam_v")};
  fs::remove(path);
  return bits;
}

TEST(Determinism, TinyIsBitwiseIdenticalAcrossThreadCountsAndRepeats) {
  const ReceiptBits reference = run_and_read("tiny", 4, 1, "t1");
  ASSERT_EQ(reference.loss.size(), 4u);
  for (int threads : {2, 3, 8, 16}) {
    std::string tag = "t";  // (not "t" + to_string(): GCC 12 raises a false -Wrestrict on it)
    tag += std::to_string(threads);
    EXPECT_TRUE(run_and_read("tiny", 4, threads, tag) == reference) << threads << " threads";
  }
  EXPECT_TRUE(run_and_read("tiny", 4, 2, "repeat") == reference) << "repeat";
}

TEST(Determinism, MicroFullRunIsIdenticalAtOneAndThreeThreads) {
  EXPECT_TRUE(run_and_read("micro", 20, 1, "m1") == run_and_read("micro", 20, 3, "m3"));
}

TEST(Determinism, SeedChangesTheRun) {
  const fs::path path = fs::temp_directory_path() / "determinism_seed.h5";
  RunOptions o;
  o.canary = "micro";
  o.steps = 2;
  o.seed = 99;
  o.out = path.string();
  o.force = true;
  run_canary(o);
  const receipt::ReceiptReader r(path.string());
  const auto other = r.hashes("params");
  fs::remove(path);
  EXPECT_NE(other, run_and_read("micro", 2, 1, "seed1337").params);
}

}  // namespace
}  // namespace harness::run
