"""canary_harness: write and read canary receipts that the C++ harness judges like its own.

The same XXH3 hashes and the same count sketches as harness/run/tensor_digest.cpp, bit for
bit, in the same HDF5 receipt format (docs/receipt-schema.md), written by the harness's
own writer library (receipt_native; an installed package carries it). numpy, h5py and
xxhash besides; torch tensors are accepted when torch is installed, never imported here. Canary
packs: canary_harness.pack (no torch). With torch: canary_harness.torch.Recorder (any
PyTorch loop), canary_harness.models.gpt2 (the PyTorch canary), canary_harness.runs.optim
(its XLA-safe AdamW), `python3 -m canary_harness.lane` (the PyTorch canary lane) and
`python3 -m canary_harness run FILE.py:NAME` (a team's own model as a canary: Canary).
"""

from .runs.canary import Canary, CanaryError, output_of
from .receipts.digest import Sketch, as_float32, batch_hash, sketch, sketch_with_salt, tensor_hash
from .receipts.philox import philox_at, stream_id
from .receipts.receipt import ReceiptError, ReceiptReader, ReceiptWriter
from .receipts.schema import HASH_FAMILIES, SCHEMA_MINOR, SCHEMA_VERSION, SKETCH_BLOCK, SKETCH_FAMILIES, SKETCH_WIDTH
from .receipts.stack import StackInfo, collect_stack_info

__version__ = "0.1.0"

__all__ = [
    "HASH_FAMILIES", "SCHEMA_MINOR", "SCHEMA_VERSION", "SKETCH_BLOCK", "SKETCH_FAMILIES", "SKETCH_WIDTH",
    "Canary", "CanaryError", "ReceiptError", "ReceiptReader", "ReceiptWriter", "Sketch", "StackInfo", "as_float32", "batch_hash",
    "collect_stack_info", "output_of", "philox_at", "sketch", "sketch_with_salt", "stream_id", "tensor_hash",
]
