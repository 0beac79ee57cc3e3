// The canary model: its tensor table, its data, its whole-model gradient, and fault specs.
#include <cmath>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "byte_stream.h"
#include "canary.h"
#include "canary_file.h"
#include "cpu_ref_engine.h"
#include "fault.h"
#include "gpt2/gpt2.h"
#include "llama/llama.h"
#include "gradient_check.h"
#include "numerics/det_math.h"
#include "preset.h"

namespace harness::canary {
namespace {

TEST(TensorTable, TinyHasDesignNamesShapesAndSharedLayouts) {
  const Gpt2Canary model(load_canary("tiny"));
  const TensorTable& t = model.tensors();
  const auto& params = model.parameters();
  ASSERT_EQ(params.size(), 4u + 12u * 4u);
  EXPECT_EQ(t[params[0]].name, "wte");
  EXPECT_EQ(t[params[0]].shape, (std::vector<std::int64_t>{256, 128}));
  EXPECT_EQ(t[params[1]].name, "wpe");
  EXPECT_EQ(t[params[4]].name, "blocks.0.attn.qkv.weight");
  EXPECT_EQ(t[params[4]].shape, (std::vector<std::int64_t>{384, 128}));
  EXPECT_EQ(t[params[10]].name, "blocks.0.mlp.fc.weight");
  EXPECT_EQ(t[params[12]].name, "blocks.0.mlp.proj.weight");
  EXPECT_EQ(t[params.back()].name, "lnf.bias");
  // Gradients and both moments mirror the parameter arena exactly.
  for (TensorId p : params) {
    for (TensorKind kind : {TensorKind::Gradient, TensorKind::AdamM, TensorKind::AdamV}) {
      const TensorId s = t.shadow(p, kind);
      EXPECT_EQ(t[s].name, t[p].name);
      EXPECT_EQ(t[s].shape, t[p].shape);
      EXPECT_EQ(t.arena_offset(s), t.arena_offset(p));
    }
  }
  EXPECT_EQ(t.arena_numel(TensorKind::Parameter), t.arena_numel(TensorKind::Gradient));
  // 256*128 + 64*128 + 4 * (12*128^2 + 13*128) + 2*128
  EXPECT_EQ(t.arena_numel(TensorKind::Parameter), 32768 + 8192 + 4 * (12 * 16384 + 13 * 128) + 256);
}

// Init comes from each parameter's role, set where it is described: norms 1, biases 0,
// matrices N(0, 0.02) and the residual projections N(0, 0.02/sqrt(2L)), by their spread.
TEST(Canary, InitialValuesFollowTheRolesAndTheRegistryKnowsGpt2) {
  const std::unique_ptr<Canary> model = make_canary(load_canary("tiny"));
  const TensorTable& t = model->tensors();
  const auto spread = [&](const std::string& name) {
    const std::vector<float> v = model->initial_values(t.find(name, TensorKind::Parameter), 1337);
    double sum_squares = 0;
    for (float x : v) sum_squares += static_cast<double>(x) * x;
    return std::sqrt(sum_squares / static_cast<double>(v.size()));
  };
  for (const char* name : {"blocks.1.ln2.weight", "lnf.weight"}) {
    for (float x : model->initial_values(t.find(name, TensorKind::Parameter), 7)) EXPECT_EQ(x, 1.0f) << name;
  }
  for (const char* name : {"blocks.3.attn.qkv.bias", "lnf.bias"}) {
    for (float x : model->initial_values(t.find(name, TensorKind::Parameter), 7)) EXPECT_EQ(x, 0.0f) << name;
  }
  EXPECT_NEAR(spread("blocks.0.mlp.fc.weight"), 0.02, 0.002);
  EXPECT_NEAR(spread("wte"), 0.02, 0.002);
  EXPECT_NEAR(spread("blocks.2.attn.proj.weight"), 0.02 / std::sqrt(8.0), 0.001);
  EXPECT_NEAR(spread("blocks.2.mlp.proj.weight"), 0.02 / std::sqrt(8.0), 0.001);
  EXPECT_THROW(model->initial_values(t.find("inputs", TensorKind::Input), 7), std::invalid_argument);
  CanaryConfig other = load_canary("micro");
  other.architecture = "mamba";
  try {
    make_canary(other);
    FAIL() << "an unknown architecture was built";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'mamba'"), std::string::npos) << e.what();
  }
}

TEST(Schedule, WarmupThenCosineToTenPercent) {
  const CanaryConfig c = load_canary("tiny");
  EXPECT_DOUBLE_EQ(learning_rate(c, 0), 3e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 9), 3e-3);
  EXPECT_DOUBLE_EQ(learning_rate(c, 10), 3e-3);
  EXPECT_NEAR(learning_rate(c, 55), 3e-4 + 0.5 * 2.7e-3, 1e-15);  // halfway: cos = 0
  for (int s = 11; s < c.steps; ++s) EXPECT_LT(learning_rate(c, s), learning_rate(c, s - 1));
}

TEST(ByteStream, BatchesArePureFunctionsOfTheStep) {
  const CanaryConfig c = load_canary("tiny");
  const ByteStream a(c), b(c);
  const Batch b7 = a.batch(7);
  (void)b.batch(3);
  EXPECT_EQ(b.batch(7).tokens, b7.tokens);  // order of requests does not matter
  EXPECT_NE(a.batch(8).tokens, b7.tokens);
  EXPECT_EQ(batch_hash(a.batch(7)), batch_hash(b7));
  ASSERT_EQ(b7.tokens.size(), static_cast<std::size_t>(c.batch_size * (c.context_length + 1)));
  for (std::int32_t tok : b7.tokens) {
    EXPECT_GE(tok, 0);
    EXPECT_LT(tok, c.vocab_size);
  }
  for (int row = 0; row < c.batch_size; ++row) {  // inputs/targets are the shifted views
    for (int t = 0; t < c.context_length; ++t) {
      const auto i = static_cast<std::size_t>(row * c.context_length + t);
      EXPECT_EQ(b7.inputs[i], b7.tokens[static_cast<std::size_t>(row * (c.context_length + 1) + t)]);
      EXPECT_EQ(b7.targets[i], b7.tokens[static_cast<std::size_t>(row * (c.context_length + 1) + t + 1)]);
    }
  }
}

TEST(ByteStream, IsLearnableButNotTrivial) {
  const ByteStream stream(load_canary("tiny"));
  const double rate = stream.entropy_rate_nats();
  EXPECT_GT(rate, 0.05);                             // not a constant stream
  EXPECT_LT(rate, 0.5 * numerics::det_log(256.0));  // far below uniform bytes
  std::set<std::int32_t> symbols;
  for (int s = 0; s < 20; ++s) {
    for (std::int32_t tok : stream.batch(s).tokens) symbols.insert(tok);
  }
  EXPECT_GE(symbols.size(), 10u);
}

// What parse_fault_spec refuses `text` with, or "accepted".
std::string fault_error(const std::string& text, const std::vector<std::string>& ops,
                        const std::vector<std::string>& parameters = {}) {
  try {
    parse_fault_spec(text, ops, parameters);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "accepted";
}

TEST(FaultSpec, ParsesAndRejectsWithTheFieldNamed) {
  const Gpt2Canary model(load_canary("tiny"));
  const auto& ops = model.forward_op_names();
  const FaultSpec f = parse_fault_spec("step=37,op=blocks.2.attn.proj", ops);
  EXPECT_EQ(f.step, 37);
  EXPECT_EQ(f.op, "blocks.2.attn.proj");
  EXPECT_EQ(f.ulps, 1);
  EXPECT_EQ(parse_fault_spec("op=blocks.0.ln1,step=3,ulps=4", ops).ulps, 4);
  EXPECT_EQ(f.to_string(), "step=37,op=blocks.2.attn.proj,ulps=1");
  const auto message = [&](const std::string& text) { return fault_error(text, ops); };
  EXPECT_NE(message("step=1,op=blocks.9.ln1").find("unknown op 'blocks.9.ln1'"), std::string::npos);
  EXPECT_NE(message("step=x,op=blocks.0.ln1").find("step='x'"), std::string::npos);
  EXPECT_NE(message("op=blocks.0.ln1").find("nudge needs step="), std::string::npos);
  EXPECT_NE(message("step=1,step=2,op=blocks.0.ln1").find("step given twice"), std::string::npos);
  EXPECT_NE(message("step=1,op=blocks.0.ln1,ulps=0").find("ulps='0'"), std::string::npos);
  EXPECT_NE(message("step=1,op=blocks.0.ln1,color=red").find("unknown key 'color'"), std::string::npos);
}

// The regressions calibrate --power injects: each kind parses from its canonical text back to
// itself, takes exactly its keys, and names what is wrong.
TEST(FaultSpec, EveryKindRoundTripsAndTakesOnlyItsKeys) {
  const Gpt2Canary model(load_canary("tiny"));
  const auto& ops = model.forward_op_names();
  const std::vector<std::string> parameters = model.parameter_names();
  const std::string weight = parameters.at(2);
  for (const std::string& text : std::vector<std::string>{"step=3,op=blocks.0.ln1,ulps=2", "kind=weight-scale,step=4,tensor=" + weight + ",by=1e-05",
                                 "kind=weight-ulps,tensor=" + weight + ",ulps=4096", "kind=lr-scale,step=5,by=0.001",
                                 "kind=eps-scale,by=10", "kind=weight-scale,step=0,tensor=" + weight + ",by=-0.3"}) {
    EXPECT_EQ(parse_fault_spec(text, ops, parameters).to_string(), text);
  }
  const FaultSpec scale = parse_fault_spec("by=1e-4,tensor=" + weight + ",kind=weight-scale,step=7", ops, parameters);
  EXPECT_EQ(scale.kind, FaultKind::kWeightScale);
  EXPECT_EQ(scale.by, 1e-4);
  EXPECT_EQ(scale.step, 7);
  const auto message = [&](const std::string& text) { return fault_error(text, ops, parameters); };
  EXPECT_NE(message("kind=lr-scale,step=1").find("lr-scale needs by="), std::string::npos);
  EXPECT_NE(message("kind=lr-scale,step=1,by=0").find("by='0' is not a relative change"), std::string::npos);
  EXPECT_NE(message("kind=lr-scale,step=1,by=-1").find("by='-1'"), std::string::npos);
  EXPECT_NE(message("kind=eps-scale,by=0").find("by='0' is not a factor > 0"), std::string::npos);
  EXPECT_NE(message("kind=eps-scale,by=nan").find("by='nan'"), std::string::npos);
  EXPECT_NE(message("kind=eps-scale,by=10,op=blocks.0.ln1").find("unknown key 'op' for eps-scale"), std::string::npos);
  EXPECT_NE(message("kind=weight-ulps,tensor=nope,ulps=1").find("unknown parameter 'nope'"), std::string::npos);
  EXPECT_NE(message("kind=shift,by=1").find("kind='shift' is not a fault kind (nudge, weight-scale"), std::string::npos);
}

// The model calls its ops through Ops::call, which traces each op's results from its
// description: held here to the tensor table's roles, which know nothing of the wrapper.
// A traced step records one value per forward op, at the model's own op names in order;
// no statistic or attention matrix (saved for the backward); every parameter's gradient
// in the backward and every parameter after its update; and a fault moves exactly the
// output of the op it names.
class TraceRecorder : public TraceSink {
 public:
  void on_trace(const OpSite& site, TensorId tensor, std::span<const float> value) override {
    records.push_back({std::string(site.name), site.phase, tensor, value.empty() ? 0.0f : value[0]});
  }
  struct Record {
    std::string site;
    Phase phase;
    TensorId tensor;
    float first;
  };
  std::vector<Record> records;
};

template <typename Model>
TraceRecorder traced_step(const CanaryConfig& c, std::optional<FaultSpec> fault = std::nullopt) {
  const Model model(c, fault, true);
  CpuRefEngine engine;
  engine.bind(model.tensors());
  model.upload_initial_parameters(engine, 1);
  TraceRecorder recorder;
  engine.set_trace_sink(&recorder);
  model.train_step(engine, 0, ByteStream(c).batch(0));
  return recorder;
}

template <typename Model>
void expect_results_traced(const CanaryConfig& c) {
  const Model model(c);
  const TensorTable& table = model.tensors();
  const TraceRecorder recorder = traced_step<Model>(c);
  std::vector<std::string> forward_sites;
  std::set<TensorId> gradients, updated;
  for (const TraceRecorder::Record& r : recorder.records) {
    const TensorDesc& d = table[r.tensor];
    EXPECT_FALSE(d.role.fp32_statistic || d.role.heads_dim >= 0) << r.site << " traced " << d.name << ", saved for the backward";
    if (r.phase == Phase::Forward) forward_sites.push_back(r.site);
    if (r.phase == Phase::Backward && d.kind == TensorKind::Gradient) gradients.insert(r.tensor);
    if (r.phase == Phase::Optimizer && d.kind == TensorKind::Parameter) {
      EXPECT_TRUE(updated.insert(r.tensor).second) << d.name << " traced twice by its update";
      EXPECT_EQ(r.site, d.name);
    }
  }
  EXPECT_EQ(forward_sites, model.forward_op_names());
  EXPECT_EQ(gradients.size(), model.parameters().size());
  EXPECT_EQ(updated.size(), model.parameters().size());
}

TEST(Ops, TracesEachOpsResultsAndNothingItSavesForLater) {
  expect_results_traced<Gpt2Canary>(load_canary("micro"));
  expect_results_traced<LlamaCanary>(load_canary("llama-tiny"));
}

TEST(Ops, AFaultMovesTheNamedOpsOutputAndNothingBeforeIt) {
  const CanaryConfig c = load_canary("micro");
  const FaultSpec fault = parse_fault_spec("step=0,op=blocks.0.mlp.fc,ulps=3", Gpt2Canary(c).forward_op_names());
  const TraceRecorder clean = traced_step<Gpt2Canary>(c), faulty = traced_step<Gpt2Canary>(c, fault);
  ASSERT_EQ(clean.records.size(), faulty.records.size());
  std::size_t first_difference = clean.records.size();
  for (std::size_t i = 0; i < clean.records.size() && first_difference == clean.records.size(); ++i) {
    if (clean.records[i].first != faulty.records[i].first) first_difference = i;
  }
  ASSERT_LT(first_difference, clean.records.size());
  EXPECT_EQ(faulty.records[first_difference].site, "blocks.0.mlp.fc");
  EXPECT_EQ(faulty.records[first_difference].phase, Phase::Forward);
  float moved = clean.records[first_difference].first;
  for (int i = 0; i < 3; ++i) moved = std::nextafter(moved, INFINITY);
  EXPECT_EQ(faulty.records[first_difference].first, moved);
}

// The whole model's backward (every op chained, tied embeddings, residuals) against
// finite differences of its loss, on a preset small enough to check many elements.
TEST(WholeModel, GradientsMatchFiniteDifferences) {
  CanaryConfig c = load_canary("micro");
  c.vocab_size = 17;
  c.context_length = 5;
  c.channels = 8;
  c.heads = 2;
  c.layers = 2;
  c.batch_size = 2;
  const Gpt2Canary model(c);
  CpuRefEngine engine;
  engine.bind(model.tensors());
  model.upload_initial_parameters(engine, 3);
  Batch batch;
  batch.tokens = {1, 5, 16, 2, 2, 9, 0, 4, 7, 13, 3, 1};
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < 5; ++t) {
      batch.inputs.push_back(batch.tokens[static_cast<std::size_t>(b * 6 + t)]);
      batch.targets.push_back(batch.tokens[static_cast<std::size_t>(b * 6 + t + 1)]);
    }
  }
  // Larger init than 0.02 so that every path carries signal well above fp32 noise.
  for (TensorId p : model.parameters()) {
    std::vector<float> v = model.initial_values(p, 5);
    for (float& x : v) x = x * 5.0f + (model.tensors()[p].rank() == 1 ? 0.3f : 0.0f);
    engine.upload(p, v);
  }
  model.compute_gradients(engine, 0, batch);
  std::vector<std::vector<float>> analytic;  // copied now: every loss evaluation zeroes gradients
  for (TensorId p : model.parameters()) {
    const auto grad_span = engine.read(model.tensors().shadow(p, TensorKind::Gradient));
    analytic.emplace_back(grad_span.begin(), grad_span.end());
  }
  for (std::size_t i = 0; i < model.parameters().size(); ++i) {
    const TensorId p = model.parameters()[i];
    const TensorDesc& d = model.tensors()[p];
    const auto values_span = engine.read(p);
    std::vector<float> values(values_span.begin(), values_span.end());
    auto loss = [&] {
      engine.upload(p, values);
      return static_cast<double>(model.evaluate_loss(engine, 0, batch));
    };
    harness::testing::expect_gradient(d.name, values, loss, analytic[i], {3e-2, 1e-3, 1e-3f}, 12);
    engine.upload(p, values);
  }
}

}  // namespace
}  // namespace harness::canary
