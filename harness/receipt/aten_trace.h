// A golden's aten traces (/aten_trace; docs/receipt-schema.md): every step of a Python
// canary's run replayed at `golden refresh` with every aten op traced, held in the golden,
// so that bisect against it needs no replay of code that may since have changed in place
// (docs/bisect.md). A step's ops change between steps (an optimizer's first step makes its
// state), so each step is a run of rows of flat datasets: step s's rows start at offset[s]
// and are length[s] long.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "receipt/receipt_reader.h"
#include "receipt/receipt_writer.h"

namespace harness::receipt {

// One step's aten trace, as `python3 -m canary_harness replay --trace aten` makes it.
struct AtenTraceStep {
  std::vector<TraceColumn> columns;  // in execution order
  std::vector<std::string> sites;    // per column, the code's file:line ("" where unknown)
  std::vector<std::uint64_t> hashes;
  std::vector<double> l2, projection;  // (columns), (columns, kSketchWidth)
};

// Adds /aten_trace, one entry per recorded step in step order, to the finished receipt at
// `path`: a file nobody else reads yet (a candidate being made), since a failure midway
// leaves it half-written. Throws h5::Hdf5Error, or std::invalid_argument when the steps
// do not match the receipt's or a step's digests do not match its columns.
void write_aten_traces(const std::string& path, const std::vector<AtenTraceStep>& steps);

// Rows [begin, begin + count) of a flat dataset of `width` values per row: one step of a
// trace, stored (/aten_trace) or per step (/trace).
template <typename T>
std::vector<T> rows(const std::vector<T>& all, std::size_t begin, std::size_t count, std::size_t width = 1) {
  return {all.begin() + static_cast<std::ptrdiff_t>(begin * width),
          all.begin() + static_cast<std::ptrdiff_t>((begin + count) * width)};
}

bool has_aten_traces(const ReceiptReader& reader);
// Step `step`'s stored aten trace; throws ReceiptError when the group is damaged.
AtenTraceStep read_aten_trace_step(const ReceiptReader& reader, int step);

}  // namespace harness::receipt
