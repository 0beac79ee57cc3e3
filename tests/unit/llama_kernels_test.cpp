// The llama ops' kernels (engines/kernels/llama_kernels.h): every backward against central
// finite differences of its forward on odd sizes, grouped-query attention against the
// multi-head kernel it generalises, RoPE as a rotation, and every kernel bitwise equal
// across thread counts.
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include "gradient_check.h"
#include "kernels/kernels.h"
#include "kernels/llama_kernels.h"
#include "numerics/philox.h"

namespace harness::kernels {
namespace {

using harness::testing::expect_gradient;
using harness::testing::weighted_sum;

std::vector<float> normals(std::size_t n, std::uint64_t stream, float scale = 1.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(numerics::normal_at(7, stream, i));
  return v;
}

TEST(LlamaOpGradients, RmsNorm) {
  constexpr int N = 5, C = 7;
  auto x = normals(N * C, 1), w = normals(C, 2);
  const auto probe = normals(N * C, 3);
  std::vector<float> out(N * C), rstd(N);
  auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
    return weighted_sum(out, probe);
  };
  loss();
  std::vector<float> dx(N * C), dw(C);
  rmsnorm_backward(dx.data(), dw.data(), probe.data(), x.data(), w.data(), rstd.data(), N, C);
  expect_gradient("rmsnorm dinp", x, loss, dx);
  expect_gradient("rmsnorm dweight", w, loss, dw);
}

TEST(LlamaOpGradients, RopeIsARotationAndItsBackwardItsTranspose) {
  constexpr int B = 2, T = 5, heads = 3, hd = 6;
  std::vector<float> cos_table(T * hd / 2), sin_table(T * hd / 2);
  rope_tables(cos_table.data(), sin_table.data(), T, hd, 10000.0);
  for (std::size_t i = 0; i < cos_table.size(); ++i) {  // cos^2 + sin^2 = 1 to fp32 rounding
    EXPECT_NEAR(cos_table[i] * cos_table[i] + sin_table[i] * sin_table[i], 1.0f, 1e-6f);
  }
  for (int i = 0; i < hd / 2; ++i) EXPECT_EQ(cos_table[static_cast<std::size_t>(i)], 1.0f);  // position 0 is unturned
  // pair i of position 1 turns by theta^(-2i/hd): i = 0 by one radian
  EXPECT_NEAR(sin_table[hd / 2], std::sin(1.0), 1e-7);
  auto x = normals(B * T * heads * hd, 1);
  const auto probe = normals(B * T * heads * hd, 2);
  std::vector<float> out(x.size());
  auto loss = [&] {
    rope_forward(out.data(), x.data(), cos_table.data(), sin_table.data(), B, T, heads, hd);
    return weighted_sum(out, probe);
  };
  loss();
  std::vector<float> dx(x.size());
  rope_backward(dx.data(), probe.data(), cos_table.data(), sin_table.data(), B, T, heads, hd);
  expect_gradient("rope dinp", x, loss, dx, {}, 1000);
  // a rotation keeps every pair's length
  loss();  // out of the unperturbed x (the gradient check left the last perturbation's)
  for (std::size_t row = 0; row < x.size() / hd; ++row) {
    for (int i = 0; i < hd / 2; ++i) {
      const std::size_t a = row * hd + static_cast<std::size_t>(i), b = a + hd / 2;
      EXPECT_NEAR(std::hypot(out[a], out[b]), std::hypot(x[a], x[b]), 1e-5);
    }
  }
}

TEST(LlamaOpGradients, SwiGlu) {
  constexpr int n = 13;
  auto gate = normals(n, 1, 3.0f), up = normals(n, 2);
  const auto probe = normals(n, 3);
  std::vector<float> out(n);
  auto loss = [&] {
    swiglu_forward(out.data(), gate.data(), up.data(), n);
    return weighted_sum(out, probe);
  };
  loss();
  for (int i = 0; i < n; ++i) {  // silu(g) * u against the formula in double
    const double g = gate[static_cast<std::size_t>(i)];
    EXPECT_NEAR(out[static_cast<std::size_t>(i)], g / (1.0 + std::exp(-g)) * up[static_cast<std::size_t>(i)], 1e-5);
  }
  std::vector<float> dgate(n), dup(n);
  swiglu_backward(dgate.data(), dup.data(), probe.data(), gate.data(), up.data(), n);
  expect_gradient("swiglu dgate", gate, loss, dgate);
  expect_gradient("swiglu dup", up, loss, dup);
}

// SiLU has no op of its own (SwiGLU applies it to the gate): with up = 1 the op is SiLU, and
// its gradient is checked by finite differences over both signs, the saturated tails and 0.
TEST(LlamaOpGradients, SiluIsSwigluWithUpOne) {
  std::vector<float> gate{-12.0f, -6.5f, -2.0f, -0.75f, -0.1f, 0.0f, 0.1f, 0.75f, 2.0f, 6.5f, 12.0f};
  const std::size_t n = gate.size();
  const std::vector<float> up(n, 1.0f), probe = normals(n, 4);
  std::vector<float> out(n);
  auto loss = [&] {
    swiglu_forward(out.data(), gate.data(), up.data(), static_cast<int>(n));
    return weighted_sum(out, probe);
  };
  loss();
  for (std::size_t i = 0; i < n; ++i) {  // x * sigmoid(x) in double
    const double g = gate[i];
    EXPECT_NEAR(out[i], g / (1.0 + std::exp(-g)), 1e-5 * std::max(1.0, std::fabs(g))) << "x = " << g;
  }
  std::vector<float> dgate(n), dup(n);
  swiglu_backward(dgate.data(), dup.data(), probe.data(), gate.data(), up.data(), static_cast<int>(n));
  expect_gradient("silu", gate, loss, dgate);
}

struct GqaCase {
  int B, T, NH, NKV, hd;
};

TEST(LlamaOpGradients, GroupedQueryAttention) {
  for (const GqaCase c : {GqaCase{2, 5, 3, 1, 4}, GqaCase{1, 7, 4, 2, 2}, GqaCase{2, 3, 2, 2, 3}}) {
    auto q = normals(static_cast<std::size_t>(c.B * c.T * c.NH * c.hd), 1);
    auto k = normals(static_cast<std::size_t>(c.B * c.T * c.NKV * c.hd), 2);
    auto v = normals(static_cast<std::size_t>(c.B * c.T * c.NKV * c.hd), 3);
    const auto probe = normals(q.size(), 4);
    std::vector<float> out(q.size()), att(static_cast<std::size_t>(c.B * c.NH * c.T * c.T));
    auto loss = [&] {
      gqa_attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), c.B, c.T, c.NH, c.NKV, c.hd);
      return weighted_sum(out, probe);
    };
    loss();
    std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
    gqa_attention_backward(dq.data(), dk.data(), dv.data(), probe.data(), q.data(), k.data(), v.data(), att.data(), c.B,
                           c.T, c.NH, c.NKV, c.hd);
    expect_gradient("gqa dq", q, loss, dq, {}, 1000);
    expect_gradient("gqa dk", k, loss, dk, {}, 1000);
    expect_gradient("gqa dv", v, loss, dv, {}, 1000);
    for (int t2 = 1; t2 < c.T; ++t2) EXPECT_EQ(att[static_cast<std::size_t>(t2)], 0.0f);  // causal
  }
}

// With as many kv heads as query heads, GQA is the multi-head attention of gpt2: the same
// products in the same order, so the same bits as kernels.h's attention on packed qkv.
TEST(LlamaOps, GqaWithOneKvHeadPerQueryHeadIsMultiHeadAttentionBitForBit) {
  constexpr int B = 2, T = 9, NH = 3, hd = 5, C = NH * hd;
  const auto qkv = normals(B * T * 3 * C, 1);
  std::vector<float> q(B * T * C), k(B * T * C), v(B * T * C);
  for (int bt = 0; bt < B * T; ++bt) {
    for (int c = 0; c < C; ++c) {
      q[static_cast<std::size_t>(bt * C + c)] = qkv[static_cast<std::size_t>(bt * 3 * C + c)];
      k[static_cast<std::size_t>(bt * C + c)] = qkv[static_cast<std::size_t>(bt * 3 * C + C + c)];
      v[static_cast<std::size_t>(bt * C + c)] = qkv[static_cast<std::size_t>(bt * 3 * C + 2 * C + c)];
    }
  }
  std::vector<float> out_mha(B * T * C), att_mha(B * NH * T * T), out_gqa(B * T * C), att_gqa(B * NH * T * T);
  attention_forward(out_mha.data(), att_mha.data(), qkv.data(), B, T, C, NH);
  gqa_attention_forward(out_gqa.data(), att_gqa.data(), q.data(), k.data(), v.data(), B, T, NH, NH, hd);
  EXPECT_EQ(out_gqa, out_mha);
  EXPECT_EQ(att_gqa, att_mha);
  const auto dout = normals(B * T * C, 2);
  std::vector<float> dqkv(B * T * 3 * C), dq(B * T * C), dk(B * T * C), dv(B * T * C);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), att_mha.data(), B, T, C, NH);
  gqa_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), att_gqa.data(), B,
                         T, NH, NH, hd);
  for (int bt = 0; bt < B * T; ++bt) {
    for (int c = 0; c < C; ++c) {
      ASSERT_EQ(dq[static_cast<std::size_t>(bt * C + c)], dqkv[static_cast<std::size_t>(bt * 3 * C + c)]);
      ASSERT_EQ(dk[static_cast<std::size_t>(bt * C + c)], dqkv[static_cast<std::size_t>(bt * 3 * C + C + c)]);
      ASSERT_EQ(dv[static_cast<std::size_t>(bt * C + c)], dqkv[static_cast<std::size_t>(bt * 3 * C + 2 * C + c)]);
    }
  }
}

std::vector<std::uint32_t> bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = std::bit_cast<std::uint32_t>(v[i]);
  return b;
}

// Every kernel's outputs, forward and backward, at the odd sizes (C = 96, NH = 3,
// NKV = 1, T = 48, H = 176): the same bits on 1, 2, 3 and 8 threads.
TEST(LlamaOps, BitwiseAcrossThreadCounts) {
  constexpr int B = 2, T = 48, C = 96, NH = 3, NKV = 1, hd = C / NH, H = 176, N = B * T;
  const auto x = normals(N * C, 1), w = normals(C, 2), dy = normals(N * C, 3);
  const auto q = normals(N * NH * hd, 4), k = normals(N * NKV * hd, 5), v = normals(N * NKV * hd, 6);
  const auto gate = normals(N * H, 7, 2.0f), up = normals(N * H, 8), dh = normals(N * H, 9);
  std::vector<float> cos_table(T * hd / 2), sin_table(T * hd / 2);
  rope_tables(cos_table.data(), sin_table.data(), T, hd, 500000.0);
  const auto run = [&] {
    std::vector<std::vector<float>> outputs;
    std::vector<float> out(N * C), rstd(N), dx(N * C), dw(C);
    rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
    rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
    outputs.insert(outputs.end(), {out, rstd, dx, dw});
    std::vector<float> rq(q.size()), drq(q.size());
    rope_forward(rq.data(), q.data(), cos_table.data(), sin_table.data(), B, T, NH, hd);
    rope_backward(drq.data(), q.data(), cos_table.data(), sin_table.data(), B, T, NH, hd);
    outputs.insert(outputs.end(), {rq, drq});
    std::vector<float> s(N * H), dgate(N * H), dup(N * H);
    swiglu_forward(s.data(), gate.data(), up.data(), N * H);
    swiglu_backward(dgate.data(), dup.data(), dh.data(), gate.data(), up.data(), N * H);
    outputs.insert(outputs.end(), {s, dgate, dup});
    std::vector<float> o(q.size()), att(B * NH * T * T), dq(q.size()), dk(k.size()), dv(v.size());
    gqa_attention_forward(o.data(), att.data(), q.data(), k.data(), v.data(), B, T, NH, NKV, hd);
    gqa_attention_backward(dq.data(), dk.data(), dv.data(), q.data(), q.data(), k.data(), v.data(), att.data(), B, T, NH,
                           NKV, hd);
    outputs.insert(outputs.end(), {o, att, dq, dk, dv});
    return outputs;
  };
  std::vector<std::vector<float>> reference;
  {
    const tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
    reference = run();
  }
  for (int threads : {2, 3, 8}) {
    const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads));
    const auto got = run();
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(bits(got[i]), bits(reference[i])) << "output " << i << " at " << threads << " threads";
    }
  }
}

}  // namespace
}  // namespace harness::kernels
