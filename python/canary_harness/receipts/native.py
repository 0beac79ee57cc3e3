"""The harness's digest library, libcanary_harness_digest, through ctypes (optional).

The shared library that the C++ build makes (harness/receipt/digest_c_api.h) computes the
receipt's hashes and sketches with the very code the C++ recorder records with: the same
bits as canary_harness.receipts.digest, several times faster, and with the GIL released while it
runs (ctypes drops it around every foreign call). The package works without it; where it is
found, digest.DigestPlan (what the Recorder digests each step with) uses it.

Which implementation runs is chosen by the environment variable CANARY_HARNESS_DIGEST:
  unset, "" or "auto"  the library if one is found (below) and passes the checks, else Python;
  "python"             always the pure-Python digest;
  a path               that library, or an error (NativeDigestError) naming the path and why.
"auto" looks next to the `harness` executable that HARNESS_BIN names (its ../lib and
../lib/<multiarch>, where `cmake --install` and the build tree put it), then in the package's
own directory (where `pip install ./python` puts it), then next to the `harness` on PATH,
then in the system's library path (ctypes.util.find_library); when it finds none it says so
once on stderr and digests in Python. A library is used only when its ABI
version is CANARY_DIGEST_ABI_VERSION, its sketch width and block are the schema's, and it
digests a probe tensor exactly as the Python code does; a found library that fails this is
skipped with a warning (auto) or refused (a path).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import sys
import threading
import warnings
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .digest import SketchLayout, check_arrays, tensor_hash
from .schema import SKETCH_BLOCK, SKETCH_WIDTH

ENV = "CANARY_HARNESS_DIGEST"
ABI_VERSION = 1  # CANARY_DIGEST_ABI_VERSION in digest_c_api.h
LIBRARY_FILE = f"libcanary_harness_digest.so.{ABI_VERSION}"

_u64p = ctypes.POINTER(ctypes.c_uint64)
_f64p = ctypes.POINTER(ctypes.c_double)


class NativeDigestError(ValueError):
    """The digest library named by CANARY_HARNESS_DIGEST cannot be used (the message says why)."""


class NativePlan:
    """A canary_digest_plan: the hashes of a fixed list of tensors and the sketches of the
    flagged ones, step after step (the Philox block codes drawn once, at creation)."""

    def __init__(self, library: "NativeDigest", numels: Sequence[int], salts: Sequence[int],
                 sketched: Sequence[bool]) -> None:
        self._lib = library.lib
        self.numels = tuple(int(n) for n in numels)
        self.count = len(self.numels)
        self.sketched = np.array([bool(s) for s in sketched], dtype=np.uint8)
        numel_array = np.array(self.numels, dtype=np.uint64)
        salt_array = np.array([int(s) for s in salts], dtype=np.uint64)
        self._handle = self._lib.canary_digest_plan_new(self.count, numel_array.ctypes.data_as(_u64p),
                                                        salt_array.ctypes.data_as(_u64p),
                                                        self.sketched.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))
        if not self._handle:
            raise MemoryError("canary_digest_plan_new: out of memory")

    def run(self, arrays: Sequence[np.ndarray], threads: int = 0) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(hashes (count,) uint64, l2 (count,), projection (count, SKETCH_WIDTH)) of C-contiguous
        float32 arrays of the plan's sizes; rows of tensors that are not sketched hold zeros."""
        check_arrays(arrays, self.numels)
        return self.run_addresses([x.ctypes.data for x in arrays], threads)

    def run_addresses(self, addresses: Sequence[int], threads: int = 0) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """run() on raw addresses: each must hold the plan's number of contiguous float32
        values (the caller checked, e.g. torch's data_ptr() of a contiguous fp32 CPU tensor of
        that numel), and stay valid and unchanged during the call."""
        if len(addresses) != self.count:
            raise ValueError(f"{len(addresses)} tensors for a plan of {self.count}")
        pointers = (ctypes.c_void_p * self.count)(*addresses)  # per call: a plan may run on two threads at once
        hashes = np.empty(self.count, dtype=np.uint64)
        l2 = np.zeros(self.count)
        projection = np.zeros((self.count, SKETCH_WIDTH))
        status = self._lib.canary_digest_plan_run(self._handle, pointers, hashes.ctypes.data_as(_u64p),
                                                  l2.ctypes.data_as(_f64p), projection.ctypes.data_as(_f64p),
                                                  int(threads))
        if status != 0:
            raise MemoryError("canary_digest_plan_run: out of memory")
        return hashes, l2, projection

    def __del__(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.canary_digest_plan_free(handle)


class NativeDigest:
    """A loaded and checked libcanary_harness_digest."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as e:
            raise NativeDigestError(f"{path}: cannot load the digest library ({e})") from None
        lib = self.lib
        try:
            for name, restype, argtypes in (
                ("canary_digest_abi_version", ctypes.c_uint32, []),
                ("canary_digest_sketch_width", ctypes.c_uint32, []),
                ("canary_digest_sketch_block", ctypes.c_uint32, []),
                ("canary_digest_plan_new", ctypes.c_void_p, [ctypes.c_size_t, _u64p, _u64p,
                                                             ctypes.POINTER(ctypes.c_uint8)]),
                ("canary_digest_plan_free", None, [ctypes.c_void_p]),
                ("canary_digest_plan_run", ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), _u64p,
                                                          _f64p, _f64p, ctypes.c_int]),
            ):
                function = getattr(lib, name)
                function.restype, function.argtypes = restype, argtypes
        except AttributeError as e:
            raise NativeDigestError(f"{path}: not a canary-harness digest library ({e})") from None
        self.abi_version = int(lib.canary_digest_abi_version())
        if self.abi_version != ABI_VERSION:
            raise NativeDigestError(f"{path}: digest ABI version {self.abi_version}; this package speaks "
                                    f"{ABI_VERSION} (install the library of the same harness release)")
        width, block = int(lib.canary_digest_sketch_width()), int(lib.canary_digest_sketch_block())
        if (width, block) != (SKETCH_WIDTH, SKETCH_BLOCK):
            raise NativeDigestError(f"{path}: sketch width {width} and block {block}; the receipt schema "
                                    f"has {SKETCH_WIDTH} and {SKETCH_BLOCK}")
        self._probe()

    def plan(self, numels: Sequence[int], salts: Sequence[int], sketched: Sequence[bool]) -> NativePlan:
        return NativePlan(self, numels, salts, sketched)

    def _probe(self) -> None:
        """The library digests a few tensors exactly as the Python code does (a build of other
        sources or flags would not): sizes around the block and lane boundaries, a NaN."""
        values = (np.arange(1, 301, dtype=np.float32) * np.float32(0.37) - np.float32(40.0)) ** 3
        values[17] = np.nan
        arrays = [np.ascontiguousarray(values[:n]) for n in (1, 31, 32, 37, 300)]
        salts = [7, 2 ** 63 + 5, 11, 12345, 2 ** 64 - 1]
        hashes, l2, projection = self.plan([a.size for a in arrays], salts, [True] * len(arrays)).run(arrays)
        python = SketchLayout([a.size for a in arrays], salts, keep_buffers=False).sketch(arrays)
        for i, a in enumerate(arrays):
            expected = np.uint64(tensor_hash(a))
            same_sketch = (np.array(l2[i]).tobytes() == np.array(python[i].l2).tobytes()
                           and projection[i].tobytes() == python[i].projection.tobytes())
            if hashes[i] != expected or not same_sketch:
                raise NativeDigestError(f"{self.path}: digests a {a.size}-element probe tensor differently from "
                                        "canary_harness.receipts.digest (a library of another release or build?)")


def library_candidates(file_name: str, soname: str) -> List[str]:
    """Where "auto" looks for one of the harness's libraries, in order (module docstring):
    `file_name` beside the `harness` that HARNESS_BIN names (the harness a run is judged
    with), then in this package's own directories (where `pip install ./python` puts it),
    then beside the `harness` on PATH, then `soname` (e.g. "canary_harness_digest") on the
    system's library path."""
    named, on_path = os.environ.get("HARNESS_BIN") or "", shutil.which("harness") or ""
    found = _beside_harness(named, file_name) + _in_package(file_name) + _beside_harness(on_path, file_name)
    found = [path for i, path in enumerate(found) if path not in found[:i] and os.path.exists(path)]
    system = ctypes.util.find_library(soname)  # a soname: the loader resolves it
    if system:
        found.append(system)
    return found


def _beside_harness(executable: str, file_name: str) -> List[str]:
    """`file_name` in the lib directories of the prefix `executable` lies in (bin/harness:
    the build tree's and `cmake --install`'s layout)."""
    if not executable or not os.path.isfile(executable):
        return []
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(executable)))
    multiarch = getattr(sys.implementation, "_multiarch", "") or ""
    libdirs = ["lib"] + ([os.path.join("lib", multiarch)] if multiarch else [])
    return [os.path.join(prefix, libdir, file_name) for libdir in libdirs]


def _in_package(file_name: str) -> List[str]:
    """`file_name` in each directory of the package (canary_harness, where the build installs
    the libraries; this module lies in one of its rooms): an installed wheel's one, or, in an
    editable install, the one its built files went to beside the sources."""
    package = sys.modules.get((__package__ or "").partition(".")[0])
    return [os.path.join(directory, file_name) for directory in getattr(package, "__path__", [])]


_lock = threading.Lock()
_loaded: dict = {}  # setting of CANARY_HARNESS_DIGEST -> Optional[NativeDigest]


def native_digest() -> Optional[NativeDigest]:
    """The digest library CANARY_HARNESS_DIGEST selects (module docstring), or None for
    pure Python; loaded and checked once per setting. Raises NativeDigestError when the
    variable names a library that cannot be used."""
    setting = os.environ.get(ENV, "").strip()
    with _lock:
        if setting not in _loaded:
            _loaded[setting] = _select(setting)
        return _loaded[setting]


def _select(setting: str) -> Optional[NativeDigest]:
    if setting == "python":
        return None
    if setting not in ("", "auto"):
        if not os.path.exists(setting):
            raise NativeDigestError(f"{ENV}={setting}: no such file (a path to {LIBRARY_FILE}, 'auto' or 'python')")
        return NativeDigest(os.path.abspath(setting))  # a bare name would send the loader searching
    candidates = library_candidates(LIBRARY_FILE, "canary_harness_digest")
    for path in candidates:
        try:
            return NativeDigest(path)
        except NativeDigestError as e:
            warnings.warn(f"canary_harness: not using {path}: {e}; digesting in Python", RuntimeWarning, stacklevel=3)
    # Said once per process (the selection is cached): the numpy digest gives the same bits,
    # several times slower, which a recording's cost shows.
    why = "none of the libraries found is usable (above)" if candidates else \
        f"no {LIBRARY_FILE} found next to `harness` (HARNESS_BIN or PATH), in the package or on the library path"
    print(f"canary_harness: digesting in Python (numpy): {why}; set HARNESS_BIN or {ENV}=PATH for the faster "
          f"library, or {ENV}=python to choose this (docs/python.md)", file=sys.stderr)
    return None
