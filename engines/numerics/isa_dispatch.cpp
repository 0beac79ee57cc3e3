#include "numerics/isa_dispatch.h"

#include <cstdlib>
#include <string_view>

namespace harness::numerics {
namespace {

bool runs(VectorIsa isa) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (isa == VectorIsa::Avx512) return __builtin_cpu_supports("avx512f") != 0;
  if (isa == VectorIsa::Avx2) return __builtin_cpu_supports("avx2") != 0;
#endif
  return isa == VectorIsa::Baseline;
}

VectorIsa choose() {
  if (const char* forced = std::getenv(kElementwiseKernelVariable); forced != nullptr) {
    const std::string_view name(forced);
    if (name == "sse-4") return VectorIsa::Baseline;
    if (name == "avx2-8" && runs(VectorIsa::Avx2)) return VectorIsa::Avx2;
    if (name == "avx512-16" && runs(VectorIsa::Avx512)) return VectorIsa::Avx512;
  }
  for (VectorIsa isa : {VectorIsa::Avx512, VectorIsa::Avx2}) {
    if (runs(isa)) return isa;
  }
  return VectorIsa::Baseline;
}

}  // namespace

VectorIsa widest_vector_isa() {
  static const VectorIsa chosen = choose();
  return chosen;
}

}  // namespace harness::numerics
