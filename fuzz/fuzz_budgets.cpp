// libFuzzer target: a budgets file (canaries/budgets.toml's format) through
// check::load_budgets, which throws check::BudgetError for a file it cannot use. Anything
// else (another exception, a crash, a sanitizer report) is a finding. docs/testing.md.
#include <cstddef>
#include <cstdint>

#include "check/budgets.h"
#include "fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static harness::fuzz::InputFile file("budgets.toml");
  try {
    (void)harness::check::load_budgets(file.write(data, size));
  } catch (const harness::check::BudgetError&) {
  }
  return 0;
}
