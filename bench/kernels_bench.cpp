// The non-GEMM kernels of cpu-ref at the tiny canary's shapes, single thread:
// where a step's time goes besides the GEMMs.
//
//   build/bench/kernels_bench
#include <random>
#include <vector>

#include <benchmark/benchmark.h>
#include <tbb/global_control.h>

#include "kernels/kernels.h"

namespace {

constexpr int B = 8, T = 64, C = 128, NH = 4, V = 256;

std::vector<float> random_values(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 gen(seed);  // benchmark data only: values never reach a receipt
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

void BM_GeluForward(benchmark::State& state) {
  const tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
  const std::size_t n = B * T * 4 * C;
  const auto x = random_values(n, 1, 3.0f);
  std::vector<float> y(n);
  for (auto _ : state) harness::kernels::gelu_forward(y.data(), x.data(), static_cast<std::int64_t>(n));
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n));
}

void BM_GeluBackward(benchmark::State& state) {
  const tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
  const std::size_t n = B * T * 4 * C;
  const auto x = random_values(n, 1, 3.0f), dy = random_values(n, 2);
  std::vector<float> dx(n);
  for (auto _ : state) harness::kernels::gelu_backward(dx.data(), x.data(), dy.data(), static_cast<std::int64_t>(n));
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n));
}

void BM_AttentionForward(benchmark::State& state) {
  const tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
  const auto qkv = random_values(B * T * 3 * C, 1);
  std::vector<float> out(B * T * C), att(B * NH * T * T);
  for (auto _ : state) harness::kernels::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
}

void BM_AttentionBackward(benchmark::State& state) {
  const tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
  const auto qkv = random_values(B * T * 3 * C, 1), dout = random_values(B * T * C, 2);
  std::vector<float> out(B * T * C), att(B * NH * T * T), dqkv(B * T * 3 * C);
  harness::kernels::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  for (auto _ : state) harness::kernels::attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
}

void BM_LayernormForwardBackward(benchmark::State& state) {
  const tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
  const int N = B * T;
  const auto x = random_values(N * C, 1), w = random_values(C, 2), b = random_values(C, 3), dy = random_values(N * C, 4);
  std::vector<float> y(N * C), mean(N), rstd(N), dx(N * C), dw(C), db(C);
  for (auto _ : state) {
    harness::kernels::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
    harness::kernels::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                                         rstd.data(), N, C);
  }
}

void BM_CrossEntropyForward(benchmark::State& state) {
  const tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
  const int N = B * T;
  const auto logits = random_values(N * V, 1, 4.0f);
  std::vector<std::int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = (i * 37) % V;
  std::vector<float> probs(N * V);
  for (auto _ : state) {
    benchmark::DoNotOptimize(harness::kernels::crossentropy_forward(probs.data(), logits.data(), targets.data(), N, V));
  }
}

void BM_AdamW(benchmark::State& state) {
  const tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
  const std::size_t n = 4 * C * C;  // one mlp.fc.weight
  auto p = random_values(n, 1), g = random_values(n, 2), m = random_values(n, 3), v = random_values(n, 4, 0.0f);
  const harness::kernels::AdamWStep step{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f};
  for (auto _ : state) harness::kernels::adamw_update(p.data(), g.data(), m.data(), v.data(), static_cast<std::int64_t>(n), step);
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n));
}

BENCHMARK(BM_GeluForward);
BENCHMARK(BM_GeluBackward);
BENCHMARK(BM_AttentionForward);
BENCHMARK(BM_AttentionBackward);
BENCHMARK(BM_LayernormForwardBackward);
BENCHMARK(BM_CrossEntropyForward);
BENCHMARK(BM_AdamW);

}  // namespace

BENCHMARK_MAIN();
