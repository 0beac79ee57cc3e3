// The C ABI (libcanary_harness_digest, receipt/digest_c_api.h) gives the receipt library's
// digests bit for bit: the shared library compiles digest.cpp itself, so a build that drifted
// between the two (flags, sources) would show here before it shows in a Python receipt.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "receipt/digest.h"
#include "receipt/digest_c_api.h"
#include "receipt/receipt_schema.h"

namespace harness::receipt {
namespace {

// Sizes around every block and lane boundary, a few large ones, and values that stress the
// sums: signed zeros, subnormals, the float32 maximum, infinities and NaN.
std::vector<std::vector<float>> test_tensors() {
  std::mt19937 rng(7);  // test data only: nothing here is recorded
  std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), -1e-40f,
                            std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  std::vector<std::vector<float>> tensors;
  std::vector<std::size_t> sizes;
  for (std::size_t n = 0; n <= 70; ++n) sizes.push_back(n);
  for (std::size_t n : {127, 128, 129, 1000, 4099, 65536, 100003}) sizes.push_back(n);
  for (std::size_t n : sizes) {
    std::vector<float> values(n);
    for (float& v : values) v = uniform(rng);
    if (n % 3 == 0 && n > 0) values[rng() % n] = specials[n % std::size(specials)];
    tensors.push_back(std::move(values));
  }
  return tensors;
}

TEST(DigestCApi, PlanGivesTheReceiptLibrarysHashesAndSketchesAtAnyThreadCount) {
  ASSERT_EQ(canary_digest_abi_version(), CANARY_DIGEST_ABI_VERSION);
  ASSERT_EQ(canary_digest_sketch_width(), static_cast<std::uint32_t>(kSketchWidth));
  ASSERT_EQ(canary_digest_sketch_block(), static_cast<std::uint32_t>(kSketchBlock));
  const auto tensors = test_tensors();
  const std::size_t count = tensors.size();
  std::vector<std::uint64_t> numels, salts;
  std::vector<std::uint8_t> sketched;
  std::vector<const float*> data;
  for (std::size_t i = 0; i < count; ++i) {
    numels.push_back(tensors[i].size());
    const std::string name = "blocks." + std::to_string(i) + ".w";
    salts.push_back(canary_digest_salt(name.c_str()));
    ASSERT_EQ(salts.back(), sketch_salt(name.c_str()));
    sketched.push_back(i % 4 != 3);  // some tensors hashed only, as adam_m and adam_v
    data.push_back(tensors[i].data());
  }
  canary_digest_plan* plan = canary_digest_plan_new(count, numels.data(), salts.data(), sketched.data());
  ASSERT_NE(plan, nullptr);
  for (int threads : {1, 2, 0}) {
    std::vector<std::uint64_t> hashes(count);
    std::vector<double> l2(count, -1.0), projection(count * kSketchWidth, -1.0);
    ASSERT_EQ(canary_digest_plan_run(plan, data.data(), hashes.data(), l2.data(), projection.data(), threads), 0);
    for (std::size_t i = 0; i < count; ++i) {
      SCOPED_TRACE("tensor of " + std::to_string(numels[i]) + " elements, threads " + std::to_string(threads));
      EXPECT_EQ(hashes[i], tensor_hash(tensors[i]));
      EXPECT_EQ(hashes[i], canary_digest_hash_f32(tensors[i].data(), tensors[i].size()));
      if (!sketched[i]) {
        EXPECT_EQ(l2[i], -1.0) << "a tensor that is only hashed leaves its sketch row alone";
        for (int b = 0; b < kSketchWidth; ++b) EXPECT_EQ(projection[i * kSketchWidth + b], -1.0);
        continue;
      }
      const TensorSketch expected = TensorSketcher(tensors[i].size(), salts[i])(tensors[i]);
      EXPECT_EQ(std::bit_cast<std::uint64_t>(l2[i]), std::bit_cast<std::uint64_t>(expected.l2));
      EXPECT_EQ(std::memcmp(&projection[i * kSketchWidth], expected.projection.data(), sizeof expected.projection), 0);
    }
  }
  canary_digest_plan_free(plan);
}

TEST(DigestCApi, EmptyPlansAndEmptyTensorsDigest) {
  canary_digest_plan* empty = canary_digest_plan_new(0, nullptr, nullptr, nullptr);
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(canary_digest_plan_run(empty, nullptr, nullptr, nullptr, nullptr, 0), 0);
  canary_digest_plan_free(empty);

  const std::uint64_t numel = 0, salt = 5;
  const std::uint8_t sketched = 1;
  canary_digest_plan* plan = canary_digest_plan_new(1, &numel, &salt, &sketched);
  ASSERT_NE(plan, nullptr);
  const float* none = nullptr;  // what torch's data_ptr() gives for an empty tensor
  std::uint64_t hash = 0;
  double l2 = -1.0, projection[kSketchWidth];
  ASSERT_EQ(canary_digest_plan_run(plan, &none, &hash, &l2, projection, -1), 0);
  EXPECT_EQ(hash, tensor_hash({}));
  EXPECT_EQ(l2, 0.0);
  for (double p : projection) EXPECT_EQ(p, 0.0);
  canary_digest_plan_free(plan);
}

}  // namespace
}  // namespace harness::receipt
