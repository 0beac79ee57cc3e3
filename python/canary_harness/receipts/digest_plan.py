"""One digest call a step: DigestPlan, the hashes of a fixed list of tensors and the sketches
of the flagged ones, on the harness's digest library (canary_harness.receipts.native) where it is
found and on canary_harness.receipts.digest's Python code otherwise, the same bits either way.

Its own module so that the imports run one way: digest (pure Python) <- native (the
library, checked against digest) <- digest_plan (which picks one of the two).
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import xxhash

from .digest import Sketch, SketchLayout, check_arrays
from .native import NativeDigestError, native_digest
from .schema import SKETCH_WIDTH


class DigestRows(NamedTuple):
    """A DigestPlan's digests as arrays: hashes (count,) uint64, l2 (count,) and projection
    (count, SKETCH_WIDTH) float64, with zeros where a tensor is not sketched."""

    hashes: np.ndarray
    l2: np.ndarray
    projection: np.ndarray


class DigestPlan:
    """The hashes of a fixed list of tensors, and the sketches of the flagged ones, step after
    step: what a recorder does (every tensor of params, grads, adam_m and adam_v hashed;
    params and grads sketched).

    It runs on the harness's digest library where canary_harness.receipts.native finds one (the C++
    recorder's own code: several times faster, and the GIL is released while it runs), and
    on SketchLayout and xxhash otherwise: the same bits either way (python/tests/test_native.py).
    `native`: None chooses as CANARY_HARNESS_DIGEST says (canary_harness.receipts.native); False
    forces Python; True requires the library (NativeDigestError without one).
    `implementation` says which one runs ("python" or the library's path).
    """

    def __init__(self, numels: Sequence[int], salts: Sequence[int], sketched: Sequence[bool],
                 native: Optional[bool] = None) -> None:
        if not len(numels) == len(salts) == len(sketched):
            raise ValueError("one salt and one sketched flag per tensor")
        self.numels = tuple(int(n) for n in numels)
        self.sketched = tuple(bool(s) for s in sketched)
        library = None
        if native is None or native:
            library = native_digest()
            if library is None and native:
                raise NativeDigestError("no digest library found (set CANARY_HARNESS_DIGEST to its path)")
        self._native = library.plan(self.numels, salts, self.sketched) if library is not None else None
        self.implementation = library.path if library is not None else "python"
        self._sketched_index = [i for i, s in enumerate(self.sketched) if s]
        self._layout = None if self._native is not None else SketchLayout(
            [self.numels[i] for i in self._sketched_index], [int(salts[i]) for i in self._sketched_index])

    @property
    def native(self) -> bool:
        """True when the digest library runs this plan."""
        return self._native is not None

    def rows(self, arrays: Sequence[np.ndarray], threads: int = 0) -> DigestRows:
        """The digests of `arrays` (C-contiguous float32, as as_float32 returns; the plan's sizes
        in order). threads: the library's thread count (0: every core); Python runs on the
        calling thread."""
        if self._native is not None:
            return DigestRows(*self._native.run(arrays, threads))
        check_arrays(arrays, self.numels)
        rows = DigestRows(np.empty(len(arrays), dtype=np.uint64), np.zeros(len(arrays)),
                          np.zeros((len(arrays), SKETCH_WIDTH)))
        hashes, sketches = self._layout.hash_and_sketch([arrays[i] for i in self._sketched_index])
        for i, h, s in zip(self._sketched_index, hashes, sketches):
            rows.hashes[i], rows.l2[i], rows.projection[i] = h, s.l2, s.projection
        for i, s in enumerate(self.sketched):
            if not s:
                rows.hashes[i] = xxhash.xxh3_64_intdigest(arrays[i], seed=0)
        return rows

    def rows_at(self, addresses: Sequence[int], threads: int = 0) -> DigestRows:
        """rows() of raw addresses of contiguous float32 values of the plan's sizes, without a
        numpy view per tensor (native only: NativePlan.run_addresses says what the caller checks)."""
        if self._native is None:
            raise ValueError("rows_at needs the digest library; use rows() with arrays")
        return DigestRows(*self._native.run_addresses(addresses, threads))

    def run(self, arrays: Sequence[np.ndarray], threads: int = 0) -> Tuple[List[int], List[Optional[Sketch]]]:
        """rows(), per tensor: (its hash, its Sketch or None where it is not sketched)."""
        rows = self.rows(arrays, threads)
        return rows.hashes.tolist(), [Sketch(float(rows.l2[i]), rows.projection[i]) if s else None
                                      for i, s in enumerate(self.sketched)]
