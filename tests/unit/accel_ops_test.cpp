// Every op of the accel engine against cpu-ref, op by op, in the manner of ggml's
// test-backend-ops: one case object per op, shape and feature, with a stable ID
// (op/shape/feature) and a tolerance per feature on the normalised mean squared error
// NMSE = sum (accel - ref)^2 / sum ref^2 of each output.
//
// Worst NMSE measured on these cases (docs/engines/accel.md): fp32 with noise 1.8e-13,
// bf16 6.1e-6, fp8 zones 2.2e-3; bounds 1e-12, 1e-4, 3e-2. Each case also checks that its
// feature is really on: a bf16 case differs from cpu-ref, an fp8 case by more than the
// bf16 bound. Every graph runs two steps, so delayed FP8 scaling quantises with the
// scales step 0's amax produced (step 0 uses scale 1).
#include <cmath>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "accel_engine.h"
#include "cpu_ref_engine.h"
#include "numerics/philox.h"

namespace harness::accel {
namespace {

struct OpGraph {
  TensorTable table;
  std::vector<TensorId> outputs;
  std::function<void(Engine&)> run;
};

struct OpCase {
  std::string op, shape, feature;
  std::function<OpGraph()> build;
  std::string id() const { return fmt::format("{}/{}/{}", op, shape, feature); }
};

AccelConfig config_for(const std::string& feature) {
  AccelConfig c;
  c.noise_seed = 42;
  c.bf16 = feature != "fp32";
  c.fp8_zones = feature == "fp8" ? unsigned{kAllZones} : 0u;
  return c;
}

double max_nmse_for(const std::string& feature) {
  if (feature == "fp32") return 1e-12;
  if (feature == "bf16") return 1e-4;
  return 3e-2;  // fp8: 3 mantissa bits forward, 2 backward
}

// Inputs: N(0,1) from Philox by tensor name (weights 0.1x, LayerNorm weights around 1),
// tokens uniform over the vocabulary, per-step scalars fixed.
void fill_inputs(Engine& e, const TensorTable& table, int vocab) {
  for (const TensorDesc& d : table.all()) {
    const TensorId id = table.find(d.name, d.kind);
    if (d.dtype == DType::I32) {
      std::vector<std::int32_t> tokens(static_cast<std::size_t>(d.numel()));
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<std::int32_t>(numerics::philox_at(3, 0, i)[0] % static_cast<std::uint32_t>(vocab));
      }
      e.upload_tokens(id, tokens);
      continue;
    }
    std::vector<float> v(static_cast<std::size_t>(d.numel()));
    const bool ln_weight = d.name.find("ln") != std::string::npos && d.kind == TensorKind::Parameter;
    const double scale = d.kind == TensorKind::Parameter ? 0.1 : 1.0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double z = numerics::normal_at(5, numerics::stream_id(d.name.c_str()) + static_cast<int>(d.kind), i);
      v[i] = static_cast<float>(ln_weight ? 1.0 + 0.1 * z : scale * z);
      if (d.kind == TensorKind::AdamV) v[i] = static_cast<float>(1e-4 * z * z);  // a second moment is >= 0
    }
    if (d.kind == TensorKind::Scalar) v.assign(v.size(), d.name == "lr" ? 1e-3f : 0.5f);
    e.upload(id, v);
  }
}

std::vector<std::vector<float>> run_on(Engine& e, const OpGraph& g, int vocab) {
  e.bind(g.table);
  fill_inputs(e, g.table, vocab);
  for (int step = 0; step < 2; ++step) {
    e.step_begin(step);
    g.run(e);
    e.step_end();
  }
  std::vector<std::vector<float>> out;
  for (TensorId id : g.outputs) {
    const auto values = e.read(id);
    out.emplace_back(values.begin(), values.end());
  }
  return out;
}

double nmse(const std::vector<float>& a, const std::vector<float>& ref) {
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err += (static_cast<double>(a[i]) - ref[i]) * (static_cast<double>(a[i]) - ref[i]);
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return norm == 0 ? err : err / norm;
}

// ---- case factories --------------------------------------------------------------------

constexpr Phase F = Phase::Forward, Bw = Phase::Backward;
TensorId act(TensorTable& t, const std::string& name, std::vector<std::int64_t> shape,
             TensorKind kind = TensorKind::Activation, TensorRole role = {}) {
  return t.add({name, std::move(shape), DType::F32, kind, kNoTensor, role});
}
const TensorRole kStatistic{.fp32_statistic = true};

OpCase linear_case(int N, int C, int OC, bool bias, const std::string& feature) {
  const std::string shape = fmt::format("N{}_C{}_OC{}{}", N, C, OC, bias ? "_bias" : "");
  return {"linear", shape, feature, [=] {
            OpGraph g;
            const TensorId w = g.table.add_parameter("blocks.0.mlp.fc.weight", {OC, C},
                                                    {.linear = LinearRole::ColumnParallel, .fp8_zone = Fp8Zone::MlpFc});
            const TensorId b = bias ? g.table.add_parameter("blocks.0.mlp.fc.bias", {OC}) : kNoTensor;
            const TensorId x = act(g.table, "x", {N, C});
            const TensorId y = act(g.table, "y", {N, OC});
            const TensorId dx = act(g.table, "x", {N, C}, TensorKind::ActivationGrad);
            const TensorId dy = act(g.table, "y", {N, OC}, TensorKind::ActivationGrad);
            const TensorId dw = g.table.shadow(w, TensorKind::Gradient);
            const TensorId db = bias ? g.table.shadow(b, TensorKind::Gradient) : kNoTensor;
            g.outputs = {y, dx, dw};
            if (bias) g.outputs.push_back(db);
            g.run = [=](Engine& e) {
              e.linear_forward({"blocks.0.mlp.fc", 0, F}, y, x, w, b);
              e.linear_backward({"blocks.0.mlp.fc", 0, Bw}, dx, dw, db, dy, x, w);
            };
            return g;
          }};
}

OpCase attention_case(int B, int T, int C, int NH, const std::string& feature) {
  const std::string shape = fmt::format("B{}_T{}_C{}_NH{}", B, T, C, NH);
  return {"attention", shape, feature, [=] {
            OpGraph g;
            const TensorId qkv = act(g.table, "qkv", {B, T, 3 * C});
            const TensorId att = act(g.table, "att", {B, NH, T, T});
            const TensorId y = act(g.table, "y", {B, T, C});
            const TensorId dqkv = act(g.table, "qkv", {B, T, 3 * C}, TensorKind::ActivationGrad);
            const TensorId dy = act(g.table, "y", {B, T, C}, TensorKind::ActivationGrad);
            g.outputs = {y, att, dqkv};
            g.run = [=](Engine& e) {
              e.attention_forward({"blocks.0.attn", 0, F}, y, att, qkv);
              e.attention_backward({"blocks.0.attn", 0, Bw}, dqkv, dy, qkv, att);
            };
            return g;
          }};
}

OpCase layernorm_case(int N, int C, const std::string& feature) {
  return {"layernorm", fmt::format("N{}_C{}", N, C), feature, [=] {
            OpGraph g;
            const TensorId w = g.table.add_parameter("ln.weight", {C});
            const TensorId b = g.table.add_parameter("ln.bias", {C});
            const TensorId x = act(g.table, "x", {N, C});
            const TensorId y = act(g.table, "y", {N, C});
            const TensorId mean = act(g.table, "y.mean", {N}, TensorKind::Activation, kStatistic);
            const TensorId rstd = act(g.table, "y.rstd", {N}, TensorKind::Activation, kStatistic);
            const TensorId dx = act(g.table, "x", {N, C}, TensorKind::ActivationGrad);
            const TensorId dy = act(g.table, "y", {N, C}, TensorKind::ActivationGrad);
            g.outputs = {y, mean, rstd, dx, g.table.shadow(w, TensorKind::Gradient), g.table.shadow(b, TensorKind::Gradient)};
            g.run = [=](Engine& e) {
              e.layernorm_forward({"ln", 0, F}, y, mean, rstd, x, w, b, 1e-5f);
              e.layernorm_backward({"ln", 0, Bw}, dx, g.table.shadow(w, TensorKind::Gradient),
                                   g.table.shadow(b, TensorKind::Gradient), dy, x, w, mean, rstd);
            };
            return g;
          }};
}

OpCase encoder_case(int B, int T, int C, int V, const std::string& feature) {
  return {"encoder", fmt::format("B{}_T{}_C{}_V{}", B, T, C, V), feature, [=] {
            OpGraph g;
            const TensorId wte = g.table.add_parameter("wte", {V, C});
            const TensorId wpe = g.table.add_parameter("wpe", {T, C});
            const TensorId inputs = g.table.add({"inputs", {B, T}, DType::I32, TensorKind::Input});
            const TensorId y = act(g.table, "y", {B, T, C});
            const TensorId dy = act(g.table, "y", {B, T, C}, TensorKind::ActivationGrad);
            const TensorId dwte = g.table.shadow(wte, TensorKind::Gradient);
            const TensorId dwpe = g.table.shadow(wpe, TensorKind::Gradient);
            g.outputs = {y, dwte, dwpe};
            g.run = [=](Engine& e) {
              e.encoder_forward({"embedding", -1, F}, y, inputs, wte, wpe);
              e.encoder_backward({"embedding", -1, Bw}, dwte, dwpe, dy, inputs);
            };
            return g;
          }};
}

OpCase elementwise_case(int n, const std::string& feature) {
  return {"gelu_residual", fmt::format("n{}", n), feature, [=] {
            OpGraph g;
            const TensorId x = act(g.table, "x", {n});
            const TensorId a = act(g.table, "a", {n});
            const TensorId y = act(g.table, "y", {n});
            const TensorId r = act(g.table, "r", {n});
            const TensorId dx = act(g.table, "x", {n}, TensorKind::ActivationGrad);
            const TensorId da = act(g.table, "a", {n}, TensorKind::ActivationGrad);
            const TensorId dy = act(g.table, "y", {n}, TensorKind::ActivationGrad);
            const TensorId dr = act(g.table, "r", {n}, TensorKind::ActivationGrad);
            g.outputs = {y, r, dx, da, dy};
            g.run = [=](Engine& e) {
              e.gelu_forward({"gelu", 0, F}, y, x);
              e.residual_forward({"residual", 0, F}, r, a, y);
              e.residual_backward({"residual", 0, Bw}, da, dy, dr);
              e.gelu_backward({"gelu", 0, Bw}, dx, x, dy);
            };
            return g;
          }};
}

OpCase crossentropy_case(int N, int V, const std::string& feature) {
  return {"crossentropy", fmt::format("N{}_V{}", N, V), feature, [=] {
            OpGraph g;
            const TensorId logits = act(g.table, "logits", {N, V});
            const TensorId probs = act(g.table, "loss.probs", {N, V}, TensorKind::Activation, kStatistic);
            const TensorId dlogits = act(g.table, "logits", {N, V}, TensorKind::ActivationGrad);
            const TensorId targets = g.table.add({"targets", {N}, DType::I32, TensorKind::Input});
            const TensorId loss = g.table.add({"loss", {}, DType::F32, TensorKind::Scalar});
            g.outputs = {loss, probs, dlogits};
            g.run = [=](Engine& e) {
              e.crossentropy_forward({"loss", -1, F}, loss, probs, logits, targets);
              e.crossentropy_backward({"loss", -1, Bw}, dlogits, probs, targets);
            };
            return g;
          }};
}

OpCase optimizer_case(int n, const std::string& feature) {
  return {"norm_clip_adamw", fmt::format("n{}", n), feature, [=] {
            OpGraph g;
            const TensorId p = g.table.add_parameter("p", {n / 8, 8});
            const TensorId q = g.table.add_parameter("q", {n});
            const TensorId norm = g.table.add({"grad_norm", {}, DType::F32, TensorKind::Scalar});
            const TensorId lr = g.table.add({"lr", {}, DType::F32, TensorKind::Scalar});
            const TensorId bc = g.table.add({"bias_correction", {}, DType::F32, TensorKind::Scalar});
            const auto grads = g.table.of_kind(TensorKind::Gradient);
            g.outputs = {norm, p, q, g.table.shadow(p, TensorKind::AdamM), g.table.shadow(q, TensorKind::AdamV)};
            g.run = [=](Engine& e) {
              e.global_norm({"optimizer", -1, Phase::Optimizer}, norm, grads);
              e.clip_by_norm({"optimizer", -1, Phase::Optimizer}, grads, norm, 1.0f);
              for (TensorId t : {p, q}) {
                e.adamw_update({"optimizer", -1, Phase::Optimizer}, t, g.table.shadow(t, TensorKind::Gradient),
                               g.table.shadow(t, TensorKind::AdamM), g.table.shadow(t, TensorKind::AdamV), lr, bc, bc,
                               AdamWConfig{0.9f, 0.95f, 1e-8f, 0.1f});
              }
            };
            return g;
          }};
}

// The llama ops (docs/canary.md, "The llama architecture").
OpCase rmsnorm_case(int N, int C, const std::string& feature) {
  return {"rmsnorm", fmt::format("N{}_C{}", N, C), feature, [=] {
            OpGraph g;
            const TensorId w = g.table.add_parameter("ln.weight", {C});
            const TensorId x = act(g.table, "x", {N, C});
            const TensorId y = act(g.table, "y", {N, C});
            const TensorId rstd = act(g.table, "y.rstd", {N}, TensorKind::Activation, kStatistic);
            const TensorId dx = act(g.table, "x", {N, C}, TensorKind::ActivationGrad);
            const TensorId dy = act(g.table, "y", {N, C}, TensorKind::ActivationGrad);
            const TensorId dw = g.table.shadow(w, TensorKind::Gradient);
            g.outputs = {y, rstd, dx, dw};
            g.run = [=](Engine& e) {
              e.rmsnorm_forward({"norm", 0, F}, y, rstd, x, w, 1e-5f);
              e.rmsnorm_backward({"norm", 0, Bw}, dx, dw, dy, x, w, rstd);
            };
            return g;
          }};
}

OpCase rope_swiglu_case(int B, int T, int heads, int hd, const std::string& feature) {
  return {"rope_swiglu", fmt::format("B{}_T{}_heads{}_hd{}", B, T, heads, hd), feature, [=] {
            OpGraph g;
            const std::vector<std::int64_t> shape{B, T, heads * hd};
            const TensorId x = act(g.table, "x", shape), y = act(g.table, "y", shape);
            const TensorId up = act(g.table, "up", shape), z = act(g.table, "z", shape);
            const TensorId dx = act(g.table, "x", shape, TensorKind::ActivationGrad);
            const TensorId dy = act(g.table, "y", shape, TensorKind::ActivationGrad);
            const TensorId dup = act(g.table, "up", shape, TensorKind::ActivationGrad);
            const TensorId dz = act(g.table, "z", shape, TensorKind::ActivationGrad);
            g.outputs = {y, z, dx, dy, dup};
            g.run = [=](Engine& e) {
              e.rope_forward({"rope", 0, F}, y, x, hd, 10000.0);
              e.swiglu_forward({"swiglu", 0, F}, z, y, up);
              e.swiglu_backward({"swiglu", 0, Bw}, dy, dup, dz, y, up);
              e.rope_backward({"rope", 0, Bw}, dx, dy, hd, 10000.0);
            };
            return g;
          }};
}

OpCase gqa_attention_case(int B, int T, int NH, int NKV, int hd, const std::string& feature) {
  return {"gqa_attention", fmt::format("B{}_T{}_NH{}_NKV{}_hd{}", B, T, NH, NKV, hd), feature, [=] {
            OpGraph g;
            const std::vector<std::int64_t> q_shape{B, T, NH * hd}, kv_shape{B, T, NKV * hd};
            const TensorId q = act(g.table, "q", q_shape), k = act(g.table, "k", kv_shape);
            const TensorId v = act(g.table, "v", kv_shape), y = act(g.table, "y", q_shape);
            const TensorId att = act(g.table, "att", {B, NH, T, T});
            const TensorId dq = act(g.table, "q", q_shape, TensorKind::ActivationGrad);
            const TensorId dk = act(g.table, "k", kv_shape, TensorKind::ActivationGrad);
            const TensorId dv = act(g.table, "v", kv_shape, TensorKind::ActivationGrad);
            const TensorId dy = act(g.table, "y", q_shape, TensorKind::ActivationGrad);
            g.outputs = {y, att, dq, dk, dv};
            g.run = [=](Engine& e) {
              e.gqa_attention_forward({"blocks.0.attn", 0, F}, y, att, q, k, v);
              e.gqa_attention_backward({"blocks.0.attn", 0, Bw}, dq, dk, dv, dy, q, k, v, att);
            };
            return g;
          }};
}

std::vector<OpCase> all_cases() {
  std::vector<OpCase> cases;
  for (const std::string f : {"fp32", "bf16", "fp8"}) {
    cases.push_back(linear_case(64, 128, 384, true, f));
    cases.push_back(linear_case(37, 72, 130, false, f));
    cases.push_back(linear_case(512, 512, 128, true, f));
  }
  for (const std::string f : {"fp32", "bf16"}) {
    cases.push_back(attention_case(2, 16, 32, 2, f));
    cases.push_back(attention_case(1, 64, 128, 4, f));
    cases.push_back(layernorm_case(100, 48, f));
    cases.push_back(encoder_case(2, 40, 24, 64, f));
    cases.push_back(elementwise_case(10007, f));
    cases.push_back(crossentropy_case(130, 256, f));
    cases.push_back(optimizer_case(20000, f));
    cases.push_back(rmsnorm_case(100, 48, f));
    cases.push_back(rope_swiglu_case(2, 24, 3, 16, f));
    cases.push_back(gqa_attention_case(2, 16, 4, 2, 8, f));
    cases.push_back(gqa_attention_case(1, 48, 3, 1, 32, f));
  }
  return cases;
}

void PrintTo(const OpCase& c, std::ostream* os) { *os << c.id(); }

class AccelOps : public ::testing::TestWithParam<OpCase> {};

TEST_P(AccelOps, MatchesCpuRefWithinTheFeatureTolerance) {
  const OpCase& c = GetParam();
  const OpGraph graph = c.build();
  constexpr int kVocab = 64;
  CpuRefEngine reference;
  AccelEngine accel(config_for(c.feature));
  const auto ref = run_on(reference, graph, kVocab);
  const auto got = run_on(accel, graph, kVocab);
  const double bound = max_nmse_for(c.feature);
  double worst = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double e = nmse(got[i], ref[i]);
    worst = std::max(worst, e);
    EXPECT_LE(e, bound) << c.id() << " output '" << graph.table[graph.outputs[i]].name << "' nmse " << e;
  }
  if (c.feature == "bf16" && c.op != "norm_clip_adamw") {
    EXPECT_GT(worst, 0.0) << c.id() << ": bf16 had no effect";
  }
  if (c.feature == "fp8") {
    EXPECT_GT(worst, max_nmse_for("bf16")) << c.id() << ": fp8 no worse than bf16";
  }
  std::ostringstream text;
  text << std::scientific << worst;
  RecordProperty("worst_nmse", text.str());
}

INSTANTIATE_TEST_SUITE_P(OpByOp, AccelOps, ::testing::ValuesIn(all_cases()), [](const auto& param_info) {
  std::string id = param_info.param.id();
  for (char& ch : id) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return id;
});

}  // namespace
}  // namespace harness::accel
