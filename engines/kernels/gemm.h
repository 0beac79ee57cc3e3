// The deterministic GEMM shared by every engine.
//
//   C[m,n] (=|+=) sum_{k=0..K-1} A[m*lda + k] * B[k*ldb + n]   (+ bias[n])
//
// Each output element is accumulated by exactly one task, sequentially over k = 0..K-1,
// with a fused multiply-add per product, starting from 0; the epilogue then adds bias or
// the old value of C. Vectorisation runs across n (output columns), never across k, so
// the bits do not depend on the vector width, the tile shape or the thread count.
//
// Three kernels compute identical bits: AVX-512F (12x32 tiles) and AVX2+FMA (6x16 tiles),
// chosen at run time by what the CPU has, and a portable kernel (std::fma per product,
// exactly rounded by IEEE-754 on any CPU). A -march=x86-64 build and a -march=native
// build therefore agree bit for bit. HARNESS_GEMM_KERNEL=generic|avx2-fma|avx512 forces
// one (when the CPU has it; tests use it).
#pragma once

#include <memory>
#include <string_view>
#include <vector>

namespace harness::kernels {

// The environment variable that forces the GEMM kernel (and, read by
// harness/run/stack_info.cpp, what reruns a lane with another recorded choice).
inline constexpr const char* kGemmKernelVariable = "HARNESS_GEMM_KERNEL";

// What the store does with each finished accumulator: C = acc (Store), C = acc + bias[n]
// (AddBias), C = C + acc (Accumulate), or C = acc * bias[0] (Scale: `bias` points at one
// factor; accel's fp8 GEMMs descale their output this way, the product rounded once, as a
// separate pass over C would).
enum class GemmEpilogue { Store, AddBias, Accumulate, Scale };

void gemm(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
          GemmEpilogue epilogue, const float* bias = nullptr);

// The same computation on the calling thread only: for small products inside a task
// that is already parallel (attention runs one per batch row and head).
void gemm_serial(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                 GemmEpilogue epilogue, const float* bias = nullptr);

// B (K x N, leading dimension ldb) packed once into the panels the kernel in use streams,
// for several gemm_serial_packed calls that share it (accel's split-K computes each K part
// in row tiles: without this every tile would pack the part's B again). B must stay alive
// and unchanged while the packed matrix is used (the columns left after the last whole
// panel are read from it).
class PackedMatrix {
 public:
  PackedMatrix(int K, int N, const float* B, int ldb);

 private:
  friend void gemm_serial_packed(int M, const float* A, int lda, const PackedMatrix& B, float* C, int ldc,
                                 GemmEpilogue epilogue, const float* bias);
  int K_, N_, ldb_;
  const float* B_;
  int panel_width_ = 0, packed_cols_ = 0;  // 0: the portable kernel, which packs nothing
  std::unique_ptr<float[]> panels_;
};

// gemm_serial(M, N, K, A, lda, B, ..., C, ldc, epilogue, bias) with B packed beforehand:
// the same bits (packing moves values only; the kernel chosen when B was packed computes).
void gemm_serial_packed(int M, const float* A, int lda, const PackedMatrix& B, float* C, int ldc,
                        GemmEpilogue epilogue = GemmEpilogue::Store, const float* bias = nullptr);

// Serial out (cols x rows, leading dimension ld_out) = in (rows x cols, leading dimension ld_in)^T.
void transpose_serial(const float* in, int rows, int cols, int ld_in, float* out, int ld_out);

// The kernel in use: "avx512", "avx2-fma" or "generic". Recorded in receipts.
std::string_view gemm_kernel_name();
// The kernels this CPU can run, fastest first.
std::vector<std::string_view> available_gemm_kernels();
// Switches every later GEMM of this process to `name` (tests and benchmarks compare the
// kernels); throws std::invalid_argument when the CPU cannot run it.
void select_gemm_kernel(std::string_view name);

// out (cols x rows) = in (rows x cols)^T, parallel over blocks.
void transpose(const float* in, int rows, int cols, float* out);

}  // namespace harness::kernels
