"""The harness's receipt writer, libcanary_harness_receipt, through ctypes.

The shared library the C++ build makes (harness/receipt/receipt_c_api.h) writes receipts
with the very code `harness run` writes with: ReceiptWriter (receipt.py) checks a step's
values and hands them here, so one writer holds the file format. ctypes releases the GIL
around every foreign call, so the HDF5 write of a step runs beside the training thread's
Python (the Recorder writes from a background thread).

Which library writes is chosen by the environment variable CANARY_HARNESS_WRITER:
  unset, "" or "auto"  the first one found that passes the checks, or an error naming where
                       it looked (an installed package carries one: docs/python.md, "Install");
  a path               that library, or an error naming the path and why.
"auto" looks where the digest library is looked for (native.library_candidates). A library
is used only when its ABI version is CANARY_RECEIPT_ABI_VERSION and it writes the schema
version and minor of this package's receipt description.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple, Type, Union

import numpy as np

from .native import library_candidates
from .schema import DESCRIPTION_FILE, SCHEMA_MINOR, SCHEMA_VERSION, SKETCH_WIDTH

ENV = "CANARY_HARNESS_WRITER"
ABI_VERSION = 1  # CANARY_RECEIPT_ABI_VERSION in receipt_c_api.h
LIBRARY_FILE = f"libcanary_harness_receipt.so.{ABI_VERSION}"
ERROR_BYTES = 1024

_u64p = ctypes.POINTER(ctypes.c_uint64)
_i64p = ctypes.POINTER(ctypes.c_int64)
_i32p = ctypes.POINTER(ctypes.c_int32)
_f64p = ctypes.POINTER(ctypes.c_double)
_f32p = ctypes.POINTER(ctypes.c_float)
_u8p = ctypes.POINTER(ctypes.c_uint8)
_strings = ctypes.POINTER(ctypes.c_char_p)
_error = [ctypes.c_char_p, ctypes.c_size_t]  # every call's last two arguments

AttrValue = Union[str, int, float]


class NativeWriterError(ValueError):
    """The library CANARY_HARNESS_WRITER names cannot be used (the message says why)."""


class _Attribute(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("kind", ctypes.c_int32), ("text", ctypes.c_char_p),
                ("integer", ctypes.c_int64), ("real", ctypes.c_double)]


def _signatures() -> List[Tuple[str, Any, List[Any]]]:
    return [
        ("canary_receipt_abi_version", ctypes.c_uint32, []),
        ("canary_receipt_schema_version", ctypes.c_int64, []),
        ("canary_receipt_schema_minor", ctypes.c_int64, []),
        ("canary_receipt_create", ctypes.c_void_p,
         [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(_Attribute),
          ctypes.c_size_t, _strings, ctypes.c_int32, ctypes.c_int32, *_error]),
        ("canary_receipt_stage_state", ctypes.c_int,
         [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, _strings, ctypes.c_size_t, _strings, _f64p, *_error]),
        ("canary_receipt_stage_trace", ctypes.c_int,
         [ctypes.c_void_p, ctypes.c_size_t, _i64p, _i64p, _strings, _strings, _strings, _strings, _u64p, _f64p, _f64p,
          *_error]),
        ("canary_receipt_append_step", ctypes.c_int,
         [ctypes.c_void_p, ctypes.c_double, ctypes.c_double, ctypes.c_double, ctypes.c_uint64, _u64p, _f64p, _f64p,
          _i32p, *_error]),
        ("canary_receipt_declare_checkpoints", ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64, *_error]),
        ("canary_receipt_add_checkpoint", ctypes.c_int,
         [ctypes.c_void_p, ctypes.c_int64, _u8p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, *_error]),
        ("canary_receipt_declare_eval", ctypes.c_int,
         [ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32,
          ctypes.c_int32, _i32p, *_error]),
        ("canary_receipt_add_eval", ctypes.c_int,
         [ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, _f32p, ctypes.c_double, *_error]),
        ("canary_receipt_dump_tensor", ctypes.c_int,
         [ctypes.c_void_p, ctypes.c_int64, ctypes.c_char_p, ctypes.c_size_t, _i64p, _f32p, *_error]),
        ("canary_receipt_finish", ctypes.c_int, [ctypes.c_void_p, *_error]),
        ("canary_receipt_close", None, [ctypes.c_void_p, ctypes.c_int]),
    ]


def _pointer(array: np.ndarray, pointer_type: Any) -> Any:
    return array.ctypes.data_as(pointer_type)


def _c_strings(values: Sequence[str]) -> Any:
    return (ctypes.c_char_p * len(values))(*(v.encode("utf-8") for v in values))


class ReceiptLibrary:
    """A loaded and checked libcanary_harness_receipt."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as e:
            raise NativeWriterError(f"{path}: cannot load the receipt library ({e})") from None
        try:
            for name, restype, argtypes in _signatures():
                function = getattr(self.lib, name)
                function.restype, function.argtypes = restype, argtypes
        except AttributeError as e:
            raise NativeWriterError(f"{path}: not a canary-harness receipt library ({e})") from None
        abi = int(self.lib.canary_receipt_abi_version())
        if abi != ABI_VERSION:
            raise NativeWriterError(f"{path}: receipt ABI version {abi}; this package speaks {ABI_VERSION} (install "
                                    "the library of the same harness release)")
        written = (int(self.lib.canary_receipt_schema_version()), int(self.lib.canary_receipt_schema_minor()))
        if written != (SCHEMA_VERSION, SCHEMA_MINOR):
            raise NativeWriterError(f"{path}: writes receipt schema {written[0]}.{written[1]}; this package's "
                                    f"description is {SCHEMA_VERSION}.{SCHEMA_MINOR} (a library of another release)")
        self.description = DESCRIPTION_FILE.read_bytes()

    def create(self, path: str, overwrite: bool, attrs: Mapping[str, AttrValue], tensor_names: Sequence[str],
               batch_shape: Optional[Tuple[int, int]], error: Type[Exception]) -> "NativeReceipt":
        return NativeReceipt(self, path, overwrite, attrs, tensor_names, batch_shape, error)


def _attributes(attrs: Mapping[str, AttrValue]) -> Any:
    array = (_Attribute * len(attrs))()
    for entry, (name, value) in zip(array, attrs.items()):
        entry.name = name.encode("utf-8")
        if isinstance(value, str):
            entry.kind, entry.text = 0, value.encode("utf-8")
        elif isinstance(value, (bool, int, np.integer)):
            entry.kind, entry.integer = 1, int(value)
        else:
            entry.kind, entry.real = 2, float(value)
    return array


class NativeReceipt:
    """One receipt being written by the library: the C API's calls with numpy arrays, each
    failure raised as `error` with the library's one-line message (it names the file)."""

    def __init__(self, library: ReceiptLibrary, path: str, overwrite: bool, attrs: Mapping[str, AttrValue],
                 tensor_names: Sequence[str], batch_shape: Optional[Tuple[int, int]], error: Type[Exception]) -> None:
        self._handle: Optional[int] = None  # (set first: __del__ runs after a failed create too)
        self._lib = library.lib
        self._error_type = error
        self._message = ctypes.create_string_buffer(ERROR_BYTES)
        self.tensors = len(tensor_names)
        rows, length = batch_shape or (0, 0)
        handle = self._lib.canary_receipt_create(path.encode("utf-8"), int(overwrite), library.description,
                                                 len(attrs), _attributes(attrs), self.tensors,
                                                 _c_strings(tensor_names), rows, length, self._message, ERROR_BYTES)
        if not handle:
            raise error(self._message.value.decode("utf-8", "replace"))
        self._handle = handle

    def _call(self, function: Callable[..., int], *args: Any) -> None:
        if self._handle is None:
            raise self._error_type("the receipt writer is closed")
        if function(self._handle, *args, self._message, ERROR_BYTES) != 0:
            raise self._error_type(self._message.value.decode("utf-8", "replace"))

    def stage_state(self, group: str, columns: Sequence[str], fields: Sequence[Tuple[str, np.ndarray]]) -> None:
        values = np.ascontiguousarray(np.concatenate([np.atleast_1d(row) for _, row in fields]), dtype=np.float64)
        self._call(self._lib.canary_receipt_stage_state, group.encode("utf-8"), len(columns), _c_strings(columns),
                   len(fields), _c_strings([name for name, _ in fields]), _pointer(values, _f64p))

    def stage_trace(self, columns: Optional[Sequence[Any]], hashes: np.ndarray, l2: np.ndarray,
                    projection: np.ndarray) -> None:
        """columns: the TraceColumns at the first traced step, None after it."""
        hashes = np.ascontiguousarray(hashes, dtype=np.uint64)
        l2 = np.ascontiguousarray(l2, dtype=np.float64)
        projection = np.ascontiguousarray(projection, dtype=np.float64)
        identity: List[Any] = [None] * 6
        if columns is not None:
            op_index = np.array([c.op_index for c in columns], dtype=np.int64)
            layer = np.array([c.layer for c in columns], dtype=np.int64)
            identity = [_pointer(op_index, _i64p), _pointer(layer, _i64p),
                        *(_c_strings([getattr(c, field) for c in columns]) for field in ("op", "phase", "tensor", "kind"))]
        self._call(self._lib.canary_receipt_stage_trace, len(hashes), *identity, _pointer(hashes, _u64p),
                   _pointer(l2, _f64p), _pointer(projection, _f64p))

    def append_step(self, loss: float, grad_norm: float, lr: float, batch_hash: int, hashes: np.ndarray,
                    l2: np.ndarray, projection: np.ndarray, tokens: Optional[np.ndarray]) -> None:
        """hashes (4, K) uint64, l2 (2, K), projection (2, K, SKETCH_WIDTH); tokens (B, T+1) or None."""
        hashes = np.ascontiguousarray(hashes, dtype=np.uint64)
        l2 = np.ascontiguousarray(l2, dtype=np.float64)
        projection = np.ascontiguousarray(projection, dtype=np.float64)
        if hashes.size != 4 * self.tensors or l2.size != 2 * self.tensors or \
                projection.size != 2 * self.tensors * SKETCH_WIDTH:
            raise self._error_type(f"append_step: rows for {self.tensors} tensors expected")
        token_pointer = None
        if tokens is not None:
            tokens = np.ascontiguousarray(tokens, dtype=np.int32)
            token_pointer = _pointer(tokens, _i32p)
        self._call(self._lib.canary_receipt_append_step, float(loss), float(grad_norm), float(lr), int(batch_hash),
                   _pointer(hashes, _u64p), _pointer(l2, _f64p), _pointer(projection, _f64p), token_pointer)

    def declare_checkpoints(self, every: int) -> None:
        self._call(self._lib.canary_receipt_declare_checkpoints, int(every))

    def add_checkpoint(self, step: int, state: bytes) -> str:
        content_hash = ctypes.create_string_buffer(64)
        data = np.frombuffer(state, dtype=np.uint8)
        self._call(self._lib.canary_receipt_add_checkpoint, int(step), _pointer(data, _u8p), data.size,
                   content_hash, len(content_hash))
        return content_hash.value.decode("ascii")

    def declare_eval(self, every: int, held_out_hash: int, source: str, targets: np.ndarray, vocab: int) -> None:
        targets = np.ascontiguousarray(targets, dtype=np.int32)
        self._call(self._lib.canary_receipt_declare_eval, int(every), int(held_out_hash), source.encode("utf-8"),
                   targets.shape[0], targets.shape[1], int(vocab), _pointer(targets, _i32p))

    def add_eval(self, step: int, loss: float, logits: np.ndarray, compiles: float) -> None:
        logits = np.ascontiguousarray(logits, dtype=np.float32)
        self._call(self._lib.canary_receipt_add_eval, int(step), float(loss), _pointer(logits, _f32p), float(compiles))

    def dump_tensor(self, step: int, name: str, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=np.float32)
        shape = np.array(values.shape, dtype=np.int64)
        self._call(self._lib.canary_receipt_dump_tensor, int(step), name.encode("utf-8"), values.ndim,
                   _pointer(shape, _i64p), _pointer(values, _f32p))

    def finish(self) -> None:
        self._call(self._lib.canary_receipt_finish)

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self, discard: bool = False) -> None:
        """Frees the writer: an unfinished receipt keeps its steps (complete = 0), a damaged one
        goes; `discard`: the file goes in any case."""
        handle, self._handle = self._handle, None
        if handle is not None:
            self._lib.canary_receipt_close(handle, int(discard))

    def __del__(self) -> None:
        self.close()


_lock = threading.Lock()
_loaded: dict = {}  # setting of CANARY_HARNESS_WRITER -> ReceiptLibrary


def receipt_library() -> ReceiptLibrary:
    """The library CANARY_HARNESS_WRITER selects (module docstring), loaded and checked once
    per setting. Raises NativeWriterError when none is found or the one named cannot be used."""
    setting = os.environ.get(ENV, "").strip()
    with _lock:
        if setting not in _loaded:
            _loaded[setting] = _select(setting)
        return _loaded[setting]


def _select(setting: str) -> ReceiptLibrary:
    if setting not in ("", "auto"):
        if not os.path.exists(setting):
            raise NativeWriterError(f"{ENV}={setting}: no such file (a path to {LIBRARY_FILE}, or 'auto')")
        return ReceiptLibrary(os.path.abspath(setting))
    candidates = library_candidates(LIBRARY_FILE, "canary_harness_receipt")
    problems = []
    for path in candidates:
        try:
            return ReceiptLibrary(path)
        except NativeWriterError as e:
            problems.append(str(e))
    why = "; ".join(problems) if problems else \
        f"no {LIBRARY_FILE} found next to `harness` (HARNESS_BIN or PATH), in the package or on the library path"
    raise NativeWriterError(f"no receipt writer: {why}; install the package with pip (it carries the library), "
                            f"or set HARNESS_BIN to a built harness or {ENV} to the library (docs/python.md, "
                            "\"Install\")")
