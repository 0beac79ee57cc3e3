// The moe canary on cpu-ref: its whole backward (router, balance loss, dispatch, experts,
// combine, with dropped choices) against finite differences of the loss it trains on, the
// same bits on any thread count, a routing record that accounts for every choice, and the
// engines without its ops refused before step 0, naming the op.
#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include "accel_config.h"
#include "accel_engine.h"
#include "canary.h"
#include "canary_file.h"
#include "cpu_ref_engine.h"
#include "data_source.h"
#include "gradient_check.h"
#include "numerics/formats.h"
#include "receipt_bits.h"
#include "registry.h"
#include "required_ops_engine.h"

namespace harness::canary {
namespace {

using harness::testing::lane;
using harness::testing::ReceiptBits;
using harness::testing::run_and_read;

CanaryConfig moe(int vocab, int T, int C, int L, int NH, int NKV, int H, int B, int E, int K, double factor) {
  CanaryConfig c = load_canary("moe-tiny");
  c.name = "moe-test";
  c.vocab_size = vocab;
  c.context_length = T;
  c.channels = C;
  c.layers = L;
  c.heads = NH;
  c.kv_heads = NKV;
  c.mlp_hidden = H;
  c.batch_size = B;
  c.experts = E;
  c.experts_per_token = K;
  c.capacity_factor = factor;
  return c;
}

// One StepState field of /routing: that field's value for every layer.
std::vector<double> routing_field(const std::vector<StepState>& state, const std::string& field) {
  for (const auto& [name, values] : state.at(0).fields) {
    if (name == field) return values;
  }
  ADD_FAILURE() << "no routing field " << field;
  return {};
}

TEST(MoeCanary, ExpertsAreStackedParametersAndTheStepCallsTheMoeOps) {
  const std::unique_ptr<Canary> model = make_canary(moe(64, 8, 16, 2, 2, 1, 24, 2, 3, 2, 1.0));
  const TensorTable& t = model->tensors();
  const TensorId router = t.find("blocks.1.moe.router.weight", TensorKind::Parameter);
  const TensorId down = t.find("blocks.1.moe.experts.down.weight", TensorKind::Parameter);
  ASSERT_NE(router, kNoTensor);
  ASSERT_NE(down, kNoTensor);
  EXPECT_EQ(t[router].shape, (std::vector<std::int64_t>{3, 16}));
  EXPECT_EQ(t[down].shape, (std::vector<std::int64_t>{3, 16, 24}));  // E experts of (C, H)
  EXPECT_EQ(t.find("blocks.0.mlp.fc.weight", TensorKind::Parameter), kNoTensor);  // no dense MLP
  const std::vector<std::string>& ops = model->forward_op_names();
  EXPECT_NE(std::find(ops.begin(), ops.end(), "blocks.0.moe.route"), ops.end());
  EXPECT_NE(std::find(ops.begin(), ops.end(), "blocks.1.moe.experts.down"), ops.end());
}

// The objective the backward differentiates: the language-model loss plus every layer's
// balance loss. A probe that flips a routing decision would measure a jump, not a slope:
// each probe's decisions must hash as the unperturbed step's (they do, at this seed; a
// change that breaks this says which element).
void expect_gradients_match_finite_differences(Engine& engine) {
  CanaryConfig config = moe(17, 5, 8, 2, 2, 1, 12, 2, 4, 2, 1.0);  // capacity 5 of 10 tokens x 2: drops
  config.balance_coef = 0.5;  // the balance path carries signal well above the fp32 noise
  const std::unique_ptr<Canary> model = make_canary(config);
  engine.bind(model->tensors());
  const Batch batch = assemble_batch(0, 2, 5, {1, 5, 16, 2, 2, 9, 0, 4, 7, 13, 3, 1});
  for (TensorId p : model->parameters()) {
    std::vector<float> v = model->initial_values(p, 5);
    for (float& x : v) x = x * 5.0f + (model->tensors()[p].rank() == 1 ? 0.3f : 0.0f);
    engine.upload(p, v);
  }
  const auto objective = [&](std::vector<double>* hashes) {
    double total = model->evaluate_loss(engine, 0, batch);
    const std::vector<StepState> state = model->step_state(engine);
    for (double balance : routing_field(state, "balance_loss")) total += balance;
    *hashes = routing_field(state, "decisions_hash");
    return total;
  };
  std::vector<double> decisions;
  objective(&decisions);
  const std::vector<double> dropped = routing_field(model->step_state(engine), "dropped");
  EXPECT_GT(dropped[0] + dropped[1], 0.0);  // the drop path is in the checked backward
  model->compute_gradients(engine, 0, batch);
  std::vector<std::vector<float>> analytic;  // copied now: every loss evaluation zeroes gradients
  for (TensorId p : model->parameters()) {
    const auto g = engine.read(model->tensors().shadow(p, TensorKind::Gradient));
    analytic.emplace_back(g.begin(), g.end());
  }
  for (std::size_t i = 0; i < model->parameters().size(); ++i) {
    const TensorId p = model->parameters()[i];
    const std::string& name = model->tensors()[p].name;
    const auto values_span = engine.read(p);
    std::vector<float> values(values_span.begin(), values_span.end());
    auto loss = [&] {
      engine.upload(p, values);
      std::vector<double> probe;
      const double total = objective(&probe);
      EXPECT_EQ(probe, decisions) << name << ": a probe flipped a routing decision";
      return total;
    };
    harness::testing::expect_gradient(name, values, loss, analytic[i], {3e-2, 1e-3, 1e-3f}, 12);
    engine.upload(p, values);
  }
}

TEST(MoeCanary, GradientsMatchFiniteDifferencesOfTheLossPlusTheBalanceLoss) {
  CpuRefEngine engine;
  expect_gradients_match_finite_differences(engine);
}

// accel's MoE ops in fp32 with the reductions in a fixed order (the experts' GEMMs split-K
// as accel's linear layers): the same gradients.
TEST(MoeAccel, GradientsMatchFiniteDifferencesOfTheLossPlusTheBalanceLoss) {
  accel::AccelConfig config;
  config.noise = accel::NoiseMode::Off;
  accel::AccelEngine engine(config);
  expect_gradients_match_finite_differences(engine);
}

// Under bf16 the router's GEMM reads its weights in fp32 (their role, fp32_weight): its
// logits are the fp32 product of the stored (bf16) input and the fp32 weights to fp32
// rounding, and far from the product with the weights rounded to bf16.
TEST(MoeAccel, TheRouterReadsItsWeightsInFp32UnderBf16) {
  const std::unique_ptr<Canary> model = make_canary(moe(64, 8, 32, 1, 2, 1, 24, 2, 4, 2, 1.0));
  accel::AccelEngine engine(accel::parse_accel_config({"bf16", {{"noise", "off"}}}));
  engine.bind(model->tensors());
  model->upload_initial_parameters(engine, 3);
  const std::unique_ptr<DataSource> data = make_data_source(model->config());
  model->evaluate_loss(engine, 0, data->batch(0));
  const TensorTable& t = model->tensors();
  const auto read = [&](const std::string& name, TensorKind kind) {
    const auto v = engine.read(t.find(name, kind));
    return std::vector<float>(v.begin(), v.end());
  };
  const std::vector<float> x = read("blocks.0.mlp_norm.out", TensorKind::Activation);
  const std::vector<float> w = read("blocks.0.moe.router.weight", TensorKind::Parameter);
  const std::vector<float> logits = read("blocks.0.moe.router.out", TensorKind::Activation);
  const int C = 32, E = 4;
  double off_fp32 = 0, off_bf16 = 0;
  for (std::size_t n = 0; n < logits.size() / E; ++n) {
    for (int e = 0; e < E; ++e) {
      double fp32 = 0, bf16 = 0;
      for (int c = 0; c < C; ++c) {
        const double xc = x[n * C + static_cast<std::size_t>(c)], wc = w[static_cast<std::size_t>(e * C + c)];
        fp32 += xc * wc;
        bf16 += xc * numerics::round_to_bf16(static_cast<float>(wc));
      }
      const double got = logits[n * E + static_cast<std::size_t>(e)];
      off_fp32 = std::max(off_fp32, std::fabs(got - fp32) / (std::fabs(fp32) + 1e-3));
      off_bf16 = std::max(off_bf16, std::fabs(got - bf16) / (std::fabs(bf16) + 1e-3));
    }
  }
  EXPECT_LT(off_fp32, 1e-5);
  EXPECT_GT(off_bf16, 1e-4);
}

// The run contract of accel on moe: noise off is bitwise on any thread count, a seeded run
// replays from its recorded seed (routing records included); an FP8 zone that covers no
// weight (moe's experts are in none yet) is refused before step 0.
TEST(MoeAccel, OffIsBitwiseAcrossThreadCountsAndSeededRunsReplay) {
  const std::map<std::string, std::string> off{{"noise", "off"}}, seeded{{"noise-seed", "7"}};
  const std::string features = "bf16,fp8=qkv,attn_proj";
  const ReceiptBits one = run_and_read(lane("moe-tiny", 2, 1, "accel", features, off), "moe_off1");
  EXPECT_TRUE(one.same_numbers(run_and_read(lane("moe-tiny", 2, 3, "accel", features, off), "moe_off3")));
  const ReceiptBits noisy = run_and_read(lane("moe-tiny", 2, 2, "accel", features, seeded), "moe_seed2");
  EXPECT_FALSE(noisy.same_numbers(one));  // the noise is really on
  EXPECT_TRUE(noisy.same_numbers(run_and_read(lane("moe-tiny", 2, 1, "accel", features, seeded), "moe_seed1")));
  const std::unique_ptr<Canary> model = make_canary(load_canary("moe-tiny"));
  try {
    accel::AccelEngine(accel::parse_accel_config({"bf16,fp8=all", {}})).check_table(model->tensors());
    ADD_FAILURE() << "fp8=all was taken on a canary whose experts are in no zone";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("FP8 zone mlp_fc covers no weight of this canary"), std::string::npos)
        << e.what();
  }
  accel::AccelEngine(accel::parse_accel_config({features, {}})).check_table(model->tensors());
}

// Two steps of training: the loss, the norm, every parameter's bits and the routing records.
std::vector<std::uint64_t> trained_bits(const Canary& model, const DataSource& data) {
  CpuRefEngine engine;
  engine.bind(model.tensors());
  model.upload_initial_parameters(engine, 11);
  std::vector<std::uint64_t> bits;
  for (int step = 0; step < 2; ++step) {
    const StepResult r = model.train_step(engine, step, data.batch(step));
    bits.push_back(std::bit_cast<std::uint32_t>(r.loss));
    bits.push_back(std::bit_cast<std::uint32_t>(r.grad_norm));
    const std::vector<StepState> state = model.step_state(engine);
    for (const auto& [field, values] : state.at(0).fields) {
      for (double v : values) bits.push_back(std::bit_cast<std::uint64_t>(v));
    }
  }
  for (TensorId p : model.parameters()) {
    for (float x : engine.read(p)) bits.push_back(std::bit_cast<std::uint32_t>(x));
  }
  return bits;
}

// Odd sizes (C = 96, 3 heads over 1 kv head, T = 48, vocab 200, 5 experts of 88, capacity
// 1.1 x the even share): the same bits on 1, 2, 3 and 8 threads.
TEST(MoeCanary, BitwiseAcrossThreadCountsAtOddSizes) {
  const CanaryConfig config = moe(200, 48, 96, 2, 3, 1, 88, 3, 5, 2, 1.1);
  const std::unique_ptr<Canary> model = make_canary(config);
  const std::unique_ptr<DataSource> data = make_data_source(config);
  const auto run = [&](int threads) {
    const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads));
    return trained_bits(*model, *data);
  };
  const std::vector<std::uint64_t> one = run(1);
  for (int threads : {2, 3, 8}) EXPECT_EQ(run(threads), one) << threads << " threads";
}

// Per layer and step, every token's K choices are either placed with an expert or dropped;
// a tight capacity drops some, a roomy one none; the layers route differently.
TEST(MoeCanary, TheRoutingRecordAccountsForEveryChoice) {
  for (const double factor : {0.5, 4.0}) {
    const CanaryConfig config = moe(64, 16, 32, 3, 2, 1, 24, 2, 4, 2, factor);
    const std::unique_ptr<Canary> model = make_canary(config);
    const std::unique_ptr<DataSource> data = make_data_source(config);
    CpuRefEngine engine;
    engine.bind(model->tensors());
    model->upload_initial_parameters(engine, 3);
    model->train_step(engine, 0, data->batch(0));
    const std::vector<StepState> state = model->step_state(engine);
    ASSERT_EQ(state.size(), 1u);
    EXPECT_EQ(state[0].group, "routing");
    EXPECT_EQ(state[0].columns, (std::vector<std::string>{"blocks.0.moe.route", "blocks.1.moe.route",
                                                         "blocks.2.moe.route"}));
    const std::vector<double> dropped = routing_field(state, "dropped");
    for (int layer = 0; layer < 3; ++layer) {
      double placed = 0.0;
      for (int e = 0; e < 4; ++e) {
        const double tokens = routing_field(state, "tokens_expert_" + std::to_string(e))[layer];
        EXPECT_LE(tokens, config.expert_capacity()) << "layer " << layer << " expert " << e;
        placed += tokens;
      }
      EXPECT_EQ(placed + dropped[layer], 2.0 * 16 * 2) << "layer " << layer;
      if (factor < 1.0) {
        EXPECT_GT(dropped[layer], 0.0) << "layer " << layer;
      } else {
        EXPECT_EQ(dropped[layer], 0.0) << "layer " << layer;
      }
      EXPECT_GT(routing_field(state, "balance_loss")[layer], 0.0);
    }
    const std::vector<double> hashes = routing_field(state, "decisions_hash");
    EXPECT_NE(hashes[0], hashes[1]);
    EXPECT_NE(hashes[1], hashes[2]);
  }
}

// An engine lacking the MoE ops refuses the canary before step 0, naming the first op it
// lacks; every registered engine runs it.
TEST(MoeCanary, AnEngineWithoutTheMoeOpsIsRefusedNamingTheOp) {
  const std::unique_ptr<Canary> model = make_canary(moe(64, 8, 16, 1, 2, 1, 24, 2, 3, 2, 1.0));
  const testing::RequiredOpsOnly llama_engine({OpFamily::Llama});  // an engine that has not learnt the MoE ops
  EXPECT_EQ(engine_cannot_run(llama_engine, *model),
            "op moe_route_forward is not implemented by engine required-only; run canary moe-test on an engine that "
            "implements it (cpu-ref implements every op)");
  EXPECT_EQ(engine_cannot_run(llama_engine, *make_canary(load_canary("llama-tiny"))), "");
  for (const std::string& name : engine_names()) {
    EXPECT_EQ(engine_cannot_run(*make_engine(name, {}), *model), "") << name;
  }
}

}  // namespace
}  // namespace harness::canary
