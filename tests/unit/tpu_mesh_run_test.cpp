// tpu-mesh at run level: one device is bitwise cpu-ref, a fixed mesh and plan are bitwise
// reproducible on any thread count, every plan stays within the documented tolerance of
// cpu-ref, and compile stability is measured: one compile at step 0, none after, none on
// a warm persistent cache, one every step when a scalar leaks into the graph; a corrupt
// cache entry is evicted and recompiled.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "byte_stream.h"
#include "canary_file.h"
#include "audit.h"
#include "gpt2/gpt2.h"
#include "preset.h"
#include "receipt_bits.h"
#include "tpu_mesh_engine.h"

namespace harness::tpu {
namespace {

using harness::testing::lane;
using harness::testing::max_loss_gap;
using harness::testing::receipt_dataset;
using harness::testing::ReceiptBits;
using harness::testing::run_and_read;
using harness::testing::scratch;
namespace fs = std::filesystem;

using Flags = std::map<std::string, std::string>;

run::RunOptions mesh_lane(const std::string& canary, int steps, int threads, Flags flags) {
  return lane(canary, steps, threads, "tpu-mesh", "", std::move(flags));
}

TEST(TpuMeshRun, OneDeviceIsBitwiseCpuRefOnEveryPlan) {
  const ReceiptBits reference = run_and_read(lane("tiny", 3, 2), "cpu_ref");
  for (const char* plan : {"dp", "tp", "zero3"}) {
    EXPECT_TRUE(reference.same_numbers(run_and_read(mesh_lane("tiny", 3, 2, {{"shard-plan", plan}}), "one_device")))
        << plan;
  }
  // dp and zero3 on 1x2 replicate the whole program over `model`: still cpu-ref's bits.
  for (const char* plan : {"dp", "zero3"}) {
    EXPECT_TRUE(reference.same_numbers(
        run_and_read(mesh_lane("tiny", 3, 2, {{"mesh", "1x2"}, {"shard-plan", plan}}), "replicated_1x2")))
        << plan;
  }
}

TEST(TpuMeshRun, FixedMeshAndPlanIsBitwiseReproducibleOnAnyThreadCount) {
  for (const char* plan : {"tp", "zero3"}) {
    const Flags flags{{"mesh", "2x2"}, {"shard-plan", plan}, {"precision", "bf16"}};
    const ReceiptBits two = run_and_read(mesh_lane("micro", 4, 2, flags), "repro2");
    EXPECT_TRUE(two.same_numbers(run_and_read(mesh_lane("micro", 4, 1, flags), "repro1"))) << plan;
    EXPECT_TRUE(two.same_numbers(run_and_read(mesh_lane("micro", 4, 3, flags), "repro3"))) << plan;
    EXPECT_TRUE(two.same_numbers(run_and_read(mesh_lane("micro", 4, 2, flags), "repro2again"))) << plan;
  }
}

// Tolerances of docs/engines/tpu-mesh.md, measured on tiny over 4 steps: fp32 moves the
// loss by at most 4.8e-7 (reduction order only), bf16 by at most 8.1e-4.
TEST(TpuMeshRun, EveryPlanAndMeshStaysWithinToleranceOfCpuRef) {
  const ReceiptBits reference = run_and_read(lane("tiny", 4, 2), "tolerance_ref");
  for (const char* precision : {"fp32", "bf16"}) {
    const double tolerance = std::string(precision) == "fp32" ? 1e-5 : 5e-3;
    bool any_moved = false;
    for (const char* plan : {"dp", "tp", "zero3"}) {
      for (const char* mesh : {"2x1", "1x2", "2x2"}) {
        const ReceiptBits run = run_and_read(
            mesh_lane("tiny", 4, 2, {{"mesh", mesh}, {"shard-plan", plan}, {"precision", precision}}), "tolerance");
        EXPECT_EQ(run.batches, reference.batches);
        EXPECT_LE(max_loss_gap(run, reference), tolerance) << plan << " " << mesh << " " << precision;
        any_moved = any_moved || max_loss_gap(run, reference) > 0;
      }
    }
    EXPECT_TRUE(any_moved) << precision << ": no plan changed a bit; sharding did nothing";
  }
}

TEST(TpuMeshRun, Zero3HoldsOneNthOfDataParallelParameterAndOptimizerBytes) {
  run_and_read(mesh_lane("tiny", 1, 2, {{"mesh", "4x1"}, {"shard-plan", "dp"}}), "memory_dp");
  run_and_read(mesh_lane("tiny", 1, 2, {{"mesh", "4x1"}, {"shard-plan", "zero3"}}), "memory_zero3");
  for (const char* category : {"/memory/parameters", "/memory/optimizer_state"}) {
    const std::vector<double> dp = receipt_dataset("memory_dp", category);
    const std::vector<double> zero3 = receipt_dataset("memory_zero3", category);
    ASSERT_EQ(dp.size(), 4u);  // one step, four devices
    for (std::size_t d = 0; d < dp.size(); ++d) EXPECT_EQ(zero3[d] * 4, dp[d]) << category << " device " << d;
  }
  EXPECT_LT(receipt_dataset("memory_zero3", "/memory/total")[0], receipt_dataset("memory_dp", "/memory/total")[0]);
}

// HARNESS_MESH_REPLICAS for the scope of one test; the outer value is restored after.
class ReplicaMode {
 public:
  explicit ReplicaMode(const char* mode) {
    if (const char* outer = std::getenv(kVariable); outer != nullptr) outer_ = outer;
    ::setenv(kVariable, mode, 1);
  }
  ~ReplicaMode() {
    if (outer_) ::setenv(kVariable, outer_->c_str(), 1);
    else ::unsetenv(kVariable);
  }

 private:
  static constexpr const char* kVariable = "HARNESS_MESH_REPLICAS";
  std::optional<std::string> outer_;
};

// dp and zero3 shard nothing on `model`: its replicas are skipped by default. Run with
// every replica (verify mode checks, after each program, that each replica holds its
// twin's exact blocks: a difference throws and fails the run), the receipt is the same,
// on every plan, precision and compile mode that replicates.
TEST(TpuMeshRun, SkippedReplicasAreExactlyTheReplicasRun) {
  const std::vector<Flags> configs = {
      {{"mesh", "2x2"}, {"shard-plan", "dp"}},
      {{"mesh", "2x2"}, {"shard-plan", "zero3"}, {"precision", "bf16"}},
      {{"mesh", "1x2"}, {"shard-plan", "zero3"}, {"compile-mode", "microstep"}, {"grad-accum", "2"}},
  };
  for (const Flags& flags : configs) {
    const ReceiptBits skipped = run_and_read(mesh_lane("micro", 3, 2, flags), "replicas_once");
    const ReplicaMode verify("verify");
    EXPECT_TRUE(skipped.same_numbers(run_and_read(mesh_lane("micro", 3, 2, flags), "replicas_verified")))
        << flags.at("mesh") << " " << flags.at("shard-plan");
  }
}

TEST(TpuMeshRun, AnUnknownReplicaModeIsAnError) {
  const ReplicaMode wrong("sometimes");
  tpu::MeshConfig config;
  config.mesh = tpu::Mesh{2, 2};
  TpuMeshEngine engine(config);
  const canary::Gpt2Canary model(canary::load_canary("micro"));
  EXPECT_THROW(engine.bind(model.tensors()), std::invalid_argument);
}

// Cold: one uncached compile at step 0, cached lookups after. Warm (same cache dir, new
// process state): no compile at all, a persistent hit at step 0, the same bits.
TEST(TpuMeshRun, CompilesOnceColdAndNeverWarm) {
  for (const char* plan : {"dp", "tp", "zero3"}) {
    const std::string cache = scratch().path(std::string("cache_") + plan);
    const Flags flags{{"mesh", "2x2"}, {"shard-plan", plan}, {"compile-cache", cache}};
    const ReceiptBits cold = run_and_read(mesh_lane("micro", 4, 2, flags), "cold");
    const std::vector<double> cold_compiles = receipt_dataset("cold", "/compile/UncachedCompile");
    EXPECT_EQ(cold_compiles, (std::vector<double>{1, 0, 0, 0})) << plan;
    EXPECT_EQ(receipt_dataset("cold", "/compile/PersistentCacheMiss")[0], 1) << plan;
    EXPECT_EQ(receipt_dataset("cold", "/compile/CachedCompile"), (std::vector<double>{0, 1, 1, 1})) << plan;
    EXPECT_EQ(receipt_dataset("cold", "/compile/HostSync"), (std::vector<double>{0, 0, 0, 0})) << plan;

    const ReceiptBits warm = run_and_read(mesh_lane("micro", 4, 2, flags), "warm");
    EXPECT_EQ(receipt_dataset("warm", "/compile/UncachedCompile"), (std::vector<double>{0, 0, 0, 0})) << plan;
    EXPECT_EQ(receipt_dataset("warm", "/compile/PersistentCacheHit")[0], 1) << plan;
    EXPECT_TRUE(cold.same_numbers(warm)) << plan;
  }
}

// A llama program (no position embedding: operands that may be absent) passes the cache's
// well-formedness check and loads warm, as gpt2's do.
TEST(TpuMeshRun, LlamaProgramsLoadWarmFromThePersistentCache) {
  const std::string cache = scratch().path("cache_llama");
  const Flags flags{{"mesh", "1x2"}, {"shard-plan", "tp"}, {"compile-cache", cache}};
  const ReceiptBits cold = run_and_read(mesh_lane("llama-tiny", 2, 2, flags), "llama_cold");
  const ReceiptBits warm = run_and_read(mesh_lane("llama-tiny", 2, 2, flags), "llama_warm");
  EXPECT_EQ(receipt_dataset("llama_warm", "/compile/UncachedCompile"), (std::vector<double>{0, 0}));
  EXPECT_EQ(receipt_dataset("llama_warm", "/compile/PersistentCacheHit")[0], 1);
  EXPECT_EQ(receipt_dataset("llama_warm", "/compile/PersistentCacheDeserializeFailure")[0], 0);
  EXPECT_TRUE(cold.same_numbers(warm));
}

// The learning rate baked into the graph: a new program every step, the same numbers.
TEST(TpuMeshRun, LeakedScalarRecompilesEveryStepWithTheSameNumerics) {
  const Flags clean{{"mesh", "2x1"}};
  Flags leaky = clean;
  leaky["leak-scalars"] = "1";
  const ReceiptBits stable = run_and_read(mesh_lane("micro", 4, 2, clean), "stable");
  const ReceiptBits leaked = run_and_read(mesh_lane("micro", 4, 2, leaky), "leaked");
  EXPECT_EQ(receipt_dataset("leaked", "/compile/UncachedCompile"), (std::vector<double>{1, 1, 1, 1}));
  EXPECT_EQ(receipt_dataset("stable", "/compile/UncachedCompile"), (std::vector<double>{1, 0, 0, 0}));
  EXPECT_TRUE(stable.same_numbers(leaked));
}

void corrupt_cache_entry(const std::string& cache, const std::string& how) {
  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(cache)) entries.push_back(e.path());
  ASSERT_EQ(entries.size(), 1u);
  const auto size = fs::file_size(entries[0]);
  if (how == "truncate") {
    fs::resize_file(entries[0], size / 2);
    return;
  }
  std::fstream f(entries[0], std::ios::in | std::ios::out | std::ios::binary);
  const auto at = how == "version" ? std::streamoff{8} : static_cast<std::streamoff>(size - 7);  // header or payload
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  f.seekp(at);
  c = static_cast<char>(c ^ 0x5A);
  f.write(&c, 1);
}

TEST(TpuMeshRun, CorruptCacheEntryIsEvictedAndRecompiledNeverTrusted) {
  for (const char* how : {"payload", "truncate", "version"}) {
    const std::string cache = scratch().path(std::string("corrupt_") + how);
    const Flags flags{{"mesh", "2x1"}, {"compile-cache", cache}};
    const ReceiptBits first = run_and_read(mesh_lane("micro", 2, 2, flags), "first");
    corrupt_cache_entry(cache, how);
    const ReceiptBits after = run_and_read(mesh_lane("micro", 2, 2, flags), "after_corruption");
    EXPECT_EQ(receipt_dataset("after_corruption", "/compile/PersistentCacheDeserializeFailure")[0], 1) << how;
    EXPECT_EQ(receipt_dataset("after_corruption", "/compile/PersistentCacheHit")[0], 0) << how;
    EXPECT_EQ(receipt_dataset("after_corruption", "/compile/UncachedCompile")[0], 1) << how;
    EXPECT_TRUE(first.same_numbers(after)) << how;
    run_and_read(mesh_lane("micro", 2, 2, flags), "rewritten");  // the recompiled entry replaced it
    EXPECT_EQ(receipt_dataset("rewritten", "/compile/PersistentCacheHit")[0], 1) << how;
  }
}

TEST(TpuMeshRun, UnwritableCacheDirRunsWithoutPersistence) {
  const std::string not_a_dir = scratch().path("cache_is_a_file");
  std::ofstream(not_a_dir) << "x";
  run_and_read(mesh_lane("micro", 2, 2, {{"compile-cache", not_a_dir}}), "no_persistence");
  EXPECT_EQ(receipt_dataset("no_persistence", "/compile/UncachedCompile"), (std::vector<double>{1, 0}));
  EXPECT_EQ(receipt_dataset("no_persistence", "/compile/PersistentCacheMiss"), (std::vector<double>{0, 0}));
}

// --compile-mode microstep --grad-accum K: a forward+backward program that writes the
// gradients (micro-batch 0), one that adds to them (1..K-1) and the optimizer: exactly
// three compiles at step 0, none after, none on a warm cache; the same bits.
TEST(TpuMeshMicroStep, CompilesThreeProgramsAtStepZeroAndNoneAfter) {
  for (const char* plan : {"dp", "tp", "zero3"}) {
    const std::string cache = scratch().path(std::string("microstep_cache_") + plan);
    const Flags flags{{"mesh", "2x2"},        {"shard-plan", plan},  {"compile-mode", "microstep"},
                      {"grad-accum", "2"},    {"compile-cache", cache}};
    const ReceiptBits cold = run_and_read(mesh_lane("tiny", 3, 2, flags), "microstep_cold");
    EXPECT_EQ(receipt_dataset("microstep_cold", "/compile/UncachedCompile"), (std::vector<double>{3, 0, 0})) << plan;
    EXPECT_EQ(receipt_dataset("microstep_cold", "/compile/CachedCompile"), (std::vector<double>{0, 3, 3})) << plan;
    EXPECT_EQ(receipt_dataset("microstep_cold", "/compile/HostSync"), (std::vector<double>{0, 0, 0})) << plan;
    const ReceiptBits warm = run_and_read(mesh_lane("tiny", 3, 2, flags), "microstep_warm");
    EXPECT_EQ(receipt_dataset("microstep_warm", "/compile/UncachedCompile"), (std::vector<double>{0, 0, 0})) << plan;
    EXPECT_EQ(receipt_dataset("microstep_warm", "/compile/PersistentCacheHit")[0], 3) << plan;
    EXPECT_TRUE(cold.same_numbers(warm)) << plan;
  }
}

TEST(TpuMeshMicroStep, TheThreeProgramsAreDistinctAndStableAcrossSteps) {
  canary::Gpt2Canary model(canary::load_canary("tiny"));
  MeshConfig config;
  config.mesh = {2, 1};
  config.compile_mode = CompileMode::Microstep;
  config.grad_accum = 4;
  TpuMeshEngine engine(config);
  engine.bind(model.tensors());
  model.upload_initial_parameters(engine, 1);
  const canary::ByteStream data(model.config());
  std::vector<std::string> first;
  for (int step = 0; step < 2; ++step) {
    model.train_step(engine, step, data.batch(step));
    std::vector<std::string> fingerprints;
    for (const TracedProgram& s : engine.step_programs()) fingerprints.push_back(s.fingerprint);
    ASSERT_EQ(fingerprints.size(), 3u);  // grad create, grad accumulate, optimizer
    EXPECT_NE(fingerprints[0], fingerprints[1]);
    EXPECT_NE(fingerprints[1], fingerprints[2]);
    EXPECT_NE(fingerprints[0], fingerprints[2]);
    if (step == 0) first = fingerprints;
    EXPECT_EQ(fingerprints, first);
    EXPECT_EQ(engine.counters().uncached_compile, step == 0 ? 3 : 0);
  }
}

// Unrolled in one step program or run as micro-step programs: the same kernels in the same
// order, so the same bits; and within fp32 tolerance of cpu-ref's whole-batch step (the
// gradients are summed per micro-batch, the loss as K partial means).
TEST(TpuMeshMicroStep, BothModesGiveTheSameBitsWithinToleranceOfCpuRef) {
  const ReceiptBits reference = run_and_read(lane("tiny", 3, 2), "accum_ref");
  for (const auto& [mesh, plan] : {std::pair{"2x1", "dp"}, {"2x2", "tp"}, {"2x1", "zero3"}, {"1x1", "dp"}}) {
    for (const char* k : {"2", "4"}) {
      const Flags step_flags{{"mesh", mesh}, {"shard-plan", plan}, {"grad-accum", k}};
      Flags micro_flags = step_flags;
      micro_flags["compile-mode"] = "microstep";
      const ReceiptBits unrolled = run_and_read(mesh_lane("tiny", 3, 2, step_flags), "accum_step");
      const ReceiptBits micro = run_and_read(mesh_lane("tiny", 3, 2, micro_flags), "accum_micro");
      EXPECT_TRUE(unrolled.same_numbers(micro)) << mesh << " " << plan << " K=" << k;
      EXPECT_EQ(micro.batches, reference.batches);
      EXPECT_LE(max_loss_gap(micro, reference), 1e-5) << mesh << " " << plan << " K=" << k;
      EXPECT_EQ(receipt_dataset("accum_step", "/compile/UncachedCompile")[0], 1);
    }
  }
  // One micro-batch on one device is cpu-ref's program cut in two: still its bits.
  const ReceiptBits one = run_and_read(mesh_lane("tiny", 3, 2, {{"compile-mode", "microstep"}}), "accum_one");
  EXPECT_TRUE(one.same_numbers(reference));
  EXPECT_EQ(receipt_dataset("accum_one", "/compile/UncachedCompile"), (std::vector<double>{2, 0, 0}));
}

TEST(TpuMeshMicroStep, MicroBatchesDivideTheActivationPeak) {
  run_and_read(mesh_lane("tiny", 1, 2, {{"compile-mode", "microstep"}}), "peak_k1");
  run_and_read(mesh_lane("tiny", 1, 2, {{"compile-mode", "microstep"}, {"grad-accum", "4"}}), "peak_k4");
  const double k1 = receipt_dataset("peak_k1", "/memory/activations")[0];
  const double k4 = receipt_dataset("peak_k4", "/memory/activations")[0];
  EXPECT_LT(k4, 0.3 * k1);
  EXPECT_GT(k4, 0.2 * k1);
  EXPECT_EQ(receipt_dataset("peak_k1", "/memory/parameters"), receipt_dataset("peak_k4", "/memory/parameters"));
}

// A leaked learning rate lives in the optimizer program: only that one recompiles.
TEST(TpuMeshMicroStep, LeakedScalarRecompilesOnlyTheOptimizerProgram) {
  const Flags flags{{"mesh", "2x1"}, {"compile-mode", "microstep"}, {"grad-accum", "2"}, {"leak-scalars", "1"}};
  run_and_read(mesh_lane("tiny", 3, 2, flags), "microstep_leak");
  EXPECT_EQ(receipt_dataset("microstep_leak", "/compile/UncachedCompile"), (std::vector<double>{3, 1, 1}));
}

}  // namespace
}  // namespace harness::tpu

namespace harness::run {
namespace {

// Two steps whose model reads a device value inside the step: the audit names the read,
// the tensor and the op before it, on every step, and nothing else.
TEST(TpuMeshAudit, NamesEveryGraphBreakWithItsTensorAndOp) {
  const canary::Gpt2Canary model(canary::load_canary("micro"));
  tpu::MeshConfig config;
  config.mesh = {2, 1};
  tpu::TpuMeshEngine engine(config);
  engine.bind(model.tensors());
  model.upload_initial_parameters(engine, 1);
  const TensorTable& table = model.tensors();
  const TensorId grad = table.of_kind(TensorKind::Gradient).front();
  std::vector<StepTrace> steps;
  for (int step = 0; step < 2; ++step) {
    engine.step_begin(step);
    engine.zero(grad);
    (void)engine.read(table.find("grad_norm", TensorKind::Scalar));  // the `.item()` trap
    engine.zero(grad);
    engine.step_end();
    steps.push_back({engine.step_programs(), engine.graph_breaks()});
  }
  const std::vector<AuditFinding> findings = audit_findings(steps);
  ASSERT_EQ(findings.size(), 2u);
  for (int step = 0; step < 2; ++step) {
    EXPECT_EQ(findings[step].kind, "graph_break");
    EXPECT_EQ(findings[step].step, step);
    EXPECT_EQ(findings[step].tensor, "grad_norm");
    EXPECT_EQ(findings[step].op, table[grad].name);
    EXPECT_NE(findings[step].message.find("host read of `grad_norm`"), std::string::npos) << findings[step].message;
  }
}

TEST(TpuMeshAudit, NamesTheFirstNodeWhereTheGraphChanges) {
  tpu::Graph a;
  a.nodes.push_back({tpu::OpKind::Zero, "x", -1, Phase::Forward, {1}, {}});
  a.nodes.push_back({tpu::OpKind::GeluForward, "blocks.0.mlp.gelu", 0, Phase::Forward, {2, 3}, {}});
  tpu::Graph b = a;
  b.nodes[1].tensors = {4, 3};  // another operand: another shape or another tensor
  const std::vector<AuditFinding> changed = audit_findings({{{{a, "a"}}, {}}, {{{b, "b"}}, {}}});
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0].kind, "graph_change");
  EXPECT_EQ(changed[0].op, "blocks.0.mlp.gelu");
  EXPECT_NE(changed[0].message.find("node 1"), std::string::npos) << changed[0].message;
  tpu::Graph shorter = a;
  shorter.nodes.pop_back();
  EXPECT_EQ(audit_findings({{{{a, "a"}}, {}}, {{{shorter, "s"}}, {}}}).size(), 1u);
  EXPECT_TRUE(audit_findings({{{{a, "a"}}, {}}, {{{a, "a"}}, {}}}).empty());
}

}  // namespace
}  // namespace harness::run
