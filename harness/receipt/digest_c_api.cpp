// The C ABI over receipt/digest.h (digest_c_api.h). Nothing may escape as an exception: a
// foreign caller (ctypes, a CUDA training loop) cannot catch one.
#include "receipt/digest_c_api.h"

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "receipt/digest.h"
#include "receipt/receipt_schema.h"

struct canary_digest_plan {
  std::vector<std::size_t> numels;
  std::vector<std::optional<harness::receipt::TensorSketcher>> sketchers;  // empty: hashed only
};

namespace {

using harness::receipt::TensorSketch;

void digest_one(const canary_digest_plan& plan, std::size_t i, const float* const* tensors, std::uint64_t* hashes,
                double* l2, double* projection) {
  const std::span<const float> values(tensors[i], plan.numels[i]);
  hashes[i] = harness::receipt::tensor_hash(values);
  if (!plan.sketchers[i]) return;
  const TensorSketch sketch = (*plan.sketchers[i])(values);
  l2[i] = sketch.l2;
  std::copy(sketch.projection.begin(), sketch.projection.end(), projection + i * harness::receipt::kSketchWidth);
}

}  // namespace

extern "C" {

uint32_t canary_digest_abi_version(void) { return CANARY_DIGEST_ABI_VERSION; }
uint32_t canary_digest_sketch_width(void) { return harness::receipt::kSketchWidth; }
uint32_t canary_digest_sketch_block(void) { return harness::receipt::kSketchBlock; }

uint64_t canary_digest_hash_f32(const float* values, size_t numel) {
  return harness::receipt::tensor_hash(std::span<const float>(values, numel));
}

uint64_t canary_digest_salt(const char* name) { return harness::receipt::sketch_salt(name); }

canary_digest_plan* canary_digest_plan_new(size_t count, const uint64_t* numels, const uint64_t* salts,
                                           const uint8_t* sketched) {
  try {
    auto plan = std::make_unique<canary_digest_plan>();
    plan->numels.assign(numels, numels + count);
    plan->sketchers.resize(count);
    for (std::size_t i = 0; i < count; ++i) {
      if (sketched[i] != 0) plan->sketchers[i].emplace(static_cast<std::size_t>(numels[i]), salts[i]);
    }
    return plan.release();
  } catch (...) {  // std::bad_alloc or std::length_error: out of memory, in effect
    return nullptr;
  }
}

void canary_digest_plan_free(canary_digest_plan* plan) { delete plan; }

int canary_digest_plan_run(const canary_digest_plan* plan, const float* const* tensors, uint64_t* hashes, double* l2,
                           double* projection, int threads) {
  try {
    const auto digest_all = [&] {
      // Each tensor is digested whole by one thread: the same bits for any schedule.
      tbb::parallel_for(std::size_t{0}, plan->numels.size(),
                        [&](std::size_t i) { digest_one(*plan, i, tensors, hashes, l2, projection); });
    };
    if (threads > 0) {
      tbb::task_arena arena(threads);
      arena.execute(digest_all);
    } else {
      digest_all();
    }
    return 0;
  } catch (...) {
    return 1;
  }
}

}  // extern "C"
