// The HDF5 receipt's schema: its version, its constants, and the description of every
// group, dataset and attribute (engines/api/receipt_description.h) that the writer, the
// reader, the validator, `harness schema` (the export Python reads) and
// docs/receipt-schema.md (the reference) share.
// kSchemaVersion is the major version: a change an older reader would misread bumps it.
// kSchemaMinor counts additions an older reader may ignore (a dataset, an attribute, a
// stricter file format); readers accept every minor of their major.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "api/receipt_description.h"

namespace harness::receipt {

inline constexpr std::int64_t kSchemaVersion = 1;
// Minor 1: the checksummed file format (HDF5 1.10, fixed-length strings, Fletcher32) and
// the manifest's schema_minor attribute itself. Receipts without the attribute are minor 0.
// Minor 2: the manifest's budget_features (the features that separate the run from the
// bitwise reference; the verdict composes budgets from them and refuses a receipt without).
// Minor 3: /checkpoints may be held in the receipt itself (attribute storage = "receipt",
// datasets offset, length and state: a Python canary's state, docs/receipt-schema.md).
// Minor 4: /eval, the logits of a held-out batch every few steps (docs/logit-kl.md).
// Minor 5: /aten_trace, a golden's aten traces of every step, made at `golden refresh` of
// a Python canary (docs/bisect.md, "A golden carries its aten traces").
// Minor 6: the manifest's cpu_capability, the CPU kernels' ISA ATen dispatched to in a
// PyTorch run (docs/budgets.md, "Hosts": another host's real stack runs other kernels).
inline constexpr std::int64_t kSchemaMinor = 6;
// /checkpoints' `storage` attribute where the checkpoints are held in the receipt.
inline constexpr const char* kCheckpointsInReceipt = "receipt";

// Value sketches: per tensor, the L2 norm and a block-structured count sketch of
// kSketchWidth numbers (docs/receipt-schema.md, "Sketches").
inline constexpr int kSketchWidth = 16;
inline constexpr int kSketchBlock = 32;
inline constexpr const char* kSketchMethod = "count-sketch over blocks";  // /sketches' `method`

// The four hashed tensor families, in receipt order.
inline constexpr const char* kHashFamilies[] = {"params", "grads", "adam_m", "adam_v"};
// The two sketched families.
inline constexpr const char* kSketchFamilies[] = {"params", "grads"};

// The names the description gives element types and attribute kinds ("float64", "string",
// "integer"): h5::DatasetInfo::dtype's words, and the export's.
std::string_view to_string(ReceiptDtype dtype);
std::string_view to_string(ReceiptValue kind);
std::string_view to_string(ReceiptDim dim);
std::string_view to_string(CounterGate gate);
std::string_view to_string(DecisionRecord decision);
std::string_view to_string(AttributeRole role);

// What every writer's receipt holds: the manifest, steps, hashes, sketches, and the groups
// the run's options add (--trace, --record-batches, --dump-tensors, checkpoints, compile
// counters, canary_harness's own settings). Engines describe the rest (engines/registry.h).
const ReceiptEntries& core_receipt_entries();

// A description made one: entries that describe the same path twice are merged when they
// agree (their writers joined), and refused (std::logic_error) when they do not.
class ReceiptSchema {
 public:
  explicit ReceiptSchema(const ReceiptEntries& entries);
  // The core alone: what a receipt library without the harness's engines knows.
  static const ReceiptSchema& core();

  const ReceiptEntries& entries() const { return entries_; }
  const ReceiptGroup* group(std::string_view path) const;
  // The dataset's entry: an exact path first, else the first pattern that matches.
  const ReceiptDataset* dataset(std::string_view path) const;
  const ReceiptAttribute* attribute(std::string_view group, std::string_view name) const;

  // The export (`harness schema`; python/canary_harness/receipts/receipt_schema.json): version,
  // constants and every entry, in the description's order.
  nlohmann::json to_json() const;
  // The export read back: from_json(s.to_json()) describes what s does. A description of
  // another schema version, or an entry with a field it cannot read, is refused
  // (std::invalid_argument naming the entry and the field).
  static ReceiptSchema from_json(const nlohmann::json& description);

 private:
  ReceiptEntries entries_;
};

// Whether `path` matches `pattern`, segment by segment, '*' matching any one segment.
bool path_matches(std::string_view pattern, std::string_view path);

}  // namespace harness::receipt
