// The run options' one table (harness/run/run_option_fields.h): every option a run takes
// survives its replay recipe and comes back in the command that reruns it.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string_view>
#include <variant>
#include <string>
#include <vector>

#include "canary_run.h"
#include "run_option_fields.h"

namespace harness::run {
namespace {

RunOptions every_option_set() {
  RunOptions o;
  o.canary = "/canaries/my model.toml";  // a space: a shell word of its own
  o.engine = "accel";
  o.engine_settings = {"bf16", {{"noise", "seeded"}, {"noise-seed", "11"}}};
  o.steps = 7;
  o.threads = 3;
  o.seed = 42;
  o.inject_fault = "step=2,op=blocks.0.ln1,ulps=1";
  o.trace = TraceLevel::kOps;
  o.checkpoint_every = 2;
  o.perturb_init = 5;
  return o;
}

void expect_same_run(const RunOptions& a, const RunOptions& b) {
  EXPECT_EQ(a.canary, b.canary);
  EXPECT_EQ(a.engine, b.engine);
  EXPECT_EQ(a.engine_settings.features, b.engine_settings.features);
  EXPECT_EQ(a.engine_settings.options, b.engine_settings.options);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.threads, b.threads);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.inject_fault, b.inject_fault);
  EXPECT_EQ(a.trace, b.trace);
  EXPECT_EQ(a.checkpoint_every, b.checkpoint_every);
  EXPECT_EQ(a.perturb_init, b.perturb_init);
}

TEST(RunOptions, EveryOptionSurvivesItsRecipe) {
  const RunOptions set = every_option_set();
  expect_same_run(options_from_recipe(replay_recipe(set, std::nullopt)), set);
  RunOptions plain;
  plain.seed = 1;
  expect_same_run(options_from_recipe(replay_recipe(plain, std::nullopt)), plain);
  // Each key the table writes is one it reads: a mistyped one is refused.
  for (const RunOptionField& field : run_option_fields()) {
    if (!field.recorded()) continue;
    nlohmann::json recipe = replay_recipe(set, std::nullopt);
    ASSERT_TRUE(recipe.contains(std::string(field.key))) << field.key;
    recipe[std::string(field.key)] = nlohmann::json::array();
    EXPECT_THROW(options_from_recipe(recipe), UsageError) << field.key;
  }
}

// The table is `harness run`'s command line: every row a flag with its help; a recorded
// row has a recipe key and all three recipe functions, an output setting none of them.
TEST(RunOptions, EveryRowIsAFlagAndARecordedOneHasItsRecipeForms) {
  std::set<std::string_view> flags, keys;
  for (const RunOptionField& field : run_option_fields()) {
    EXPECT_TRUE(field.flag.starts_with("--")) << field.flag;
    EXPECT_FALSE(field.help.empty()) << field.flag;
    EXPECT_TRUE(flags.insert(field.flag).second) << field.flag << " twice";
    const int recipe_forms = (field.write != nullptr) + (field.read != nullptr) + (field.words != nullptr);
    EXPECT_EQ(recipe_forms, field.recorded() ? 3 : 0) << field.flag;
    if (field.recorded()) {
      EXPECT_TRUE(keys.insert(field.key).second) << field.key << " twice";
    }
    if (field.check != FlagCheck::kNone) {  // a checked value is a number the parser converts
      EXPECT_FALSE(std::holds_alternative<TextFlag>(field.target)) << field.flag;
    }
  }
  for (const char* output : {"--out", "--force", "--dump-tensors", "--record-batches"}) {
    EXPECT_TRUE(flags.count(output)) << output;
  }
}

TEST(RunOptions, TheRerunCommandSetsEveryOptionThatIsNotItsDefault) {
  const std::vector<std::string> words = run_command_words(every_option_set());
  const auto has = [&](const std::string& flag, const std::string& value) {
    const auto it = std::find(words.begin(), words.end(), flag);
    return it != words.end() && it + 1 != words.end() && *(it + 1) == value;
  };
  EXPECT_TRUE(has("--canary", "'/canaries/my model.toml'"));
  EXPECT_TRUE(has("--engine", "accel"));
  EXPECT_TRUE(has("--features", "bf16"));
  EXPECT_TRUE(has("--noise", "seeded"));
  EXPECT_TRUE(has("--noise-seed", "11"));
  EXPECT_TRUE(has("--seed", "42"));
  EXPECT_TRUE(has("--steps", "7"));
  EXPECT_TRUE(has("--threads", "3"));
  EXPECT_TRUE(has("--perturb-init", "5"));
  EXPECT_TRUE(has("--inject-fault", "step=2,op=blocks.0.ln1,ulps=1"));
  EXPECT_TRUE(has("--trace", "ops"));
  EXPECT_TRUE(has("--checkpoint-every", "2"));

  RunOptions plain;  // defaults: the canary's steps, every core, no trace, no fault
  const std::vector<std::string> few = run_command_words(plain);
  EXPECT_EQ(few, (std::vector<std::string>{"harness", "run", "--canary", "tiny", "--engine", "cpu-ref"}));
}

TEST(RunOptions, ShellWordsQuoteWhatAShellWouldSplitOrExpand) {
  EXPECT_EQ(shell_word("blocks.0.ln1"), "blocks.0.ln1");
  EXPECT_EQ(shell_word("a b"), "'a b'");
  EXPECT_EQ(shell_word("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_word("$HOME"), "'$HOME'");
  EXPECT_EQ(shell_word(""), "''");
}

}  // namespace
}  // namespace harness::run
