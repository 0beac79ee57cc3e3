// Checking receipts: reading two 100-step tiny receipts and judging them, as `harness
// check` and `harness compare` do (target: under 50 ms per check). The budgets file is
// parsed once per check too.
#include <filesystem>
#include <string>

#include <benchmark/benchmark.h>

#include "budgets.h"
#include "canary_run.h"
#include "verdict.h"

namespace {

namespace fs = std::filesystem;

std::string receipt(const std::string& name, const std::string& engine, const std::string& features) {
  const fs::path path = fs::temp_directory_path() / ("check_bench_" + name + ".h5");
  if (!fs::exists(path)) {
    harness::run::RunOptions o;
    o.canary = "tiny";
    o.engine = engine;
    o.engine_settings.features = features;
    o.out = path.string();
    o.force = true;
    harness::run::run_canary(o);
  }
  return path.string();
}

const std::string kBudgets = std::string(HARNESS_SOURCE_DIR) + "/canaries/budgets.toml";

// 0: bitwise (cpu-ref against itself), 1: budgeted (accel bf16+fp8 against cpu-ref).
void BM_CheckTwoReceipts(benchmark::State& state) {
  const std::string reference = receipt("cpu_ref", "cpu-ref", "");
  const std::string run = state.range(0) == 0 ? reference : receipt("accel_fp8", "accel", "bf16,fp8=all");
  for (auto _ : state) {
    const harness::check::Budgets budgets = harness::check::load_budgets(kBudgets);
    const auto verdict = harness::check::compare_receipts(harness::check::load_receipt(run),
                                                          harness::check::load_receipt(reference), budgets, "compare");
    benchmark::DoNotOptimize(verdict.pass());
  }
}
BENCHMARK(BM_CheckTwoReceipts)->Arg(0)->Arg(1)->ArgName("budgeted")->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
