// The llama canary on cpu-ref: its whole backward against finite differences of its loss,
// bitwise across thread counts at odd sizes, and refused before step 0 by the engines that
// do not run its ops yet.
#include <bit>
#include <cstdint>
#include <memory>
#include <vector>

#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include "canary.h"
#include "canary_file.h"
#include "cpu_ref_engine.h"
#include "data_source.h"
#include "gradient_check.h"
#include "registry.h"

namespace harness::canary {
namespace {

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
  EXPECT_TRUE(model->needs_llama_ops());
}

// Every op of the model chained (RMSNorm, RoPE, GQA, SwiGLU, the untied head) against
// finite differences of its loss, on sizes small enough to check many elements.
TEST(LlamaCanary, GradientsMatchFiniteDifferences) {
  const std::unique_ptr<Canary> model = make_canary(llama(17, 5, 8, 2, 2, 1, 12, 2));
  CpuRefEngine engine;
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

// The odd sizes: C = 96, 3 heads over 1 kv head, T = 48, vocab 200, hidden 176.
// Two steps of training give the same loss, norm and parameter bits on 1, 2, 3, 8 threads.
TEST(LlamaCanary, BitwiseAcrossThreadCountsAtOddSizes) {
  const CanaryConfig config = llama(200, 48, 96, 2, 3, 1, 176, 3);
  const std::unique_ptr<Canary> model = make_canary(config);
  const std::unique_ptr<DataSource> data = make_data_source(config);
  const auto run = [&](int threads) {
    const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads));
    CpuRefEngine engine;
    engine.bind(model->tensors());
    model->upload_initial_parameters(engine, 11);
    std::vector<std::uint32_t> bits;
    for (int step = 0; step < 2; ++step) {
      const StepResult r = model->train_step(engine, step, data->batch(step));
      bits.push_back(std::bit_cast<std::uint32_t>(r.loss));
      bits.push_back(std::bit_cast<std::uint32_t>(r.grad_norm));
    }
    for (TensorId p : model->parameters()) {
      for (float x : engine.read(p)) bits.push_back(std::bit_cast<std::uint32_t>(x));
    }
    return bits;
  };
  const std::vector<std::uint32_t> one = run(1);
  for (int threads : {2, 3, 8}) EXPECT_EQ(run(threads), one) << threads << " threads";
}

TEST(LlamaCanary, EnginesWithoutItsOpsRefuseItBeforeStepZero) {
  const std::unique_ptr<Canary> llama_model = make_canary(llama(64, 8, 16, 1, 2, 1, 24, 2));
  const std::unique_ptr<Canary> gpt2_model = make_canary(load_canary("micro"));
  EXPECT_EQ(engine_cannot_run(*make_engine("cpu-ref", {}), *llama_model), "");
  for (const char* name : {"accel", "tpu-mesh"}) {
    const std::string why = engine_cannot_run(*make_engine(name, {}), *llama_model);
    EXPECT_NE(why.find(std::string("engine ") + name + " does not run the llama ops"), std::string::npos) << why;
    EXPECT_EQ(engine_cannot_run(*make_engine(name, {}), *gpt2_model), "");
  }
}

}  // namespace
}  // namespace harness::canary
