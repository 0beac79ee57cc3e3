#include "logit_compare.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "numerics/det_math.h"

namespace harness::check {
namespace {

namespace paths = receipt::paths;

// log-softmax of one token's logits, in double.
void log_softmax(std::span<const float> logits, std::vector<double>& out) {
  out.resize(logits.size());
  const double top = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float x : logits) sum += numerics::det_exp(static_cast<double>(x) - top);
  const double log_sum = numerics::det_log(sum);
  for (std::size_t v = 0; v < logits.size(); ++v) out[v] = static_cast<double>(logits[v]) - top - log_sum;
}

std::size_t argmax(std::span<const float> logits) {
  return static_cast<std::size_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int int_attribute(const receipt::ReceiptReader& r, const char* name) {
  const h5::Handle group = h5::open_group(r.file(), paths::kEval);
  return static_cast<int>(h5::read_attr_int(group, name));
}

std::string text_attribute(const receipt::ReceiptReader& r, const char* name) {
  const h5::Handle group = h5::open_group(r.file(), paths::kEval);
  return h5::read_attr_string(group, name);
}

}  // namespace

std::optional<EvalRecord> read_eval(const receipt::ReceiptReader& r) {
  if (!h5::exists(r.file(), paths::kEval)) return std::nullopt;
  EvalRecord e;
  e.every = int_attribute(r, "every");
  e.held_out_hash = text_attribute(r, "held_out_hash");
  e.source = text_attribute(r, "source");
  const std::vector<hsize_t> shape = h5::dataset_shape(r.file(), paths::kEvalLogits);
  const std::vector<hsize_t> targets = h5::dataset_shape(r.file(), paths::kEvalTargets);
  const auto fail = [&](const std::string& what) {
    throw receipt::ReceiptError(fmt::format("{}: /eval: {}; the receipt is damaged", r.path(), what));
  };
  if (shape.size() != 4 || targets.size() != 2 || targets[0] != shape[1] || targets[1] != shape[2]) {
    fail("/eval/targets is not (rows, tokens) of /eval/logits");
  }
  e.rows = static_cast<int>(shape[1]);
  e.tokens = static_cast<int>(shape[2]);
  e.vocab = static_cast<int>(shape[3]);
  e.steps = h5::read_i64(r.file(), paths::kEvalStep);
  e.loss = h5::read_f64(r.file(), paths::kEvalLoss);
  e.logits = h5::read_f32(r.file(), paths::kEvalLogits);
  e.targets = h5::read_i32(r.file(), paths::kEvalTargets);
  if (h5::exists(r.file(), paths::kEvalCompiles)) e.compiles = h5::read_f64(r.file(), paths::kEvalCompiles);
  if (e.vocab < 1 || e.steps.size() != shape[0] || e.loss.size() != shape[0]) fail("its datasets disagree in length");
  for (const std::int32_t t : e.targets) {
    if (t < 0 || t >= e.vocab) fail(fmt::format("target {} is outside the vocabulary 0..{}", t, e.vocab - 1));
  }
  return e;
}

double LogitDistance::value(const std::string& metric) const {
  if (metric == kEvalMetrics[0]) return kl;
  if (metric == kEvalMetrics[1]) return max_logprob_delta;
  if (metric == kEvalMetrics[2]) return top1_mismatch;
  throw std::logic_error("LogitDistance: no metric " + metric);
}

double LogitDistance::resolution(const std::string& metric, std::size_t tokens) {
  return metric == kEvalMetrics[2] && tokens > 0 ? 1.0 / static_cast<double>(tokens) : 0.0;
}

LogitDistance logit_distance(std::span<const float> run, std::span<const float> reference,
                             std::span<const std::int32_t> targets, int vocab) {
  const auto V = static_cast<std::size_t>(vocab);
  if (run.size() != reference.size() || run.size() != targets.size() * V) {
    throw std::logic_error("logit_distance: logits are not (tokens, vocab) of the targets");
  }
  LogitDistance d;
  d.identical = std::memcmp(run.data(), reference.data(), run.size_bytes()) == 0;
  std::vector<double> log_p_run, log_p_ref;
  std::size_t mismatches = 0;
  for (std::size_t t = 0; t < targets.size(); ++t) {
    const std::span<const float> a = run.subspan(t * V, V), b = reference.subspan(t * V, V);
    log_softmax(a, log_p_run);
    log_softmax(b, log_p_ref);
    double kl = 0;
    for (std::size_t v = 0; v < V; ++v) kl += numerics::det_exp(log_p_ref[v]) * (log_p_ref[v] - log_p_run[v]);
    d.kl += kl;
    const auto target = static_cast<std::size_t>(targets[t]);
    d.max_logprob_delta = std::max(d.max_logprob_delta, std::fabs(log_p_run[target] - log_p_ref[target]));
    mismatches += argmax(a) != argmax(b) ? 1 : 0;
  }
  const double tokens = static_cast<double>(std::max<std::size_t>(1, targets.size()));
  // KL is never negative; a sum of rounded terms may be by a few ulps.
  d.kl = std::max(0.0, d.kl / tokens);
  d.top1_mismatch = static_cast<double>(mismatches) / tokens;
  return d;
}

namespace {

// The evaluations of `run` and `ref` at the same step, as (run's index, ref's index), when
// their logits compare at all; else none, and `not_compared` says why.
std::vector<std::pair<std::size_t, std::size_t>> common_evaluations(const std::optional<EvalRecord>& run,
                                                                    const std::optional<EvalRecord>& ref,
                                                                    std::string& not_compared) {
  if (!run || !ref) {
    not_compared = !run && !ref ? "neither run evaluated a held-out batch ([eval] every)"
                   : !run       ? "the run has no /eval (its canary's [eval] every is 0)"
                                : "the reference has no /eval (recorded before [eval], or with every = 0)";
    return {};
  }
  if (run->held_out_hash != ref->held_out_hash) {
    not_compared = fmt::format("the held-out batches differ ({} against {})", run->held_out_hash, ref->held_out_hash);
    return {};
  }
  if (run->rows != ref->rows || run->tokens != ref->tokens || run->vocab != ref->vocab) {
    not_compared = fmt::format("the recorded logits differ in shape ({}x{}x{} against {}x{}x{})", run->rows,
                               run->tokens, run->vocab, ref->rows, ref->tokens, ref->vocab);
    return {};
  }
  std::vector<std::pair<std::size_t, std::size_t>> pairs;
  for (std::size_t i = 0; i < run->steps.size(); ++i) {
    const auto at = std::find(ref->steps.begin(), ref->steps.end(), run->steps[i]);
    if (at != ref->steps.end()) pairs.emplace_back(i, static_cast<std::size_t>(at - ref->steps.begin()));
  }
  if (pairs.empty()) not_compared = "the runs evaluated at no common step";
  return pairs;
}

}  // namespace

EvalComparison compare_evals(const std::optional<EvalRecord>& run, const std::optional<EvalRecord>& ref) {
  EvalComparison c;
  for (const auto& [i, j] : common_evaluations(run, ref, c.not_compared)) {
    c.steps.push_back(static_cast<int>(run->steps[i]));
    c.distances.push_back(logit_distance(run->logits_at(i), ref->logits_at(j), ref->targets, ref->vocab));
  }
  return c;
}

std::vector<int> compared_eval_steps(const std::optional<EvalRecord>& run, const std::optional<EvalRecord>& ref) {
  std::string not_compared;
  std::vector<int> steps;
  for (const auto& [i, j] : common_evaluations(run, ref, not_compared)) steps.push_back(static_cast<int>(run->steps[i]));
  return steps;
}

}  // namespace harness::check
