"""Tensor digests exactly as harness/run/tensor_digest.cpp computes them.

A receipt written here is judged by the C++ harness against C++ receipts with ==, so the
hash and every bit of the sketch must match: the arithmetic below follows the C++ loop's
operation order exactly, and numpy is only used where its order is the same: element-wise
ops, np.cumsum (a strict left-to-right recurrence), and np.add.reduce over axis 0 of a
C-contiguous matrix (row after row, probed at first use; see column_chains), never a sum along
a contiguous axis, which numpy adds pairwise. Many tensors are sketched in one pass
(SketchLayout), which is what the Recorder does every step.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import xxhash

from .philox import philox_words, stream_id
from .schema import SKETCH_BLOCK, SKETCH_WIDTH

_INT32_LE = np.dtype("<i4")  # a batch's tokens, as hashed
_LANES = 4  # the C++ keeps four interleaved accumulators (element i -> lane i % 4)


def _to_numpy(values: Any) -> np.ndarray:
    """np.asarray, plus torch tensors when torch is loaded (never imported from here)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(values, torch.Tensor):
        values = values.detach().cpu()
        if values.is_floating_point() and values.dtype != torch.float32:
            values = values.float()  # bf16/fp16 -> fp32 is exact; fp64 is checked below
        return values.numpy()
    return np.asarray(values)


def as_float32(values: Any) -> np.ndarray:
    """The tensor as C-contiguous little-endian float32: the bytes a hash is taken over.

    Another dtype is accepted only when it converts to float32 exactly; otherwise the hash
    would describe a value the tensor does not hold, so that is an error.
    """
    array = _to_numpy(values)
    out = np.ascontiguousarray(array, dtype="<f4")
    if array.dtype != np.float32 and not np.array_equal(out, array, equal_nan=array.dtype.kind in "fc"):
        raise ValueError(f"a {array.dtype} tensor does not convert to float32 exactly; hash the float32 values")
    return out


def tensor_hash(values: Any) -> int:
    """XXH3-64, seed 0, over the tensor's full logical value as little-endian fp32, row-major."""
    return xxhash.xxh3_64_intdigest(as_float32(values), seed=0)  # the buffer itself, no copy


def batch_hash(tokens: Any) -> int:
    """XXH3-64 of a batch's int32 little-endian tokens (B, T+1): the data contract."""
    array = _to_numpy(tokens)
    if array.dtype != _INT32_LE or not array.flags.c_contiguous:  # else: hashed as it is, no copy, no check
        out = np.ascontiguousarray(array, dtype=_INT32_LE)
        if not np.array_equal(out, array):
            raise ValueError(f"batch tokens of dtype {array.dtype} do not convert to int32 exactly")
        array = out
    return xxhash.xxh3_64_intdigest(array, seed=0)


def _raw_array(node: Any) -> Tuple[Optional[np.ndarray], str]:
    """A batch leaf as a numpy array of its own bytes and its dtype's name: a torch tensor
    on the host unconverted (bf16, which numpy lacks, as its 16-bit integers)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(node, torch.Tensor):
        t = node.detach().cpu().contiguous()
        name = str(t.dtype).replace("torch.", "")
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        return t.numpy(), name
    if isinstance(node, (bytes, str)):
        return None, ""
    array = np.asarray(node)
    return array, array.dtype.name


def batch_tree_hash(batch: Any) -> int:
    """XXH3-64 of a Python canary's batch (canary_harness.Canary.batch): a tensor or array,
    a number, or tuples, lists and dicts of them (dicts by sorted key). Each leaf adds its
    place in the tree (container kinds and key types included), its own dtype and shape,
    then its bytes little-endian, unconverted (a bf16 tensor's 16 bits), so two batches
    hash alike only when they hold the same values of the same dtypes in the same structure."""
    state = xxhash.xxh3_64(seed=0)

    def visit(node: Any, where: str) -> None:
        if isinstance(node, Mapping):
            for key in sorted(node, key=repr):
                visit(node[key], f"{where}{{{key!r}}}")
        elif isinstance(node, (tuple, list)):
            opening = "(" if isinstance(node, tuple) else "["
            for index, item in enumerate(node):
                visit(item, f"{where}{opening}{index}")
        else:
            array, dtype = _raw_array(node)
            if array is None or array.dtype.kind not in "biuf":
                raise ValueError(f"batch{where}: a {type(node).__name__}; a batch holds tensors, arrays and "
                                 "numbers (in tuples, lists and dicts)")
            array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
            state.update(f"{where}|{dtype}|{array.shape}|".encode())
            state.update(array)

    visit(batch, "")
    return state.intdigest()


class Sketch(NamedTuple):
    """A tensor's L2 norm and its SKETCH_WIDTH-number count sketch (both float64)."""

    l2: float
    projection: np.ndarray


@functools.lru_cache(maxsize=4096)
def block_codes(numel: int, salt: int) -> np.ndarray:
    """Per block j: bucket in bits 0..6, sign in bit 7, from Philox(seed=salt, stream 0, j)[0].

    As TensorSketcher's constructor: drawn once per (size, name), hence the cache.
    """
    blocks = -(-numel // SKETCH_BLOCK)
    draw = philox_words(salt, 0, np.arange(blocks, dtype=np.uint64))[0]
    codes = ((draw % SKETCH_WIDTH) | ((draw >> 31) << 7)).astype(np.uint8)
    codes.flags.writeable = False
    return codes


# ---- ordered sums ------------------------------------------------------------------------------
#
# Every sum of the sketch is a chain from 0.0 in a fixed order, the C++ loop's. Long chains
# (L2: numel / 4 terms per lane) are laid out as the columns of a C-contiguous (rows, W)
# float64 matrix, one column per chain, and summed by np.add.reduce over axis 0: numpy then
# adds row after row into the W running sums (element-wise, vectorised across the columns),
# which is each column's sequential chain. Pairwise summation only applies to a reduction
# along the contiguous axis, never used here. That is numpy's iteration order rather than
# its documented contract, so it is probed once on this numpy (_probe_reduce_order, at the
# first use); where the probe fails, np.cumsum (a strict left-to-right recurrence by
# definition) is used.


def _probe_reduce_order() -> bool:
    """True when np.add.reduce(m, axis=0) on a C-contiguous matrix adds row after row.

    Column = [2**53, 1, 1, ...]: in order, every 2**53 + 1 rounds back to 2**53 (ties to
    even), so the sum is 2**53; any other order (pairwise, blocked, reversed) adds some of
    the ones together first and ends above it. The shapes span the sketch's: few and many
    rows, 4 to 1024 columns.
    """
    for rows, width in ((9, 4), (300, 4), (5000, 4), (300, 64), (2100, 64), (40, 208), (300, 208), (200, 1024),
                        (2100, 1024)):
        m = np.ones((rows, width))
        m[0] = 2.0 ** 53
        if not np.array_equal(np.add.reduce(m, axis=0), np.full(width, 2.0 ** 53)):
            return False
    return True


_REDUCE_IS_SEQUENTIAL: Optional[bool] = None  # probed at the first use


def column_chains(m: np.ndarray) -> np.ndarray:
    """Per column c of a (rows >= 1, W) float64 matrix: ((m[0,c] + m[1,c]) + m[2,c]) + ...

    Strictly in row order (see above); the chain starts at m[0], so a chain "from 0.0" puts
    +0.0 in row 0, or has a first term that is never -0.0 (0.0 + x == x for every other x).
    """
    global _REDUCE_IS_SEQUENTIAL
    if _REDUCE_IS_SEQUENTIAL is None:
        _REDUCE_IS_SEQUENTIAL = _probe_reduce_order()
    m = np.ascontiguousarray(m)
    if _REDUCE_IS_SEQUENTIAL and m.shape[0] > 1:
        return np.add.reduce(m, axis=0)
    return np.cumsum(m, axis=0)[-1]


_ROWS_PER_BLOCK = SKETCH_BLOCK // _LANES  # 8 rows of four lanes per block
_CHUNK_BYTES = 1 << 20  # float64 working set of one L2 chunk: stays in cache


class _Group:
    """The tensors of one block count, side by side: every lane of every tensor is a column."""

    def __init__(self, blocks: int, members: List[int], base: int) -> None:
        self.blocks = blocks
        self.members = np.array(members, dtype=np.intp)
        self.count = len(members)
        self.width = _LANES * self.count
        self.rows = blocks * _ROWS_PER_BLOCK  # L2 chain length per lane, zero-padded to whole blocks
        chunk = max(_ROWS_PER_BLOCK, (_CHUNK_BYTES // (8 * self.width)) // _ROWS_PER_BLOCK * _ROWS_PER_BLOCK)
        self.chunk_rows = min(self.rows, chunk)
        self.base = base  # block sums of the group: signed[base + block * count + slot]


def check_arrays(arrays: Sequence[np.ndarray], numels: Sequence[int]) -> None:
    """ValueError unless arrays are C-contiguous float32 (as as_float32 returns) of these sizes."""
    if len(arrays) != len(numels):
        raise ValueError(f"{len(arrays)} tensors where {len(numels)} are expected")
    for i, (x, n) in enumerate(zip(arrays, numels)):
        if not isinstance(x, np.ndarray) or x.dtype != np.float32 or not x.flags.c_contiguous:
            raise ValueError(f"tensor {i}: a C-contiguous float32 array is expected (as_float32)")
        if x.size != n:
            raise ValueError(f"tensor {i} has {x.size} elements where {n} are expected")


class SketchLayout:
    """Sketches of a fixed list of tensors (sizes and salts) in one vectorised pass.

    What TensorSketcher does per tensor, for many tensors at once, bit for bit. Tensors of
    one block count form a group; each is zero-padded to whole blocks (a +0.0 added to a
    running sum that starts at +0.0 changes nothing) and seen as rows of four lanes, and is
    copied into a (rows, 4 * count) float32 matrix beside the group's others (as 16-byte
    items: numpy moves those fast), so that column 4s + k is lane k of tensor s. Then
      - block sums: lane k of block b of tensor s is 0.0 + rows 8b .. 8b+7 of column 4s + k
        in order (eight element-wise adds over every block and column at once, float32
        widened exactly by numpy), then (0 + 1) + (2 + 3) of the tensor's four lanes;
      - L2: in chunks of rows that stay in cache, widened to float64 and squared (both
        exact) under a first row that holds every column's running sum (from 0.0), each
        column chained down the rows (column_chains): each lane's one sequential chain
        across the whole tensor; at the end (0 + 1) + (2 + 3) per tensor, and sqrt;
      - projection: each (tensor, bucket) chain of signed block sums, from 0.0 in block
        order, is a column of a gathered matrix, chained down the rows.
    Block codes and gathers are built once per layout; `keep_buffers` (the Recorder's layout,
    one call per step) reuses the scratch buffers between calls under a lock.
    """

    def __init__(self, numels: Sequence[int], salts: Sequence[int], keep_buffers: bool = True) -> None:
        if len(numels) != len(salts):
            raise ValueError("one salt per tensor")
        self.numels = tuple(int(n) for n in numels)
        self.salts = tuple(int(s) for s in salts)
        self.blocks = [-(-n // SKETCH_BLOCK) for n in self.numels]
        self.total_blocks = sum(self.blocks)
        by_blocks: Dict[int, List[int]] = {}
        for i, nb in enumerate(self.blocks):
            if nb:
                by_blocks.setdefault(nb, []).append(i)
        self.groups: List[_Group] = []
        base = 0
        for nb, members in sorted(by_blocks.items()):
            self.groups.append(_Group(nb, members, base))
            base += nb * len(members)
        zero_slot = self.total_blocks  # signed[zero_slot] = +0.0: where every chain starts and pads
        self.negative = np.zeros(self.total_blocks, dtype=bool)
        self.gathers: List[np.ndarray] = []
        for group in self.groups:
            orders = []
            for slot, member in enumerate(group.members):
                codes = block_codes(self.numels[member], self.salts[member])
                position = group.base + np.arange(group.blocks) * group.count + slot  # of block j in signed
                self.negative[position] = codes >= 0x80
                buckets = codes & 0x7F
                orders.append((position[np.argsort(buckets, kind="stable")],  # by bucket, block order within
                               np.bincount(buckets, minlength=SKETCH_WIDTH)))
            longest = max(int(counts.max()) for _, counts in orders)
            # Column (slot, bucket): +0.0 (projection[b] starts at 0.0), the bucket's signed block
            # sums in block order, then +0.0 padding: an accumulator that starts at +0.0 never
            # becomes -0.0 (round to nearest), and s + 0.0 == s bit for bit for every such s.
            gather = np.full((longest + 1, group.count * SKETCH_WIDTH), zero_slot, dtype=np.intp)
            for slot, (order, counts) in enumerate(orders):
                first = 0
                for b in range(SKETCH_WIDTH):
                    gather[1:1 + counts[b], slot * SKETCH_WIDTH + b] = order[first:first + counts[b]]
                    first += counts[b]
            self.gathers.append(gather)
        self.keep_buffers = keep_buffers
        self._buffers: Optional[Dict[str, Any]] = None
        self._lock = threading.Lock()

    def _new_buffers(self) -> Dict[str, Any]:
        chunk = max([g.chunk_rows * g.width for g in self.groups], default=0)
        return {
            # tensors whose size is not whole blocks: copied into zeros first (the padding is never written)
            "staging": {i: np.zeros(nb * SKETCH_BLOCK, dtype=np.float32)
                        for i, (n, nb) in enumerate(zip(self.numels, self.blocks)) if n % SKETCH_BLOCK},
            "lanes32": [np.empty((g.rows, g.width), dtype=np.float32) for g in self.groups],
            "chunk64": np.empty(chunk),
            "chain": np.empty(chunk + max([g.width for g in self.groups], default=0)),
            "lane_sums": np.empty(self.total_blocks * _LANES),
        }

    def sketch(self, arrays: Sequence[np.ndarray]) -> List[Sketch]:
        """The sketches of `arrays` (C-contiguous float32, as as_float32 returns), in order."""
        return self._run(arrays, None)

    def hash_and_sketch(self, arrays: Sequence[np.ndarray]) -> Tuple[List[int], List[Sketch]]:
        """tensor_hash and the sketch of every array: each hashed just before the sketch reads it
        (so that read finds it in cache), from the array's own buffer (no copy)."""
        hashes: List[Optional[int]] = [None] * len(self.numels)
        sketches = self._run(arrays, hashes)
        return [xxhash.xxh3_64_intdigest(x, seed=0) if h is None else h for h, x in zip(hashes, arrays)], sketches

    def _run(self, arrays: Sequence[np.ndarray], hashes: Optional[List[Optional[int]]]) -> List[Sketch]:
        check_arrays(arrays, self.numels)
        with self._lock:
            buffers = self._buffers
            if buffers is None:
                buffers = self._new_buffers()
                if self.keep_buffers:
                    self._buffers = buffers
            with np.errstate(all="ignore"):  # inf - inf in a tensor's sums is its digest, not an error
                return self._sketch(arrays, buffers, hashes)

    def _sketch(self, arrays: Sequence[np.ndarray], buffers: Dict[str, Any],
                hashes: Optional[List[Optional[int]]]) -> List[Sketch]:
        K = len(self.numels)
        lanes = np.zeros((K, _LANES))
        signed = np.empty(self.total_blocks + 1)
        lane_sums_all = buffers["lane_sums"]
        for group, lanes32 in zip(self.groups, buffers["lanes32"]):
            width, count = group.width, group.count
            # Side by side: column 4 * slot + k of lanes32 is lane k of the group's tensor `slot`.
            lane_items = lanes32.view(np.complex128)  # (rows, count): one item = 4 floats, one row
            for slot, member in enumerate(group.members):
                if hashes is not None:
                    hashes[member] = xxhash.xxh3_64_intdigest(arrays[member], seed=0)
                flat = arrays[member].reshape(-1)
                if flat.size % SKETCH_BLOCK:
                    staged = buffers["staging"][member]
                    staged[:flat.size] = flat
                    flat = staged
                np.copyto(lane_items[:, slot], flat.view(np.complex128))

            # Block sums: lane k of block b of tensor s is 0.0 + rows 8b .. 8b+7 of column 4s + k.
            blocks = group.blocks
            sums = lane_sums_all[:blocks * width].reshape(blocks, width)
            sums.fill(0.0)
            cells = lanes32.reshape(blocks, _ROWS_PER_BLOCK, width)
            for r in range(_ROWS_PER_BLOCK):
                np.add(sums, cells[:, r, :], out=sums)  # float64 + float32 widened exactly
            quads = sums.reshape(blocks, count, _LANES)
            block_sums = signed[group.base:group.base + blocks * count].reshape(blocks, count)
            np.add(quads[:, :, 0], quads[:, :, 1], out=block_sums)
            block_sums += quads[:, :, 2] + quads[:, :, 3]  # (0 + 1) + (2 + 3)

            # L2: each column chained down all the rows, a chunk (in cache) at a time, the chunk
            # under a first row that holds the columns' running sums (from 0.0).
            rows = group.chunk_rows
            chunk64 = buffers["chunk64"][:rows * width].reshape(rows, width)
            chain = buffers["chain"][:(rows + 1) * width].reshape(rows + 1, width)
            running = np.zeros(width)
            for first in range(0, group.rows, rows):
                n = min(rows, group.rows - first)
                x = chunk64[:n]
                np.copyto(x, lanes32[first:first + n])  # float32 -> float64: exact
                chain[0] = running
                np.multiply(x, x, out=chain[1:n + 1])  # exact: 24-bit significands
                running = column_chains(chain[:n + 1])
            lanes[group.members] = running.reshape(count, _LANES)
        l2 = np.sqrt((lanes[:, 0] + lanes[:, 1]) + (lanes[:, 2] + lanes[:, 3]))

        np.negative(signed[:-1], out=signed[:-1], where=self.negative)
        signed[-1] = 0.0
        projection = np.zeros((K, SKETCH_WIDTH))
        for group, gather in zip(self.groups, self.gathers):
            projection[group.members] = column_chains(signed[gather]).reshape(-1, SKETCH_WIDTH)
        return [Sketch(float(l2[i]), projection[i]) for i in range(K)]


@functools.lru_cache(maxsize=64)
def _single_layout(numel: int, salt: int) -> SketchLayout:
    return SketchLayout((numel,), (salt,), keep_buffers=False)


def sketch_with_salt(values: Any, salt: int) -> Sketch:
    """The sketch of a tensor whose sketcher is keyed by `salt` (see sketch())."""
    x = as_float32(values)
    return _single_layout(x.size, salt).sketch([x])[0]


def sketch_many(arrays: Sequence[Any], names: Sequence[str]) -> List[Sketch]:
    """sketch(a, name) for every pair, in one pass (build a SketchLayout to reuse across calls)."""
    xs = [as_float32(a) for a in arrays]
    return SketchLayout([x.size for x in xs], [stream_id(n) for n in names], keep_buffers=False).sketch(xs)


def sketch(values: Any, name: str) -> Sketch:
    """L2 norm and count sketch of the tensor called `name` (its Philox stream is the name's)."""
    return sketch_with_salt(values, stream_id(name))
