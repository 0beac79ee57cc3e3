// `harness schema`: the receipt description this harness writes and validates against (the
// core and every engine's additions), as JSON on stdout. Its export is
// python/canary_harness/receipts/receipt_schema.json, what the Python package reads; a test holds
// the two equal (python/tests/test_receipt_schema.py). `--lane-stacks`: the lane stacks'
// descriptions instead (nightly/lane_stacks.h), exported as
// python/canary_harness/cli/lane_stacks.json (python/tests/test_lane_stacks.py).
#include <memory>

#include <fmt/format.h>

#include "commands.h"
#include "json_text.h"
#include "lane_stacks.h"
#include "run/full_receipt_schema.h"

namespace harness::cli {

void add_schema_command(CLI::App& app, CommandRegistry& commands) {
  CLI::App* schema = app.add_subcommand(
      "schema", "Print the receipt schema as JSON: every group, dataset and attribute, its type, shape and writer");
  auto stacks = std::make_shared<bool>(false);
  schema->add_flag("--lane-stacks", *stacks,
                   "Print the lane stacks' descriptions instead: each stack's lane name and budget features");
  commands.add(schema, [stacks] {
    if (*stacks) {
      fmt::print("{}\n", run::json_text(nightly::lane_stacks_json()));
      return kExitPass;
    }
    fmt::print("{}\n", run::json_text(run::full_receipt_schema().to_json()));
    return kExitPass;
  });
}

}  // namespace harness::cli
