// Names and version of the HDF5 receipt (docs/receipt-schema.md is the reference).
// A change to what a reader must understand bumps kSchemaVersion.
#pragma once

#include <cstdint>

namespace harness::receipt {

inline constexpr std::int64_t kSchemaVersion = 1;

// Value sketches: per tensor, the L2 norm and a block-structured count sketch of
// kSketchWidth numbers (docs/receipt-schema.md, "Sketches").
inline constexpr int kSketchWidth = 16;
inline constexpr int kSketchBlock = 32;

// The four hashed tensor families, in receipt order.
inline constexpr const char* kHashFamilies[] = {"params", "grads", "adam_m", "adam_v"};
// The two sketched families.
inline constexpr const char* kSketchFamilies[] = {"params", "grads"};

}  // namespace harness::receipt
