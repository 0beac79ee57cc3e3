// The mixture-of-experts kernels (engines/kernels/moe_kernels.h): the router's decisions
// (top-k order, ties, the capacity's priority), its soft path and the balance loss against
// central finite differences, dispatch and combine as each other's transposes, and every
// kernel bitwise equal across thread counts.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include "gradient_check.h"
#include "kernels/moe_kernels.h"
#include "numerics/philox.h"

namespace harness::kernels {
namespace {

using harness::testing::expect_gradient;
using harness::testing::weighted_sum;

std::vector<float> normals(std::size_t n, std::uint64_t stream, float scale = 1.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(numerics::normal_at(11, stream, i));
  return v;
}

// Logits whose experts are 0.25 apart in every row (a shuffled ladder plus small noise), so
// the finite-difference steps below never flip a routing decision.
std::vector<float> separated_logits(int N, int E, std::uint64_t stream) {
  std::vector<float> logits(static_cast<std::size_t>(N) * E);
  const std::vector<float> noise = normals(logits.size(), stream, 0.01f);
  for (int n = 0; n < N; ++n) {
    std::vector<int> rank(static_cast<std::size_t>(E));
    std::iota(rank.begin(), rank.end(), 0);
    std::rotate(rank.begin(), rank.begin() + (n * 3) % E, rank.end());
    if (n % 2) std::reverse(rank.begin(), rank.end());
    for (int e = 0; e < E; ++e) {
      const std::size_t i = static_cast<std::size_t>(n) * E + e;
      logits[i] = 0.25f * static_cast<float>(rank[static_cast<std::size_t>(e)]) + noise[i];
    }
  }
  return logits;
}

struct Routing {
  std::vector<float> probs, weights, expert, slot, tokens_per_expert;
  Routing(int N, int E, int K)
      : probs(static_cast<std::size_t>(N) * E), weights(static_cast<std::size_t>(N) * K), expert(weights.size()),
        slot(weights.size()), tokens_per_expert(static_cast<std::size_t>(E)) {}
};

Routing route(const std::vector<float>& logits, int N, int E, int K, int cap) {
  Routing r(N, E, K);
  moe_route_forward(r.probs.data(), r.weights.data(), r.expert.data(), r.slot.data(), r.tokens_per_expert.data(),
                    logits.data(), N, E, K, cap);
  return r;
}

TEST(MoeRouter, TakesTheMostProbableExpertsLowerIndexOnATieAndRenormalises) {
  // Row 0: experts 2 and 3 tie at the top, 0 is next. Row 1: a strict order 1 > 3 > 0 > 2.
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 2.0f, 0.0f, 1.0f, -2.0f, 0.5f};
  const Routing r = route(logits, 2, 4, 3, 2);
  EXPECT_EQ(r.expert, (std::vector<float>{2, 3, 0, 1, 3, 0}));
  for (int n = 0; n < 2; ++n) {
    EXPECT_FLOAT_EQ(r.weights[n * 3] + r.weights[n * 3 + 1] + r.weights[n * 3 + 2], 1.0f);
    for (int j = 0; j < 3; ++j) {
      const float p = r.probs[static_cast<std::size_t>(n * 4 + static_cast<int>(r.expert[n * 3 + j]))];
      EXPECT_FLOAT_EQ(r.weights[n * 3 + j] / r.weights[n * 3], p / r.probs[n * 4 + static_cast<int>(r.expert[n * 3])]);
    }
  }
}

TEST(MoeRouter, CapacityServesEveryFirstChoiceBeforeAnySecondInRowOrder) {
  // Four tokens all prefer expert 0, then expert 1; capacity 2 per expert.
  const std::vector<float> logits = {3, 2, 0, 3, 2, 0, 3, 2, 0, 3, 2, 0};
  const Routing r = route(logits, 4, 3, 2, 2);
  // First choices: tokens 0 and 1 take expert 0's two rows, 2 and 3 are dropped there; the
  // second choices (expert 1) go in row order, tokens 0 and 1 again.
  EXPECT_EQ(r.slot, (std::vector<float>{0, 0, 1, 1, kDroppedSlot, kDroppedSlot, kDroppedSlot, kDroppedSlot}));
  EXPECT_EQ(r.tokens_per_expert, (std::vector<float>{2, 2, 0}));
}

TEST(MoeRouter, BalanceLossIsOneWhenUniformAndEWhenCollapsed) {
  constexpr int N = 4, E = 4, K = 1;
  std::vector<float> probs(N * E, 0.25f), expert = {0, 1, 2, 3};
  EXPECT_FLOAT_EQ(moe_balance_loss(probs.data(), expert.data(), N, E, K, 1.0f), 1.0f);
  std::fill(probs.begin(), probs.end(), 0.0f);
  for (int n = 0; n < N; ++n) probs[n * E] = 1.0f;
  expert = {0, 0, 0, 0};
  EXPECT_FLOAT_EQ(moe_balance_loss(probs.data(), expert.data(), N, E, K, 1.0f), 4.0f);
}

// The router's soft path: with decisions fixed, the combine's weights and the balance loss
// are smooth functions of the logits; their gradient against finite differences.
TEST(MoeRouter, SoftPathAndBalanceLossMatchFiniteDifferences) {
  constexpr int N = 7, E = 5, K = 2, C = 3, cap = 2;  // 14 choices, 10 rows: some dropped
  constexpr float coef = 0.7f;
  auto logits = separated_logits(N, E, 1);
  const auto expert_out = normals(static_cast<std::size_t>(E) * cap * C, 2);
  const auto probe = normals(static_cast<std::size_t>(N) * C, 3);
  const Routing decided = route(logits, N, E, K, cap);
  std::vector<float> out(static_cast<std::size_t>(N) * C);
  auto loss = [&] {
    const Routing r = route(logits, N, E, K, cap);
    EXPECT_EQ(r.slot, decided.slot) << "a finite-difference step flipped a routing decision";
    moe_combine_forward(out.data(), expert_out.data(), r.weights.data(), r.expert.data(), r.slot.data(), N, C, K, cap);
    return weighted_sum(out, probe) + moe_balance_loss(r.probs.data(), r.expert.data(), N, E, K, coef);
  };
  std::vector<float> dexpert_out(expert_out.size()), dweights(decided.weights.size()), dlogits(logits.size());
  moe_combine_backward(dexpert_out.data(), dweights.data(), probe.data(), expert_out.data(), decided.weights.data(),
                       decided.expert.data(), decided.slot.data(), N, C, K, cap);
  moe_route_backward(dlogits.data(), dweights.data(), decided.probs.data(), decided.weights.data(),
                     decided.expert.data(), N, E, K, coef);
  expect_gradient("router dlogits", logits, loss, dlogits, {3e-2, 1e-3, 1e-3f});
  EXPECT_GT(*std::max_element(dweights.begin(), dweights.end()), 0.0f);  // the probe reaches the router
}

// Dispatch and combine move rows to experts and back: through a nonlinear expert (x^2),
// the inputs' and the expert outputs' gradients against finite differences.
TEST(MoeDispatchCombine, GradientsMatchFiniteDifferences) {
  constexpr int N = 6, E = 3, K = 2, C = 4, cap = 3;
  const Routing r = route(separated_logits(N, E, 4), N, E, K, cap);
  auto x = normals(static_cast<std::size_t>(N) * C, 5);
  const auto probe = normals(static_cast<std::size_t>(N) * C, 6);
  std::vector<float> expert_in(static_cast<std::size_t>(E) * cap * C), expert_out(expert_in.size()), out(x.size());
  auto loss = [&] {
    moe_dispatch_forward(expert_in.data(), x.data(), r.expert.data(), r.slot.data(), N, C, E, K, cap);
    for (std::size_t i = 0; i < expert_in.size(); ++i) expert_out[i] = expert_in[i] * expert_in[i];
    moe_combine_forward(out.data(), expert_out.data(), r.weights.data(), r.expert.data(), r.slot.data(), N, C, K, cap);
    return weighted_sum(out, probe);
  };
  loss();
  std::vector<float> dexpert_out(expert_out.size()), dweights(r.weights.size()), dexpert_in(expert_in.size()),
      dx(x.size());
  moe_combine_backward(dexpert_out.data(), dweights.data(), probe.data(), expert_out.data(), r.weights.data(),
                       r.expert.data(), r.slot.data(), N, C, K, cap);
  for (std::size_t i = 0; i < expert_in.size(); ++i) dexpert_in[i] = 2.0f * expert_in[i] * dexpert_out[i];
  moe_dispatch_backward(dx.data(), dexpert_in.data(), r.expert.data(), r.slot.data(), N, C, K, cap);
  expect_gradient("dispatch+combine dinp", x, loss, dx);
  // 12 choices for 9 rows: the dropped ones were among those differentiated.
  const float dropped =
      static_cast<float>(N * K) - std::accumulate(r.tokens_per_expert.begin(), r.tokens_per_expert.end(), 0.0f);
  EXPECT_GT(dropped, 0.0f);
}

std::vector<std::uint32_t> bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  std::transform(v.begin(), v.end(), b.begin(), [](float f) { return std::bit_cast<std::uint32_t>(f); });
  return b;
}

TEST(MoeKernels, EveryOutputIsBitwiseEqualOnAnyThreadCount) {
  constexpr int N = 97, E = 6, K = 2, C = 24, cap = 30;
  const auto logits = normals(static_cast<std::size_t>(N) * E, 7);  // near ties included
  const auto x = normals(static_cast<std::size_t>(N) * C, 8), dy = normals(x.size(), 9);
  auto run = [&] {
    Routing r = route(logits, N, E, K, cap);
    std::vector<float> expert_in(static_cast<std::size_t>(E) * cap * C), out(x.size());
    moe_dispatch_forward(expert_in.data(), x.data(), r.expert.data(), r.slot.data(), N, C, E, K, cap);
    moe_combine_forward(out.data(), expert_in.data(), r.weights.data(), r.expert.data(), r.slot.data(), N, C, K, cap);
    std::vector<float> dexpert(expert_in.size()), dweights(r.weights.size()), dx(x.size()), dlogits(logits.size());
    moe_combine_backward(dexpert.data(), dweights.data(), dy.data(), expert_in.data(), r.weights.data(),
                         r.expert.data(), r.slot.data(), N, C, K, cap);
    moe_dispatch_backward(dx.data(), dexpert.data(), r.expert.data(), r.slot.data(), N, C, K, cap);
    moe_route_backward(dlogits.data(), dweights.data(), r.probs.data(), r.weights.data(), r.expert.data(), N, E, K,
                       0.01f);
    const float balance = moe_balance_loss(r.probs.data(), r.expert.data(), N, E, K, 0.01f);
    return std::vector<std::vector<float>>{r.probs, r.weights, r.expert, r.slot, out, dx, dlogits, {balance}};
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
