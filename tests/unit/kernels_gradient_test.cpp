// Every op's backward against central finite differences of its forward, on small odd
// shapes (5, 7, 11, 13), with probe weights drawn from the counter-based generator.
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "gradient_check.h"
#include "kernels/kernels.h"
#include "numerics/philox.h"

namespace harness::kernels {
namespace {

using harness::testing::expect_gradient;
using harness::testing::weighted_sum;

std::vector<float> normals(std::size_t n, std::uint64_t stream, float scale = 1.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(numerics::normal_at(42, stream, i));
  return v;
}

TEST(OpGradients, Layernorm) {
  constexpr int N = 5, C = 7;
  auto x = normals(N * C, 1), w = normals(C, 2), b = normals(C, 3);
  const auto probe = normals(N * C, 4);
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
    return weighted_sum(out, probe);
  };
  loss();
  std::vector<float> dx(N * C), dw(C), db(C);
  layernorm_backward(dx.data(), dw.data(), db.data(), probe.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  expect_gradient("layernorm dinp", x, loss, dx);
  expect_gradient("layernorm dweight", w, loss, dw);
  expect_gradient("layernorm dbias", b, loss, db);
}

TEST(OpGradients, Linear) {
  constexpr int N = 5, C = 7, OC = 11;
  auto x = normals(N * C, 1), w = normals(OC * C, 2), b = normals(OC, 3);
  const auto probe = normals(N * OC, 4);
  std::vector<float> out(N * OC), scratch(N * OC + C * OC);
  auto loss = [&] {
    linear_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC, scratch.data());
    return weighted_sum(out, probe);
  };
  std::vector<float> dx(N * C), dw(OC * C), db(OC);
  linear_backward(dx.data(), dw.data(), db.data(), probe.data(), x.data(), w.data(), N, C, OC, scratch.data());
  expect_gradient("linear dinp", x, loss, dx);
  expect_gradient("linear dweight", w, loss, dw);
  expect_gradient("linear dbias", b, loss, db);
}

TEST(OpGradients, AttentionCausal) {
  constexpr int B = 2, T = 5, C = 6, NH = 2;
  auto qkv = normals(B * T * 3 * C, 1);
  const auto probe = normals(B * T * C, 2);
  std::vector<float> out(B * T * C), att(B * NH * T * T);
  auto loss = [&] {
    attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return weighted_sum(out, probe);
  };
  loss();
  std::vector<float> dqkv(B * T * 3 * C);
  attention_backward(dqkv.data(), probe.data(), qkv.data(), att.data(), B, T, C, NH);
  expect_gradient("attention dqkv", qkv, loss, dqkv, {}, 1000);
  // causality: the output at t = 0 ignores every later position
  for (int t2 = 1; t2 < T; ++t2) EXPECT_EQ(att[static_cast<std::size_t>(t2)], 0.0f);
}

// Both GELUs, tanh and exact (erf): elementwise, with the same signatures.
TEST(OpGradients, Gelu) {
  using Forward = void (*)(float*, const float*, std::int64_t);
  using Backward = void (*)(float*, const float*, const float*, std::int64_t);
  const struct {
    const char* name;
    Forward forward;
    Backward backward;
  } gelus[] = {{"gelu dinp", gelu_forward, gelu_backward}, {"gelu_erf dinp", gelu_erf_forward, gelu_erf_backward}};
  for (const auto& gelu : gelus) {
    constexpr int n = 13;
    auto x = normals(n, 1, 2.0f);
    const auto probe = normals(n, 2);
    std::vector<float> out(n);
    auto loss = [&] {
      gelu.forward(out.data(), x.data(), n);
      return weighted_sum(out, probe);
    };
    std::vector<float> dx(n);
    gelu.backward(dx.data(), x.data(), probe.data(), n);
    expect_gradient(gelu.name, x, loss, dx, {1e-2, 1e-3});
  }
}

TEST(OpGradients, EncoderWithRepeatedTokens) {
  constexpr int B = 2, T = 5, C = 7, V = 11;
  const std::vector<std::int32_t> tokens = {3, 1, 3, 10, 0, 7, 3, 3, 1, 9};  // repeats on purpose
  auto wte = normals(V * C, 1), wpe = normals(T * C, 2);
  const auto probe = normals(B * T * C, 3);
  std::vector<float> out(B * T * C);
  auto loss = [&] {
    encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return weighted_sum(out, probe);
  };
  std::vector<float> dwte(V * C), dwpe(T * C);
  encoder_backward(dwte.data(), dwpe.data(), probe.data(), tokens.data(), B, T, C);
  expect_gradient("encoder dwte", wte, loss, dwte, {}, 1000);
  expect_gradient("encoder dwpe", wpe, loss, dwpe, {}, 1000);
}

TEST(OpGradients, CrossEntropy) {
  constexpr int N = 5, V = 11;
  auto logits = normals(N * V, 1, 3.0f);
  const std::vector<std::int32_t> targets = {0, 10, 4, 4, 7};
  std::vector<float> probs(N * V);
  auto loss = [&] { return static_cast<double>(crossentropy_forward(probs.data(), logits.data(), targets.data(), N, V)); };
  loss();
  std::vector<float> dlogits(N * V);
  crossentropy_backward(dlogits.data(), probs.data(), targets.data(), N, V);
  expect_gradient("crossentropy dlogits", logits, loss, dlogits, {3e-2, 2e-4}, 1000);
}

TEST(OpGradients, ResidualAndAccumulation) {
  constexpr int n = 11;
  const auto a = normals(n, 1), b = normals(n, 2);
  std::vector<float> out(n);
  residual_forward(out.data(), a.data(), b.data(), n);
  for (int i = 0; i < n; ++i) EXPECT_EQ(out[static_cast<std::size_t>(i)], a[static_cast<std::size_t>(i)] + b[static_cast<std::size_t>(i)]);
  std::vector<float> acc = a;
  add_inplace(acc.data(), b.data(), n);
  EXPECT_EQ(acc, out);
}

TEST(Optimizer, AdamWMatchesTheFormulaInDouble) {
  constexpr int n = 13;
  auto p = normals(n, 1), g = normals(n, 2), m = normals(n, 3, 0.1f), v = normals(n, 4, 0.1f);
  for (float& x : v) x = x * x;
  const AdamWStep s{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.271f, 0.1426f};
  const auto p0 = p, m0 = m, v0 = v;
  adamw_update(p.data(), g.data(), m.data(), v.data(), n, s);
  for (int i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    const double mm = 0.9 * m0[k] + 0.1 * g[k], vv = 0.95 * v0[k] + 0.05 * double(g[k]) * g[k];
    const double expected = p0[k] * (1.0 - 3e-3 * 0.1) - 3e-3 * (mm / 0.271) / (std::sqrt(vv / 0.1426) + 1e-8);
    EXPECT_NEAR(p[k], expected, 1e-6 * (1.0 + std::fabs(expected))) << i;
    EXPECT_NEAR(m[k], mm, 1e-6);
    EXPECT_NEAR(v[k], vv, 1e-6);
  }
}

TEST(FaultInjection, NextUpMovesByExactlyNUlps) {
  EXPECT_EQ(next_up(1.0f, 1), std::nextafter(1.0f, 2.0f));
  EXPECT_EQ(next_up(-1.0f, 1), std::nextafter(-1.0f, 0.0f));
  EXPECT_EQ(next_up(0.0f, 1), std::nextafter(0.0f, 1.0f));
  EXPECT_EQ(next_up(1.0f, 3), std::nextafter(std::nextafter(std::nextafter(1.0f, 2.0f), 2.0f), 2.0f));
  EXPECT_EQ(next_up(2.5f, 0), 2.5f);
}

}  // namespace
}  // namespace harness::kernels
