/* The receipt digests behind a C ABI (docs/receipt-schema.md, "Digests: the algorithms,
 * exactly"), built as the shared library libcanary_harness_digest. Any language with a C
 * FFI hashes and sketches tensors exactly as the harness does; the Python package loads it
 * with ctypes when it finds it (docs/python.md, "The native digest"). Every function is
 * thread-safe and never throws; an error is a return code, never an abort. */
#ifndef CANARY_HARNESS_DIGEST_C_API_H
#define CANARY_HARNESS_DIGEST_C_API_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define CANARY_DIGEST_API __attribute__((visibility("default")))
#else
#define CANARY_DIGEST_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a function's signature or an algorithm changes: a caller refuses another. */
#define CANARY_DIGEST_ABI_VERSION 1

CANARY_DIGEST_API uint32_t canary_digest_abi_version(void);
CANARY_DIGEST_API uint32_t canary_digest_sketch_width(void); /* numbers per projection (16) */
CANARY_DIGEST_API uint32_t canary_digest_sketch_block(void); /* elements per sketch block (32) */

/* XXH3-64, seed 0, of `numel` little-endian fp32 values: a tensor's hash. */
CANARY_DIGEST_API uint64_t canary_digest_hash_f32(const float* values, size_t numel);

/* The sketch salt of the tensor called `name` (FNV-1a 64 of the name). */
CANARY_DIGEST_API uint64_t canary_digest_salt(const char* name);

/* A plan digests a fixed list of tensors (sizes, salts, which are sketched) again and
 * again, as a recorder does every step: each sketched tensor's Philox block codes are
 * drawn once, at creation. The three arrays hold `count` entries (any pointer when count
 * is 0). NULL when out of memory. */
typedef struct canary_digest_plan canary_digest_plan;
CANARY_DIGEST_API canary_digest_plan* canary_digest_plan_new(size_t count, const uint64_t* numels,
                                                             const uint64_t* salts, const uint8_t* sketched);
CANARY_DIGEST_API void canary_digest_plan_free(canary_digest_plan* plan);

/* Digests tensors[0..count) (each numels[i] fp32 values; a 0-element tensor's pointer may
 * be NULL): hashes[i] for every tensor; l2[i] and projection[i * width .. + width) for
 * every sketched one (others left as they are). Tensors in parallel on up to `threads`
 * threads (0 or less: every core); the results do not depend on it. Returns 0, or 1 when
 * the work could not be run (out of memory). `name` (canary_digest_salt) is a C string. */
CANARY_DIGEST_API int canary_digest_plan_run(const canary_digest_plan* plan, const float* const* tensors,
                                             uint64_t* hashes, double* l2, double* projection, int threads);

#ifdef __cplusplus
}
#endif

#endif
