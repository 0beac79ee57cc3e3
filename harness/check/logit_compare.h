// Logit comparison (docs/logit-kl.md): two runs' output distributions on the same held-out
// batch, from their receipts' /eval. MaxText and torchtitan gate bring-up on the KL
// divergence of logits on a fixed batch, and RL pipelines need trainer and sampler
// log-probabilities to agree; a receipt's losses and hashes alone do not show either.
//
// Per evaluation both runs made at the same step: KL(reference || run), the mean over the
// recorded tokens of sum_v p_ref(v) (log p_ref(v) - log p_run(v)); the largest move of the
// log-probability of a token's target; and the fraction of tokens whose top-1 (the first
// largest logit) differs. Log-softmax is taken in double with the project's own exp and log
// (numerics/det_math.h): a report's number reads the same on every machine, and two
// bitwise-equal logits give a KL of exactly 0.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "budgets.h"
#include "receipt/receipt_reader.h"

namespace harness::check {

// What a comparison reads of a receipt's /eval.
struct EvalRecord {
  int every = 0;
  std::string held_out_hash, source;
  int rows = 0, tokens = 0, vocab = 0;
  std::vector<std::int64_t> steps;     // each evaluation's step
  std::vector<double> loss;            // each evaluation's held-out loss
  std::vector<float> logits;           // (evaluations, rows, tokens, vocab)
  std::vector<std::int32_t> targets;   // (rows, tokens)
  std::vector<double> compiles;        // programs each evaluation compiled; empty when not recorded

  std::size_t logits_per_eval() const {
    return static_cast<std::size_t>(rows) * static_cast<std::size_t>(tokens) * static_cast<std::size_t>(vocab);
  }
  std::span<const float> logits_at(std::size_t evaluation) const {
    return std::span<const float>(logits).subspan(evaluation * logits_per_eval(), logits_per_eval());
  }
};
// The receipt's /eval, nullopt when it has none. Throws receipt::ReceiptError naming the
// file when its datasets disagree in shape or a target is outside the vocabulary.
std::optional<EvalRecord> read_eval(const receipt::ReceiptReader& reader);

// One evaluation of two runs.
struct LogitDistance {
  bool identical = true;          // every logit bit for bit
  double kl = 0;                  // KL(reference || run), mean over tokens
  double max_logprob_delta = 0;   // max over tokens of |log p_run(target) - log p_ref(target)|
  double top1_mismatch = 0;       // fraction of tokens whose top-1 differs
  double value(const std::string& metric) const;  // by its kEvalMetrics name
  // The smallest nonzero value of `metric` over `tokens` tokens: 1/tokens for the fraction
  // top1_mismatch, 0 for the continuous ones.
  static double resolution(const std::string& metric, std::size_t tokens);
};
// `run` and `reference` are (tokens, vocab) logits; `targets` one per token.
LogitDistance logit_distance(std::span<const float> run, std::span<const float> reference,
                             std::span<const std::int32_t> targets, int vocab);

// The evaluations of two runs, step by step, where both evaluated.
struct EvalComparison {
  std::vector<int> steps;
  std::vector<LogitDistance> distances;
  // Why the runs' logits are not compared ("" when they are): one has no /eval, or their
  // held-out batches or recorded rows differ.
  std::string not_compared;
};
EvalComparison compare_evals(const std::optional<EvalRecord>& run, const std::optional<EvalRecord>& reference);
// compare_evals(run, reference).steps without computing the distances.
std::vector<int> compared_eval_steps(const std::optional<EvalRecord>& run, const std::optional<EvalRecord>& reference);

}  // namespace harness::check
