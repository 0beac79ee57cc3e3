#include "canary_file.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "architecture.h"
#include "canary.h"
#include "token_file.h"

namespace harness::canary {
namespace {

namespace fs = std::filesystem;

inline constexpr std::int64_t kCanarySchemaVersion = 1;

// The keys of each table (docs/canary-files.md); "" is the top level. [model] holds the
// shared keys and every architecture's own (ArchitectureSpec::model_keys).
const std::map<std::string, std::set<std::string>>& known_keys() {
  static const std::map<std::string, std::set<std::string>> keys = [] {
    std::map<std::string, std::set<std::string>> k{
        {"", {"schema_version", "name", "architecture", "model", "train", "optimizer", "data", "eval"}},
        {"model", {"vocab", "context", "channels", "layers", "heads", "kv_heads", "mlp_hidden", "rope_theta",
                   "norm_eps", "init_std"}},
        {"train", {"batch", "steps", "seed"}},
        {"optimizer", {"lr", "min_lr_ratio", "warmup_steps", "beta1", "beta2", "eps", "weight_decay", "clip_norm"}},
        {"data", {"source", "seed", "path", "dtype"}},
        {"eval", {"every", "rows"}},
    };
    for (const ArchitectureSpec* spec : architectures()) {
      for (const ModelKey& key : spec->model_keys) k["model"].emplace(key.name);
    }
    return k;
  }();
  return keys;
}

// Reads one canary file's keys, each checked for type and range; every error names the
// file and the key.
class Reader {
 public:
  Reader(fs::path path, const toml::table& root) : path_(std::move(path)), root_(root) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw CanaryFileError(fmt::format("{}: {}: {}", path_.string(), key, what));
  }

  void check_known_keys() const {
    for (auto&& [key, node] : root_) check_key("", std::string(key.str()), node);
    for (const auto& [table, keys] : known_keys()) {
      if (table.empty() || !root_.contains(table)) continue;
      const toml::table* t = root_[table].as_table();
      if (!t) fail(table, "must be a table ([" + table + "])");
      for (auto&& [key, node] : *t) check_key(table, std::string(key.str()), node);
    }
  }

  std::optional<std::int64_t> integer(const std::string& key, std::int64_t low, std::int64_t high) const {
    const toml::node* node = find(key);
    if (!node) return std::nullopt;
    const auto value = node->value_exact<std::int64_t>();
    if (!value) fail(key, "must be an integer");
    if (*value < low || *value > high) fail(key, fmt::format("{} is outside {}..{}", *value, low, high));
    return *value;
  }
  int integer(const std::string& key, std::int64_t low, std::int64_t high, std::optional<int> fallback) const {
    const auto value = integer(key, low, high);
    if (!value && !fallback) fail(key, "missing (required)");
    return static_cast<int>(value.value_or(fallback.value_or(0)));
  }

  // A finite number in [low, high] (low excluded when `open_low`); integers are accepted.
  double number(const std::string& key, double low, double high, bool open_low, double fallback) const {
    const toml::node* node = find(key);
    if (!node) return fallback;
    std::optional<double> value = node->value_exact<double>();
    if (!value && node->is_integer()) value = static_cast<double>(*node->value_exact<std::int64_t>());
    if (!value) fail(key, "must be a number");
    if (!std::isfinite(*value) || *value < low || (open_low && *value == low) || *value > high) {
      fail(key, fmt::format("{} is outside {}{}, {}]", *value, open_low ? "(" : "[", low, high));
    }
    return *value;
  }

  std::optional<std::string> text(const std::string& key) const {
    const toml::node* node = find(key);
    if (!node) return std::nullopt;
    const auto value = node->value_exact<std::string>();
    if (!value) fail(key, "must be a string");
    return *value;
  }
  // One of `choices`; the first when the key is absent.
  std::string choice(const std::string& key, std::span<const std::string_view> choices) const {
    const auto value = text(key);
    if (!value) return std::string(choices.front());
    if (std::find(choices.begin(), choices.end(), *value) == choices.end()) {
      fail(key, fmt::format("'{}' is not one of {}", *value, fmt::join(choices, ", ")));
    }
    return *value;
  }
  std::string required_text(const std::string& key) const {
    const auto value = text(key);
    if (!value) fail(key, "missing (required)");
    return *value;
  }

  bool has(const std::string& key) const { return find(key) != nullptr; }
  const fs::path& path() const { return path_; }

 private:
  void check_key(const std::string& table, const std::string& key, const toml::node& node) const {
    const std::set<std::string>& allowed = known_keys().at(table);
    const std::string where = table.empty() ? key : table + "." + key;
    if (!allowed.count(key)) fail(where, fmt::format("unknown key (allowed: {})", fmt::join(allowed, ", ")));
    if (table.empty() && known_keys().count(key) && !node.is_table()) fail(where, "must be a table ([" + key + "])");
  }

  // "model.heads" -> root[model][heads]; "name" -> root[name].
  const toml::node* find(const std::string& key) const {
    const std::size_t dot = key.find('.');
    if (dot == std::string::npos) return root_.get(key);
    const toml::table* table = root_[key.substr(0, dot)].as_table();
    return table ? table->get(key.substr(dot + 1)) : nullptr;
  }

  fs::path path_;
  const toml::table& root_;
};

// Canary names become lane names, golden folders and budget tables ([NAME.bf16]):
// letters, digits, '-' and '_'.
bool valid_canary_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  });
}

void read_identity(const Reader& r, CanaryConfig& c) {
  const auto version = r.integer("schema_version", 1, std::numeric_limits<std::int64_t>::max());
  if (version != kCanarySchemaVersion) {
    r.fail("schema_version", fmt::format("must be {}, the version this harness reads", kCanarySchemaVersion));
  }
  c.name = r.required_text("name");
  if (!valid_canary_name(c.name)) r.fail("name", fmt::format("'{}' must be letters, digits, '-' or '_'", c.name));
  c.architecture = r.required_text("architecture");
  const std::vector<std::string> known = architecture_names();
  if (std::find(known.begin(), known.end(), c.architecture) == known.end()) {
    r.fail("architecture", fmt::format("'{}' is not an architecture (known: {})", c.architecture, fmt::join(known, ", ")));
  }
}

// The keys architectures declare (ArchitectureSpec::model_keys): this one's are read, each
// in its range; another's are refused by what this one lacks.
void read_declared_keys(const Reader& r, const ArchitectureSpec& arch, CanaryConfig& c) {
  const auto declares = [&](std::string_view name) {
    const auto named = [&](const ModelKey& k) { return k.name == name; };
    return std::any_of(arch.model_keys.begin(), arch.model_keys.end(), named);
  };
  for (const ArchitectureSpec* other : architectures()) {
    for (const ModelKey& key : other->model_keys) {
      const std::string where = fmt::format("model.{}", key.name);
      if (!declares(key.name) && r.has(where)) {
        r.fail(where, fmt::format("{} has no {}: leave it out", arch.name, key.feature));
      }
    }
  }
  for (const ModelKey& key : arch.model_keys) {
    const std::string where = fmt::format("model.{}", key.name);
    if (key.choice != nullptr) {
      c.*key.choice = r.choice(where, key.choices);
    } else if (key.integer != nullptr) {
      const auto high = key.high_field != nullptr ? c.*key.high_field : static_cast<std::int64_t>(key.high);
      c.*key.integer = r.integer(where, static_cast<std::int64_t>(key.low), high,
                                 key.required ? std::nullopt : std::optional<int>(c.*key.integer));
    } else {
      if (key.required && !r.has(where)) r.fail(where, "missing (required)");
      c.*key.number = r.number(where, key.low, key.high, key.open_low, c.*key.number);
    }
  }
}

void read_model(const Reader& r, CanaryConfig& c) {
  constexpr int kMaxSize = 1 << 20;
  c.vocab_size = r.integer("model.vocab", 2, kMaxSize, std::nullopt);
  c.context_length = r.integer("model.context", 1, 1 << 16, std::nullopt);
  c.channels = r.integer("model.channels", 1, 1 << 16, std::nullopt);
  c.layers = r.integer("model.layers", 1, 1024, std::nullopt);
  c.heads = r.integer("model.heads", 1, 1 << 16, std::nullopt);
  if (c.channels % c.heads != 0) {
    r.fail("model.heads", fmt::format("{} does not divide model.channels {}", c.heads, c.channels));
  }
  c.kv_heads = r.integer("model.kv_heads", 1, 1 << 16, c.heads);
  if (c.heads % c.kv_heads != 0) {
    r.fail("model.kv_heads", fmt::format("{} does not divide model.heads {}", c.kv_heads, c.heads));
  }
  // The architecture's own rules (architectures/NAME/: ModelKeyRules); read_identity checked it exists.
  const std::string_view arch = c.architecture;
  const ArchitectureSpec& spec = *find_architecture(c.architecture);
  const ModelKeyRules& rules = spec.rules;
  if (!rules.grouped_query_attention && c.kv_heads != c.heads) {
    r.fail("model.kv_heads", fmt::format("{} has no grouped-query attention: leave it out", arch));
  }
  if (!rules.rope && r.has("model.rope_theta")) {
    r.fail("model.rope_theta", fmt::format("{} has learned positions, no RoPE: leave it out", arch));
  }
  const int fixed_mlp = rules.mlp_ratio * c.channels;
  c.mlp_hidden = r.integer("model.mlp_hidden", 1, kMaxSize, fixed_mlp > 0 ? std::optional<int>(fixed_mlp) : std::nullopt);
  if (fixed_mlp > 0 && c.mlp_hidden != fixed_mlp) {
    r.fail("model.mlp_hidden",
           fmt::format("{}: {}'s MLP is {} * model.channels = {}", c.mlp_hidden, arch, rules.mlp_ratio, fixed_mlp));
  }
  c.rope_theta = r.number("model.rope_theta", 0.0, 1e12, true, 10000.0);
  if (rules.rope && c.head_size() % 2 != 0) {
    r.fail("model.heads", fmt::format("{}: {}'s RoPE turns pairs of a head's channels, so the head size "
                                      "model.channels / model.heads = {} must be even",
                                      c.heads, arch, c.head_size()));
  }
  c.layernorm_eps = r.number("model.norm_eps", 0.0, 1.0, true, c.layernorm_eps);
  c.init_std = r.number("model.init_std", 0.0, 10.0, true, c.init_std);
  read_declared_keys(r, spec, c);
}

void read_train(const Reader& r, CanaryConfig& c) {
  c.batch_size = r.integer("train.batch", 1, 1 << 16, std::nullopt);
  c.steps = r.integer("train.steps", 1, kMaxSteps, std::nullopt);
  c.init_seed = r.integer("train.seed", 0, std::numeric_limits<std::int64_t>::max()).value_or(c.init_seed);
  c.peak_lr = r.number("optimizer.lr", 0.0, 1e3, true, c.peak_lr);
  c.min_lr_ratio = r.number("optimizer.min_lr_ratio", 0.0, 1.0, false, c.min_lr_ratio);
  c.warmup_steps = r.integer("optimizer.warmup_steps", 0, kMaxSteps, c.warmup_steps);
  c.beta1 = r.number("optimizer.beta1", 0.0, 0.999999, false, c.beta1);
  c.beta2 = r.number("optimizer.beta2", 0.0, 0.999999, false, c.beta2);
  c.adam_eps = r.number("optimizer.eps", 0.0, 1.0, true, c.adam_eps);
  c.weight_decay = r.number("optimizer.weight_decay", 0.0, 1e3, false, c.weight_decay);
  c.max_grad_norm = r.number("optimizer.clip_norm", 0.0, 1e12, true, c.max_grad_norm);
}

// The held-out evaluation (docs/logit-kl.md): off unless [eval] every is given.
void read_eval(const Reader& r, CanaryConfig& c) {
  c.eval_every = r.integer("eval.every", 0, kMaxSteps, 0);
  if (c.eval_every == 0 && r.has("eval.rows")) r.fail("eval.rows", "only with eval.every > 0");
  c.eval_rows = c.eval_every == 0 ? 0 : r.integer("eval.rows", 1, c.batch_size, std::min(2, c.batch_size));
}

void read_data(const Reader& r, CanaryConfig& c) {
  const std::string source = r.required_text("data.source");
  if (source == "builtin") {
    for (const char* key : {"data.path", "data.dtype"}) {
      if (r.has(key)) r.fail(key, "only for source = \"tokens\"");
    }
    if (c.vocab_size < 8 || c.vocab_size > 256) {
      r.fail("model.vocab", fmt::format("{}: the builtin byte stream needs 8..256 (every byte value below it is a "
                                        "token); use source = \"tokens\" for another vocabulary",
                                        c.vocab_size));
    }
    const auto seed = r.integer("data.seed", 0, std::numeric_limits<std::int64_t>::max());
    if (seed) c.data_seed = static_cast<std::uint64_t>(*seed);
    return;
  }
  if (source != "tokens") r.fail("data.source", fmt::format("'{}' is not a data source; use builtin or tokens", source));
  if (r.has("data.seed")) r.fail("data.seed", "only for source = \"builtin\" (a token file has no seed)");
  const std::string file = r.required_text("data.path");
  c.tokens_dtype = r.required_text("data.dtype");
  if (c.tokens_dtype != "uint16" && c.tokens_dtype != "uint32") {
    r.fail("data.dtype", fmt::format("'{}' is not a token type; use uint16 or uint32", c.tokens_dtype));
  }
  const fs::path path = fs::absolute(r.path().parent_path() / file).lexically_normal();
  TokenFileContent content;
  try {
    content = read_token_file(path, c.tokens_dtype, c.vocab_size, c.context_length);
  } catch (const std::invalid_argument& e) {
    r.fail("data.path", e.what());
  }
  c.data_source = DataSourceKind::kTokens;
  c.tokens_path = path.string();
  c.tokens_count = static_cast<std::int64_t>(content.tokens.size());
  c.tokens_xxh3 = content.xxh3;
}

}  // namespace

bool is_canary_path(std::string_view spec) {
  return spec.find('/') != std::string_view::npos || spec.ends_with(".toml");
}

fs::path shipped_canary_dir() { return fs::path(HARNESS_CANARY_DIR); }

CanaryConfig load_canary_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    throw CanaryFileError(fmt::format("{}: no such canary file (a canary is a TOML file: docs/canary-files.md)",
                                      path.string()));
  }
  toml::table root;
  try {
    root = toml::parse_file(path.string());
  } catch (const toml::parse_error& e) {
    throw CanaryFileError(fmt::format("{}:{}:{}: not TOML: {}", path.string(), e.source().begin.line,
                                      e.source().begin.column, e.description()));
  }
  const Reader r(path, root);
  r.check_known_keys();
  CanaryConfig c;
  read_identity(r, c);
  read_model(r, c);
  read_train(r, c);
  read_data(r, c);
  read_eval(r, c);
  return c;
}

std::vector<std::string> shipped_canaries() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(shipped_canary_dir(), ec)) {
    if (e.path().extension() != ".toml") continue;
    // The folder also holds the budgets and the nightly matrix: a canary file says its
    // architecture.
    try {
      if (toml::parse_file(e.path().string()).contains("architecture")) names.push_back(e.path().stem().string());
    } catch (const toml::parse_error&) {
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

CanaryConfig load_canary(std::string_view spec) {
  if (is_canary_path(spec)) {
    CanaryConfig c = load_canary_file(fs::path(spec));
    c.spec = fs::absolute(fs::path(spec)).lexically_normal().string();
    return c;
  }
  const std::vector<std::string> names = shipped_canaries();
  if (std::find(names.begin(), names.end(), spec) == names.end()) {
    throw CanaryFileError(fmt::format("unknown canary '{}' (shipped: {}; or give a canary file's path, NAME.toml)", spec,
                                      fmt::join(names, ", ")));
  }
  CanaryConfig c = load_canary_file(shipped_canary_dir() / (std::string(spec) + ".toml"));
  if (c.name != spec) {
    throw CanaryFileError(fmt::format("{}: name: '{}' must be the file's name, '{}'",
                                      (shipped_canary_dir() / (std::string(spec) + ".toml")).string(), c.name, spec));
  }
  c.spec = std::string(spec);
  return c;
}

}  // namespace harness::canary
