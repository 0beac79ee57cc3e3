#include "preset.h"

#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "architecture.h"
#include "numerics/det_math.h"

namespace harness::canary {

nlohmann::json CanaryConfig::to_json() const {
  nlohmann::json j = {{"preset", name},
          {"vocab_size", vocab_size},
          {"context_length", context_length},
          {"channels", channels},
          {"layers", layers},
          {"heads", heads},
          {"batch_size", batch_size},
          {"steps", steps},
          {"peak_lr", peak_lr},
          {"min_lr_ratio", min_lr_ratio},
          {"warmup_steps", warmup_steps},
          {"beta1", beta1},
          {"beta2", beta2},
          {"adam_eps", adam_eps},
          {"weight_decay", weight_decay},
          {"max_grad_norm", max_grad_norm},
          {"init_std", init_std},
          {"layernorm_eps", layernorm_eps},
          {"data_seed", data_seed}};
  const ArchitectureSpec* described = find_architecture(architecture);
  if (described == nullptr || !described->legacy_identity) {  // the legacy identity leaves out what its rules fix
    j["architecture"] = architecture;
    j["kv_heads"] = kv_heads;
    j["mlp_hidden"] = mlp_hidden;
    j["rope_theta"] = rope_theta;
  }
  if (described != nullptr) {  // its own model keys, under their names
    for (const ModelKey& key : described->model_keys) {
      if (key.choice != nullptr) {
        if (this->*key.choice != key.choices.front()) j[std::string(key.name)] = this->*key.choice;
      } else if (key.integer != nullptr) {
        j[std::string(key.name)] = this->*key.integer;
      } else {
        j[std::string(key.name)] = this->*key.number;
      }
    }
  }
  if (data_source == DataSourceKind::kTokens) {
    j["data_source"] = "tokens";
    j["data_tokens_dtype"] = tokens_dtype;
    j["data_tokens_count"] = tokens_count;
    j["data_tokens_xxh3"] = fmt::format("{:016x}", tokens_xxh3);
  }
  return j;
}

CanaryConfig CanaryConfig::from_json(const nlohmann::json& j) {
  CanaryConfig c;
  c.name = j.at("preset").get<std::string>();
  c.vocab_size = j.at("vocab_size").get<int>();
  c.context_length = j.at("context_length").get<int>();
  c.channels = j.at("channels").get<int>();
  c.layers = j.at("layers").get<int>();
  c.heads = j.at("heads").get<int>();
  c.batch_size = j.at("batch_size").get<int>();
  c.steps = j.at("steps").get<int>();
  c.peak_lr = j.at("peak_lr").get<double>();
  c.min_lr_ratio = j.at("min_lr_ratio").get<double>();
  c.warmup_steps = j.at("warmup_steps").get<int>();
  c.beta1 = j.at("beta1").get<double>();
  c.beta2 = j.at("beta2").get<double>();
  c.adam_eps = j.at("adam_eps").get<double>();
  c.weight_decay = j.at("weight_decay").get<double>();
  c.max_grad_norm = j.at("max_grad_norm").get<double>();
  c.init_std = j.at("init_std").get<double>();
  c.layernorm_eps = j.at("layernorm_eps").get<double>();
  c.data_seed = j.at("data_seed").get<std::uint64_t>();
  const ArchitectureSpec& legacy = legacy_identity_architecture();
  c.architecture = j.value("architecture", std::string(legacy.name));
  c.kv_heads = j.value("kv_heads", c.heads);
  c.mlp_hidden = j.value("mlp_hidden", legacy.rules.mlp_ratio * c.channels);
  c.rope_theta = j.value("rope_theta", 10000.0);
  for (const ArchitectureSpec* spec : architectures()) {  // declared keys: absent ones keep their defaults
    for (const ModelKey& key : spec->model_keys) {
      const std::string name(key.name);
      if (key.choice != nullptr) {
        c.*key.choice = j.value(name, std::string(key.choices.front()));
      } else if (key.integer != nullptr) {
        c.*key.integer = j.value(name, c.*key.integer);
      } else {
        c.*key.number = j.value(name, c.*key.number);
      }
    }
  }
  if (j.value("data_source", std::string("builtin")) == "tokens") {
    c.data_source = DataSourceKind::kTokens;
    c.tokens_dtype = j.at("data_tokens_dtype").get<std::string>();
    c.tokens_count = j.at("data_tokens_count").get<std::int64_t>();
    c.tokens_xxh3 = std::stoull(j.at("data_tokens_xxh3").get<std::string>(), nullptr, 16);
  }
  return c;
}

int CanaryConfig::expert_capacity() const {
  if (experts <= 0) return 0;
  const double rows = capacity_factor * static_cast<double>(batch_size) * context_length * experts_per_token / experts;
  const auto whole = static_cast<int>(rows);
  return whole < rows ? whole + 1 : whole;
}

double learning_rate(const CanaryConfig& c, int step) {
  const double peak = c.peak_lr;
  if (step < c.warmup_steps) return peak * (step + 1) / c.warmup_steps;
  const double min_lr = c.min_lr_ratio * peak;
  const int decay_steps = c.steps - c.warmup_steps;
  if (decay_steps <= 0) return min_lr;
  const double progress = static_cast<double>(step - c.warmup_steps) / decay_steps;
  return min_lr + 0.5 * (peak - min_lr) * (1.0 + numerics::det_cos(numerics::kPi * progress));
}

}  // namespace harness::canary
