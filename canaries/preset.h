// Canary presets. `tiny` is a contract (../docs/canary.md): goldens and external twins
// are built on it. Smaller presets exist only to make tests fast.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace harness::canary {

struct CanaryConfig {
  std::string preset;
  // model: B = batch, T = context, C = channels, L = layers, NH = heads, V = vocab
  int vocab_size = 256;
  int context_length = 64;
  int channels = 128;
  int layers = 4;
  int heads = 4;
  int batch_size = 8;
  int steps = 100;
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

  int head_size() const { return channels / heads; }
  nlohmann::json to_json() const;
  static CanaryConfig from_json(const nlohmann::json& j);  // throws on missing keys
};

// Throws std::invalid_argument naming the known presets when `name` is unknown.
CanaryConfig preset(std::string_view name);
std::vector<std::string> preset_names();

// Learning rate at step s: linear warm-up, then cosine to min_lr_ratio * peak at the last
// step. Evaluated in double with the project's own cosine (no libm).
double learning_rate(const CanaryConfig& config, int step);

}  // namespace harness::canary
