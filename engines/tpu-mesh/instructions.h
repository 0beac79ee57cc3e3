// Each instruction kind described once: the operands a compiled program's instruction of
// that kind must hold (Executable::well_formed checks a loaded program against them) and,
// for a kernel, what every device runs on its own blocks (MeshExecutor dispatches from
// here, no switch). Collectives and Trace combine devices: the executor runs those itself.
// A new kernel is its InstrKind (appended, program.h) and one entry in instructions.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "program.h"

namespace harness::kernels {
struct RopeTables;
}

namespace harness::tpu {

class MeshExecutor;

// One kernel instruction as one device runs it: its operands resolved in that device's
// memory (P: a float buffer, nullptr where the schema lets it be absent; I: an int32 one).
struct KernelCall {
  MeshExecutor& executor;
  const Executable& exe;
  const Instr& in;
  int device;
  std::span<const std::int32_t> buffers;
  std::span<const std::int64_t> n;  // dims
  std::span<const float> attrs;
  float* scratch;                   // the device's GEMM packing space

  float* P(std::size_t i) const;
  const std::int32_t* I(std::size_t i) const;
  int dim(std::size_t i) const { return static_cast<int>(n[i]); }
  const Mesh& mesh() const;
  // RoPE's tables, made by MeshExecutor::run before the devices' kernels look them up.
  const kernels::RopeTables& rope_tables(int T, int head_size, double theta) const;
};

inline constexpr int kPerTensor = -1;  // one per tensor (GlobalNorm, Clip)

// Exact operand counts (or kPerTensor), the one buffer operand that may be absent (-1 for
// none), and whether dims[0] elements of every buffer are touched (elementwise).
struct InstrSchema {
  int buffers, dims, attrs, specs, nullable;
  bool elementwise;
};

struct InstrDescription {
  InstrKind kind;
  InstrSchema schema;
  void (*kernel)(const KernelCall&) = nullptr;  // nullptr: a collective or Trace
};

// The description of `kind`; std::logic_error for a kind past the table.
const InstrDescription& instruction(InstrKind kind);
// Whether `kind` (a loaded program's raw value) is a kind this build describes.
bool known_instruction(std::int32_t kind);

}  // namespace harness::tpu
