// libFuzzer target: a receipt file through the validator and the reader every judging
// command uses. validate_receipt never throws for a bad file (every problem goes into its
// report); load_receipt throws receipt::ReceiptError. Anything else (another exception, a
// crash, a sanitizer report, an HDF5 object left open) is a finding. docs/testing.md,
// "Fuzzing".
#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "check/verdict.h"
#include "fuzz_input_file.h"
#include "receipt/hdf5_file.h"
#include "receipt/receipt_reader.h"
#include "receipt/receipt_validator.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  harness::h5::silence_library_errors();  // as the CLI does: errors come back as exceptions
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static harness::fuzz::InputFile file("receipt.h5");
  const std::string& path = file.write(data, size);
  const harness::receipt::ValidationReport report = harness::receipt::validate_receipt(path);
  (void)report.to_json();
  try {
    (void)harness::check::load_receipt(path);
  } catch (const harness::receipt::ReceiptError&) {
  }
  // Every file, group, dataset and attribute the reader opened is closed again, on every
  // error path (an open id would also keep the file open for the next input).
  if (const ssize_t open = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL); open != 0) {
    std::fprintf(stderr, "fuzz_receipt: %zd HDF5 objects left open after reading the input\n", open);
    std::abort();
  }
  return 0;
}
