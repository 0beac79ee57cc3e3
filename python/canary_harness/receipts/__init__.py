"""Receipts and digests: the receipt's description (receipt_schema.json), its writer (the harness's library through ctypes) and reader, the tensor digests, and the stack line a receipt records."""
