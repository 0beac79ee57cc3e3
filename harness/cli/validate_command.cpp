// `harness validate RECEIPT [--json]`: every schema problem of a receipt, whoever wrote
// it, one line each. Exit 0 valid, 2 not (or not readable at all).
#include <memory>

#include <fmt/format.h>

#include "commands.h"
#include "receipt/receipt_validator.h"
#include "run/full_receipt_schema.h"
#include "json_text.h"

namespace harness::cli {
namespace {

struct ValidateFlags {
  std::string path;
  bool json = false;
};

void print_human(const receipt::ValidationReport& report) {
  if (report.valid()) {
    fmt::print("{}: valid receipt, schema {}.{}, {} steps, {} tensors\n", report.path, report.schema_major,
               report.schema_minor, report.steps, report.tensors);
  }
  for (const std::string& problem : report.problems) fmt::print(stderr, "{}: {}\n", report.path, problem);
  if (report.legacy_format) {
    fmt::print("{}: note: schema minor 0, the legacy file format without checksums: corruption may go unnoticed; "
               "re-record it (goldens: harness golden refresh, then approve)\n",
               report.path);
  }
  for (const std::string& item : report.unknown) fmt::print("{}: unknown (ignored): {}\n", report.path, item);
}

int validate_action(const ValidateFlags& flags) {
  const receipt::ValidationReport report = receipt::validate_receipt(flags.path, run::full_receipt_schema());
  if (flags.json) {
    fmt::print("{}\n", run::json_text(report.to_json()));
  } else {
    print_human(report);
  }
  return report.valid() ? kExitPass : kExitBadInput;
}

}  // namespace

void add_validate_command(CLI::App& app, CommandRegistry& commands) {
  auto flags = std::make_shared<ValidateFlags>();
  CLI::App* validate = app.add_subcommand(
      "validate", "Check a receipt from any writer against the schema: every problem named, unknown content listed");
  validate->add_option("receipt", flags->path, "Receipt (.h5)")->required();
  validate->add_flag("--json", flags->json, "Machine-readable output (keys in docs/cli.md)");
  commands.add(validate, [flags] { return validate_action(*flags); });
}

}  // namespace harness::cli
