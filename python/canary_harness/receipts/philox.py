"""Philox4x32-10 and the FNV-1a stream id, bit for bit as engines/numerics/philox.h.

The count sketch draws each block's bucket and sign from Philox keyed by the tensor
name's stream id; reproducing the generator exactly is what lets Python sketches be
compared with C++ ones by ==.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

_MUL0, _MUL1 = 0xD2511F53, 0xCD9E8D57
_WEYL0, _WEYL1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF

Block = Tuple[int, int, int, int]


def philox4x32_10(counter: Block, key: Tuple[int, int]) -> Block:
    """Ten Philox rounds on plain Python ints (the reference; see philox_words for arrays)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p1 = _MUL0 * c0, _MUL1 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & _MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & _MASK32
        k0, k1 = (k0 + _WEYL0) & _MASK32, (k1 + _WEYL1) & _MASK32
    return c0, c1, c2, c3


def _split(value: int) -> Tuple[int, int]:
    return value & _MASK32, (value >> 32) & _MASK32


def philox_at(seed: int, stream: int, index: int) -> Block:
    """The 4 random words at position `index` of stream `stream` under `seed` (philox_at in C++)."""
    return philox4x32_10((*_split(index), *_split(stream)), _split(seed))


def philox_words(seed: int, stream: int, indices: np.ndarray) -> np.ndarray:
    """philox_at for many indices at once: a (4, n) uint32 array, word w of index i at [w, i].

    uint32 values are held in uint64 lanes: a 32x32-bit product fits in 64 bits exactly, so
    the high and low halves are the same as the C++ computes.
    """
    idx = np.asarray(indices, dtype=np.uint64)
    mask = np.uint64(_MASK32)
    c0, c1 = idx & mask, idx >> np.uint64(32)
    s0, s1 = _split(stream)
    c2, c3 = np.full_like(idx, s0), np.full_like(idx, s1)
    k0, k1 = _split(seed)
    m0, m1, shift = np.uint64(_MUL0), np.uint64(_MUL1), np.uint64(32)
    for _ in range(10):
        p0, p1 = m0 * c0, m1 * c2
        c0, c1, c2, c3 = (p1 >> shift) ^ c1 ^ np.uint64(k0), p1 & mask, (p0 >> shift) ^ c3 ^ np.uint64(k1), p0 & mask
        k0, k1 = (k0 + _WEYL0) & _MASK32, (k1 + _WEYL1) & _MASK32
    return np.stack([c0, c1, c2, c3]).astype(np.uint32)


def stream_id(name: str) -> int:
    """FNV-1a 64 of the name's UTF-8 bytes: a tensor's random stream depends on its name only."""
    h = 0xCBF29CE484222325
    for byte in name.encode("utf-8"):
        h = ((h ^ byte) * 0x100000001B3) & _MASK64
    return h
