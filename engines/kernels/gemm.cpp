#include "kernels/gemm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <immintrin.h>
#include <tbb/blocked_range.h>
#include <tbb/blocked_range2d.h>
#include <tbb/parallel_for.h>

namespace harness::kernels {
namespace {

constexpr int kTileRows = 6;   // micro-tile: 6 rows x 16 columns = 12 ymm accumulators
constexpr int kTileCols = 16;

inline float epilogue_value(float acc, float old_c, GemmEpilogue epilogue, const float* bias, int n) {
  switch (epilogue) {
    case GemmEpilogue::Store: return acc;
    case GemmEpilogue::AddBias: return acc + bias[n];
    case GemmEpilogue::Accumulate: return old_c + acc;
    case GemmEpilogue::Scale: return acc * bias[0];
  }
  return acc;
}

// One output element, the portable way; also the edge path of the vector kernel. Being
// the same sequence of fmas, it gives the same bits as a vector lane.
inline float dot_column(int K, const float* a_row, const float* B, int ldb, int n) {
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc = std::fma(a_row[k], B[static_cast<long>(k) * ldb + n], acc);
  return acc;
}

void gemm_block_generic(int m0, int m1, int n0, int n1, int K, const float* A, int lda, const float* B, int ldb,
                        float* C, int ldc, GemmEpilogue epilogue, const float* bias) {
  for (int m = m0; m < m1; ++m) {
    const float* a_row = A + static_cast<long>(m) * lda;
    float* c_row = C + static_cast<long>(m) * ldc;
    for (int n = n0; n < n1; ++n) {
      c_row[n] = epilogue_value(dot_column(K, a_row, B, ldb, n), c_row[n], epilogue, bias, n);
    }
  }
}

__attribute__((target("avx2,fma"))) void store_tile_row(float* c_row, __m256 acc0, __m256 acc1,
                                                        GemmEpilogue epilogue, const float* bias, int n) {
  if (epilogue == GemmEpilogue::AddBias) {
    acc0 = _mm256_add_ps(acc0, _mm256_loadu_ps(bias + n));
    acc1 = _mm256_add_ps(acc1, _mm256_loadu_ps(bias + n + 8));
  } else if (epilogue == GemmEpilogue::Accumulate) {
    acc0 = _mm256_add_ps(_mm256_loadu_ps(c_row + n), acc0);
    acc1 = _mm256_add_ps(_mm256_loadu_ps(c_row + n + 8), acc1);
  } else if (epilogue == GemmEpilogue::Scale) {
    const __m256 scale = _mm256_set1_ps(bias[0]);
    acc0 = _mm256_mul_ps(acc0, scale);
    acc1 = _mm256_mul_ps(acc1, scale);
  }
  _mm256_storeu_ps(c_row + n, acc0);
  _mm256_storeu_ps(c_row + n + 8, acc1);
}

// Full 6x16 tile: acc[r][j] = fma(A[m+r][k], B[k][n+j], acc[r][j]) for k = 0..K-1.
// Twelve named accumulators: GCC keeps an array of __m256 in memory, these stay in registers.
__attribute__((target("avx2,fma"))) void tile_6x16(int K, const float* A, int lda, const float* B, int ldb,
                                                   float* C, int ldc, GemmEpilogue epilogue, const float* bias,
                                                   int n) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  const float* a0 = A;
  const float* a1 = A + lda;
  const float* a2 = A + 2L * lda;
  const float* a3 = A + 3L * lda;
  const float* a4 = A + 4L * lda;
  const float* a5 = A + 5L * lda;
  const float* b_row = B + n;
  for (int k = 0; k < K; ++k, b_row += ldb) {
    const __m256 b0 = _mm256_loadu_ps(b_row);
    const __m256 b1 = _mm256_loadu_ps(b_row + 8);
    __m256 av = _mm256_broadcast_ss(a0 + k);
    c00 = _mm256_fmadd_ps(av, b0, c00);
    c01 = _mm256_fmadd_ps(av, b1, c01);
    av = _mm256_broadcast_ss(a1 + k);
    c10 = _mm256_fmadd_ps(av, b0, c10);
    c11 = _mm256_fmadd_ps(av, b1, c11);
    av = _mm256_broadcast_ss(a2 + k);
    c20 = _mm256_fmadd_ps(av, b0, c20);
    c21 = _mm256_fmadd_ps(av, b1, c21);
    av = _mm256_broadcast_ss(a3 + k);
    c30 = _mm256_fmadd_ps(av, b0, c30);
    c31 = _mm256_fmadd_ps(av, b1, c31);
    av = _mm256_broadcast_ss(a4 + k);
    c40 = _mm256_fmadd_ps(av, b0, c40);
    c41 = _mm256_fmadd_ps(av, b1, c41);
    av = _mm256_broadcast_ss(a5 + k);
    c50 = _mm256_fmadd_ps(av, b0, c50);
    c51 = _mm256_fmadd_ps(av, b1, c51);
  }
  store_tile_row(C, c00, c01, epilogue, bias, n);
  store_tile_row(C + ldc, c10, c11, epilogue, bias, n);
  store_tile_row(C + 2L * ldc, c20, c21, epilogue, bias, n);
  store_tile_row(C + 3L * ldc, c30, c31, epilogue, bias, n);
  store_tile_row(C + 4L * ldc, c40, c41, epilogue, bias, n);
  store_tile_row(C + 5L * ldc, c50, c51, epilogue, bias, n);
}

// Partial tile (fewer than 6 rows) with full 16 columns.
__attribute__((target("avx2,fma"))) void tile_rx16(int rows, int K, const float* A, int lda, const float* B,
                                                   int ldb, float* C, int ldc, GemmEpilogue epilogue,
                                                   const float* bias, int n) {
  for (int r = 0; r < rows; ++r) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const float* a_row = A + static_cast<long>(r) * lda;
    for (int k = 0; k < K; ++k) {
      const float* b_row = B + static_cast<long>(k) * ldb + n;
      const __m256 av = _mm256_broadcast_ss(a_row + k);
      acc0 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b_row), acc0);
      acc1 = _mm256_fmadd_ps(av, _mm256_loadu_ps(b_row + 8), acc1);
    }
    store_tile_row(C + static_cast<long>(r) * ldc, acc0, acc1, epilogue, bias, n);
  }
}

// Copies the `width` columns of B[0:K] starting at `src` into one contiguous K x width
// panel, so a tile streams through memory (a row stride of 512 floats otherwise maps every
// k to the same cache sets). Copying changes no value, so it cannot change a bit.
void pack_panel(int width, int K, const float* src, int ldb, float* dst) {
  for (int k = 0; k < K; ++k) {
    std::memcpy(dst + static_cast<long>(k) * width, src + static_cast<long>(k) * ldb, sizeof(float) * width);
  }
}

// How many floats pack_panels writes for B[0:K][n0:n1): whole panels only.
std::size_t packed_size(int width, int K, int n0, int n1) {
  return static_cast<std::size_t>((n1 - n0) / width) * static_cast<std::size_t>(K) * static_cast<std::size_t>(width);
}

// B[0:K][n0:n1) as contiguous K x width panels (the last n1-n0 mod width columns are left
// out), written over every one of packed_size(width, K, n0, n1) floats at `panels`.
void pack_panels(int width, int K, const float* B, int ldb, int n0, int n1, float* panels) {
  const int panel_count = (n1 - n0) / width;
  for (int p = 0; p < panel_count; ++p) {
    pack_panel(width, K, B + n0 + p * width, ldb, panels + static_cast<long>(p) * K * width);
  }
}

void pack_panels(int width, int K, const float* B, int ldb, int n0, int n1, std::vector<float>& panels) {
  panels.resize(packed_size(width, K, n0, n1));
  pack_panels(width, K, B, ldb, n0, n1, panels.data());
}

// Columns n0..n_vec_end of C (whole 16-column panels of B, packed from column n0 by
// pack_panels) with the 6x16 tiles.
__attribute__((target("avx2,fma"))) void avx2_from_panels(int m0, int m1, int n0, int n_vec_end, int K,
                                                          const float* A, int lda, const float* panels, float* C,
                                                          int ldc, GemmEpilogue epilogue, const float* bias) {
  for (int n = n0; n < n_vec_end; n += kTileCols) {
    // The panel holds columns n..n+15 at offset 0; C, bias keep absolute column n.
    const float* panel = panels + static_cast<long>((n - n0) / kTileCols) * K * kTileCols - n;
    int m = m0;
    for (; m + kTileRows <= m1; m += kTileRows) {
      tile_6x16(K, A + static_cast<long>(m) * lda, lda, panel, kTileCols, C + static_cast<long>(m) * ldc, ldc,
                epilogue, bias, n);
    }
    if (m < m1) {
      tile_rx16(m1 - m, K, A + static_cast<long>(m) * lda, lda, panel, kTileCols, C + static_cast<long>(m) * ldc, ldc,
                epilogue, bias, n);
    }
  }
}

__attribute__((target("avx2,fma"))) void gemm_block_avx2(int m0, int m1, int n0, int n1, int K, const float* A,
                                                         int lda, const float* B, int ldb, float* C, int ldc,
                                                         GemmEpilogue epilogue, const float* bias) {
  const int n_vec_end = n0 + (n1 - n0) / kTileCols * kTileCols;
  thread_local std::vector<float> panels;
  pack_panels(kTileCols, K, B, ldb, n0, n_vec_end, panels);
  avx2_from_panels(m0, m1, n0, n_vec_end, K, A, lda, panels.data(), C, ldc, epilogue, bias);
  if (n_vec_end < n1) gemm_block_generic(m0, m1, n_vec_end, n1, K, A, lda, B, ldb, C, ldc, epilogue, bias);
}

// ---- AVX-512F: 12 x 32 tiles ---------------------------------------------------------
// The same fma chain per element as the kernels above, in 512-bit lanes: 24 zmm
// accumulators (12 rows x 2 vectors of 16 columns), two B loads and twelve broadcasts
// per k. Columns left over (fewer than 32) go to the AVX2 path, which gives the same bits.
constexpr int kWideTileRows = 12;
constexpr int kWideTileCols = 32;

__attribute__((target("avx512f"))) void store_wide_row(float* c_row, __m512 acc0, __m512 acc1, GemmEpilogue epilogue,
                                                       const float* bias, int n) {
  if (epilogue == GemmEpilogue::AddBias) {
    acc0 = _mm512_add_ps(acc0, _mm512_loadu_ps(bias + n));
    acc1 = _mm512_add_ps(acc1, _mm512_loadu_ps(bias + n + 16));
  } else if (epilogue == GemmEpilogue::Accumulate) {
    acc0 = _mm512_add_ps(_mm512_loadu_ps(c_row + n), acc0);
    acc1 = _mm512_add_ps(_mm512_loadu_ps(c_row + n + 16), acc1);
  } else if (epilogue == GemmEpilogue::Scale) {
    const __m512 scale = _mm512_set1_ps(bias[0]);
    acc0 = _mm512_mul_ps(acc0, scale);
    acc1 = _mm512_mul_ps(acc1, scale);
  }
  _mm512_storeu_ps(c_row + n, acc0);
  _mm512_storeu_ps(c_row + n + 16, acc1);
}

// ROWS x 32 tile, ROWS <= 12, acc[r][j] = fma(A[m+r][k], B[k][n+j], acc[r][j]) for k = 0..K-1.
// A fixed ROWS lets the compiler unroll the row loop and keep the accumulators in registers.
template <int ROWS>
__attribute__((target("avx512f"))) void wide_tile(int K, const float* A, int lda, const float* panel, float* C, int ldc,
                                                  GemmEpilogue epilogue, const float* bias, int n) {
  __m512 acc0[ROWS], acc1[ROWS];
  for (int r = 0; r < ROWS; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  const float* b_row = panel;
  for (int k = 0; k < K; ++k, b_row += kWideTileCols) {
    const __m512 b0 = _mm512_loadu_ps(b_row);
    const __m512 b1 = _mm512_loadu_ps(b_row + 16);
    for (int r = 0; r < ROWS; ++r) {
      const __m512 av = _mm512_set1_ps(A[static_cast<long>(r) * lda + k]);
      acc0[r] = _mm512_fmadd_ps(av, b0, acc0[r]);
      acc1[r] = _mm512_fmadd_ps(av, b1, acc1[r]);
    }
  }
  for (int r = 0; r < ROWS; ++r) store_wide_row(C + static_cast<long>(r) * ldc, acc0[r], acc1[r], epilogue, bias, n);
}

using WideTile = void (*)(int, const float*, int, const float*, float*, int, GemmEpilogue, const float*, int);
constexpr WideTile kWideTiles[kWideTileRows + 1] = {nullptr,        wide_tile<1>,  wide_tile<2>, wide_tile<3>, wide_tile<4>,
                                                    wide_tile<5>,   wide_tile<6>,  wide_tile<7>, wide_tile<8>, wide_tile<9>,
                                                    wide_tile<10>, wide_tile<11>, wide_tile<12>};

// Columns n0..n_wide_end of C (whole 32-column panels of B, packed from column n0 by
// pack_panels) with the 12x32 tiles.
__attribute__((target("avx512f"))) void avx512_from_panels(int m0, int m1, int n0, int n_wide_end, int K,
                                                           const float* A, int lda, const float* panels, float* C,
                                                           int ldc, GemmEpilogue epilogue, const float* bias) {
  for (int n = n0; n < n_wide_end; n += kWideTileCols) {
    const float* panel = panels + static_cast<long>((n - n0) / kWideTileCols) * K * kWideTileCols;
    for (int m = m0; m < m1; m += kWideTileRows) {
      const int rows = std::min(kWideTileRows, m1 - m);
      kWideTiles[rows](K, A + static_cast<long>(m) * lda, lda, panel, C + static_cast<long>(m) * ldc, ldc, epilogue,
                       bias, n);
    }
  }
}

__attribute__((target("avx512f"))) void gemm_block_avx512(int m0, int m1, int n0, int n1, int K, const float* A,
                                                          int lda, const float* B, int ldb, float* C, int ldc,
                                                          GemmEpilogue epilogue, const float* bias) {
  const int n_wide_end = n0 + (n1 - n0) / kWideTileCols * kWideTileCols;
  thread_local std::vector<float> panels;
  pack_panels(kWideTileCols, K, B, ldb, n0, n_wide_end, panels);
  avx512_from_panels(m0, m1, n0, n_wide_end, K, A, lda, panels.data(), C, ldc, epilogue, bias);
  if (n_wide_end < n1) gemm_block_avx2(m0, m1, n_wide_end, n1, K, A, lda, B, ldb, C, ldc, epilogue, bias);
}

// The parallel AVX-512 GEMM packs B into its 32-column panels once per call, not once per
// block (a block of 48 rows would otherwise copy K x 128 floats for 48 x 128 x K fmas:
// about a fifth of its time at K = 128). Blocks then cover whole panels.
constexpr int kWideBlockRows = 4 * kWideTileRows;
constexpr int kWideBlockPanels = 4;

// A reusable buffer per thread for the packed panels; a call nested inside another's wait
// (TBB may run another task on a waiting thread) gets a buffer of its own.
class PanelBuffer {
 public:
  explicit PanelBuffer(std::size_t size) : owned_(cache_in_use_ ? size : 0) {
    if (!cache_in_use_) {
      cache_in_use_ = borrowed_ = true;
      cache_.resize(size);
    }
  }
  ~PanelBuffer() {
    if (borrowed_) cache_in_use_ = false;
  }
  PanelBuffer(const PanelBuffer&) = delete;
  PanelBuffer& operator=(const PanelBuffer&) = delete;
  float* data() { return borrowed_ ? cache_.data() : owned_.data(); }

 private:
  static thread_local std::vector<float> cache_;
  static thread_local bool cache_in_use_;
  std::vector<float> owned_;
  bool borrowed_ = false;
};
thread_local std::vector<float> PanelBuffer::cache_;
thread_local bool PanelBuffer::cache_in_use_ = false;

void gemm_parallel_avx512(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                          GemmEpilogue epilogue, const float* bias) {
  const int panel_count = N / kWideTileCols;
  const long panel_size = static_cast<long>(K) * kWideTileCols;
  PanelBuffer panels(static_cast<std::size_t>(panel_count * panel_size));
  float* packed = panels.data();
  tbb::parallel_for(0, panel_count,
                    [&](int p) { pack_panel(kWideTileCols, K, B + p * kWideTileCols, ldb, packed + p * panel_size); });
  tbb::parallel_for(tbb::blocked_range2d<int>(0, M, kWideBlockRows, 0, panel_count, kWideBlockPanels),
                    [&](const tbb::blocked_range2d<int>& r) {
                      for (int p = r.cols().begin(); p < r.cols().end(); ++p) {
                        const int n = p * kWideTileCols;
                        for (int m = r.rows().begin(); m < r.rows().end(); m += kWideTileRows) {
                          const int rows = std::min(kWideTileRows, r.rows().end() - m);
                          kWideTiles[rows](K, A + static_cast<long>(m) * lda, lda, packed + p * panel_size,
                                           C + static_cast<long>(m) * ldc, ldc, epilogue, bias, n);
                        }
                      }
                    });
  const int n_wide_end = panel_count * kWideTileCols;
  if (n_wide_end < N) {  // fewer than 32 columns left: the AVX2 tiles, then the portable edge
    tbb::parallel_for(tbb::blocked_range<int>(0, M, kWideBlockRows), [&](const tbb::blocked_range<int>& r) {
      gemm_block_avx2(r.begin(), r.end(), n_wide_end, N, K, A, lda, B, ldb, C, ldc, epilogue, bias);
    });
  }
}

using BlockKernel = void (*)(int, int, int, int, int, const float*, int, const float*, int, float*, int, GemmEpilogue,
                             const float*);

struct KernelChoice {
  BlockKernel block;
  std::string_view name;
};

// Every kernel, fastest first, with whether this CPU can run it.
struct KernelEntry {
  KernelChoice choice;
  bool (*supported)();
};

const std::vector<KernelEntry>& kernel_entries() {
  static const std::vector<KernelEntry> entries = {
      {{gemm_block_avx512, "avx512"}, [] { return __builtin_cpu_supports("avx512f") != 0; }},
      {{gemm_block_avx2, "avx2-fma"}, [] { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }},
      {{gemm_block_generic, "generic"}, [] { return true; }},
  };
  return entries;
}

const KernelChoice* find_kernel(std::string_view name) {
  __builtin_cpu_init();
  for (const KernelEntry& e : kernel_entries()) {
    if (e.choice.name == name) return e.supported() ? &e.choice : nullptr;
  }
  return nullptr;
}

// HARNESS_GEMM_KERNEL=NAME forces a kernel (generic, avx2-fma, avx512; tests and the
// kernel-choice CLI test use it); otherwise the fastest this CPU supports.
const KernelChoice* choose_kernel() {
  if (const char* forced = std::getenv(kGemmKernelVariable); forced != nullptr && *forced != '\0') {
    if (const KernelChoice* k = find_kernel(forced)) return k;
  }
  __builtin_cpu_init();
  for (const KernelEntry& e : kernel_entries()) {
    if (e.supported()) return &e.choice;
  }
  return &kernel_entries().back().choice;
}

std::atomic<const KernelChoice*>& kernel_slot() {
  static std::atomic<const KernelChoice*> slot{choose_kernel()};
  return slot;
}

const KernelChoice& kernel() { return *kernel_slot().load(std::memory_order_acquire); }

}  // namespace

std::string_view gemm_kernel_name() { return kernel().name; }

std::vector<std::string_view> available_gemm_kernels() {
  std::vector<std::string_view> names;
  __builtin_cpu_init();
  for (const KernelEntry& e : kernel_entries()) {
    if (e.supported()) names.push_back(e.choice.name);
  }
  return names;
}

void select_gemm_kernel(std::string_view name) {
  const KernelChoice* k = find_kernel(name);
  if (!k) throw std::invalid_argument("GEMM kernel '" + std::string(name) + "' is not available on this CPU");
  kernel_slot().store(k, std::memory_order_release);
}

void gemm(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
          GemmEpilogue epilogue, const float* bias) {
  const BlockKernel block = kernel().block;
  if (block == gemm_block_avx512) {
    gemm_parallel_avx512(M, N, K, A, lda, B, ldb, C, ldc, epilogue, bias);
    return;
  }
  // Blocks of 48 rows x 128 columns; which thread runs a block never changes its bits.
  constexpr int kBlockRows = 8 * kTileRows, kBlockCols = 8 * kTileCols;
  tbb::parallel_for(tbb::blocked_range2d<int>(0, M, kBlockRows, 0, N, kBlockCols),
                    [&](const tbb::blocked_range2d<int>& r) {
                      block(r.rows().begin(), r.rows().end(), r.cols().begin(), r.cols().end(), K, A, lda, B, ldb,
                            C, ldc, epilogue, bias);
                    });
}

void gemm_serial(int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                 GemmEpilogue epilogue, const float* bias) {
  kernel().block(0, M, 0, N, K, A, lda, B, ldb, C, ldc, epilogue, bias);
}

PackedMatrix::PackedMatrix(int K, int N, const float* B, int ldb) : K_(K), N_(N), ldb_(ldb), B_(B) {
  const BlockKernel block = kernel().block;
  panel_width_ = block == gemm_block_avx512 ? kWideTileCols : block == gemm_block_avx2 ? kTileCols : 0;
  packed_cols_ = panel_width_ == 0 ? 0 : N / panel_width_ * panel_width_;
  if (packed_cols_ > 0) {
    // Left uninitialised (pack_panels writes every float): zero-filling it first cost as
    // much as a quarter of the packing.
    panels_ = std::make_unique_for_overwrite<float[]>(packed_size(panel_width_, K, 0, packed_cols_));
    pack_panels(panel_width_, K, B, ldb, 0, packed_cols_, panels_.get());
  }
}

void gemm_serial_packed(int M, const float* A, int lda, const PackedMatrix& B, float* C, int ldc,
                        GemmEpilogue epilogue, const float* bias) {
  // What gemm_block_avx512 / gemm_block_avx2 / gemm_block_generic do for columns 0..N,
  // with the panels packed once: the same tiles on the same values, so the same bits.
  const int K = B.K_, N = B.N_, packed = B.packed_cols_;
  switch (B.panel_width_) {
    case kWideTileCols:
      avx512_from_panels(0, M, 0, packed, K, A, lda, B.panels_.get(), C, ldc, epilogue, bias);
      if (packed < N) gemm_block_avx2(0, M, packed, N, K, A, lda, B.B_, B.ldb_, C, ldc, epilogue, bias);
      return;
    case kTileCols:
      avx2_from_panels(0, M, 0, packed, K, A, lda, B.panels_.get(), C, ldc, epilogue, bias);
      if (packed < N) gemm_block_generic(0, M, packed, N, K, A, lda, B.B_, B.ldb_, C, ldc, epilogue, bias);
      return;
    default:
      gemm_block_generic(0, M, 0, N, K, A, lda, B.B_, B.ldb_, C, ldc, epilogue, bias);
  }
}

// ---- transposes ----------------------------------------------------------------------
//
// Pure data movement (the bits cannot change): 8x8 tiles through AVX2 registers where the
// CPU has AVX2, element by element at the edges and elsewhere. A step transposes about 13 MB
// (every weight for the forward GEMMs, every output gradient for the weight gradients).

namespace {

void transpose_block_portable(const float* in, int ld_in, float* out, int ld_out, int i0, int i1, int j0, int j1) {
  for (int i = i0; i < i1; ++i) {
    for (int j = j0; j < j1; ++j) out[static_cast<long>(j) * ld_out + i] = in[static_cast<long>(i) * ld_in + j];
  }
}

// out[j][i] = in[i][j] for the 8x8 tile at in (row stride ld_in) and out (row stride ld_out).
__attribute__((target("avx2"))) inline void transpose_tile_8x8(const float* in, long ld_in, float* out, long ld_out) {
  __m256 r[8], t[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(in + k * ld_in);
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);      // a0 b0 a1 b1 | a4 b4 a5 b5
    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);  // a2 b2 a3 b3 | a6 b6 a7 b7
  }
  for (int k = 0; k < 8; k += 4) {
    r[k] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));      // a0 b0 c0 d0 | a4 b4 c4 d4
    r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));  // a1 b1 c1 d1 | a5 ..
    r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int k = 0; k < 4; ++k) {
    _mm256_storeu_ps(out + k * ld_out, _mm256_permute2f128_ps(r[k], r[k + 4], 0x20));
    _mm256_storeu_ps(out + (k + 4) * ld_out, _mm256_permute2f128_ps(r[k], r[k + 4], 0x31));
  }
}

__attribute__((target("avx2"))) void transpose_block_avx2(const float* in, int ld_in, float* out, int ld_out, int i0,
                                                          int i1, int j0, int j1) {
  const int i_tiles = i0 + (i1 - i0) / 8 * 8, j_tiles = j0 + (j1 - j0) / 8 * 8;
  for (int i = i0; i < i_tiles; i += 8) {
    for (int j = j0; j < j_tiles; j += 8) {
      transpose_tile_8x8(in + static_cast<long>(i) * ld_in + j, ld_in, out + static_cast<long>(j) * ld_out + i, ld_out);
    }
  }
  transpose_block_portable(in, ld_in, out, ld_out, i0, i_tiles, j_tiles, j1);  // right edge
  transpose_block_portable(in, ld_in, out, ld_out, i_tiles, i1, j0, j1);       // bottom edge
}

using TransposeBlock = void (*)(const float*, int, float*, int, int, int, int, int);

TransposeBlock transpose_block() {
  static const TransposeBlock chosen = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? transpose_block_avx2 : transpose_block_portable;
  }();
  return chosen;
}

}  // namespace

void transpose_serial(const float* in, int rows, int cols, int ld_in, float* out, int ld_out) {
  transpose_block()(in, ld_in, out, ld_out, 0, rows, 0, cols);
}

void transpose(const float* in, int rows, int cols, float* out) {
  constexpr int kBlock = 64;  // 16 KiB in and out: one task's tile pair stays in L1
  const TransposeBlock block = transpose_block();
  tbb::parallel_for(tbb::blocked_range2d<int>(0, rows, kBlock, 0, cols, kBlock), [&](const tbb::blocked_range2d<int>& r) {
    block(in, cols, out, rows, r.rows().begin(), r.rows().end(), r.cols().begin(), r.cols().end());
  });
}

}  // namespace harness::kernels
