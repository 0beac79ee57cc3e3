// The tiny canary's training step on cpu-ref (fwd + bwd + clip + AdamW), at 1 and 2
// threads, and the per-step recording cost (hashing + sketches + HDF5 append + flush),
// so the recording overhead can be stated as a share of the step.
//
//   build/bench/step_bench --benchmark_counters_tabular=true
#include <filesystem>
#include <memory>

#include <benchmark/benchmark.h>
#include <tbb/global_control.h>

#include "byte_stream.h"
#include "cpu_ref_engine.h"
#include "gpt2.h"
#include "receipt/receipt_writer.h"
#include "tensor_digest.h"

namespace {

using namespace harness;

struct TinyRun {
  canary::Gpt2Canary model{canary::preset("tiny")};
  canary::ByteStream data{model.config()};
  CpuRefEngine engine;
  TinyRun() {
    engine.bind(model.tensors());
    model.upload_initial_parameters(engine, 1337);
  }
};

void BM_TinyTrainStep(benchmark::State& state) {
  const tbb::global_control threads(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(state.range(0)));
  TinyRun run;
  int step = 0;
  for (auto _ : state) {
    const canary::Batch batch = run.data.batch(step % 100);
    benchmark::DoNotOptimize(run.model.train_step(run.engine, step % 100, batch));
    ++step;
  }
  const auto& c = run.model.config();
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(c.batch_size * c.context_length) *
                                                      static_cast<double>(state.iterations()),
                                                  benchmark::Counter::kIsRate);
}
BENCHMARK(BM_TinyTrainStep)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_RecordStep(benchmark::State& state) {
  const tbb::global_control threads(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(state.range(0)));
  TinyRun run;
  run.model.train_step(run.engine, 0, run.data.batch(0));
  std::vector<std::string> names;
  for (TensorId p : run.model.parameters()) names.push_back(run.model.tensors()[p].name);
  const auto path = std::filesystem::temp_directory_path() / "step_bench_receipt.h5";
  auto writer = std::make_unique<receipt::ReceiptWriter>(path.string(), receipt::Manifest{}, names, true, false,
                                                         receipt::BatchShape{8, 65});
  const run::StepDigester digester(run.model);
  receipt::StepRecord record;
  for (auto _ : state) {
    digester.digest(run.engine, record);
    writer->append_step(record);
  }
  writer.reset();
  std::filesystem::remove(path);
}
BENCHMARK(BM_RecordStep)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
