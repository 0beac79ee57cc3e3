// libFuzzer target: a nightly lane matrix (canaries/nightly.toml's format) through
// nightly::load_matrix, which throws nightly::MatrixError for a file it cannot use.
// Anything else (another exception, a crash, a sanitizer report) is a finding.
// docs/testing.md, "Fuzzing".
#include <cstddef>
#include <cstdint>

#include "fuzz_input_file.h"
#include "matrix.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static harness::fuzz::InputFile file("nightly.toml");
  try {
    (void)harness::nightly::load_matrix(file.write(data, size));
  } catch (const harness::nightly::MatrixError&) {
  }
  return 0;
}
