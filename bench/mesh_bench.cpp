// tpu-mesh: the tiny canary's training step on 1x1 (against cpu-ref in the same run) and
// on 2x2 per shard plan, and the compile cache: a cold compile of the traced step against
// a warm start from the persistent cache (read, checksum, deserialise), plus the
// per-step fingerprint that both pay; and moe-tiny on cpu-ref against a 4x1 mesh under dp
// (every device runs every expert) and ep (each runs its own after the all-to-all).
//
//   build/bench/mesh_bench --benchmark_counters_tabular=true
#include <filesystem>

#include <benchmark/benchmark.h>
#include <tbb/global_control.h>

#include "canary_file.h"
#include "byte_stream.h"
#include "compile_cache.h"
#include "compiler.h"
#include "cpu_ref_engine.h"
#include "gpt2/gpt2.h"
#include "tpu_mesh_engine.h"

namespace {

using namespace harness;

tpu::MeshConfig mesh_config(int mesh, int plan, int bf16 = 0) {
  tpu::MeshConfig c;
  c.mesh = mesh == 0 ? tpu::Mesh{1, 1} : tpu::Mesh{2, 2};
  c.plan = static_cast<tpu::ShardPlan>(plan);
  if (bf16 != 0) c.precision = tpu::Precision::Bf16;
  return c;
}

template <typename EngineT>
void run_steps(benchmark::State& state, EngineT& engine, const canary::Canary& model) {
  const tbb::global_control threads(tbb::global_control::max_allowed_parallelism, 2);
  const canary::ByteStream data(model.config());
  engine.bind(model.tensors());
  model.upload_initial_parameters(engine, 1337);
  int step = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(model.train_step(engine, step % 100, data.batch(step % 100)));
    ++step;
  }
}

template <typename EngineT>
void train_steps(benchmark::State& state, EngineT& engine) {
  run_steps(state, engine, canary::Gpt2Canary(canary::load_canary("tiny")));
}

void BM_CpuRefStep(benchmark::State& state) {
  CpuRefEngine engine;
  train_steps(state, engine);
}
BENCHMARK(BM_CpuRefStep)->Unit(benchmark::kMillisecond)->UseRealTime();

// mesh: 0 = 1x1, 1 = 2x2; plan: 0 dp, 1 tp, 2 zero3; bf16: 0 fp32, 1 bf16.
void BM_MeshStep(benchmark::State& state) {
  tpu::TpuMeshEngine engine(mesh_config(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)),
                                        static_cast<int>(state.range(2))));
  state.SetLabel(engine.lane_engine() + "+" + engine.features());
  train_steps(state, engine);
}
BENCHMARK(BM_MeshStep)
    ->Args({0, 0, 0})
    ->ArgsProduct({{1}, {0, 1, 2}, {0}})
    ->Args({1, 2, 1})
    ->ArgNames({"mesh", "plan", "bf16"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

template <typename EngineT>
void moe_steps(benchmark::State& state, EngineT& engine) {
  run_steps(state, engine, *canary::make_canary(canary::load_canary("moe-tiny")));
}

void BM_MoeCpuRefStep(benchmark::State& state) {
  CpuRefEngine engine;
  moe_steps(state, engine);
}
BENCHMARK(BM_MoeCpuRefStep)->Unit(benchmark::kMillisecond)->UseRealTime();

// plan: 0 dp, 3 ep, on 4x1.
void BM_MoeMeshStep(benchmark::State& state) {
  tpu::MeshConfig config;
  config.mesh = tpu::Mesh{4, 1};
  config.plan = static_cast<tpu::ShardPlan>(state.range(0));
  tpu::TpuMeshEngine engine(config);
  state.SetLabel(engine.lane_engine() + "+" + engine.features());
  moe_steps(state, engine);
}
BENCHMARK(BM_MoeMeshStep)->Arg(0)->Arg(3)->ArgName("plan")->Unit(benchmark::kMillisecond)->UseRealTime();

struct TracedTiny {
  canary::Gpt2Canary model{canary::load_canary("tiny")};
  tpu::MeshConfig config;
  tpu::Graph graph;
  std::string fingerprint;

  explicit TracedTiny(tpu::MeshConfig c) : config(std::move(c)) {
    tpu::TpuMeshEngine engine(config);
    engine.bind(model.tensors());
    model.upload_initial_parameters(engine, 1337);
    model.train_step(engine, 0, canary::ByteStream(model.config()).batch(0));
    graph = engine.step_programs().front().graph;
    fingerprint = engine.step_programs().front().fingerprint;
  }
};

void BM_MeshFingerprint(benchmark::State& state) {
  const TracedTiny traced(mesh_config(static_cast<int>(state.range(0)), 1));
  const std::string digest = tpu::table_digest(traced.model.tensors());
  for (auto _ : state) benchmark::DoNotOptimize(tpu::fingerprint(traced.graph, digest, traced.config.fingerprint_flags()));
}
BENCHMARK(BM_MeshFingerprint)->Arg(0)->Arg(1)->ArgName("mesh")->Unit(benchmark::kMicrosecond);

void BM_MeshCompileCold(benchmark::State& state) {
  const TracedTiny traced(mesh_config(static_cast<int>(state.range(0)), 1));
  const auto plan = tpu::plan_shardings(traced.model.tensors(), traced.config);
  for (auto _ : state) {
    benchmark::DoNotOptimize(tpu::compile(traced.graph, traced.model.tensors(), traced.config, plan, traced.fingerprint));
  }
}
BENCHMARK(BM_MeshCompileCold)->Arg(0)->Arg(1)->ArgName("mesh")->Unit(benchmark::kMicrosecond);

// A new process's first lookup: a fresh cache object reads the entry from disk.
void BM_MeshCacheWarmStart(benchmark::State& state) {
  const TracedTiny traced(mesh_config(static_cast<int>(state.range(0)), 1));
  const auto dir = std::filesystem::temp_directory_path() / "mesh_bench_cache";
  std::filesystem::remove_all(dir);
  tpu::CompileCache(dir.string())
      .insert(tpu::compile(traced.graph, traced.model.tensors(), traced.config,
                           tpu::plan_shardings(traced.model.tensors(), traced.config), traced.fingerprint));
  for (auto _ : state) {
    tpu::CompileCache cache(dir.string());
    const tpu::CacheLookup hit = cache.find(traced.fingerprint);
    if (hit.source != tpu::CacheSource::Disk) state.SkipWithError("the persistent cache missed");
    benchmark::DoNotOptimize(hit.executable);
  }
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_MeshCacheWarmStart)->Arg(0)->Arg(1)->ArgName("mesh")->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
