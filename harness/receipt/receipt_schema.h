// Names and version of the HDF5 receipt (docs/receipt-schema.md is the reference).
// kSchemaVersion is the major version: a change an older reader would misread bumps it.
// kSchemaMinor counts additions an older reader may ignore (a dataset, an attribute, a
// stricter file format); readers accept every minor of their major.
#pragma once

#include <cstdint>

namespace harness::receipt {

inline constexpr std::int64_t kSchemaVersion = 1;
// Minor 1: the checksummed file format (HDF5 1.10, fixed-length strings, Fletcher32) and
// the manifest's schema_minor attribute itself. Receipts without the attribute are minor 0.
// Minor 2: the manifest's budget_features (the features that separate the run from the
// bitwise reference; the verdict composes budgets from them and refuses a receipt without).
// Minor 3: /checkpoints may be held in the receipt itself (attribute storage = "receipt",
// datasets offset, length and state: a Python canary's state, docs/receipt-schema.md).
inline constexpr std::int64_t kSchemaMinor = 3;
// /checkpoints' `storage` attribute where the checkpoints are held in the receipt.
inline constexpr const char* kCheckpointsInReceipt = "receipt";

// Value sketches: per tensor, the L2 norm and a block-structured count sketch of
// kSketchWidth numbers (docs/receipt-schema.md, "Sketches").
inline constexpr int kSketchWidth = 16;
inline constexpr int kSketchBlock = 32;

// The four hashed tensor families, in receipt order.
inline constexpr const char* kHashFamilies[] = {"params", "grads", "adam_m", "adam_v"};
// The two sketched families.
inline constexpr const char* kSketchFamilies[] = {"params", "grads"};

}  // namespace harness::receipt
