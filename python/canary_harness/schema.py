"""Receipt schema constants, mirrored from harness/receipt/receipt_schema.h.

They live in one module so that a schema change on the C++ side is one edit here, and so
that tests can assert the two sides agree instead of repeating literals.
"""

SCHEMA_VERSION = 1  # major: a reader refuses any other
# minor 1: HDF5 1.10 format, fixed-length UTF-8 strings, Fletcher32; 2: manifest budget_features;
# 3: /checkpoints held in the receipt (a Python canary's state)
SCHEMA_MINOR = 3

SKETCH_WIDTH = 16  # buckets of the count sketch
SKETCH_BLOCK = 32  # elements per sketched block
SKETCH_METHOD = "count-sketch over blocks"

HASH_FAMILIES = ("params", "grads", "adam_m", "adam_v")  # receipt order of /hashes
SKETCH_FAMILIES = ("params", "grads")  # receipt order of /sketches

# Chunk rows of the growing datasets, as receipt_writer.cpp: 1-D step series and (N, K) tables.
STEP_CHUNK_ROWS = 128
TABLE_CHUNK_ROWS = 16
