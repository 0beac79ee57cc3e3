// FP8 scaling state against hand-computed sequences (Transformer Engine's DelayedScaling
// semantics: history roll, max vs most_recent, margin, zero and non-finite amax) and
// current scaling.
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "numerics/fp8_scaling.h"

namespace harness::numerics {
namespace {

std::vector<float> scales_used(Fp8ScalingState& s, const std::vector<float>& amaxes) {
  std::vector<float> used;
  for (float a : amaxes) {
    used.push_back(s.scale_for(a));
    s.end_step();
  }
  return used;
}

Fp8ScalingConfig delayed(int history, AmaxAlgo algo = AmaxAlgo::Max, int margin = 0) {
  return {Fp8Recipe::Delayed, history, algo, margin};
}

TEST(Fp8Scaling, DelayedMaxOverAThreeStepWindow) {
  // step: amax recorded -> history after the roll -> next scale = 448 / max(window)
  //   0: 2    [0, 0, 2]      448/2 = 224
  //   1: 4    [0, 2, 4]      448/4 = 112
  //   2: 1    [0, 4, 1]      112 (4 still in the window)
  //   3: 0.5  [0, 1, 0.5]    112
  //   4: 0.25 [0, 0.5, 0.25] 448/1 = 448 (4 has left the window)
  Fp8ScalingState s(Fp8Format::E4M3, delayed(3));
  EXPECT_EQ(scales_used(s, {2, 4, 1, 0.5f, 0.25f}), (std::vector<float>{1, 224, 112, 112, 112}));
  EXPECT_EQ(s.scale(), 448.0f);
  EXPECT_EQ(std::vector<float>(s.history().begin(), s.history().end()), (std::vector<float>{0, 0.5f, 0.25f}));
}

TEST(Fp8Scaling, MostRecentUsesOnlyTheLastAmax) {
  Fp8ScalingState s(Fp8Format::E4M3, delayed(3, AmaxAlgo::MostRecent));
  EXPECT_EQ(scales_used(s, {2, 4, 1, 0.5f}), (std::vector<float>{1, 224, 112, 448}));
  EXPECT_EQ(s.scale(), 896.0f);
}

TEST(Fp8Scaling, MarginDividesByPowersOfTwoAndE5M2UsesItsMax) {
  Fp8ScalingState s(Fp8Format::E5M2, delayed(4, AmaxAlgo::Max, 2));
  EXPECT_EQ(scales_used(s, {8, 8}), (std::vector<float>{1, 57344.0f / 8 / 4}));
}

TEST(Fp8Scaling, ZeroOrNonFiniteAmaxKeepsThePreviousScale) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Fp8ScalingState s(Fp8Format::E4M3, delayed(1));
  // history 1: each step sees only its own amax
  EXPECT_EQ(scales_used(s, {4, 0, inf, nan, 2}), (std::vector<float>{1, 112, 112, 112, 112}));
  EXPECT_EQ(s.scale(), 224.0f);
  // with a longer history a NaN in the window keeps the scale until it rolls out
  Fp8ScalingState w(Fp8Format::E4M3, delayed(2));
  EXPECT_EQ(scales_used(w, {4, nan, 2, 2}), (std::vector<float>{1, 112, 112, 112}));
  EXPECT_EQ(w.scale(), 224.0f);
}

TEST(Fp8Scaling, AnInfiniteScaleBecomesFltMax) {
  EXPECT_EQ(compute_fp8_scale(1e-45f, 1.0f, 448.0f, 0), std::numeric_limits<float>::max());
  EXPECT_EQ(compute_fp8_scale(0.0f, 3.0f, 448.0f, 0), 3.0f);
  EXPECT_EQ(compute_fp8_scale(448.0f, 3.0f, 448.0f, 1), 0.5f);
}

TEST(Fp8Scaling, CurrentScalingUsesTheTensorsOwnAmax) {
  Fp8ScalingState s(Fp8Format::E4M3, {Fp8Recipe::Current, 16, AmaxAlgo::Max, 0});
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(scales_used(s, {2, 4, 0, 7, inf}), (std::vector<float>{224, 112, 1, 64, 1}));
  EXPECT_EQ(s.scale_for(7), 64.0f);
  EXPECT_EQ(s.step_amax(), 7.0f);
  s.end_step();
  EXPECT_EQ(s.step_amax(), 0.0f);
}

// What lets accel quantise a tensor and find its amax in one pass: under delayed scaling the
// scale a step quantises with is fixed before the step's amaxes arrive (any amax, NaN and
// infinity too, and several uses in a step); current scaling says it is not.
TEST(Fp8Scaling, ADelayedScaleDoesNotWaitForTheAmax) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  Fp8ScalingState delayed_state(Fp8Format::E5M2, delayed(4));
  ASSERT_TRUE(delayed_state.scale_precedes_amax());
  for (const std::vector<float>& step : {std::vector<float>{3, 0.5f}, {1e30f}, {nan, 2}, {0}, {inf, 1e-3f}}) {
    for (float amax : step) {
      const float before = delayed_state.scale();
      EXPECT_EQ(delayed_state.scale_for(amax), before) << amax;
    }
    delayed_state.end_step();
  }
  EXPECT_FALSE(Fp8ScalingState(Fp8Format::E4M3, {Fp8Recipe::Current, 16, AmaxAlgo::Max, 0}).scale_precedes_amax());
}

TEST(Fp8Scaling, SeveralUsesInOneStepRecordTheLargestAmax) {
  Fp8ScalingState s(Fp8Format::E4M3, delayed(4));
  s.scale_for(1);
  s.scale_for(8);
  s.scale_for(2);
  EXPECT_EQ(s.step_amax(), 8.0f);
  s.end_step();
  EXPECT_EQ(s.scale(), 56.0f);
}

TEST(Fp8Scaling, TensorAmaxIsTheLargestMagnitudeOrNan) {
  const std::vector<float> x{1, -5, 3};
  EXPECT_EQ(tensor_amax(x.data(), 3), 5.0f);
  const std::vector<float> y{1, std::numeric_limits<float>::quiet_NaN(), 3};
  EXPECT_TRUE(tensor_amax(y.data(), 3) != tensor_amax(y.data(), 3));
}

}  // namespace
}  // namespace harness::numerics
