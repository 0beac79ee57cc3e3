// The one-ulp perturbation of initial weights (engines/numerics/perturbation.h): the step is
// nextafter toward the chosen infinity on finite values, exhaustively over one in every 251
// fp32 bit patterns of both signs; directions are a fair coin per element; a perturbed
// canary's parameters are exactly its unperturbed ones moved one ulp each.
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "numerics/perturbation.h"

namespace harness::numerics {
namespace {

TEST(Perturbation, TheStepIsNextafterOnFiniteValues) {
  std::uint64_t checked = 0;
  for (std::uint64_t bits = 0; bits <= 0xffffffffull; bits += 251) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    if (!std::isfinite(x)) continue;
    for (const bool up : {true, false}) {
      const float want = std::nextafter(x, up ? INFINITY : -INFINITY);
      const float got = one_ulp_step(x, up);
      // nextafter of a zero keeps no sign of its own: compare values there
      ASSERT_TRUE(std::bit_cast<std::uint32_t>(got) == std::bit_cast<std::uint32_t>(want) || (got == 0 && want == 0))
          << std::hexfloat << x << (up ? " up" : " down");
    }
    ++checked;
  }
  EXPECT_GT(checked, 16'000'000u);
}

TEST(Perturbation, InfinitiesAndNaNStay) {
  for (const float x : {INFINITY, -INFINITY, NAN}) {
    for (const bool up : {true, false}) {
      EXPECT_EQ(std::bit_cast<std::uint32_t>(one_ulp_step(x, up)), std::bit_cast<std::uint32_t>(x));
    }
  }
}

TEST(Perturbation, EveryElementMovesOneUlpAndTheDirectionsAreAFairCoin) {
  std::vector<float> values(100000, 1.0f);
  perturb_one_ulp(values, 3, "blocks.0.attn.qkv.weight");
  int up = 0;
  for (const float v : values) {
    ASSERT_TRUE(v == std::nextafter(1.0f, 2.0f) || v == std::nextafter(1.0f, 0.0f)) << v;
    up += v > 1.0f ? 1 : 0;
  }
  EXPECT_NEAR(up, 50000, 500);
  std::vector<float> other_seed(values.size(), 1.0f), other_name(values.size(), 1.0f);
  perturb_one_ulp(other_seed, 4, "blocks.0.attn.qkv.weight");
  perturb_one_ulp(other_name, 3, "blocks.0.attn.proj.weight");
  int same_seed = 0, same_name = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    same_seed += values[i] == other_seed[i] ? 1 : 0;
    same_name += values[i] == other_name[i] ? 1 : 0;
  }
  EXPECT_NEAR(same_seed, 50000, 1000);  // another seed or tensor: independent directions
  EXPECT_NEAR(same_name, 50000, 1000);
}

}  // namespace
}  // namespace harness::numerics
