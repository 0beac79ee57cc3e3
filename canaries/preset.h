// A canary's resolved definition. Canaries are data: TOML files (canary_file.h,
// docs/canary-files.md); the shipped ones live in canaries/ (`tiny` is a contract,
// docs/canary.md: goldens and external twins are built on it; `micro` makes tests fast).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace harness::canary {

// Where a canary's training tokens come from (docs/canary-files.md, "[data]").
enum class DataSourceKind { kBuiltin, kTokens };

struct CanaryConfig {
  std::string name;          // lane names use it; the JSON spells it "preset"
  std::string architecture = "gpt2";
  // How to load this canary again (a replay recipe): a shipped canary's name, or the
  // absolute path of its file. Not part of the identity: a copy elsewhere is the same canary.
  std::string spec;
  // model: B = batch, T = context, C = channels, L = layers, NH = heads, V = vocab
  int vocab_size = 256;
  int context_length = 64;
  int channels = 128;
  int layers = 4;
  int heads = 4;
  int kv_heads = 4;          // llama: grouped-query attention; gpt2: always heads
  int mlp_hidden = 512;      // gpt2: 4 * channels
  double rope_theta = 10000.0;  // llama only
  std::string gelu = "tanh";    // gpt2: the MLP's GELU, "tanh" (GPT-2's approximation) or "erf" (exact)
  // moe: each block's MLP is `experts` SwiGLU experts of mlp_hidden, `experts_per_token`
  // of them per token; each takes capacity_factor * B*T*K/E token rows a step (rounded up,
  // expert_capacity()); the balance loss is balance_coef * E * sum f_e P_e. 0 experts: no MoE.
  int experts = 0;
  int experts_per_token = 0;
  double capacity_factor = 1.25;
  double balance_coef = 0.01;
  int batch_size = 8;
  int steps = 100;
  std::int64_t init_seed = 1337;  // [train] seed: the run's --seed when none is given
  // optimizer and schedule
  double peak_lr = 3e-3;
  double min_lr_ratio = 0.1;
  int warmup_steps = 10;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double adam_eps = 1e-8;
  double weight_decay = 0.1;
  double max_grad_norm = 1.0;
  // init and data
  double init_std = 0.02;
  double layernorm_eps = 1e-5;
  std::uint64_t data_seed = 20240611;  // the byte stream: its successor permutations and sampling
  DataSourceKind data_source = DataSourceKind::kBuiltin;
  // source = "tokens": the token file (absolute path), its element type, its length and
  // its XXH3-64: the identity holds the content, never the path.
  std::string tokens_path;
  std::string tokens_dtype;
  std::int64_t tokens_count = 0;
  std::uint64_t tokens_xxh3 = 0;
  // [eval] (docs/logit-kl.md): every `eval_every` steps (0: never) a forward-only pass over
  // the held-out batch records the logits of its first `eval_rows` rows. Not part of the
  // identity: the pass changes no trained bit (the engine's state is restored after it).
  int eval_every = 0;
  int eval_rows = 0;

  int head_size() const { return channels / heads; }
  int expert_capacity() const;
  // The canary's identity, the receipt's `canary` attribute: every key that changes the
  // numbers. Keys beyond gpt2's builtin-data set appear only when they are used, so the
  // identity of a gpt2 canary on builtin data is what it was before canary files existed.
  nlohmann::json to_json() const;
  static CanaryConfig from_json(const nlohmann::json& j);  // throws on missing keys
};

// Learning rate at step s: linear warm-up, then cosine to min_lr_ratio * peak at the last
// step. Evaluated in double with the project's own cosine (no libm).
double learning_rate(const CanaryConfig& config, int step);

}  // namespace harness::canary
