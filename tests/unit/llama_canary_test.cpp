// The llama canary on every engine: its whole backward against finite differences of its
// loss (cpu-ref, accel), cpu-ref bitwise across thread counts at odd sizes, tpu-mesh on one
// device bitwise cpu-ref on every plan and within tolerance when sharded, accel's FP8 zones
// by role and its run contract.
#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <string>
#include <cstdint>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include "canary.h"
#include "canary_file.h"
#include "accel_config.h"
#include "accel_engine.h"
#include "cpu_ref_engine.h"
#include "data_source.h"
#include "gradient_check.h"
#include "receipt_bits.h"
#include "required_ops_engine.h"
#include "registry.h"

namespace harness::canary {
namespace {

using harness::testing::lane;
using harness::testing::ReceiptBits;
using harness::testing::run_and_read;

CanaryConfig llama(int vocab, int T, int C, int L, int NH, int NKV, int H, int B) {
  CanaryConfig c = load_canary("micro");
  c.name = "llama-test";
  c.architecture = "llama";
  c.vocab_size = vocab;
  c.context_length = T;
  c.channels = C;
  c.layers = L;
  c.heads = NH;
  c.kv_heads = NKV;
  c.mlp_hidden = H;
  c.batch_size = B;
  c.rope_theta = 10000.0;
  return c;
}

TEST(LlamaCanary, TensorTableFollowsTheContract) {
  const std::unique_ptr<Canary> model = make_canary(llama(200, 48, 96, 2, 3, 1, 176, 2));
  const TensorTable& t = model->tensors();
  const auto& p = model->parameters();
  ASSERT_EQ(p.size(), 1u + 9u * 2u + 2u);
  EXPECT_EQ(t[p[0]].name, "wte");
  EXPECT_EQ(t[p[2]].name, "blocks.0.attn.q.weight");
  EXPECT_EQ(t[p[2]].shape, (std::vector<std::int64_t>{96, 96}));
  EXPECT_EQ(t[p[3]].shape, (std::vector<std::int64_t>{32, 96}));  // k: NKV * hd rows
  EXPECT_EQ(t[p[5]].name, "blocks.0.attn.o.weight");
  EXPECT_EQ(t[p[9]].name, "blocks.0.mlp.down.weight");
  EXPECT_EQ(t[p[9]].shape, (std::vector<std::int64_t>{96, 176}));
  EXPECT_EQ(t[p[p.size() - 2]].name, "norm.weight");
  EXPECT_EQ(t[p.back()].name, "lm_head.weight");  // untied
  const std::vector<OpKind> ops = model->step_ops();
  EXPECT_NE(std::find(ops.begin(), ops.end(), OpKind::RmsNormForward), ops.end());
}

// Every op of the model chained (RMSNorm, RoPE, GQA, SwiGLU, the untied head) against
// finite differences of its loss, on sizes small enough to check many elements.
void expect_gradients_match_finite_differences(Engine& engine) {
  const std::unique_ptr<Canary> model = make_canary(llama(17, 5, 8, 2, 2, 1, 12, 2));
  engine.bind(model->tensors());
  model->upload_initial_parameters(engine, 3);
  Batch batch = assemble_batch(0, 2, 5, {1, 5, 16, 2, 2, 9, 0, 4, 7, 13, 3, 1});
  // Larger init than 0.02 so that every path carries signal well above fp32 noise.
  for (TensorId p : model->parameters()) {
    std::vector<float> v = model->initial_values(p, 5);
    for (float& x : v) x = x * 5.0f + (model->tensors()[p].rank() == 1 ? 0.3f : 0.0f);
    engine.upload(p, v);
  }
  model->compute_gradients(engine, 0, batch);
  std::vector<std::vector<float>> analytic;  // copied now: every loss evaluation zeroes gradients
  for (TensorId p : model->parameters()) {
    const auto g = engine.read(model->tensors().shadow(p, TensorKind::Gradient));
    analytic.emplace_back(g.begin(), g.end());
  }
  for (std::size_t i = 0; i < model->parameters().size(); ++i) {
    const TensorId p = model->parameters()[i];
    const auto values_span = engine.read(p);
    std::vector<float> values(values_span.begin(), values_span.end());
    auto loss = [&] {
      engine.upload(p, values);
      return static_cast<double>(model->evaluate_loss(engine, 0, batch));
    };
    harness::testing::expect_gradient(model->tensors()[p].name, values, loss, analytic[i], {3e-2, 1e-3, 1e-3f}, 12);
    engine.upload(p, values);
  }
}

TEST(LlamaCanary, GradientsMatchFiniteDifferences) {
  CpuRefEngine engine;
  expect_gradients_match_finite_differences(engine);
}

// accel's own llama kernels (GQA over noisy key/query blocks, RMSNorm over token blocks)
// in fp32 with the reductions in a fixed order: the same gradients.
TEST(LlamaAccel, GradientsMatchFiniteDifferences) {
  accel::AccelConfig config;
  config.noise = accel::NoiseMode::Off;
  accel::AccelEngine engine(config);
  expect_gradients_match_finite_differences(engine);
}

// Two steps of training on `engine` (after its plan check): the loss, the norm and every
// parameter's bits.
std::vector<std::uint32_t> trained_bits(Engine& engine, const Canary& model, const DataSource& data, int steps = 2) {
  engine.check_table(model.tensors());
  engine.bind(model.tensors());
  model.upload_initial_parameters(engine, 11);
  std::vector<std::uint32_t> bits;
  for (int step = 0; step < steps; ++step) {
    const StepResult r = model.train_step(engine, step, data.batch(step));
    bits.push_back(std::bit_cast<std::uint32_t>(r.loss));
    bits.push_back(std::bit_cast<std::uint32_t>(r.grad_norm));
  }
  for (TensorId p : model.parameters()) {
    for (float x : engine.read(p)) bits.push_back(std::bit_cast<std::uint32_t>(x));
  }
  return bits;
}

// The odd sizes: C = 96, 3 heads over 1 kv head, T = 48, vocab 200, hidden 176.
// Two steps of training give the same loss, norm and parameter bits on 1, 2, 3, 8 threads.
TEST(LlamaCanary, BitwiseAcrossThreadCountsAtOddSizes) {
  const CanaryConfig config = llama(200, 48, 96, 2, 3, 1, 176, 3);
  const std::unique_ptr<Canary> model = make_canary(config);
  const std::unique_ptr<DataSource> data = make_data_source(config);
  const auto run = [&](int threads) {
    const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads));
    CpuRefEngine engine;
    return trained_bits(engine, *model, *data);
  };
  const std::vector<std::uint32_t> one = run(1);
  for (int threads : {2, 3, 8}) EXPECT_EQ(run(threads), one) << threads << " threads";
}

// tpu-mesh on one device runs cpu-ref's kernels in cpu-ref's order on every plan: the same
// bits at the odd sizes; a mesh whose model axis would split a head is refused before
// step 0, naming the tensor.
TEST(LlamaTpuMesh, OneDeviceIsBitwiseCpuRefOnEveryPlanAtOddSizes) {
  const CanaryConfig config = llama(200, 48, 96, 2, 3, 1, 176, 4);
  const std::unique_ptr<Canary> model = make_canary(config);
  const std::unique_ptr<DataSource> data = make_data_source(config);
  CpuRefEngine reference;
  const std::vector<std::uint32_t> expected = trained_bits(reference, *model, *data);
  for (const char* plan : {"dp", "tp", "zero3"}) {
    const auto engine = make_engine("tpu-mesh", {"", {{"mesh", "1x1"}, {"shard-plan", plan}}});
    EXPECT_EQ(trained_bits(*engine, *model, *data), expected) << plan;
  }
  const auto split_heads = make_engine("tpu-mesh", {"", {{"mesh", "1x2"}, {"shard-plan", "tp"}}});
  try {
    split_heads->check_table(model->tensors());
    ADD_FAILURE() << "a tp plan splitting 3 heads over 2 devices was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("blocks.0.attn.q.weight dimension 0 has size 96, which does not divide into "
                                         "2 shards of whole heads (32 wide)"),
              std::string::npos)
        << e.what();
  }
}

// Sharded plans move the numbers only by the order of their sums (fp32) or by bf16, and a
// fixed mesh and plan repeats its bits on any thread count.
TEST(LlamaTpuMesh, ShardedPlansStayNearCpuRefAndRepeatTheirBits) {
  const CanaryConfig config = llama(64, 16, 32, 2, 4, 2, 48, 4);
  const std::unique_ptr<Canary> model = make_canary(config);
  const std::unique_ptr<DataSource> data = make_data_source(config);
  CpuRefEngine cpu_ref;
  const std::vector<std::uint32_t> reference = trained_bits(cpu_ref, *model, *data, 3);
  const auto loss_at = [](const std::vector<std::uint32_t>& bits, int step) {
    return static_cast<double>(std::bit_cast<float>(bits[2 * static_cast<std::size_t>(step)]));
  };
  for (const char* precision : {"fp32", "bf16"}) {
    const double tolerance = std::string(precision) == "fp32" ? 1e-5 : 5e-3;
    bool any_moved = false;
    for (const char* plan : {"dp", "tp", "zero3"}) {
      for (const char* mesh : {"2x1", "1x2", "2x2"}) {
        const EngineSettings settings{"", {{"mesh", mesh}, {"shard-plan", plan}, {"precision", precision}}};
        const std::vector<std::uint32_t> run = trained_bits(*make_engine("tpu-mesh", settings), *model, *data, 3);
        for (int step = 0; step < 3; ++step) {
          EXPECT_LE(std::fabs(loss_at(run, step) - loss_at(reference, step)), tolerance)
              << plan << " " << mesh << " " << precision << " step " << step;
        }
        any_moved = any_moved || run != reference;
      }
    }
    EXPECT_TRUE(any_moved) << precision << ": no plan changed a bit; sharding did nothing";
  }
  const EngineSettings tp{"", {{"mesh", "2x2"}, {"shard-plan", "tp"}, {"precision", "bf16"}}};
  const auto bits_on = [&](int threads) {
    const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads));
    return trained_bits(*make_engine("tpu-mesh", tp), *model, *data);
  };
  EXPECT_EQ(bits_on(1), bits_on(3));
}


// An engine lacking an op a canary's step calls is refused before step 0, naming the op,
// the engine and the canary; one that implements every op of the step runs it.
TEST(LlamaCanary, AnEngineWithoutAnOpOfTheStepIsRefusedNamingTheOp) {
  const testing::RequiredOpsOnly engine;
  const std::unique_ptr<Canary> llama_model = make_canary(llama(64, 8, 16, 1, 2, 1, 24, 2));
  EXPECT_EQ(engine_cannot_run(engine, *llama_model),
            fmt::format("op rmsnorm_forward is not implemented by engine required-only; run canary {} on an engine "
                        "that implements it (cpu-ref implements every op)",
                        llama_model->config().name));
  const std::unique_ptr<Canary> gpt2_model = make_canary(load_canary("micro"));
  EXPECT_EQ(engine_cannot_run(engine, *gpt2_model), "");
}

// Every registered engine runs the llama ops (an engine that does not would be refused
// before step 0 by engine_cannot_run, naming itself).
TEST(LlamaCanary, EveryEngineRunsItsOps) {
  const std::unique_ptr<Canary> llama_model = make_canary(llama(64, 8, 16, 1, 2, 1, 24, 2));
  for (const std::string& name : engine_names()) {
    EXPECT_EQ(engine_cannot_run(*make_engine(name, {}), *llama_model), "") << name;
  }
}

// The FP8 zones are the weights' roles (docs/engine-boundary.md): `qkv` covers q, k and v,
// `attn_proj` o, `mlp_fc` gate and up, `mlp_proj` down; the LM head is never quantised.
TEST(LlamaAccel, Fp8ZonesCoverTheLayersTheirRolesName) {
  const std::unique_ptr<Canary> model = make_canary(llama(64, 8, 16, 2, 2, 1, 24, 2));
  const auto zone_layers = [&](const std::string& zones) {
    accel::AccelEngine engine(accel::parse_accel_config({"bf16,fp8=" + zones, {}}));
    engine.bind(model->tensors());
    std::vector<std::string> layers;
    for (const StepState& state : engine.step_state()) {
      for (const std::string& column : state.columns) {
        if (column.ends_with("/weight")) layers.push_back(column.substr(0, column.size() - 7));
      }
    }
    return layers;
  };
  using Layers = std::vector<std::string>;
  EXPECT_EQ(zone_layers("qkv"), (Layers{"blocks.0.attn.q", "blocks.0.attn.k", "blocks.0.attn.v", "blocks.1.attn.q",
                                        "blocks.1.attn.k", "blocks.1.attn.v"}));
  EXPECT_EQ(zone_layers("attn_proj"), (Layers{"blocks.0.attn.o", "blocks.1.attn.o"}));
  EXPECT_EQ(zone_layers("mlp_fc"), (Layers{"blocks.0.mlp.gate", "blocks.0.mlp.up", "blocks.1.mlp.gate",
                                           "blocks.1.mlp.up"}));
  EXPECT_EQ(zone_layers("mlp_proj"), (Layers{"blocks.0.mlp.down", "blocks.1.mlp.down"}));
  EXPECT_EQ(zone_layers("all").size(), 14u);  // 7 linear layers per block, never lm_head
}

// The run contract of accel on llama: noise off is bitwise on any thread count, a seeded
// run replays from its recorded seed, bf16 stays near cpu-ref and FP8 moves further.
TEST(LlamaAccel, OffIsBitwiseAcrossThreadCountsAndSeededRunsReplay) {
  const std::map<std::string, std::string> off{{"noise", "off"}}, seeded{{"noise-seed", "7"}};
  const ReceiptBits one = run_and_read(lane("llama-tiny", 2, 1, "accel", "bf16,fp8=all", off), "llama_off1");
  EXPECT_TRUE(one.same_numbers(run_and_read(lane("llama-tiny", 2, 3, "accel", "bf16,fp8=all", off), "llama_off3")));
  const ReceiptBits noisy = run_and_read(lane("llama-tiny", 2, 2, "accel", "bf16,fp8=all", seeded), "llama_seed2");
  EXPECT_FALSE(noisy.same_numbers(one));  // the noise is really on
  EXPECT_TRUE(noisy.same_numbers(run_and_read(lane("llama-tiny", 2, 1, "accel", "bf16,fp8=all", seeded), "llama_seed1")));
}

TEST(LlamaAccel, Bf16StaysNearCpuRefAndFp8MovesFurther) {
  const std::map<std::string, std::string> off{{"noise", "off"}};
  const ReceiptBits reference = run_and_read(lane("llama-tiny", 12, 2), "llama_drift_ref");
  const ReceiptBits bf16 = run_and_read(lane("llama-tiny", 12, 2, "accel", "bf16", off), "llama_drift_bf16");
  const ReceiptBits fp8 = run_and_read(lane("llama-tiny", 12, 2, "accel", "bf16,fp8=all", off), "llama_drift_fp8");
  const auto drift = [&](const ReceiptBits& run) {
    double worst = 0;
    for (std::size_t s = 0; s < reference.loss.size(); ++s) {
      worst = std::max(worst, std::fabs(run.loss[s] - reference.loss[s]));
    }
    return worst;
  };
  EXPECT_GT(drift(bf16), 0.0);  // bf16 is really on
  EXPECT_LT(drift(bf16), 1e-2);
  EXPECT_GT(drift(fp8), drift(bf16));
  EXPECT_LT(drift(fp8), 5e-2);
  EXPECT_EQ(bf16.batches, reference.batches);
}

}  // namespace
}  // namespace harness::canary
