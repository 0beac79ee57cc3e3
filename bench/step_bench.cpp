// The tiny canary's training step (fwd + bwd + clip + AdamW) on cpu-ref at 1 and 2
// threads (llama-tiny's and scale's too) and on accel per feature and noise mode at 2 threads, and the per-step
// recording cost (hashing + sketches + HDF5 append + flush), so the recording overhead
// can be stated as a share of the step.
//
//   build/bench/step_bench --benchmark_counters_tabular=true
#include <array>
#include <filesystem>
#include <memory>

#include <benchmark/benchmark.h>
#include <tbb/global_control.h>

#include "canary_file.h"
#include "accel_engine.h"
#include "canary.h"
#include "data_source.h"
#include "cpu_ref_engine.h"
#include "receipt/receipt_writer.h"
#include "tensor_digest.h"

namespace {

using namespace harness;

// A shipped canary (tiny unless named) bound to one engine, from its initial parameters.
template <typename EngineT>
struct CanaryRun {
  std::unique_ptr<canary::Canary> canary;
  std::unique_ptr<canary::DataSource> data;
  canary::Canary& model;
  EngineT engine;
  template <typename... Args>
  explicit CanaryRun(const std::string& name, Args&&... args)
      : canary(canary::make_canary(canary::load_canary(name))),
        data(canary::make_data_source(canary->config())),
        model(*canary),
        engine(std::forward<Args>(args)...) {
    engine.bind(model.tensors());
    model.upload_initial_parameters(engine, 1337);
  }
};
template <typename EngineT>
struct TinyRun : CanaryRun<EngineT> {
  template <typename... Args>
  explicit TinyRun(Args&&... args) : CanaryRun<EngineT>("tiny", std::forward<Args>(args)...) {}
};

template <typename EngineT>
void train_steps(benchmark::State& state, CanaryRun<EngineT>& run) {
  int step = 0;
  for (auto _ : state) {
    const canary::Batch batch = run.data->batch(step % 100);
    benchmark::DoNotOptimize(run.model.train_step(run.engine, step % 100, batch));
    ++step;
  }
  const auto& c = run.model.config();
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(c.batch_size * c.context_length) *
                                                      static_cast<double>(state.iterations()),
                                                  benchmark::Counter::kIsRate);
}

void BM_TinyTrainStep(benchmark::State& state) {
  const tbb::global_control threads(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(state.range(0)));
  TinyRun<CpuRefEngine> run;
  train_steps(state, run);
}
BENCHMARK(BM_TinyTrainStep)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// A shipped canary's step on cpu-ref (bench/canary-step.sh CANARY sets it beside PyTorch's
// lane step on the same canary): llama-tiny and moe-tiny.
void BM_CanaryTrainStep(benchmark::State& state, const char* canary) {
  const tbb::global_control threads(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(state.range(0)));
  CanaryRun<CpuRefEngine> run(canary);
  train_steps(state, run);
}
BENCHMARK_CAPTURE(BM_CanaryTrainStep, llama_tiny, "llama-tiny")
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_CanaryTrainStep, moe_tiny, "moe-tiny")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// The scale canary's step (gpt2, C=512, L=8, T=256: bench/scale.sh sets it beside PyTorch's
// and tiny's, with the peak memory of each).
void BM_ScaleTrainStep(benchmark::State& state) {
  const tbb::global_control threads(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(state.range(0)));
  CanaryRun<CpuRefEngine> run("scale");
  train_steps(state, run);
}
BENCHMARK(BM_ScaleTrainStep)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// accel at 2 threads: features (0 fp32, 1 bf16, 2 bf16+fp8=all) x noise (0 seeded, 1 racy, 2 off).
void BM_AccelTrainStep(benchmark::State& state) {
  const tbb::global_control threads(tbb::global_control::max_allowed_parallelism, 2);
  accel::AccelConfig config;
  config.bf16 = state.range(0) >= 1;
  config.fp8_zones = state.range(0) == 2 ? unsigned{accel::kAllZones} : 0u;
  config.noise = std::array{accel::NoiseMode::Seeded, accel::NoiseMode::Racy, accel::NoiseMode::Off}[state.range(1)];
  if (config.noise == accel::NoiseMode::Seeded) config.noise_seed = 7;
  TinyRun<accel::AccelEngine> run(config);
  state.SetLabel(config.canonical_features().empty() ? "fp32" : config.canonical_features());
  train_steps(state, run);
}
BENCHMARK(BM_AccelTrainStep)
    ->ArgsProduct({{0, 1, 2}, {0, 1, 2}})
    ->ArgNames({"features", "noise"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A tiny run after one step, and a receipt in the temp directory (removed at the end).
struct RecordedTinyRun {
  TinyRun<CpuRefEngine> run;
  std::filesystem::path path;
  std::unique_ptr<receipt::ReceiptWriter> writer;

  explicit RecordedTinyRun(const std::string& file) : path(std::filesystem::temp_directory_path() / file) {
    run.model.train_step(run.engine, 0, run.data->batch(0));
    std::vector<std::string> names;
    for (TensorId p : run.model.parameters()) names.push_back(run.model.tensors()[p].name);
    writer = std::make_unique<receipt::ReceiptWriter>(path.string(), receipt::Manifest{}, names, true, false,
                                                      receipt::BatchShape{8, 65});
  }
  ~RecordedTinyRun() {
    writer.reset();
    std::filesystem::remove(path);
  }
};

void BM_RecordStep(benchmark::State& state) {
  const tbb::global_control threads(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(state.range(0)));
  RecordedTinyRun recorded("step_bench_receipt.h5");
  const run::StepDigester digester(recorded.run.model);
  receipt::StepRecord record;
  for (auto _ : state) {
    digester.digest(recorded.run.engine, record);
    recorded.writer->append_step(record);
  }
}
BENCHMARK(BM_RecordStep)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// The receipt's share of BM_RecordStep: one step's row appended to 14 datasets and flushed.
void BM_AppendStep(benchmark::State& state) {
  RecordedTinyRun recorded("step_bench_append.h5");
  receipt::StepRecord record;
  run::StepDigester(recorded.run.model).digest(recorded.run.engine, record);
  for (auto _ : state) recorded.writer->append_step(record);
}
BENCHMARK(BM_AppendStep)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
