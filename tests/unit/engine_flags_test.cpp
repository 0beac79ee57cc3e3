// Engine flags are described once (engines/api/engine_settings.h, each engine's config):
// every described flag reaches its engine's parser and changes what the engine reports,
// and every other engine refuses it naming the engine it belongs to.
#include <filesystem>
#include <map>
#include <optional>
#include <variant>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "registry.h"

namespace harness {
namespace {

// A non-default value of every flag, and the features it needs. A flag added to an engine
// without an example here fails EveryFlagHasAnExample.
struct Example {
  std::string value, features;
};
const std::map<std::string, Example>& examples() {
  static const std::map<std::string, Example> e{
      {"noise", {"off", ""}},
      {"noise-seed", {"7", ""}},
      {"split-k", {"rows", ""}},
      {"fp8-recipe", {"current", "bf16,fp8=all"}},
      {"amax-history", {"16", "bf16,fp8=all"}},
      {"amax-algo", {"most_recent", "bf16,fp8=all"}},
      {"margin", {"1", "bf16,fp8=all"}},
      {"fp8-accumulate", {"limited", "bf16,fp8=all"}},
      {"fp8-off", {"mlp_fc@1", "bf16,fp8=all"}},
      {"fp8-e5m2", {"qkv@0", "bf16,fp8=all"}},
      {"fp8-saturate", {"attn_proj@1", "bf16,fp8=all"}},
      {"bf16-off", {"mlp_proj@0", "bf16"}},
      {"mesh", {"2x1", ""}},
      {"shard-plan", {"tp", ""}},
      {"precision", {"bf16", ""}},
      {"compile-cache", {(std::filesystem::temp_directory_path() / "harness-engine-flags-cache").string(), ""}},
      {"compile-mode", {"microstep", ""}},
      {"grad-accum", {"2", ""}},
      {"leak-scalars", {"1", ""}},
      {"fast-exp", {"1", ""}},
  };
  return e;
}

// What an engine tells the receipt about its settings: its features, lane and manifest.
std::string reported(const Engine& engine) {
  std::string text = engine.features() + "|" + engine.lane_engine();
  for (const auto& [key, value] : engine.manifest_attributes()) {
    text += "|" + key + "=" + std::visit([](const auto& v) { return fmt::format("{}", v); }, value);
  }
  return text;
}

TEST(EngineFlags, EveryFlagHasAnExampleAndOneName) {
  std::set<std::string> names;
  for (const DescribedFlag& f : engine_flags()) {
    const std::string name(f.flag.name);
    EXPECT_TRUE(names.insert(name).second) << name << " is described twice";
    EXPECT_TRUE(examples().contains(name)) << name << " has no example in this test";
    EXPECT_FALSE(f.flag.help.empty()) << name;
    ASSERT_NE(find_engine_flag(name), nullptr) << name;
    EXPECT_EQ(find_engine_flag(name)->engine, f.engine) << name;
  }
  EXPECT_EQ(names.size(), examples().size());
  EXPECT_EQ(find_engine_flag("no-such-flag"), nullptr);
}

TEST(EngineFlags, EachFlagChangesWhatItsEngineReports) {
  for (const DescribedFlag& f : engine_flags()) {
    const std::string name(f.flag.name);
    const Example& example = examples().at(name);
    // noise-seed against a fixed other seed: without one a seeded run draws its own.
    EngineSettings base{example.features, {}};
    if (name == "noise-seed") base.options.emplace(name, example.value + "1");
    EngineSettings with = base;
    with.options.insert_or_assign(name, example.value);
    EXPECT_NE(reported(*make_engine(f.engine, base)), reported(*make_engine(f.engine, with))) << f.flag.name;
  }
}

TEST(EngineFlags, OtherEnginesRefuseAFlagNamingItsEngine) {
  for (const DescribedFlag& f : engine_flags()) {
    for (const std::string& engine : engine_names()) {
      if (engine == f.engine) continue;
      const EngineSettings settings{"", {{std::string(f.flag.name), examples().at(std::string(f.flag.name)).value}}};
      try {
        (void)make_engine(engine, settings);
        ADD_FAILURE() << engine << " took --" << f.flag.name;
      } catch (const std::invalid_argument& e) {
        const std::string message = e.what();
        EXPECT_EQ(message.rfind(fmt::format("--{}:", f.flag.name), 0), 0u) << message;
        EXPECT_NE(message.find("it belongs to --engine " + f.engine), std::string::npos) << message;
      }
    }
  }
}

// Each engine declares how it orders its reductions, and a seeded one names the flag and
// seed that replay its order (what replay recipes and calibrate's repeats use, by no name).
TEST(EngineFlags, EnginesDeclareTheirReductionOrderAndItsSeed) {
  using Order = Engine::ReductionOrder;
  const auto order_of = [](const std::string& engine, std::map<std::string, std::string> options) {
    return make_engine(engine, {"", std::move(options)})->reduction_order();
  };
  EXPECT_EQ(order_of("cpu-ref", {}), Order::kFixed);
  EXPECT_EQ(order_of("tpu-mesh", {}), Order::kFixed);
  EXPECT_EQ(order_of("accel", {{"noise", "off"}}), Order::kFixed);
  EXPECT_EQ(order_of("accel", {{"noise", "racy"}}), Order::kRacy);
  EXPECT_EQ(order_of("accel", {}), Order::kSeeded);  // accel's default
  for (const std::int64_t seed : {0LL, 7LL, 9223372036854775807LL}) {
    const auto engine = make_engine("accel", {"", {{"noise-seed", std::to_string(seed)}}});
    ASSERT_EQ(engine->reduction_order(), Order::kSeeded);
    const std::optional<Engine::ReductionSeed> drawn = engine->reduction_seed();
    ASSERT_TRUE(drawn.has_value());
    EXPECT_EQ(drawn->seed, seed);
    const DescribedFlag* flag = find_engine_flag(drawn->flag);
    ASSERT_NE(flag, nullptr) << drawn->flag << " is not a flag";
    EXPECT_TRUE(flag->flag.seeds_reduction_order) << drawn->flag;  // what the report names without the engine
    // the seed's manifest attribute and the flag agree: a recipe replays what the receipt records
    EXPECT_EQ(std::get<std::int64_t>(engine->manifest_attributes().at("noise_seed")), seed);
  }
  for (const std::string engine : {"cpu-ref", "tpu-mesh"}) EXPECT_FALSE(make_engine(engine, {})->reduction_seed()) << engine;
  EXPECT_FALSE(make_engine("accel", {"", {{"noise", "racy"}}})->reduction_seed());
  int seed_flags = 0;  // one flag seeds accel's order, and no other flag claims to
  for (const DescribedFlag& f : engine_flags()) seed_flags += f.flag.seeds_reduction_order ? 1 : 0;
  EXPECT_EQ(seed_flags, 1);
}

}  // namespace
}  // namespace harness
