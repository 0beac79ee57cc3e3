// `harness schema`: the receipt description this harness writes and validates against (the
// core and every engine's additions), as JSON on stdout. Its export is
// python/canary_harness/receipt_schema.json, what the Python package reads; a test holds
// the two equal (python/tests/test_receipt_schema.py).
#include <memory>

#include <fmt/format.h>

#include "commands.h"
#include "json_text.h"
#include "run/full_receipt_schema.h"

namespace harness::cli {

void add_schema_command(CLI::App& app, CommandRegistry& commands) {
  CLI::App* schema = app.add_subcommand(
      "schema", "Print the receipt schema as JSON: every group, dataset and attribute, its type, shape and writer");
  commands.add(schema, [] {
    fmt::print("{}\n", run::json_text(run::full_receipt_schema().to_json()));
    return kExitPass;
  });
}

}  // namespace harness::cli
