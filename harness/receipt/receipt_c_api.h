/* The receipt writer behind a C ABI, built as the shared library libcanary_harness_receipt:
 * a writer of another language (the Python package's ReceiptWriter, docs/python.md) writes
 * its receipts with the very code `harness run` writes with, so one writer holds the format
 * (docs/receipt-schema.md). A call never throws and never aborts: it returns 0, or 1 with a
 * one-line message in `error` (at most error_size bytes, NUL-terminated) naming the receipt
 * and what to do. Calls may come from any thread: the library runs one at a time (HDF5 is
 * entered by one thread at once, whether or not it was built thread-safe). */
#ifndef CANARY_HARNESS_RECEIPT_C_API_H
#define CANARY_HARNESS_RECEIPT_C_API_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define CANARY_RECEIPT_API __attribute__((visibility("default")))
#else
#define CANARY_RECEIPT_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a function's signature or meaning changes: a caller refuses another. */
#define CANARY_RECEIPT_ABI_VERSION 1

CANARY_RECEIPT_API uint32_t canary_receipt_abi_version(void);
/* The receipt schema this library writes (its manifest's schema_version and schema_minor). */
CANARY_RECEIPT_API int64_t canary_receipt_schema_version(void);
CANARY_RECEIPT_API int64_t canary_receipt_schema_minor(void);

/* A manifest attribute: kind 0 a string (text, UTF-8), 1 an integer, 2 a float. */
typedef struct canary_receipt_attribute {
  const char* name;
  int32_t kind;
  const char* text;
  int64_t integer;
  double real;
} canary_receipt_attribute;

typedef struct canary_receipt_writer canary_receipt_writer;

/* Creates the receipt at `path` (refused where it exists, unless overwrite) with the
 * manifest's attributes as given, in order (the caller gives every one: schema_version,
 * complete = 0, ...), and the tensor names. `description` is the receipt description's
 * JSON (`harness schema`): a manifest attribute it describes must have its kind, and step
 * state must be described. batch_size and row_length > 0: every step's tokens are recorded
 * (/batches/tokens, batch_size x row_length int32); 0 and 0: none. NULL on an error, and
 * no file is left. */
CANARY_RECEIPT_API canary_receipt_writer* canary_receipt_create(
    const char* path, int overwrite, const char* description, size_t attribute_count,
    const canary_receipt_attribute* attributes, size_t tensor_count, const char* const* tensor_names,
    int32_t batch_size, int32_t row_length, char* error, size_t error_size);

/* Step state for the next canary_receipt_append_step (a group of /compile counters, moe's
 * /routing): `group` with `column_count` column names (0: one value per field and step, a
 * 1-D dataset) and `field_count` fields, values[field * max(1, column_count) + column].
 * The first step's groups are created; every later step must stage the same ones. */
CANARY_RECEIPT_API int canary_receipt_stage_state(canary_receipt_writer* writer, const char* group,
                                                  size_t column_count, const char* const* columns,
                                                  size_t field_count, const char* const* fields,
                                                  const double* values, char* error, size_t error_size);

/* The op traces of the next step (/trace): per traced op output its hash, L2 norm and
 * sketch projection (column_count x sketch width). The first call gives the columns'
 * identities (op_index, layer, op, phase, tensor, kind), which create /trace; later calls
 * pass NULL for them and the same column_count. */
CANARY_RECEIPT_API int canary_receipt_stage_trace(canary_receipt_writer* writer, size_t column_count,
                                                  const int64_t* op_index, const int64_t* layer,
                                                  const char* const* op, const char* const* phase,
                                                  const char* const* tensor, const char* const* kind,
                                                  const uint64_t* hashes, const double* l2, const double* projection,
                                                  char* error, size_t error_size);

/* One step: the staged state and trace, then the step's row of every per-step dataset,
 * flushed. hashes: 4 x K (params, grads, adam_m, adam_v); l2: 2 x K and projection:
 * 2 x K x sketch width (params, grads); batch_tokens: the step's tokens where the receipt
 * records them, else NULL. A write that failed part-way (a full disk, a file size limit)
 * leaves a file that is no receipt: it is removed at once, and every later call is refused
 * (so too for checkpoints, evaluations and finish). */
CANARY_RECEIPT_API int canary_receipt_append_step(canary_receipt_writer* writer, double loss, double grad_norm,
                                                  double lr, uint64_t batch_hash, const uint64_t* hashes,
                                                  const double* l2, const double* projection,
                                                  const int32_t* batch_tokens, char* error, size_t error_size);

/* /checkpoints held in the receipt (storage = "receipt"), before the first step; then each
 * checkpoint's state bytes. content_hash receives "xxh128:" and 32 hex digits (40 bytes
 * with the NUL). */
CANARY_RECEIPT_API int canary_receipt_declare_checkpoints(canary_receipt_writer* writer, int64_t every,
                                                          char* error, size_t error_size);
CANARY_RECEIPT_API int canary_receipt_add_checkpoint(canary_receipt_writer* writer, int64_t step, const uint8_t* state,
                                                     size_t length, char* content_hash, size_t content_hash_size,
                                                     char* error, size_t error_size);

/* /eval (docs/logit-kl.md), once, before the first evaluation (after steps too: a model's
 * vocabulary may be known only from its first logits): targets are rows x tokens ids below
 * vocab. Then one evaluation at a time, logits rows x tokens x vocab. */
CANARY_RECEIPT_API int canary_receipt_declare_eval(canary_receipt_writer* writer, int64_t every,
                                                   uint64_t held_out_hash, const char* source, int32_t rows,
                                                   int32_t tokens, int32_t vocab, const int32_t* targets,
                                                   char* error, size_t error_size);
CANARY_RECEIPT_API int canary_receipt_add_eval(canary_receipt_writer* writer, int64_t step, double loss,
                                               const float* logits, double compiles, char* error, size_t error_size);

/* /tensors/step_<step>/<name>: float32 values of the given shape, written by finish (a
 * run killed before it leaves none). */
CANARY_RECEIPT_API int canary_receipt_dump_tensor(canary_receipt_writer* writer, int64_t step, const char* name,
                                                  size_t rank, const int64_t* shape, const float* values,
                                                  char* error, size_t error_size);

/* The dumps written, complete = 1, the file closed; the writer stays to be closed. */
CANARY_RECEIPT_API int canary_receipt_finish(canary_receipt_writer* writer, char* error, size_t error_size);

/* Frees the writer: an unfinished receipt keeps its flushed steps with complete = 0; a
 * damaged one (a failed flush) is removed. `discard` != 0: the file is removed in any case
 * (a run that could not start). NULL is accepted. */
CANARY_RECEIPT_API void canary_receipt_close(canary_receipt_writer* writer, int discard);

#ifdef __cplusplus
}
#endif

#endif
