// Element-wise loops built for the widest vector ISA the CPU has. A loop qualifies only
// when every element gets the same operations at every vector width: integer bit
// formulas, or IEEE operations on that element alone in a fixed order. Never a loop whose
// result depends on how elements are grouped (a sum or a product across elements).
#pragma once

namespace harness::numerics {

enum class VectorIsa { Baseline, Avx2, Avx512 };

// The environment variable that forces the element-wise width (and, read by
// harness/run/stack_info.cpp, what reruns a lane with another recorded choice).
inline constexpr const char* kElementwiseKernelVariable = "HARNESS_ELEMENTWISE_KERNEL";

// The widest this CPU runs, or the one HARNESS_ELEMENTWISE_KERNEL names (sse-4, avx2-8,
// avx512-16: the names of kernels/vector_lanes.h, so one variable forces every
// element-wise width), when the CPU runs it.
VectorIsa widest_vector_isa();

namespace isa_detail {
#if defined(__x86_64__)
template <typename Body>
__attribute__((target("avx512f"))) void run_avx512(const Body& body) { body(); }
template <typename Body>
__attribute__((target("avx2"))) void run_avx2(const Body& body) { body(); }
#endif
template <typename Body>
void run_baseline(const Body& body) { body(); }
}  // namespace isa_detail

// Runs body(), compiled into one function per ISA. The body must be a lambda marked
// __attribute__((always_inline)), so that its loop is compiled (and vectorised) inside
// each variant.
template <typename Body>
void run_widest(const Body& body) {
#if defined(__x86_64__)
  switch (widest_vector_isa()) {
    case VectorIsa::Avx512: isa_detail::run_avx512(body); return;
    case VectorIsa::Avx2: isa_detail::run_avx2(body); return;
    case VectorIsa::Baseline: break;
  }
#endif
  isa_detail::run_baseline(body);
}

}  // namespace harness::numerics
