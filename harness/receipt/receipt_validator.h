// `harness validate`: every way a receipt departs from the schema, named, whoever wrote it.
// A receipt from a foreign stack (canary_harness in Python, a hand-written h5py script)
// passes the same checks as one of ours, and is then judged exactly like one of ours.
// docs/receipt-schema.md is the schema these checks enforce.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "receipt/receipt_schema.h"

namespace harness::receipt {

struct ValidationReport {
  std::string path;
  std::int64_t schema_major = -1, schema_minor = -1;  // -1: not read
  std::int64_t steps = 0, tensors = 0;
  bool legacy_format = false;          // schema minor 0: no checksums (still readable)
  std::vector<std::string> problems;   // one line each: "WHERE: what is wrong"
  std::vector<std::string> unknown;    // content this harness does not know (ignored by readers)

  bool valid() const { return problems.empty(); }
  nlohmann::json to_json() const;  // keys in docs/cli.md ("validate")
};

// Never throws for a bad file: every problem, corruption included, goes into the report.
// `schema` says what a receipt may hold; the core's alone lists an engine's settings and
// groups as unknown (the harness passes its engines' too: run/full_receipt_schema.h).
ValidationReport validate_receipt(const std::string& path, const ReceiptSchema& schema = ReceiptSchema::core());

// The one gate before a receipt's numbers are used (check, compare, bisect, replay, golden
// approve): throws ReceiptError, one line naming the file and its first problem (and how
// many more, for `harness validate`), unless the receipt validates.
void require_valid_receipt(const std::string& path, const ReceiptSchema& schema = ReceiptSchema::core());

}  // namespace harness::receipt
