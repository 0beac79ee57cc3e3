// The bounds of engines/numerics/function_bounds.h against fp32 code computed the ways the
// stacks compute it. The attention core at its output: the scale after the dot or folded
// into q, a divide or 1/sum and a multiply, the sums in order or reversed, with an exp at its
// worst within the measured ulps (rounded away from the exact value, per term, in the
// direction that hurts that element most); a probability rounded to bf16, or a fast-math
// exp, must leave it. GELU, tanh and erf forms: 0.5 x (1 + f) and 0.5 x + 0.5 x f, with f
// off by its measured worst absolute error in the direction that hurts; a fast tanh or a bf16
// argument must leave it. SwiGLU: SiLU off by its measured worst, times up; a bf16 SiLU must
// leave it. The mean cross-entropy: exps and logs rounded up (their worst, all one way), two
// output forms; a sum kept in bf16 must leave it. Inputs from Philox keyed by the case.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>

#include "numerics/formats.h"
#include "numerics/philox.h"
#include "numerics/function_bounds.h"

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

// ---- GELU ---------------------------------------------------------------------------

// fp32 GELU as a stack computes it: the argument with its roundings, f off by `shift` (its
// measured worst, with the sign that hurts), then 0.5 x (1 + f) or, expanded, 0.5 x + 0.5 x f.
struct GeluKernel {
  GeluForm form;
  bool expanded;
  bool fast_tanh = false;      // a rational tanh about 1e-4 off (a fast-math one)
  bool bf16_argument = false;  // the argument rounded to bf16 (a module computing below fp32)
};
float gelu_fp32(float x, const GeluKernel& k, double function_error) {
  float a = 0;
  if (k.form == GeluForm::Tanh) {
    const float beta = static_cast<float>(0.7978845608028654), kappa = 0.044715f;
    a = beta * (x + kappa * (x * x * x));
  } else {
    a = x * static_cast<float>(0.7071067811865476);
  }
  if (k.bf16_argument) a = round_to_bf16(a);
  double f = k.form == GeluForm::Tanh ? std::tanh(static_cast<double>(a)) : std::erf(static_cast<double>(a));
  if (k.fast_tanh) f = static_cast<double>(a) * (27 + a * a) / (27 + 9 * a * a);  // Pade, clamped below
  f = std::clamp(f, -1.0, 1.0);
  // Off by the measured worst in the direction that moves the output up (f's weight is x/2),
  // rounded to fp32 and stepped back a grid step where the rounding took it past the worst.
  float f32 = static_cast<float>(f + (x >= 0 ? 1 : -1) * function_error);
  if (!k.fast_tanh && std::fabs(static_cast<double>(f32) - f) > function_error) f32 = std::nextafter(f32, static_cast<float>(f));
  const float half = 0.5f * x;
  return k.expanded ? half + half * f32 : half * (1.0f + f32);
}

GeluTerms gelu_terms(float x, GeluForm form) {
  const double x64 = x;
  GeluTerms t;
  t.form = form, t.x = x64;
  t.argument = form == GeluForm::Tanh ? 0.7978845608028654 * (x64 + 0.044715 * x64 * x64 * x64) : x64 * 0.7071067811865476;
  t.function = form == GeluForm::Tanh ? std::tanh(t.argument) : std::erf(t.argument);
  t.function_error = form == GeluForm::Tanh ? kStackGeluTanhError : kStackGeluErfError;
  return t;
}

double gelu_exact(const GeluTerms& t) { return 0.5 * t.x * (1 + t.function); }

// Inputs over [-10, 10] from Philox, with the ranges where 1 + f cancels (x near -3 to -6)
// and tiny ones among them.
std::vector<float> gelu_inputs() {
  std::vector<float> xs;
  for (std::uint64_t i = 0; i < 200000; ++i) {
    const PhiloxBlock w = philox_at(11, stream_id("function_bounds/gelu"), i);
    const double r = static_cast<double>(w[0]) * 0x1p-32, scale = (w[1] & 3) == 0 ? 1e-3 : 10.0;
    xs.push_back(static_cast<float>((2 * r - 1) * scale));
  }
  for (float x = -6.0f; x <= 0.0f; x += 1.0f / 1024) xs.push_back(x);
  return xs;
}

TEST(GeluOutputBound, TanhAndErfFormsWithTheirFunctionAtItsWorstAreWithin) {
  std::ostringstream tightness;
  tightness.precision(3);
  for (GeluForm form : {GeluForm::Tanh, GeluForm::Erf}) {
    for (bool expanded : {false, true}) {
      double worst = 0;
      for (float x : gelu_inputs()) {
        const GeluTerms t = gelu_terms(x, form);
        const double bound = gelu_output_bound(t);
        const double error = std::fabs(static_cast<double>(gelu_fp32(x, {form, expanded}, t.function_error)) - gelu_exact(t));
        ASSERT_LE(error, bound) << (form == GeluForm::Tanh ? "tanh" : "erf") << (expanded ? " expanded" : "")
                                << " at x = " << x;
        if (bound > 0) worst = std::max(worst, error / bound);
      }
      tightness << (form == GeluForm::Tanh ? "tanh" : "erf") << (expanded ? "/expanded" : "") << ":" << worst << " ";
    }
  }
  RecordProperty("worst_error_over_bound", tightness.str());
}

// Not vacuous: a fast-math tanh, or an argument rounded to bf16, leaves it at many inputs.
TEST(GeluOutputBound, AFastTanhOrABf16ArgumentIsOutside) {
  for (const GeluKernel& fault : {GeluKernel{GeluForm::Tanh, false, true, false}, GeluKernel{GeluForm::Tanh, false, false, true},
                                  GeluKernel{GeluForm::Erf, false, false, true}}) {
    std::size_t outside = 0, count = 0;
    for (float x : gelu_inputs()) {
      if (std::fabs(x) < 0.1f || std::fabs(x) > 3.0f) continue;  // where the fault moves the output
      const GeluTerms t = gelu_terms(x, fault.form);
      outside += std::fabs(static_cast<double>(gelu_fp32(x, fault, 0.0)) - gelu_exact(t)) > gelu_output_bound(t);
      ++count;
    }
    EXPECT_GT(outside, count / 2) << "fast tanh " << fault.fast_tanh << ", bf16 argument " << fault.bf16_argument << ": "
                                  << outside << " of " << count << " outside";
  }
}

// ---- SwiGLU --------------------------------------------------------------------------

// silu(g) up in fp32 with SiLU off by `relative` (its measured worst, with the sign that
// moves the output up), or rounded to bf16 (a module computing below fp32).
float swiglu_fp32(float g, float up, double relative, bool bf16_silu) {
  const double silu = static_cast<double>(g) / (1 + std::exp(-static_cast<double>(g)));
  float s = static_cast<float>(silu * (1 + ((silu * up >= 0) ? relative : -relative)));
  if (!bf16_silu && std::fabs(static_cast<double>(s) - silu) > relative * std::fabs(silu)) {
    s = std::nextafter(s, static_cast<float>(silu));  // the rounding took it past the worst: a grid step back
  }
  if (bf16_silu) s = round_to_bf16(static_cast<float>(silu));
  return s * up;
}

TEST(SwigluOutputBound, SiluAtItsWorstTimesUpIsWithinAndABf16SiluIsOutside) {
  double worst = 0;
  std::size_t outside = 0, count = 0;
  for (std::uint64_t i = 0; i < 200000; ++i) {
    const PhiloxBlock w = philox_at(13, stream_id("function_bounds/swiglu"), i);
    const float g = static_cast<float>((static_cast<double>(w[0]) * 0x1p-32 * 2 - 1) * 20);
    const float up = static_cast<float>((static_cast<double>(w[1]) * 0x1p-32 * 2 - 1) * 4);
    const double exact = static_cast<double>(g) / (1 + std::exp(-static_cast<double>(g))) * up;
    const double bound = swiglu_output_bound(std::fabs(exact), std::fabs(static_cast<double>(up)), kStackSiluError);
    const double error = std::fabs(static_cast<double>(swiglu_fp32(g, up, kStackSiluError, false)) - exact);
    ASSERT_LE(error, bound) << "g = " << g << ", up = " << up;
    worst = std::max(worst, error / bound);
    if (std::fabs(exact) > 1e-3) {
      ++count;
      outside += std::fabs(static_cast<double>(swiglu_fp32(g, up, 0, true)) - exact) > bound;
    }
  }
  EXPECT_GT(outside, count / 2) << outside << " of " << count << " bf16 SiLUs outside";
  RecordProperty("worst_error_over_bound", std::to_string(worst));
}

// Below x = -87.34 the stacks lose SiLU's value: fp32's exp(-x) overflows (x / inf = -0), or
// XLA's logistic gives 0. Both are within the bound's absolute term there.
TEST(SiluOutputBound, WhereTheStacksLoseItsValueTheAbsoluteTermHoldsIt) {
  for (float g = -95.0f; g <= -80.0f; g += 1.0f / 64) {
    const double exact = static_cast<double>(g) / (1 + std::exp(-static_cast<double>(g)));
    const double bound = silu_output_bound(std::fabs(exact), kStackSiluError);
    const float quotient = g / (1.0f + std::exp(-g));  // fp32 exp: inf past 88.72
    ASSERT_LE(std::fabs(static_cast<double>(quotient) - exact), bound) << "g = " << g;
    if (g <= -87.34f) {
      ASSERT_LE(std::fabs(exact), bound) << "a lost SiLU at g = " << g;  // 0 for it
    }
  }
}

// ---- the mean cross-entropy ------------------------------------------------------------

// One step up from x in fp32 (an exp or log at its worst: rounded up, not to nearest).
float up(float x) { return std::nextafter(x, std::numeric_limits<float>::infinity()); }

// One row's exact terms (m, log S, z_j, R) in double: the cross-entropy's and a log-softmax's.
CrossEntropyRow row_terms(const std::vector<float>& z, std::size_t j) {
  const double m = *std::max_element(z.begin(), z.end());
  double sum = 0, spread = 0;
  for (float v : z) sum += std::exp(v - m), spread = std::max(spread, m - v);
  return {m, std::log(sum), z[j], spread};
}

// The mean cross-entropy of `rows` in fp32: exps and logs rounded up (their worst, pushing
// the loss up), the sum in order, then z_t - m less log S (`fused`: ATen's log_softmax) or
// z_t less m + log S; `bf16_sum` rounds each partial sum to bf16 (a kernel below fp32).
float cross_entropy_fp32(const std::vector<std::vector<float>>& rows, const std::vector<std::size_t>& targets,
                         bool fused, bool bf16_sum) {
  float total = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::vector<float>& z = rows[i];
    const float m = *std::max_element(z.begin(), z.end());
    float sum = 0;
    for (float v : z) {
      sum += up(static_cast<float>(std::exp(static_cast<double>(v - m))));
      if (bf16_sum) sum = round_to_bf16(sum);
    }
    const float log_sum = up(static_cast<float>(std::log(static_cast<double>(sum))));
    const float log_probability = fused ? (z[targets[i]] - m) - log_sum : z[targets[i]] - (m + log_sum);
    total += -log_probability;
  }
  return total / static_cast<float>(rows.size());
}

TEST(CrossEntropyMeanBound, Fp32KernelsWithExpAndLogAtTheirWorstAreWithinAndABf16SumIsOutside) {
  std::ostringstream tightness;
  tightness.precision(3);
  for (std::size_t V : {8, 256, 4096}) {
    for (double scale : {0.1, 3.0}) {
      double worst = 0;
      std::size_t outside = 0;
      for (std::uint64_t trial = 0; trial < 8; ++trial) {
        std::vector<std::vector<float>> rows(16, std::vector<float>(V));
        std::vector<std::size_t> targets(rows.size());
        std::vector<CrossEntropyRow> terms(rows.size());
        double exact = 0;
        std::uint64_t index = 0;
        for (std::size_t i = 0; i < rows.size(); ++i) {
          const std::uint64_t stream = stream_id("function_bounds/cross_entropy") + trial * 100 + V;
          for (float& v : rows[i]) v = static_cast<float>(normal_at(17, stream, index++) * scale + 1.0);
          targets[i] = philox_at(17, stream, index++)[0] % V;
          terms[i] = row_terms(rows[i], targets[i]);
          exact += terms[i].max + terms[i].log_sum - terms[i].target;
        }
        exact /= static_cast<double>(rows.size());
        const double bound = cross_entropy_mean_bound(terms, static_cast<std::int64_t>(V), 1.0, 1.0);
        for (bool fused : {false, true}) {
          const double error = std::fabs(static_cast<double>(cross_entropy_fp32(rows, targets, fused, false)) - exact);
          ASSERT_LE(error, bound) << "V=" << V << " scale " << scale << " trial " << trial << " fused " << fused;
          worst = std::max(worst, error / bound);
        }
        outside += std::fabs(static_cast<double>(cross_entropy_fp32(rows, targets, false, true)) - exact) > bound;
      }
      if (V >= 256) {  // a bf16 sum of 8 terms can be exact: its rounding needs more terms to show
        EXPECT_GT(outside, 4u) << "V=" << V << " scale " << scale << ": a bf16 sum outside in " << outside << " of 8";
      }
      tightness << "V=" << V << "/scale=" << scale << ":" << worst << " ";
    }
  }
  RecordProperty("worst_error_over_bound", tightness.str());
}

// GELU's backward in the erf form as torch's CPU kernel computes it, in fp32: erf off by
// `erf_offset` u (its worst case pushed one way), exp rounded up, the cdf rounded to bf16
// where `bf16_cdf` (a kernel below fp32).
float gelu_erf_backward_fp32(float x, float g, double erf_offset, bool bf16_cdf) {
  const auto alpha = static_cast<float>(0.7071067811865476), beta = static_cast<float>(0.3989422804014327);
  const float a = x * alpha;
  const auto erf = static_cast<float>(std::erf(static_cast<double>(a)) + erf_offset * 0x1p-24);
  float cdf = 0.5f * (1.0f + erf);
  if (bf16_cdf) cdf = round_to_bf16(cdf);
  const float pdf = beta * up(static_cast<float>(std::exp(static_cast<double>(x * x * -0.5f))));
  return g * (cdf + x * pdf);
}

TEST(GeluErfBackwardBound, Fp32KernelsWithErfAndExpAtTheirWorstAreWithinAndABf16CdfIsOutside) {
  double worst = 0;
  std::size_t outside = 0, count = 0;
  for (float x = -12.0f; x <= 12.0f; x += 1.0f / 512) {
    const float g = 0.75f + x / 64;
    const double cdf = 0.5 * std::erfc(-static_cast<double>(x) * 0.7071067811865476);
    const double pdf = 0.3989422804014327 * std::exp(-0.5 * static_cast<double>(x) * x);
    const double exact = g * (cdf + x * pdf);
    const double bound = gelu_erf_backward_bound({x, g, cdf, pdf}, kStackGeluErfError, kStackExpUlps);
    for (double offset : {-12.0, 0.0, 12.0}) {
      const double error = std::fabs(static_cast<double>(gelu_erf_backward_fp32(x, g, offset, false)) - exact);
      ASSERT_LE(error, bound) << "x = " << x << " erf offset " << offset;
      worst = std::max(worst, error / bound);
    }
    if (std::fabs(exact) > 1e-3) {
      ++count;
      outside += std::fabs(static_cast<double>(gelu_erf_backward_fp32(x, g, 0.0, true)) - exact) > bound;
    }
  }
  EXPECT_GT(outside, count / 2) << outside << " of " << count << " bf16 cdfs outside";
  RecordProperty("worst_error_over_bound", std::to_string(worst));
}

// A subnormal gradient (a product below the least normal value, off by up to half a step) and
// an input so large that exp(u x^2 / 2) is infinite while pdf is 0: within a finite bound.
TEST(GeluErfBackwardBound, ASubnormalGradientAndAHugeInputAreWithinAFiniteBound) {
  for (const float x : {0.0f, -0.5f, 1.0f, 3.0f, 2e5f, -2e5f}) {
    for (const float g : {0x1p-149f, 0x1p-140f, 0x1p-130f, 3.0f}) {
      const double cdf = 0.5 * std::erfc(-static_cast<double>(x) * 0.7071067811865476);
      const double pdf = 0.3989422804014327 * std::exp(-0.5 * static_cast<double>(x) * x);
      const double exact = g * (cdf + x * pdf);
      const double bound = gelu_erf_backward_bound({x, g, cdf, pdf}, kStackGeluErfError, kStackExpUlps);
      ASSERT_TRUE(std::isfinite(bound)) << "x = " << x << " g = " << g;
      ASSERT_LE(std::fabs(static_cast<double>(gelu_erf_backward_fp32(x, g, 0.0, false)) - exact), bound)
          << "x = " << x << " g = " << g;
    }
  }
}

// ---- log-softmax and its backward -----------------------------------------------------

// A row's log-softmax in fp32, exps and the log rounded up (their worst): z_j less m + log S
// (ATen's) or (z_j - m) less log S (`fused`); `bf16_sum` rounds each partial sum to bf16.
std::vector<float> log_softmax_fp32(const std::vector<float>& z, bool fused, bool bf16_sum) {
  const float m = *std::max_element(z.begin(), z.end());
  float sum = 0;
  for (float v : z) {
    sum += up(static_cast<float>(std::exp(static_cast<double>(v - m))));
    if (bf16_sum) sum = round_to_bf16(sum);
  }
  const float log_sum = up(static_cast<float>(std::log(static_cast<double>(sum))));
  std::vector<float> y(z.size());
  for (std::size_t j = 0; j < z.size(); ++j) y[j] = fused ? (z[j] - m) - log_sum : z[j] - (m + log_sum);
  return y;
}

std::vector<float> normal_row(std::size_t n, double scale, std::uint64_t stream) {
  std::vector<float> z(n);
  for (std::size_t j = 0; j < n; ++j) z[j] = static_cast<float>(normal_at(19, stream, j) * scale + 1.0);
  return z;
}

TEST(LogSoftmaxBound, Fp32KernelsWithExpAndLogAtTheirWorstAreWithinAndABf16SumIsOutside) {
  std::ostringstream tightness;
  tightness.precision(3);
  for (std::size_t V : {8, 256, 4096}) {
    for (double scale : {0.1, 3.0}) {
      double worst = 0;
      std::size_t outside = 0;
      for (std::uint64_t trial = 0; trial < 8; ++trial) {
        const std::vector<float> z = normal_row(V, scale, stream_id("function_bounds/log_softmax") + trial * 100 + V);
        std::vector<double> bound(V), exact(V);
        CrossEntropyRow r = row_terms(z, 0);
        for (std::size_t j = 0; j < V; ++j) {
          r.target = z[j];
          bound[j] = log_softmax_bound(r, static_cast<std::int64_t>(V), 1.0, 1.0);
          exact[j] = r.target - r.max - r.log_sum;
        }
        for (bool fused : {false, true}) {
          const std::vector<float> y = log_softmax_fp32(z, fused, false);
          for (std::size_t j = 0; j < V; ++j) {
            const double error = std::fabs(static_cast<double>(y[j]) - exact[j]);
            ASSERT_LE(error, bound[j]) << "V=" << V << " scale " << scale << " trial " << trial << " j " << j;
            worst = std::max(worst, error / bound[j]);
          }
        }
        const std::vector<float> low = log_softmax_fp32(z, false, true);
        bool any = false;
        for (std::size_t j = 0; j < V; ++j) any = any || std::fabs(static_cast<double>(low[j]) - exact[j]) > bound[j];
        outside += any;
      }
      if (V >= 256) {  // a bf16 sum of 8 terms can be exact: its rounding needs more terms to show
        EXPECT_GT(outside, 4u) << "V=" << V << " scale " << scale << ": a bf16 sum outside in " << outside << " of 8";
      }
      tightness << "V=" << V << "/scale=" << scale << ":" << worst << " ";
    }
  }
  RecordProperty("worst_error_over_bound", tightness.str());
}

// g_j - exp(y_j) sum g in fp32 (exp rounded up, the sum in order; `bf16_sum`: partial sums
// rounded to bf16) against the float64 value on the same y and g.
TEST(LogSoftmaxBackwardBound, Fp32KernelsWithExpAtItsWorstAreWithinAndABf16SumIsOutside) {
  std::ostringstream tightness;
  tightness.precision(3);
  for (std::size_t n : {8, 256, 4096}) {
    double worst = 0;
    std::size_t outside = 0;
    for (std::uint64_t trial = 0; trial < 8; ++trial) {
      const std::uint64_t stream = stream_id("function_bounds/log_softmax_backward") + trial * 100 + n;
      const std::vector<float> y = log_softmax_fp32(normal_row(n, 3.0, stream), false, false);
      const std::vector<float> g = normal_row(n, 1.0, stream + 1);
      double a = 0, A = 0;
      float sum = 0, low_sum = 0;
      for (float v : g) a += v, A += std::fabs(v), sum += v, low_sum = round_to_bf16(low_sum + v);
      bool any = false;
      for (std::size_t j = 0; j < n; ++j) {
        const double p = std::exp(static_cast<double>(y[j])), exact = g[j] - p * a;
        const double bound = log_softmax_backward_bound(p, std::fabs(a), A, std::fabs(exact), static_cast<std::int64_t>(n), 1.0);
        const float p_hat = up(static_cast<float>(std::exp(static_cast<double>(y[j]))));
        const double error = std::fabs(static_cast<double>(g[j] - p_hat * sum) - exact);
        ASSERT_LE(error, bound) << "n=" << n << " trial " << trial << " j " << j;
        worst = std::max(worst, error / bound);
        any = any || std::fabs(static_cast<double>(g[j] - p_hat * low_sum) - exact) > bound;
      }
      outside += any;
    }
    if (n >= 256) {
      EXPECT_GT(outside, 4u) << "n=" << n << ": a bf16 sum outside in " << outside << " of 8";
    }
    tightness << "n=" << n << ":" << worst << " ";
  }
  RecordProperty("worst_error_over_bound", tightness.str());
}

// The cross-entropy's backward: g one-hot (-1 at the target), logits parted by 60 to 120, so
// that p_j a falls below the least normal value off the target: exp's and the product's
// results in the subnormals are within the bound's underflow term.
TEST(LogSoftmaxBackwardBound, AOneHotGradientWhoseProductsUnderflowIsWithin) {
  for (float gap = 60.0f; gap <= 120.0f; gap += 0.25f) {
    const std::vector<float> z = {gap, 0.0f, -gap / 2, 1.0f};
    const std::vector<float> y = log_softmax_fp32(z, false, false);
    const std::vector<float> g = {0.0f, -1.0f, 0.0f, 0.0f};
    for (std::size_t j = 0; j < z.size(); ++j) {
      const double p = std::exp(static_cast<double>(y[j])), exact = g[j] - p * -1.0;
      const double bound = log_softmax_backward_bound(p, 1.0, 1.0, std::fabs(exact), 4, 1.0);
      const float p_hat = up(static_cast<float>(std::exp(static_cast<double>(y[j]))));
      ASSERT_LE(std::fabs(static_cast<double>(g[j] - p_hat * -1.0f) - exact), bound) << "gap " << gap << " j " << j;
    }
  }
}

}  // namespace
}  // namespace harness::numerics
