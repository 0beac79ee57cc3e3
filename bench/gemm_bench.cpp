// Deterministic GEMM (every kernel the CPU has) vs OpenBLAS sgemm, on one and two threads,
// at the tiny canary's shapes.
// Both compute C = A @ B (+ C) in fp32; counters report GFLOP/s (2*M*N*K per call).
//
//   build/bench/gemm_bench --benchmark_counters_tabular=true
#include <cblas.h>

#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <tbb/global_control.h>

#include "kernels/gemm.h"

extern "C" void openblas_set_num_threads(int);

namespace {

struct Shape {
  const char* role;
  int M, N, K;
};
// N = B*T = 512 tokens, C = 128 (qkv 3C, mlp 4C, vocab 256).
const Shape kShapes[] = {
    {"fwd.qkv", 512, 384, 128},     {"fwd.attn_proj", 512, 128, 128}, {"fwd.mlp_fc", 512, 512, 128},
    {"fwd.mlp_proj", 512, 128, 512}, {"fwd.lm_head", 512, 256, 128},   {"bwd.dW.mlp_fc", 512, 128, 512},
    {"bwd.dinp.mlp_fc", 512, 128, 512},
};

std::vector<float> random_matrix(int rows, int cols, unsigned seed) {
  std::mt19937 gen(seed);  // benchmark data only: values never reach a receipt
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> m(static_cast<std::size_t>(rows) * cols);
  for (float& x : m) x = dist(gen);
  return m;
}

void set_flops(benchmark::State& state, const Shape& s) {
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * s.M * s.N * s.K * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

void BM_DeterministicGemm(benchmark::State& state, Shape s, std::string_view kernel, int threads) {
  const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads));
  harness::kernels::select_gemm_kernel(kernel);
  const auto A = random_matrix(s.M, s.K, 1), B = random_matrix(s.K, s.N, 2);
  std::vector<float> C(static_cast<std::size_t>(s.M) * s.N);
  for (auto _ : state) {
    harness::kernels::gemm(s.M, s.N, s.K, A.data(), s.K, B.data(), s.N, C.data(), s.N,
                           harness::kernels::GemmEpilogue::Store);
    benchmark::DoNotOptimize(C.data());
  }
  set_flops(state, s);
  state.SetLabel(std::string(harness::kernels::gemm_kernel_name()));
}

void BM_OpenBlasSgemm(benchmark::State& state, Shape s, int threads) {
  openblas_set_num_threads(threads);
  const auto A = random_matrix(s.M, s.K, 1), B = random_matrix(s.K, s.N, 2);
  std::vector<float> C(static_cast<std::size_t>(s.M) * s.N);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.M, s.N, s.K, 1.0f, A.data(), s.K, B.data(), s.N, 0.0f,
                C.data(), s.N);
    benchmark::DoNotOptimize(C.data());
  }
  set_flops(state, s);
}

int register_all() {
  for (const Shape& s : kShapes) {
    const std::string suffix = std::string(s.role) + "/" + std::to_string(s.M) + "x" + std::to_string(s.N) + "x" +
                               std::to_string(s.K);
    // Every kernel the CPU has (all give the same bits), one thread and two, beside
    // OpenBLAS with as many threads.
    for (int threads : {1, 2}) {
      const std::string t = "/threads:" + std::to_string(threads);
      for (std::string_view kernel : harness::kernels::available_gemm_kernels()) {
        if (kernel == "generic") continue;  // the portable path: correctness, not speed
        benchmark::RegisterBenchmark(("deterministic_gemm/" + std::string(kernel) + "/" + suffix + t).c_str(),
                                     BM_DeterministicGemm, s, kernel, threads);
      }
      benchmark::RegisterBenchmark(("openblas_sgemm/" + suffix + t).c_str(), BM_OpenBlasSgemm, s, threads);
    }
  }
  return 0;
}
const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();
