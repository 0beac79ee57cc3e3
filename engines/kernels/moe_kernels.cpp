#include "moe_kernels.h"

#include <vector>

#include <xxhash.h>

#include <tbb/parallel_for.h>

#include "deterministic_reduce.h"
#include "kernels.h"
#include "vector_lanes.h"

namespace harness::kernels {
namespace {

std::int64_t at(int row, int width) { return static_cast<std::int64_t>(row) * width; }
int index_of(float stored) { return static_cast<int>(stored); }

// probs = softmax(z) over one row of E logits (max subtracted, the lanes' exp).
void softmax_row(float* p, const float* z, int E) {
  float max_logit = z[0];
  for (int e = 1; e < E; ++e) max_logit = z[e] > max_logit ? z[e] : max_logit;
  for (int e = 0; e < E; ++e) p[e] = z[e] - max_logit;
  lane_kernels().exp_inplace(p, E);
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) sum += p[e];
  const float inv_sum = 1.0f / sum;
  for (int e = 0; e < E; ++e) p[e] *= inv_sum;
}

// The K most probable experts of one row, most probable first; a tie goes to the lower
// expert (a strict comparison over experts in order).
void top_k_row(float* expert, float* weights, const float* p, int E, int K) {
  std::vector<char> taken(static_cast<std::size_t>(E), 0);
  float total = 0.0f;
  for (int j = 0; j < K; ++j) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      if (!taken[static_cast<std::size_t>(e)] && (best < 0 || p[e] > p[best])) best = e;
    }
    taken[static_cast<std::size_t>(best)] = 1;
    expert[j] = static_cast<float>(best);
    weights[j] = p[best];
    total += p[best];
  }
  const float inv_total = 1.0f / total;
  for (int j = 0; j < K; ++j) weights[j] *= inv_total;
}

// How many of the N*K choices picked each expert, before capacity.
std::vector<float> choices_per_expert(const float* expert, int N, int E, int K) {
  std::vector<float> counts(static_cast<std::size_t>(E), 0.0f);
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(N) * K; ++i)
    counts[static_cast<std::size_t>(index_of(expert[i]))] += 1.0f;
  return counts;
}

}  // namespace

void moe_route_forward(float* probs, float* weights, float* expert, float* slot, float* tokens_per_expert,
                       const float* logits, int N, int E, int K, int cap) {
  tbb::parallel_for(0, N, [&](int n) {
    softmax_row(probs + at(n, E), logits + at(n, E), E);
    top_k_row(expert + at(n, K), weights + at(n, K), probs + at(n, E), E, K);
  });
  // Capacity, in one fixed priority: rank j of every token before rank j + 1 of any.
  for (int e = 0; e < E; ++e) tokens_per_expert[e] = 0.0f;
  for (int j = 0; j < K; ++j) {
    for (int n = 0; n < N; ++n) {
      const std::int64_t choice = at(n, K) + j;
      float& taken = tokens_per_expert[index_of(expert[choice])];
      if (taken < static_cast<float>(cap)) {
        slot[choice] = taken;
        taken += 1.0f;
      } else {
        slot[choice] = kDroppedSlot;
      }
    }
  }
}

float moe_balance_loss(const float* probs, const float* expert, int N, int E, int K, float coef) {
  const std::vector<float> counts = choices_per_expert(expert, N, E, K);
  const float choices = static_cast<float>(N) * static_cast<float>(K);
  float loss = 0.0f;
  for (int e = 0; e < E; ++e) {
    const float mean_prob =
        blocked_sum<float>(N, kTokenBlock, [&](std::int64_t n) { return probs[n * E + e]; }) / static_cast<float>(N);
    loss += (counts[static_cast<std::size_t>(e)] / choices) * mean_prob;
  }
  return coef * static_cast<float>(E) * loss;
}

void moe_route_backward(float* dlogits, const float* dweights, const float* probs, const float* weights,
                        const float* expert, int N, int E, int K, float balance_coef) {
  // d balance / d probs[n][e] = coef * E * f_e / N, the same for every row.
  std::vector<float> balance = choices_per_expert(expert, N, E, K);
  const float scale =
      balance_coef * static_cast<float>(E) / (static_cast<float>(N) * static_cast<float>(K) * static_cast<float>(N));
  for (float& b : balance) b *= scale;
  tbb::parallel_for(0, N, [&](int n) {
    const float* p = probs + at(n, E);
    const float* w = weights + at(n, K);
    const float* dw = dweights + at(n, K);
    const float* chosen = expert + at(n, K);
    std::vector<float> dp(balance);
    // w_j = p_j / S over the chosen: dp_j += (dw_j - sum_i dw_i w_i) / S, with S = p_j / w_j.
    float weighted = 0.0f;
    for (int j = 0; j < K; ++j) weighted += dw[j] * w[j];
    float total = 0.0f;
    for (int j = 0; j < K; ++j) total += p[index_of(chosen[j])];
    const float inv_total = 1.0f / total;
    for (int j = 0; j < K; ++j) dp[static_cast<std::size_t>(index_of(chosen[j]))] += (dw[j] - weighted) * inv_total;
    // Softmax: dz_e = p_e (dp_e - sum_f p_f dp_f).
    float dot = 0.0f;
    for (int e = 0; e < E; ++e) dot += p[e] * dp[static_cast<std::size_t>(e)];
    float* dz = dlogits + at(n, E);
    for (int e = 0; e < E; ++e) dz[e] += p[e] * (dp[static_cast<std::size_t>(e)] - dot);
  });
}

void moe_dispatch_forward(float* expert_in, const float* inp, const float* expert, const float* slot, int N, int C,
                          int E, int K, int cap) {
  const std::int64_t total = static_cast<std::int64_t>(E) * cap * C;
  for (std::int64_t i = 0; i < total; ++i) expert_in[i] = 0.0f;
  tbb::parallel_for(0, N, [&](int n) {  // every placed choice owns its slot: no two rows write one
    for (int j = 0; j < K; ++j) {
      const std::int64_t choice = at(n, K) + j;
      if (slot[choice] == kDroppedSlot) continue;
      float* row = expert_in + (at(index_of(expert[choice]), cap) + index_of(slot[choice])) * C;
      const float* x = inp + at(n, C);
      for (int c = 0; c < C; ++c) row[c] = x[c];
    }
  });
}

void moe_dispatch_backward(float* dinp, const float* dexpert_in, const float* expert, const float* slot, int N, int C,
                           int K, int cap) {
  tbb::parallel_for(0, N, [&](int n) {
    float* dx = dinp + at(n, C);
    for (int j = 0; j < K; ++j) {
      const std::int64_t choice = at(n, K) + j;
      if (slot[choice] == kDroppedSlot) continue;
      const float* d = dexpert_in + (at(index_of(expert[choice]), cap) + index_of(slot[choice])) * C;
      for (int c = 0; c < C; ++c) dx[c] += d[c];
    }
  });
}

void moe_combine_forward(float* out, const float* expert_out, const float* weights, const float* expert,
                         const float* slot, int N, int C, int K, int cap) {
  tbb::parallel_for(0, N, [&](int n) {
    float* y = out + at(n, C);
    for (int c = 0; c < C; ++c) y[c] = 0.0f;
    for (int j = 0; j < K; ++j) {
      const std::int64_t choice = at(n, K) + j;
      if (slot[choice] == kDroppedSlot) continue;
      const float* v = expert_out + (at(index_of(expert[choice]), cap) + index_of(slot[choice])) * C;
      const float w = weights[choice];
      for (int c = 0; c < C; ++c) y[c] += w * v[c];
    }
  });
}

void moe_combine_backward(float* dexpert_out, float* dweights, const float* dout, const float* expert_out,
                          const float* weights, const float* expert, const float* slot, int N, int C, int K, int cap) {
  tbb::parallel_for(0, N, [&](int n) {  // every placed choice owns its slot
    const float* dy = dout + at(n, C);
    for (int j = 0; j < K; ++j) {
      const std::int64_t choice = at(n, K) + j;
      if (slot[choice] == kDroppedSlot) continue;
      const std::int64_t row = (at(index_of(expert[choice]), cap) + index_of(slot[choice])) * C;
      const float w = weights[choice];
      float dot = 0.0f;
      for (int c = 0; c < C; ++c) {
        dexpert_out[row + c] += w * dy[c];
        dot += dy[c] * expert_out[row + c];
      }
      dweights[choice] += dot;
    }
  });
}

void moe_routing_record(float* record, const float* expert, const float* slot, float balance_loss, int N, int E,
                        int K) {
  float placed = 0.0f;
  for (int e = 0; e < E; ++e) placed += record[e];
  record[E] = static_cast<float>(N) * static_cast<float>(K) - placed;
  record[E + 1] = balance_loss;
  // XXH3-64 (the receipt's tensor hash) of every choice's (expert, slot) as int32 pairs in
  // choice order, little-endian; a dropped choice's slot is -1.
  std::vector<std::int32_t> decisions(static_cast<std::size_t>(N) * static_cast<std::size_t>(K) * 2);
  for (std::size_t i = 0; i < decisions.size() / 2; ++i) {
    decisions[2 * i] = index_of(expert[i]);
    decisions[2 * i + 1] = index_of(slot[i]);
  }
  const std::uint64_t hash = XXH3_64bits(decisions.data(), decisions.size() * sizeof(std::int32_t));
  record[E + 2] = static_cast<float>((hash >> 24) & 0xffffffu);
  record[E + 3] = static_cast<float>(hash & 0xffffffu);
}

void moe_route_with_record(float* probs, float* weights, float* expert, float* slot, float* record, const float* logits,
                           int N, int E, int K, int cap, float balance_coef) {
  moe_route_forward(probs, weights, expert, slot, record, logits, N, E, K, cap);
  const float balance = moe_balance_loss(probs, expert, N, E, K, balance_coef);
  moe_routing_record(record, expert, slot, balance, N, E, K);
}

void expert_linear_forward(float* out, const float* inp, const float* weight, int E, int cap, int C, int OC,
                           float* scratch) {
  for (int e = 0; e < E; ++e) {
    linear_forward(out + at(e, cap) * OC, inp + at(e, cap) * C, weight + at(e, OC) * C, nullptr, cap, C, OC, scratch);
  }
}

void expert_linear_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                            int E, int cap, int C, int OC, float* scratch) {
  for (int e = 0; e < E; ++e) {
    linear_backward(dinp + at(e, cap) * C, dweight + at(e, OC) * C, nullptr, dout + at(e, cap) * OC,
                    inp + at(e, cap) * C, weight + at(e, OC) * C, cap, C, OC, scratch);
  }
}

}  // namespace harness::kernels
