#include "op_oracle.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "numerics/det_math.h"
#include "numerics/rounding_bounds.h"
#include "numerics/function_bounds.h"

namespace harness::run {
namespace {

using numerics::Precision;

double unit_roundoff(Precision p) { return numerics::precision_traits(p).unit_roundoff; }

// How one side of a GEMM reads its operand: rounded to the call's operand precision, or
// quantised to an FP8 format with its scale (the engine declares the roundings its descale
// adds: OpNumerics::descale_roundings). `max_scaled`: the largest |x| the format holds at
// that scale.
struct GemmSide {
  numerics::OperandRounding rounding;
  double max_scaled = std::numeric_limits<double>::infinity();
};

GemmSide gemm_side(const Engine::OpNumerics& n, std::size_t operand) {
  if (const std::optional<Engine::OpNumerics::Scaled> s = n.scaled_operand(operand)) {
    return {numerics::scaled_rounding(s->format, s->scale),
            numerics::precision_traits(s->format).max_finite / std::fabs(s->scale)};
  }
  return {numerics::format_rounding(n.operands)};
}

// The precision the products' operands were read in: "fp32", "bf16", or an FP8 unit's
// scaled formats ("e4m3,e4m3 scaled").
std::string operands_text(const Engine::OpNumerics& n) {
  std::string scaled;
  for (const std::optional<Engine::OpNumerics::Scaled>& s : n.scaled) {
    if (!s) continue;
    if (!scaled.empty()) scaled += ',';
    scaled += numerics::to_string(s->format);
  }
  return scaled.empty() ? std::string(numerics::to_string(n.operands)) : scaled + " scaled";
}

// A matrix over a flat span: element (i, j) at i * di + j * dj; 0 everywhere when empty
// (no bias).
struct View {
  std::span<const float> values;
  std::int64_t di = 0, dj = 0;
  double at(std::int64_t i, std::int64_t j) const { return values.empty() ? 0.0 : values[i * di + j * dj]; }
};

// Per row of a (rows, k) or per column of b (k, cols), the line's sum |x|, and whether an
// element of it lies past what its FP8 format holds at its scale (saturated: no bound).
struct LineSums {
  std::vector<double> abs;
  std::vector<char> saturated;
};
LineSums line_sums(std::int64_t lines, std::int64_t k, const std::function<double(std::int64_t, std::int64_t)>& at,
                   const GemmSide& side) {
  LineSums s{std::vector<double>(lines, 0.0), std::vector<char>(lines, 0)};
  for (std::int64_t line = 0; line < lines; ++line) {
    for (std::int64_t t = 0; t < k; ++t) {
      const double x = std::fabs(at(line, t));
      s.abs[line] += x;
      if (x > side.max_scaled) s.saturated[line] = 1;
    }
  }
  return s;
}

// out (rows, cols) = extra + a (rows, k) @ b (k, cols): each element in double (the
// products of floats exact, the sum's error far below any fp32 bound) and its bound, each
// side's operand read as `sa` and `sb` say, the GEMM's descale and accumulator as the engine
// declares (docs/oracle.md, "Dot products and sums", "A limited accumulator").
// Row-parallel: each element is computed by one thread, in one order, whatever the threads.
void dot_products(std::int64_t rows, std::int64_t cols, std::int64_t k, View a, View b, View extra, const GemmSide& sa,
                  const GemmSide& sb, const Engine::OpNumerics& declared, std::vector<double>& exact,
                  std::vector<double>& bound) {
  exact.assign(rows * cols, 0.0);
  bound.assign(rows * cols, 0.0);
  const LineSums row = line_sums(rows, k, [&](std::int64_t i, std::int64_t t) { return a.at(i, t); }, sa);
  const LineSums col = line_sums(cols, k, [&](std::int64_t j, std::int64_t t) { return b.at(t, j); }, sb);
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, rows, 8), [&](const auto& r) {
    for (std::int64_t i = r.begin(); i < r.end(); ++i) {
      for (std::int64_t j = 0; j < cols; ++j) {
        double sum = 0, abs_sum = 0;
        for (std::int64_t t = 0; t < k; ++t) {
          const double product = a.at(i, t) * b.at(t, j);
          sum += product;
          abs_sum += std::fabs(product);
        }
        const double e = extra.at(i, j);
        exact[i * cols + j] = e + sum;
        bound[i * cols + j] =
            row.saturated[i] || col.saturated[j]
                ? std::numeric_limits<double>::infinity()
                : numerics::rounded_operands_dot_bound({k, abs_sum, row.abs[i], col.abs[j], std::fabs(e)}, sa.rounding,
                                                       sb.rounding, declared.descale_roundings, declared.accumulator);
      }
    }
  });
}

}  // namespace

bool oracle_judges(OpKind op) {
  switch (op) {
    case OpKind::LinearForward:
    case OpKind::LinearBackward:
    case OpKind::ResidualForward:
    case OpKind::ResidualBackward:
    case OpKind::GeluErfForward:
    case OpKind::LayerNormForward:
    case OpKind::AttentionForward:
    case OpKind::CrossEntropyForward:
    case OpKind::LayerNormBackward: return true;
    default: return false;
  }
}

std::int64_t OracleReport::ops_over() const {
  return std::count_if(judged.begin(), judged.end(), [](const OpJudgement& j) { return !j.within(); });
}

OpOracle::OpOracle(Engine& engine, const TensorTable& table, std::optional<numerics::Precision> against)
    : engine_(engine), table_(table), against_(against) {
  if (engine.step_compilation() != nullptr) {
    throw std::invalid_argument(fmt::format("engine {} compiles its steps: its ops run when a step ends, so the oracle "
                                            "cannot read an op's operands as it ran (it judges engines that run each op "
                                            "as it is called: cpu-ref, accel)",
                                            engine.name()));
  }
}

std::span<const float> OpOracle::Call::operand(std::string_view name) const {
  const std::size_t i = describe(op).index_of(name);
  if (i >= before.size()) throw std::logic_error(fmt::format("op oracle: {} has no operand {}", describe(op).name, name));
  return before[i];
}

void OpOracle::before_op(OpKind op, const OpSite& site, std::span<const TensorId> operands,
                         std::span<const double> attributes) {
  const OpDescription& d = describe(op);
  call_ = Call{op, std::string(site.name), site.phase, {operands.begin(), operands.end()},
               {attributes.begin(), attributes.end()}, {}, {}};
  if (!oracle_judges(op)) {
    ++report_.not_judged[std::string(d.name)];
    return;
  }
  call_.before.resize(operands.size());
  for (std::size_t i = 0; i < operands.size(); ++i) {
    // A pure result's old value is not read; nor are tokens (the oracle reads floats).
    if (operands[i] == kNoTensor || d.access(i) == Access::Write || table_[operands[i]].dtype != DType::F32) continue;
    const std::span<const float> value = engine_.read(operands[i]);
    call_.before[i].assign(value.begin(), value.end());
  }
}

void OpOracle::after_op(OpKind op, const OpSite& site, std::span<const TensorId> operands) {
  if (!oracle_judges(op) || call_.before.empty()) return;
  // Asked now the op has run: a scale may come from the operand's own amax.
  call_.numerics = engine_.op_numerics(op, site, operands);
  if (against_) {  // every operand and result in that precision, nothing scaled
    call_.numerics = {};
    call_.numerics.operands = *against_;
    call_.numerics.results.assign(operands.size(), *against_);
  }
  if (!call_.numerics.bounded) {
    report_.not_bounded.push_back({std::string(site.name), std::string(to_string(site.phase)),
                                   std::string(describe(op).name), call_.numerics.why_not_bounded});
    return;
  }
  if (!captured_ && call_.site == capture_site_ && call_.phase == capture_phase_) keep(call_);
  switch (op) {
    case OpKind::LinearForward: judge_linear_forward(call_); break;
    case OpKind::LinearBackward: judge_linear_backward(call_); break;
    case OpKind::LayerNormForward: judge_layernorm_forward(call_); break;
    case OpKind::AttentionForward: judge_attention_forward(call_); break;
    case OpKind::CrossEntropyForward: judge_crossentropy_forward(call_); break;
    case OpKind::LayerNormBackward: judge_layernorm_backward(call_); break;
    default: judge_elementwise(call_); break;
  }
}

// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC)
void OpOracle::judge_linear_forward(const Call& call) {
  const OpDescription& d = describe(call.op);
  const TensorDesc& w = table_[call.operands[d.index_of("weight")]];
  const std::int64_t OC = w.dim(0), C = w.dim(1);
  const std::span<const float> x = call.operand("inp");
  const std::span<const float> bias = call.operands[d.index_of("bias")] == kNoTensor ? std::span<const float>() : call.operand("bias");
  std::vector<double> exact, bound;
  dot_products(static_cast<std::int64_t>(x.size()) / C, OC, C, {x, C, 1}, {call.operand("weight"), 1, C}, {bias, 0, 1},
               gemm_side(call.numerics, d.index_of("inp")), gemm_side(call.numerics, d.index_of("weight")),
               call.numerics, exact, bound);
  add(call, d.index_of("out"), engine_.read(call.operands[d.index_of("out")]), exact, bound);
}

// dinp (N,C) += dout (N,OC) @ weight (OC,C); dweight (OC,C) += dout^T @ inp; dbias (OC) += sum over N of dout
void OpOracle::judge_linear_backward(const Call& call) {
  const OpDescription& d = describe(call.op);
  const TensorDesc& w = table_[call.operands[d.index_of("weight")]];
  const std::int64_t OC = w.dim(0), C = w.dim(1);
  const std::span<const float> dy = call.operand("dout"), x = call.operand("inp");
  const std::int64_t N = static_cast<std::int64_t>(x.size()) / C;
  std::vector<double> exact, bound;
  const auto judge = [&](std::string_view result) {
    add(call, d.index_of(result), engine_.read(call.operands[d.index_of(result)]), exact, bound);
  };
  const GemmSide output_gradient = gemm_side(call.numerics, d.index_of("dout"));
  dot_products(N, C, OC, {dy, OC, 1}, {call.operand("weight"), C, 1}, {call.operand("dinp"), C, 1}, output_gradient,
               gemm_side(call.numerics, d.index_of("weight")), call.numerics, exact, bound);
  judge("dinp");
  dot_products(OC, C, N, {dy, 1, OC}, {x, C, 1}, {call.operand("dweight"), C, 1}, output_gradient,
               gemm_side(call.numerics, d.index_of("inp")), call.numerics, exact, bound);
  judge("dweight");
  if (call.operands[d.index_of("dbias")] == kNoTensor) return;
  const std::span<const float> dbias_old = call.operand("dbias");
  exact.assign(OC, 0.0);
  bound.assign(OC, 0.0);
  for (std::int64_t o = 0; o < OC; ++o) {  // N + 1 terms in any order: gamma_N
    double sum = dbias_old[o], abs_sum = std::fabs(dbias_old[o]);
    for (std::int64_t n = 0; n < N; ++n) {
      sum += dy[n * OC + o];
      abs_sum += std::fabs(dy[n * OC + o]);
    }
    exact[o] = sum;
    bound[o] = numerics::recursive_sum_bound(N + 1, abs_sum, Precision::Fp32);
  }
  judge("dbias");
}

// A softmax's probabilities and their bounds (docs/oracle.md, "Attention"), as the kernels
// compute one (engines/kernels/kernels.cpp: causal_softmax_row, crossentropy_rows): the
// max subtracted and rounded, exp_poly within 3.5 ulps, the sum of the n positive terms,
// 1/sum and the multiply (engines/numerics/function_bounds.h). s: the exact scores; delta:
// how far the op's own fp32 scores may be from them (0 for scores it was given).
struct SoftmaxBounds {
  std::vector<double> p, bound;
};
SoftmaxBounds softmax_bounds(std::span<const double> s, std::span<const double> delta) {
  constexpr double kExpPolyUlps = 3.5;  // numerics::exp_poly (det_math.h; DetMath.PolynomialExpIsWithinThreeUlpOnItsDomain)
  const std::size_t n = s.size();
  const double max_score = *std::max_element(s.begin(), s.end());
  const double max_delta = *std::max_element(delta.begin(), delta.end());
  std::vector<double> eta(n);
  double sum = 0, max_eta = 0;
  for (std::size_t j = 0; j < n; ++j) {
    eta[j] = numerics::softmax_exponent_error(delta[j], max_delta, std::fabs(s[j] - max_score));
    max_eta = std::max(max_eta, eta[j]);
    sum += numerics::det_exp(s[j] - max_score);
  }
  SoftmaxBounds b{std::vector<double>(n), std::vector<double>(n)};
  for (std::size_t j = 0; j < n; ++j) {
    b.p[j] = numerics::det_exp(s[j] - max_score) / sum;
    b.bound[j] = numerics::softmax_probability_bound(b.p[j], eta[j], max_eta, static_cast<std::int64_t>(n), kExpPolyUlps);
  }
  return b;
}

// Row t of causal attention: scores s_j = (q . k_j) / sqrt(hs) for j <= t, each within
// Delta_j of the op's fp32 one (numerics::attention_score_error).
SoftmaxBounds attention_row(std::int64_t t, std::int64_t hs, const std::function<double(std::int64_t, std::int64_t)>& q,
                            const std::function<double(std::int64_t, std::int64_t)>& k) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  std::vector<double> s(static_cast<std::size_t>(t + 1)), delta(s.size());
  for (std::int64_t j = 0; j <= t; ++j) {
    double dot = 0, abs_sum = 0;
    for (std::int64_t d = 0; d < hs; ++d) {
      const double product = q(t, d) * k(j, d);
      dot += product;
      abs_sum += std::fabs(product);
    }
    s[j] = dot * scale;
    delta[j] = numerics::attention_score_error(hs, abs_sum, std::fabs(dot), scale);
  }
  return softmax_bounds(s, delta);
}

// out (B,T,C), att (B,NH,T,T) from qkv (B,T,3C) = [q | k | v] per token: att judged on q and
// k (attention_row; 0 exactly past the causal mask), out on the op's own att and v, a dot
// product of T terms per element (masked terms exact zeros).
void OpOracle::judge_attention_forward(const Call& call) {
  const OpDescription& d = describe(call.op);
  const TensorDesc& a = table_[call.operands[d.index_of("att")]];
  const std::int64_t B = a.dim(0), NH = a.dim(1), T = a.dim(2);
  const std::span<const float> x = call.operand("qkv");
  const std::int64_t C3 = static_cast<std::int64_t>(x.size()) / (B * T), C = C3 / 3, hs = C / NH;
  const std::span<const float> att = engine_.read(call.operands[d.index_of("att")]);
  std::vector<double> exact(att.size(), 0.0), bound(att.size(), 0.0);
  std::vector<double> out_exact(static_cast<std::size_t>(B * T * C)), out_bound(out_exact.size());
  tbb::parallel_for(std::int64_t{0}, B * NH, [&](std::int64_t bh) {
    const std::int64_t b = bh / NH, h = bh % NH;
    const auto at = [&](std::int64_t part) {  // q (part 0), k (1) or v (2) of head h, token r, dim c
      return [&, part](std::int64_t r, std::int64_t c) { return static_cast<double>(x[(b * T + r) * C3 + part * C + h * hs + c]); };
    };
    for (std::int64_t t = 0; t < T; ++t) {
      const SoftmaxBounds row = attention_row(t, hs, at(0), at(1));
      const std::int64_t base = (bh * T + t) * T;
      std::copy(row.p.begin(), row.p.end(), exact.begin() + base);
      std::copy(row.bound.begin(), row.bound.end(), bound.begin() + base);
      const auto v = at(2);
      for (std::int64_t c = 0; c < hs; ++c) {
        double sum = 0, abs_sum = 0;
        for (std::int64_t j = 0; j < T; ++j) {
          const double product = static_cast<double>(att[base + j]) * v(j, c);
          sum += product;
          abs_sum += std::fabs(product);
        }
        const std::size_t o = static_cast<std::size_t>((b * T + t) * C + h * hs + c);
        out_exact[o] = sum;
        out_bound[o] = numerics::dot_product_bound(T, abs_sum, Precision::Fp32);
      }
    }
  });
  add(call, d.index_of("att"), att, exact, bound);
  add(call, d.index_of("out"), engine_.read(call.operands[d.index_of("out")]), out_exact, out_bound);
}

// probs (N,V) = softmax of each row of logits (N,V), which the op was given: softmax_bounds
// with no error in the scores. The loss (the mean of -log probs[target]) is listed as not
// judged: the oracle reads float operands only, and the targets are tokens.
void OpOracle::judge_crossentropy_forward(const Call& call) {
  const OpDescription& d = describe(call.op);
  const std::span<const float> logits = call.operand("logits");
  const std::int64_t V = table_[call.operands[d.index_of("logits")]].shape.back(), N = static_cast<std::int64_t>(logits.size()) / V;
  std::vector<double> exact(logits.size()), bound(logits.size());
  tbb::parallel_for(std::int64_t{0}, N, [&](std::int64_t i) {
    const std::vector<double> row(logits.begin() + i * V, logits.begin() + (i + 1) * V);
    const SoftmaxBounds b = softmax_bounds(row, std::vector<double>(static_cast<std::size_t>(V), 0.0));
    std::copy(b.p.begin(), b.p.end(), exact.begin() + i * V);
    std::copy(b.bound.begin(), b.bound.end(), bound.begin() + i * V);
  });
  add(call, d.index_of("probs"), engine_.read(call.operands[d.index_of("probs")]), exact, bound);
  ++report_.not_judged["crossentropy_forward loss"];
}

// The layer norm's backward given the forward's own mean and rstd (operands), as
// kernels::layernorm_backward_row computes it (docs/oracle.md, "Layer norm backward"): per
// row, norm = (x - mean) rstd (two roundings), dnorm = w dy (one), their means A = sum dnorm
// / C and B = sum dnorm norm / C (within gamma_{C+1} and gamma_{C+4} of their sums of
// magnitudes over C), dinp += (dnorm - A - norm B) rstd; dweight += sum over rows of norm dy
// (each term three roundings, N + 1 terms in any order: gamma_{N+4}), dbias += sum of dy
// (gamma_N).
void OpOracle::judge_layernorm_backward(const Call& call) {
  const OpDescription& d = describe(call.op);
  const std::span<const float> x = call.operand("inp"), dy = call.operand("dout"), w = call.operand("weight");
  const std::span<const float> mean = call.operand("mean"), rstd = call.operand("rstd");
  const std::span<const float> dinp_old = call.operand("dinp");
  const std::int64_t C = static_cast<std::int64_t>(w.size()), N = static_cast<std::int64_t>(x.size()) / C;
  const double u = unit_roundoff(Precision::Fp32);
  const auto g = [u](std::int64_t n) { return numerics::gamma(n, u); };
  std::vector<double> dinp_exact(x.size()), dinp_bound(x.size());
  tbb::parallel_for(std::int64_t{0}, N, [&](std::int64_t i) {
    const std::int64_t row = i * C;
    const double m = mean[i], r = rstd[i];
    double a = 0, b = 0, abs_d = 0, abs_dn = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      const double n = (x[row + c] - m) * r, dn = static_cast<double>(w[c]) * dy[row + c];
      a += dn, b += dn * n, abs_d += std::fabs(dn), abs_dn += std::fabs(dn * n);
    }
    a /= static_cast<double>(C), b /= static_cast<double>(C);
    const double error_a = g(C + 1) * abs_d / static_cast<double>(C), error_b = g(C + 4) * abs_dn / static_cast<double>(C);
    for (std::int64_t c = 0; c < C; ++c) {
      const double n = (x[row + c] - m) * r, dn = static_cast<double>(w[c]) * dy[row + c];
      const double t = dn - a - n * b, magnitude = std::fabs(dn) + std::fabs(a) + std::fabs(n * b);
      const double error_t = g(6) * magnitude + (1 + g(6)) * (error_a + (1 + g(3)) * std::fabs(n) * error_b);
      dinp_exact[row + c] = dinp_old[row + c] + t * r;
      dinp_bound[row + c] = r * error_t * (1 + g(2)) + g(2) * (r * (magnitude + error_t) + std::fabs(dinp_old[row + c]));
    }
  });
  add(call, d.index_of("dinp"), engine_.read(call.operands[d.index_of("dinp")]), dinp_exact, dinp_bound);
  const std::span<const float> dweight_old = call.operand("dweight"), dbias_old = call.operand("dbias");
  std::vector<double> dw_exact(C), dw_bound(C), db_exact(C), db_bound(C);
  tbb::parallel_for(std::int64_t{0}, C, [&](std::int64_t c) {
    double dw = dweight_old[c], abs_dw = std::fabs(dweight_old[c]), db = dbias_old[c], abs_db = std::fabs(dbias_old[c]);
    for (std::int64_t i = 0; i < N; ++i) {
      const double n = (x[i * C + c] - static_cast<double>(mean[i])) * rstd[i], y = dy[i * C + c];
      dw += n * y, abs_dw += std::fabs(n * y), db += y, abs_db += std::fabs(y);
    }
    dw_exact[c] = dw, dw_bound[c] = g(N + 4) * abs_dw;
    db_exact[c] = db, db_bound[c] = numerics::recursive_sum_bound(N + 1, abs_db, Precision::Fp32);
  });
  add(call, d.index_of("dweight"), engine_.read(call.operands[d.index_of("dweight")]), dw_exact, dw_bound);
  add(call, d.index_of("dbias"), engine_.read(call.operands[d.index_of("dbias")]), db_exact, db_bound);
}

// out (N,C) = (inp - mean) * rstd * weight + bias, mean and rstd (N) saved, each judged on
// what the op computed it from (docs/oracle.md, "Layer norm"): the mean, a sum of C terms
// divided by C; rstd = 1/sqrt(sum((x - mean)^2)/C + eps) given the op's own mean; the output
// given the op's own mean and rstd, four roundings.
void OpOracle::judge_layernorm_forward(const Call& call) {
  const OpDescription& d = describe(call.op);
  const std::span<const float> x = call.operand("inp"), w = call.operand("weight"), b = call.operand("bias");
  const std::int64_t C = static_cast<std::int64_t>(w.size()), N = static_cast<std::int64_t>(x.size()) / C;
  const double u = unit_roundoff(Precision::Fp32), eps = call.attributes.at(0);
  const std::span<const float> mean = engine_.read(call.operands[d.index_of("mean")]);
  std::vector<double> exact_mean(N), bound_mean(N), exact_rstd(N), bound_rstd(N);
  for (std::int64_t n = 0; n < N; ++n) {
    double sum = 0, abs_sum = 0, squares = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      sum += x[n * C + c];
      abs_sum += std::fabs(x[n * C + c]);
      const double deviation = static_cast<double>(x[n * C + c]) - mean[n];
      squares += deviation * deviation;
    }
    exact_mean[n] = sum / static_cast<double>(C);
    const double sum_error = numerics::recursive_sum_bound(C, abs_sum, Precision::Fp32);
    bound_mean[n] = sum_error / static_cast<double>(C) * (1 + u) + u * std::fabs(exact_mean[n]);
    // var + eps: each deviation and its square rounded, C of them summed (gamma_C), /C, +eps:
    // a relative error ev; the square root halves it. The root's rounding is in the
    // denominator, (1+u)/(1-u); the reciprocal's, (1+u).
    const double ev = (1 + u) * (1 + u) * (1 + numerics::gamma(C, u)) * (1 + u) * (1 + u) - 1;
    exact_rstd[n] = 1.0 / std::sqrt(squares / static_cast<double>(C) + eps);
    bound_rstd[n] = exact_rstd[n] * ((1 + ev / (2 * (1 - ev))) * (1 + u) / (1 - u) * (1 + u) - 1);
  }
  add(call, d.index_of("mean"), mean, exact_mean, bound_mean);
  const std::span<const float> rstd = engine_.read(call.operands[d.index_of("rstd")]);
  add(call, d.index_of("rstd"), rstd, exact_rstd, bound_rstd);
  std::vector<double> exact(N * C), bound(N * C);
  for (std::int64_t n = 0; n < N; ++n) {
    for (std::int64_t c = 0; c < C; ++c) {
      const double scaled = (static_cast<double>(x[n * C + c]) - mean[n]) * rstd[n] * w[c];
      exact[n * C + c] = scaled + b[c];
      bound[n * C + c] = numerics::gamma(4, u) * (std::fabs(scaled) + std::fabs(b[c]));
    }
  }
  add(call, d.index_of("out"), engine_.read(call.operands[d.index_of("out")]), exact, bound);
}

// residual_forward: out = a + b; residual_backward: da += dout, db += dout (one fp32
// rounding each); gelu_erf_forward: out = x Phi(x), 1.5 ulp of fp32: its test's one grid step
// (tests/unit/det_math_test.cpp), against libm's erfc, a reference the kernel does not use.
void OpOracle::judge_elementwise(const Call& call) {
  const OpDescription& d = describe(call.op);
  const auto one_rounding = [](double y) { return numerics::rounding_bound(y, Precision::Fp32); };
  const auto judge = [&](std::string_view result, const auto& value_of, const auto& bound_of) {
    const std::size_t at = d.index_of(result);
    const std::span<const float> got = engine_.read(call.operands[at]);
    std::vector<double> exact(got.size()), bound(got.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      exact[i] = value_of(i);
      bound[i] = bound_of(exact[i]);
    }
    add(call, at, got, exact, bound);
  };
  switch (call.op) {
    case OpKind::ResidualForward: {
      const std::span<const float> a = call.operand("a"), b = call.operand("b");
      judge("out", [&](std::size_t i) { return static_cast<double>(a[i]) + b[i]; }, one_rounding);
      break;
    }
    case OpKind::ResidualBackward: {
      const std::span<const float> dout = call.operand("dout");
      for (const char* result : {"da", "db"}) {
        const std::span<const float> old = call.operand(result);
        judge(result, [&](std::size_t i) { return static_cast<double>(old[i]) + dout[i]; }, one_rounding);
      }
      break;
    }
    case OpKind::GeluErfForward: {
      const std::span<const float> x = call.operand("inp");
      judge(
          "out", [&](std::size_t i) { return 0.5 * x[i] * std::erfc(-static_cast<double>(x[i]) / std::sqrt(2.0)); },
          // the test allows one grid step from the correctly rounded value: 1.5 ulp from the exact one
          [](double y) { return 1.5 * numerics::ulp_of(y, Precision::Fp32); });
      break;
    }
    default: throw std::logic_error(fmt::format("op oracle: no elementwise judgement of {}", d.name));
  }
}

void OpOracle::keep(const Call& call) {
  const OpDescription& d = describe(call.op);
  CapturedOp c{call.op,      call.site, std::string(to_string(call.phase)), operands_text(call.numerics),
               call.attributes, {}, {}, {}};
  for (std::size_t i = 0; i < call.operands.size(); ++i) {
    if (call.operands[i] == kNoTensor) continue;
    const std::string name(d.operands[i].name);
    const TensorDesc& desc = table_[call.operands[i]];
    if (!call.before[i].empty()) c.inputs.push_back({name, desc.name, desc.shape, call.before[i]});
    if (d.writes(i)) {  // its results and what it saves (layernorm's mean and rstd), as the op left them
      const std::span<const float> after = engine_.read(call.operands[i]);
      c.results.push_back({name, desc.name, desc.shape, {after.begin(), after.end()}});
      c.stored.emplace_back(numerics::to_string(call.numerics.result(i)));
    }
  }
  captured_ = std::move(c);
}

void OpOracle::add(const Call& call, std::size_t result, std::span<const float> got, const std::vector<double>& exact,
                   const std::vector<double>& compute_bound) {
  OpJudgement j;
  j.site = call.site;
  j.op = std::string(describe(call.op).name);
  j.phase = std::string(to_string(call.phase));
  j.result = std::string(describe(call.op).operands[result].name);
  j.tensor = table_[call.operands[result]].name;
  j.operands = operands_text(call.numerics);
  const std::vector<double> values(got.begin(), got.end());
  judge_values(j, values, exact, compute_bound, call.numerics.result(result));
  report_.judged.push_back(std::move(j));
}

void judge_values(OpJudgement& j, std::span<const double> got, std::span<const double> exact,
                  std::span<const double> compute_bound, Precision stored) {
  j.stored = std::string(numerics::to_string(stored));
  j.elements = static_cast<std::int64_t>(got.size());
  double worst_bound = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double y = exact[i], e = compute_bound[i];
    // The fp32 result rounded once more where it is stored narrower (docs/oracle.md).
    const double bound = stored == Precision::Fp32 ? e : e + numerics::rounding_bound(std::fabs(y) + e, stored);
    // Non-finite operands, or an exact value past the format's range (its overflow to inf is
    // the rounding it has): no bound.
    if (!std::isfinite(y) || !std::isfinite(bound) || std::fabs(y) > numerics::precision_traits(stored).max_finite) {
      ++j.unbounded;
      continue;
    }
    const double error = std::fabs(got[i] - y);  // NaN or infinite for a non-finite result
    const bool within = std::isfinite(error) && error <= bound;
    if (!within) ++j.over;
    // error / bound; a NaN or infinite error, or any error over a bound of 0, is infinitely over.
    const double ratio = error == 0 ? 0.0 : std::isfinite(error) && bound > 0 ? error / bound
                                                                              : std::numeric_limits<double>::infinity();
    if (ratio > j.worst_ratio || i == 0) {
      j.worst_ratio = ratio;
      j.worst_index = static_cast<std::int64_t>(i);
      worst_bound = bound;
    }
  }
  if (!got.empty()) {
    j.value = got[j.worst_index];
    j.exact = exact[j.worst_index];
    j.error_ulps = numerics::error_in_ulps(j.value, j.exact, stored);
    j.bound_ulps = worst_bound / numerics::ulp_of(j.exact, stored);
  }
}

}  // namespace harness::run
