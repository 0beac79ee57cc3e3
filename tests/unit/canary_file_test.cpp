// Canary files (docs/canary-files.md): the shipped canaries keep the identity their goldens
// were recorded with, every bad key is refused with the file and key named, and a token
// file trains on exactly the windows the contract fixes.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "architecture.h"
#include "canary.h"
#include "canary_file.h"
#include "data_source.h"
#include "receipt/receipt_reader.h"
#include "scratch_dir.h"
#include "token_file.h"

namespace harness::canary {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

void write_tokens(const fs::path& path, const std::vector<std::uint32_t>& ids, int bytes_per_token) {
  std::ofstream out(path, std::ios::binary);
  for (std::uint32_t id : ids) {
    for (int b = 0; b < bytes_per_token; ++b) out.put(static_cast<char>((id >> (8 * b)) & 0xff));
  }
}

// The goldens were recorded before canaries were files: the shipped tiny must still be the
// canary they name, key for key, or every golden would stop comparing.
TEST(CanaryFile, ShippedTinyIsTheCanaryOfItsGoldens) {
  const CanaryConfig tiny = load_canary("tiny");
  for (const auto& entry : fs::directory_iterator(fs::path(HARNESS_SOURCE_DIR) / "goldens" / "tiny")) {
    const receipt::ReceiptReader golden(entry.path().string());
    nlohmann::json recorded = nlohmann::json::parse(golden.manifest_string("canary"));
    nlohmann::json now = tiny.to_json();
    now["steps"] = recorded["steps"];  // --steps of the golden's run
    EXPECT_EQ(now, recorded) << entry.path();
  }
}

TEST(CanaryFile, EveryShippedCanaryLoadsUnderItsOwnName) {
  const std::vector<std::string> names = shipped_canaries();
  ASSERT_GE(names.size(), 2u);
  for (const std::string& name : names) {
    const CanaryConfig c = load_canary(name);
    EXPECT_EQ(c.name, name);
    EXPECT_EQ(c.spec, name);
  }
}

// A copy of a shipped file elsewhere is the same canary: the identity holds content, not paths.
TEST(CanaryFile, ACopyElsewhereHasTheSameIdentity) {
  const testing::ScratchDir dir;
  const fs::path copy = dir.path("copy.toml");
  fs::copy_file(shipped_canary_dir() / "micro.toml", copy);
  const CanaryConfig a = load_canary("micro"), b = load_canary(copy.string());
  EXPECT_EQ(a.to_json(), b.to_json());
  EXPECT_EQ(b.spec, fs::absolute(copy).lexically_normal().string());
  EXPECT_EQ(CanaryConfig::from_json(b.to_json()).to_json(), b.to_json());
}

struct BadCase {
  std::string from, to;  // a text replacement in micro.toml
  std::string key;       // the key the error must name
  std::string detail;    // and a word of the reason
};

// Each case edits one line of a valid file, written to `file`; loading it is refused with
// one line that starts with the file and names the key and the reason.
void expect_each_refused(const std::string& valid, const std::vector<BadCase>& cases, const fs::path& file) {
  for (const BadCase& c : cases) {
    const std::size_t at = valid.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    std::string text = valid;
    text.replace(at, c.from.size(), c.to);
    write_text(file, text);
    try {
      load_canary(file.string());
      ADD_FAILURE() << "accepted: " << c.from << " -> " << c.to;
    } catch (const CanaryFileError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      EXPECT_EQ(what.rfind(file.string(), 0), 0u) << what;
      EXPECT_NE(what.find(c.key), std::string::npos) << "names not " << c.key << ": " << what;
      EXPECT_TRUE(std::regex_search(what, std::regex(c.detail))) << "lacks /" << c.detail << "/: " << what;
    }
  }
}

// Each case edits one line of a valid file; the error is one line naming the file and key.
TEST(CanaryFile, EveryBadKeyIsRefusedWithFileAndKey) {
  const std::string valid = read_text(shipped_canary_dir() / "micro.toml");
  const std::vector<BadCase> cases = {
      {"schema_version = 1", "schema_version = 2", "schema_version", "must be 1"},
      {"schema_version = 1", "schema_version = 1\ncolour = \"red\"", "colour", "unknown key"},
      {"name = \"micro\"", "", "name", "missing"},
      {"name = \"micro\"", "name = \"my canary\"", "name", "letters"},
      {"architecture = \"gpt2\"", "architecture = \"mamba\"", "architecture", "not an architecture"},
      {"architecture = \"gpt2\"", "", "architecture", "missing"},
      {"architecture = \"gpt2\"\n\n[model]\nvocab = 128\ncontext = 16\nchannels = 32\nlayers = 2\nheads = 2",
       "architecture = \"gpt2\"\nmodel = 3", "model", "must be a table"},
      {"vocab = 128", "vocab = 128\nwidth = 3", "model.width", "unknown key"},
      {"vocab = 128", "vocab = \"128\"", "model.vocab", "integer"},
      {"vocab = 128", "vocab = 300", "model.vocab", "8..256"},
      {"vocab = 128", "", "model.vocab", "missing"},
      {"heads = 2", "heads = 3", "model.heads", "does not divide model.channels 32"},
      {"heads = 2", "heads = 0", "model.heads", "outside"},
      {"heads = 2", "heads = 2\nkv_heads = 1", "model.kv_heads", "gpt2"},
      {"heads = 2", "heads = 2\nmlp_hidden = 100", "model.mlp_hidden", "4 \\* model.channels"},
      {"heads = 2", "heads = 2\nrope_theta = 1e4", "model.rope_theta", "gpt2"},
      {"heads = 2", "heads = 2\nnorm_eps = -1.0", "model.norm_eps", "outside"},
      {"steps = 20", "steps = 0", "train.steps", "outside"},
      {"batch = 2", "batch = 2\nseed = -4", "train.seed", "outside"},
      {"warmup_steps = 4", "warmup_steps = 4\nlr = nan", "optimizer.lr", "outside"},
      {"warmup_steps = 4", "warmup_steps = 4\nbeta2 = 1.0", "optimizer.beta2", "outside"},
      {"warmup_steps = 4", "warmup_steps = 4\nclip_norm = \"1\"", "optimizer.clip_norm", "number"},
      {"source = \"builtin\"", "source = \"web\"", "data.source", "builtin or tokens"},
      {"source = \"builtin\"", "source = \"builtin\"\ndtype = \"uint16\"", "data.dtype", "only for source"},
      {"source = \"builtin\"", "source = \"tokens\"\ndtype = \"uint16\"", "data.path", "missing"},
      {"source = \"builtin\"", "source = \"tokens\"\npath = \"t.bin\"\ndtype = \"int8\"", "data.dtype", "uint16 or uint32"},
      {"source = \"builtin\"", "source = \"tokens\"\npath = \"none.bin\"\ndtype = \"uint16\"", "data.path", "cannot read"},
      {"source = \"builtin\"", "source = \"tokens\"\npath = \"t.bin\"\ndtype = \"uint16\"\nseed = 3", "data.seed",
       "only for source"},
      {"[data]", "[data", "bad.toml:", "not TOML"},
      {"[data]", "[eval]\nrows = 1\n\n[data]", "eval.rows", "only with eval.every"},
      {"[data]", "[eval]\nevery = 5\nrows = 3\n\n[data]", "eval.rows", "outside"},
      {"[data]", "[eval]\nevery = -1\n\n[data]", "eval.every", "outside"},
      {"[data]", "[eval]\nevery = 5\nbatch = 1\n\n[data]", "eval.batch", "unknown key"},
  };
  const testing::ScratchDir dir;
  const fs::path file = dir.path("bad.toml");
  write_tokens(dir.path("t.bin"), std::vector<std::uint32_t>(64, 1), 2);
  expect_each_refused(valid, cases, file);
}

// llama's own keys: grouped-query attention must divide, RoPE needs an even head size,
// the SwiGLU hidden size has no default.
TEST(CanaryFile, LlamaKeysAreValidatedToo) {
  const std::string valid = read_text(shipped_canary_dir() / "llama-tiny.toml");
  const std::vector<BadCase> cases = {
      {"kv_heads = 2", "kv_heads = 3", "model.kv_heads", "does not divide model.heads 4"},
      {"mlp_hidden = 352", "", "model.mlp_hidden", "missing"},
      {"heads = 4", "heads = 8\nchannels_note = 1", "model.channels_note", "unknown key"},
      {"channels = 128", "channels = 12", "model.heads", "head size .* = 3 must be even"},
      {"rope_theta = 10000.0", "rope_theta = 0.0", "model.rope_theta", "outside"},
      {"kv_heads = 2", "kv_heads = 2\ngelu = \"erf\"", "model.gelu", "llama has no GELU choice: leave it out"},
  };
  const testing::ScratchDir dir;
  const fs::path file = dir.path("llama.toml");
  expect_each_refused(valid, cases, file);
  const CanaryConfig llama = load_canary("llama-tiny");
  EXPECT_EQ(llama.to_json().at("architecture"), "llama");
  EXPECT_EQ(llama.to_json().at("kv_heads"), 2);
  EXPECT_EQ(CanaryConfig::from_json(llama.to_json()).to_json(), llama.to_json());
}

// moe's keys: required where the MLP is experts, refused by architectures without them,
// each within its range; the capacity is the even share of the step's choices times the
// factor, rounded up.
TEST(CanaryFile, MixtureOfExpertsKeysAreValidated) {
  const std::string valid = read_text(shipped_canary_dir() / "moe-tiny.toml");
  const std::vector<BadCase> cases = {
      {"experts = 4", "", "model.experts", "missing"},
      {"experts = 4", "experts = 1", "model.experts", "outside"},
      {"experts_per_token = 2", "experts_per_token = 5", "model.experts_per_token", "outside"},
      {"capacity_factor = 1.25", "capacity_factor = 0.0", "model.capacity_factor", "outside"},
      {"balance_coef = 0.01", "balance_coef = -1.0", "model.balance_coef", "outside"},
  };
  const testing::ScratchDir dir;
  expect_each_refused(valid, cases, dir.path("moe.toml"));
  const std::string llama = read_text(shipped_canary_dir() / "llama-tiny.toml");
  expect_each_refused(llama, {{"kv_heads = 2", "kv_heads = 2\nexperts = 4", "model.experts", "llama has no experts"}},
                      dir.path("llama.toml"));
  const std::string gpt2 = read_text(shipped_canary_dir() / "tiny.toml");
  expect_each_refused(gpt2,
                      {{"heads = 4", "heads = 4\nbalance_coef = 0.5", "model.balance_coef", "gpt2 has no experts"}},
                      dir.path("gpt2.toml"));
  const CanaryConfig moe = load_canary("moe-tiny");
  EXPECT_EQ(moe.expert_capacity(), 320);  // 1.25 * 8*64 tokens * 2 choices / 4 experts
  CanaryConfig odd = moe;
  odd.capacity_factor = 1.0;
  odd.batch_size = 3;
  EXPECT_EQ(odd.expert_capacity(), 96);  // 3*64*2/4 exactly: no rounding up
  odd.experts = 5;
  EXPECT_EQ(odd.expert_capacity(), 77);  // 76.8 rounds up
  EXPECT_EQ(CanaryConfig::from_json(moe.to_json()).to_json(), moe.to_json());
  EXPECT_EQ(moe.to_json().at("experts"), 4);
}

// The architectures are one table (canary.cpp): every one a canary file may name has a
// model and a shipped canary, and one it may not is refused by the factory too.
TEST(CanaryFile, EveryArchitectureHasAModelAndAShippedCanary) {
  std::set<std::string> shipped;
  for (const std::string& name : shipped_canaries()) shipped.insert(load_canary(name).architecture);
  for (const std::string& architecture : architecture_names()) {
    EXPECT_TRUE(shipped.count(architecture)) << architecture << ": no shipped canary";
  }
  CanaryConfig config = load_canary("micro");
  config.architecture = "mamba";
  try {
    make_canary(config);
    ADD_FAILURE() << "a model of an unknown architecture was made";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "canary architecture 'mamba' has no model in this build (known: " +
                                         fmt::format("{}", fmt::join(architecture_names(), ", ")) + ")");
  }
}

// Each architecture describes itself (architectures/NAME/): found by its name, one of them
// the identity that names no architecture, and every shipped canary's identity read back
// as itself whatever its architecture.
TEST(CanaryFile, ArchitecturesDescribeThemselves) {
  int legacy = 0;
  std::map<std::string, int> declared;
  for (const ArchitectureSpec* spec : architectures()) {
    EXPECT_EQ(find_architecture(spec->name), spec);
    EXPECT_NE(spec->make, nullptr) << spec->name;
    legacy += spec->legacy_identity ? 1 : 0;
    // 0: the file gives model.mlp_hidden; more: the width is that multiple of model.channels.
    EXPECT_GE(spec->rules.mlp_ratio, 0) << spec->name;
    for (const ModelKey& key : spec->model_keys) {  // one field, a range or choices, a word for its absence
      const int fields = (key.integer != nullptr) + (key.number != nullptr) + (key.choice != nullptr);
      EXPECT_EQ(fields, 1) << key.name;
      EXPECT_EQ(key.choice != nullptr, !key.choices.empty()) << key.name << ": a choice lists its choices";
      EXPECT_FALSE(key.feature.empty()) << key.name;
      EXPECT_TRUE(key.high_field != nullptr || key.low <= key.high) << key.name;
      declared[std::string(key.name)] += 1;
    }
  }
  EXPECT_EQ(legacy, 1);
  CanaryConfig probe;
  const nlohmann::json shared = probe.to_json();
  for (const auto& [name, count] : declared) {
    EXPECT_EQ(count, 1) << name << " is declared by two architectures";
    EXPECT_FALSE(shared.contains(name)) << name << " is a shared identity key";
  }
  for (const std::string& name : shipped_canaries()) {
    const CanaryConfig c = load_canary(name);
    EXPECT_EQ(CanaryConfig::from_json(c.to_json()).to_json(), c.to_json()) << name;
    EXPECT_EQ(c.to_json().contains("architecture"), !find_architecture(c.architecture)->legacy_identity) << name;
  }
}

TEST(CanaryFile, AnUnknownNameListsTheShippedCanaries) {
  try {
    load_canary("huge");
    FAIL() << "accepted";
  } catch (const CanaryFileError& e) {
    // every shipped canary, in name order
    EXPECT_NE(std::string(e.what()).find("(shipped: " + fmt::format("{}", fmt::join(shipped_canaries(), ", ")) + ";"),
              std::string::npos)
        << e.what();
  }
}

class TokenCanary : public ::testing::Test {
 protected:
  fs::path write_canary(const std::string& dtype, const std::vector<std::uint32_t>& ids) {
    write_tokens(dir_.path("tokens.bin"), ids, dtype == "uint16" ? 2 : 4);
    std::string text = read_text(shipped_canary_dir() / "micro.toml");
    text.replace(text.find("source = \"builtin\""), 18,
                 "source = \"tokens\"\npath = \"tokens.bin\"\ndtype = \"" + dtype + "\"");
    const fs::path file = dir_.path("mine.toml");
    write_text(file, text);
    return file;
  }
  testing::ScratchDir dir_;
};

// Row b of batch s is the window of T+1 tokens at ((s*B + b) * T) mod (N - T - 1).
TEST_F(TokenCanary, BatchesAreTheContractsWindows) {
  std::mt19937 random(7);
  for (const std::string dtype : {"uint16", "uint32"}) {
    std::vector<std::uint32_t> ids(1001);
    for (auto& id : ids) id = random() % 128;
    const CanaryConfig c = load_canary(write_canary(dtype, ids).string());
    const auto data = make_data_source(c);
    const int B = c.batch_size, T = c.context_length, starts = static_cast<int>(ids.size()) - T - 1;
    for (int step : {0, 1, 7, 63, 999, 123457}) {
      const Batch batch = data->batch(step);
      ASSERT_EQ(batch.tokens.size(), static_cast<std::size_t>(B * (T + 1)));
      for (int b = 0; b < B; ++b) {
        const std::int64_t start = (static_cast<std::int64_t>(step) * B + b) * T % starts;
        for (int t = 0; t <= T; ++t) {
          ASSERT_EQ(batch.tokens[static_cast<std::size_t>(b * (T + 1) + t)], static_cast<std::int32_t>(ids[start + t]))
              << dtype << " step " << step << " row " << b << " t " << t;
        }
        EXPECT_EQ(batch.inputs[static_cast<std::size_t>(b * T)], batch.tokens[static_cast<std::size_t>(b * (T + 1))]);
        EXPECT_EQ(batch.targets[static_cast<std::size_t>(b * T + T - 1)],
                  batch.tokens[static_cast<std::size_t>(b * (T + 1) + T)]);
      }
    }
  }
}

TEST_F(TokenCanary, TheIdentityHoldsTheTokensNotThePath) {
  std::vector<std::uint32_t> ids(200, 5);
  const CanaryConfig a = load_canary(write_canary("uint16", ids).string());
  EXPECT_EQ(a.to_json().at("data_tokens_count"), 200);
  EXPECT_EQ(a.to_json().dump().find("tokens.bin"), std::string::npos);
  ids[150] = 6;
  const CanaryConfig b = load_canary(write_canary("uint16", ids).string());
  EXPECT_NE(a.to_json(), b.to_json());
  // The data source insists on the content the canary was loaded with.
  EXPECT_THROW(make_data_source(a), std::invalid_argument);
  EXPECT_NO_THROW(make_data_source(b));
}

TEST_F(TokenCanary, ABadTokenFileNamesTheProblem) {
  std::vector<std::uint32_t> ids(300, 3);
  ids[217] = 128;  // == vocab
  const auto refused = [&](const std::string& pattern) {
    try {
      load_canary(dir_.path("mine.toml"));
      ADD_FAILURE() << "accepted; wanted /" << pattern << "/";
    } catch (const CanaryFileError& e) {
      EXPECT_NE(std::string(e.what()).find("data.path"), std::string::npos) << e.what();
      EXPECT_TRUE(std::regex_search(std::string(e.what()), std::regex(pattern))) << e.what();
    }
  };
  write_canary("uint32", ids);
  refused("token 128 at byte offset 868 \\(token 217\\) is not below model.vocab 128");
  write_canary("uint16", std::vector<std::uint32_t>(17, 1));  // T = 16 needs 18
  refused("holds 17 tokens, fewer than model.context \\+ 2 = 18");
  write_canary("uint16", std::vector<std::uint32_t>(100, 1));
  std::ofstream(dir_.path("tokens.bin"), std::ios::app).put('\0');
  refused("201 bytes, not a whole number of uint16 tokens");
}

}  // namespace
}  // namespace harness::canary
