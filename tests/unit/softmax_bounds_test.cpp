// The attention core's bound at its output (engines/numerics/softmax_bounds.h) against fp32
// attention computed the ways the stacks compute it: the scale after the dot or folded into
// q, a divide or 1/sum and a multiply, the sums in order or reversed, with an exp at its
// worst within the measured ulps (rounded away from the exact value, per term, in the
// direction that hurts that element most). Each must be within; a probability rounded to
// bf16, or a fast-math exp, must not. Inputs from Philox keyed by the case.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "numerics/formats.h"
#include "numerics/philox.h"
#include "numerics/softmax_bounds.h"

namespace harness::numerics {
namespace {

// One head of attention: T queries, keys and values of hs dims, scores scaled by 1/sqrt(hs).
struct Head {
  std::int64_t T = 0, hs = 0;
  std::vector<float> q, k, v;  // (T, hs) each
  float at(const std::vector<float>& x, std::int64_t t, std::int64_t d) const { return x[t * hs + d]; }
};

// Normal-ish values (the sum of four uniforms, centred) times `spread`: the scores' spread
// decides how far from uniform the softmax is, and with it which terms dominate.
Head draw_head(std::int64_t T, std::int64_t hs, float spread, std::uint64_t trial) {
  const std::uint64_t stream = stream_id("softmax_bounds/head") + trial * 1000 + static_cast<std::uint64_t>(T * 100 + hs);
  Head h{T, hs, {}, {}, {}};
  std::uint64_t index = 0;
  for (std::vector<float>* x : {&h.q, &h.k, &h.v}) {
    x->resize(static_cast<std::size_t>(T * hs));
    for (float& value : *x) {
      const PhiloxBlock w = philox_at(7, stream, index++);
      double sum = 0;
      for (std::uint32_t word : w) sum += static_cast<double>(word) * 0x1p-32;
      value = static_cast<float>((sum - 2.0) * spread);
    }
  }
  return h;
}

enum class Kernel { ScaleAfterDot, ScaleFoldedIntoQ, ReciprocalMultiplyReversedSums };
constexpr Kernel kKernels[] = {Kernel::ScaleAfterDot, Kernel::ScaleFoldedIntoQ, Kernel::ReciprocalMultiplyReversedSums};

// A fast-math exp: 2^(x log2 e) from the exponent's bits and a cubic in the fraction
// (about 1e-4 relative error, varying with x; cpu-ref's --fast-exp is of this kind).
float fast_math_exp(float x) {
  const double t = static_cast<double>(x) * 1.4426950408889634, n = std::floor(t), f = t - n;
  return static_cast<float>(std::ldexp(1 + f * (0.695976 + f * (0.224940 + f * 0.079440)), static_cast<int>(n)));
}

// exp(x) in fp32 within 1 ulp, at its worst for output element (t, c): rounded up where the
// term's value pushes the output up (v_jc >= 0), down elsewhere; or a fast-math one.
float worst_exp(float x, bool up, bool fast_math) {
  if (fast_math) return fast_math_exp(x);
  const double exact = std::exp(static_cast<double>(x));
  const float nearest = static_cast<float>(exact);
  if (static_cast<double>(nearest) == exact) return nearest;
  if (up) return static_cast<double>(nearest) > exact ? nearest : std::nextafter(nearest, std::numeric_limits<float>::infinity());
  return static_cast<double>(nearest) < exact ? nearest : std::nextafter(nearest, 0.0f);
}

struct Options {
  bool bf16_probabilities = false;
  bool fast_math_exp = false;
};

// Output element (t, c) of causal attention as `kernel` computes it in fp32.
float attention_fp32(const Head& h, std::int64_t t, std::int64_t c, Kernel kernel, const Options& options) {
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(h.hs)));
  std::vector<float> s(static_cast<std::size_t>(t + 1));
  for (std::int64_t j = 0; j <= t; ++j) {
    float dot = 0;
    for (std::int64_t d = 0; d < h.hs; ++d) {
      const float qd = kernel == Kernel::ScaleFoldedIntoQ ? h.at(h.q, t, d) * scale : h.at(h.q, t, d);
      dot += qd * h.at(h.k, j, d);
    }
    s[j] = kernel == Kernel::ScaleFoldedIntoQ ? dot : dot * scale;
  }
  const float m = *std::max_element(s.begin(), s.end());
  std::vector<float> e(s.size());
  for (std::size_t j = 0; j < s.size(); ++j) e[j] = worst_exp(s[j] - m, h.at(h.v, static_cast<std::int64_t>(j), c) >= 0, options.fast_math_exp);
  float sum = 0;
  if (kernel == Kernel::ReciprocalMultiplyReversedSums) {
    for (std::size_t j = e.size(); j-- > 0;) sum += e[j];
  } else {
    for (float x : e) sum += x;
  }
  const float reciprocal = 1.0f / sum;
  float out = 0;
  for (std::size_t i = 0; i < e.size(); ++i) {
    const std::size_t j = kernel == Kernel::ReciprocalMultiplyReversedSums ? e.size() - 1 - i : i;
    float p = kernel == Kernel::ReciprocalMultiplyReversedSums ? e[j] * reciprocal : e[j] / sum;
    if (options.bf16_probabilities) p = round_to_bf16(p);
    out += p * h.at(h.v, static_cast<std::int64_t>(j), c);
  }
  return out;
}

// The exact output (double: the errors here are ~2^-53, far below fp32's) and its bound.
struct Judged {
  double exact = 0, bound = 0;
};
Judged judge(const Head& h, std::int64_t t, std::int64_t c) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(h.hs));
  std::vector<double> s(static_cast<std::size_t>(t + 1));
  AttentionOutputTerms terms;
  terms.head_size = h.hs, terms.keys = t + 1, terms.scale = scale;
  for (std::int64_t j = 0; j <= t; ++j) {
    double dot = 0, abs_products = 0;
    for (std::int64_t d = 0; d < h.hs; ++d) {
      const double product = static_cast<double>(h.at(h.q, t, d)) * h.at(h.k, j, d);
      dot += product, abs_products += std::fabs(product);
    }
    s[j] = dot * scale;
    terms.abs_products = std::max(terms.abs_products, abs_products);
    terms.abs_dot = std::max(terms.abs_dot, std::fabs(dot));
  }
  const double m = *std::max_element(s.begin(), s.end());
  double sum = 0;
  for (double x : s) sum += std::exp(x - m), terms.spread = std::max(terms.spread, m - x);
  Judged judged;
  for (std::int64_t j = 0; j <= t; ++j) {
    const double p = std::exp(s[j] - m) / sum, v = h.at(h.v, j, c);
    judged.exact += p * v;
    terms.magnitude += p * std::fabs(v);
    terms.abs_values += std::fabs(v);
  }
  judged.bound = attention_output_bound(terms);
  return judged;
}

constexpr std::uint64_t kTrials = 6;
struct Shape {
  std::int64_t T, hs;
  float spread;
};
// The canaries' heads (hs 8 and 16, T up to 64) and a long one; spreads from near-uniform
// softmaxes to ones a single key dominates.
constexpr Shape kShapes[] = {{1, 8, 1.0f}, {5, 8, 0.3f}, {16, 16, 1.0f}, {32, 16, 3.0f}, {64, 64, 1.0f}, {64, 8, 6.0f}};

TEST(AttentionOutputBound, Fp32KernelsWithAnExpAtItsWorstAreWithin) {
  std::ostringstream tightness;
  tightness.precision(3);
  for (const Shape& shape : kShapes) {
    double worst = 0;
    for (std::uint64_t trial = 0; trial < kTrials; ++trial) {
      const Head h = draw_head(shape.T, shape.hs, shape.spread, trial);
      for (std::int64_t t = 0; t < h.T; ++t) {
        for (std::int64_t c = 0; c < h.hs; ++c) {
          const Judged judged = judge(h, t, c);
          for (Kernel kernel : kKernels) {
            const double error = std::fabs(static_cast<double>(attention_fp32(h, t, c, kernel, {})) - judged.exact);
            ASSERT_LE(error, judged.bound) << "T=" << h.T << " hs=" << h.hs << " trial " << trial << " row " << t
                                           << " dim " << c << " kernel " << static_cast<int>(kernel);
            worst = std::max(worst, error / judged.bound);
          }
        }
      }
    }
    tightness << "T=" << shape.T << "/hs=" << shape.hs << ":" << worst << " ";
  }
  RecordProperty("worst_error_over_bound", tightness.str());
}

// Not vacuous: probabilities rounded to bf16, or a fast-math exp, leave the bound on every
// head of more than one key (some element of it).
TEST(AttentionOutputBound, Bf16ProbabilitiesOrAFastMathExpAreOutside) {
  for (const Options& fault : {Options{true, false}, Options{false, true}}) {
    for (const Shape& shape : kShapes) {
      if (shape.T < 4) continue;
      for (std::uint64_t trial = 0; trial < kTrials; ++trial) {
        const Head h = draw_head(shape.T, shape.hs, shape.spread, trial);
        bool outside = false;
        for (std::int64_t t = 1; t < h.T && !outside; ++t) {
          for (std::int64_t c = 0; c < h.hs && !outside; ++c) {
            const Judged judged = judge(h, t, c);
            outside = std::fabs(static_cast<double>(attention_fp32(h, t, c, Kernel::ScaleAfterDot, fault)) - judged.exact) >
                      judged.bound;
          }
        }
        EXPECT_TRUE(outside) << (fault.bf16_probabilities ? "bf16 probabilities" : "a fast-math exp") << ", T="
                             << h.T << " hs=" << h.hs << " trial " << trial;
      }
    }
  }
}

// One key: the output is v itself times a probability of exactly 1 (exp of exactly 0, within
// its ulp, divided by itself), whatever the score's error: the bound is a few ulps of |v|.
TEST(AttentionOutputBound, OneKeyIsAFewUlpsOfTheValue) {
  AttentionOutputTerms terms;
  terms.head_size = 16, terms.keys = 1, terms.scale = 0.25, terms.abs_products = 2, terms.abs_dot = 1;
  terms.magnitude = 1, terms.abs_values = 1;
  const double bound = attention_output_bound(terms);
  EXPECT_GT(bound, 0x1p-24);
  EXPECT_LT(bound, 16 * 0x1p-24);
}

}  // namespace
}  // namespace harness::numerics
