"""Receipts (docs/receipt-schema.md): the HDF5 file one training run leaves behind.

ReceiptWriter checks a step's values here and writes them through the harness's own writer
(harness/receipt/receipt_writer.cpp behind its C ABI: receipt_native.py), so a Python
receipt is the format `harness run` writes, and `harness check`/`inspect` judge it like a
C++ one: HDF5 1.10 (checksummed metadata), fixed-length strings, Fletcher32 on every
dataset, one flushed row per step in SWMR mode (a run killed at step k leaves a readable
receipt of k steps with `complete` = 0).

ReceiptReader reads both that format and the older one (variable-length strings, no
schema_minor). Every failure either side can meet in a file is a ReceiptError whose
message starts with the file's path.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from typing import Any, Dict, List, Mapping, NamedTuple, NoReturn, Optional, Sequence, Tuple, Union

import h5py
import numpy as np
import xxhash

from .budget_features import parse_features

from . import digest
from .digest import Sketch, as_float32, sketch, tensor_hash
from .schema import (CHECKPOINTS_IN_RECEIPT, HASH_FAMILIES, PATHS, SCHEMA_MINOR, SCHEMA_VERSION, SKETCH_FAMILIES,
                     SKETCH_WIDTH, attribute_entry, dataset_entry, dataset_rank, hashes_path, sketch_paths)
from .receipt_native import AttrValue, NativeReceipt, NativeWriterError, receipt_library
from .stack import StackInfo, collect_stack_info

PathLike = Union[str, "os.PathLike[str]"]
SketchLike = Union[Sketch, Tuple[float, Sequence[float]]]


class SketchRows(NamedTuple):
    """A family's sketches as two arrays: l2 (K,) and projection (K, SKETCH_WIDTH), float64,
    tensors in canonical order (what digest.DigestRows holds): append_step takes them as
    they are, without a (l2, projection) pair per tensor."""

    l2: np.ndarray
    projection: np.ndarray


class StoredCheckpoint(NamedTuple):
    """A checkpoint held in the receipt: the state at the start of `step`."""

    step: int
    content_hash: str
    offset: int
    length: int


# /checkpoints held in the receipt (Python canaries): the storage attribute's value.
CHECKPOINT_STORAGE = CHECKPOINTS_IN_RECEIPT
TRACE_TEXT_FIELDS = ("op", "phase", "tensor", "kind")  # /trace's string columns, PATHS["trace_<field>"]


class ReceiptError(ValueError):
    """A receipt that cannot be written or read as asked; the message starts with its path.
    A ValueError, as the writer's argument errors were before they named the path."""


class TraceColumn(NamedTuple):
    """One traced op output (`--trace ops`): a column of /trace (TraceColumn in receipt_writer.h).

    op_index numbers the step's traced ops in execution order (the outputs of one op share
    it); op is the op's site (`blocks.2.attn.proj`, `loss`, `optimizer`, or a parameter
    name for its AdamW update); layer the block index, -1 outside the blocks; phase
    `forward`, `backward` or `optimizer`; tensor and kind the output's table name and kind
    (`activation`, `activation_grad`, `gradient`, `parameter`, `scalar`).
    """

    op_index: int
    op: str
    layer: int
    phase: str
    tensor: str
    kind: str


# One step of /trace: the columns (the same every step), and per column the output's
# hash and sketch (an (l2, projection) pair, as append_step's sketches).
TraceRow = Tuple[Sequence[TraceColumn], Sequence[int], Sequence["SketchLike"]]
# One state group as the rows the library stages: (group, columns, [(field, float64 row)]).
StateRows = Tuple[str, List[str], List[Tuple[str, np.ndarray]]]


class StepState(NamedTuple):
    """A group of per-step state with columns, as the C++ writer's StepState (engine.h): the
    group (`routing`), its columns (`names`, one per deciding op), and per field one value
    per column (moe's routing records). Every path must be in the receipt description."""

    group: str
    columns: Sequence[str]
    fields: Sequence[Tuple[str, Sequence[float]]]


# ---- a step's values, checked and converted before the first row is written -----------------

U64_MAX = 2**64 - 1


def _number(field: str, value: Any) -> float:
    """A real number (int, float, numpy scalar, or a 1-element array/tensor) as float."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    if _is_real_scalar_tensor(value):  # the loss as the step left it: with grad, bf16, on a device
        return float(value.detach().to(device="cpu", dtype=torch_module().float64))
    try:
        array = np.asarray(value)
    except Exception:  # noqa: BLE001 -- anything numpy cannot take is not a number
        array = None
    if array is None or array.size != 1 or array.dtype.kind not in "iuf":
        raise ValueError(f"{field} is {value!r:.60}, not a number")
    return float(array.reshape(()))


def torch_module() -> Any:
    """torch, imported where a tensor is given (torch is optional for the package)."""
    import torch

    return torch


def _is_real_scalar_tensor(value: Any) -> bool:
    """A torch tensor of one real (floating or integer, not bool or complex) element; False
    without importing torch when torch is not loaded (then no tensor can be given)."""
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor) and value.numel() == 1 \
        and not value.is_complex() and value.dtype != torch.bool


def _uint64(field: str, value: Any) -> int:
    """A hash: a Python or numpy integer in 0..2**64-1; never a float, a bool or a str."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or not 0 <= int(value) <= U64_MAX:
        raise ValueError(f"{field} is {value!r:.60}, not an integer in 0..2**64-1")
    return int(value)


def _uint64_row(field: str, values: Any, count: int) -> np.ndarray:
    """`count` hashes as uint64: a uint64 array as it is, else every value checked (_uint64)."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind not in "iu":
            raise ValueError(f"{field} holds {values.dtype} values, not integer hashes")
        if values.shape != (count,):
            raise ValueError(f"{field} has shape {values.shape}: it must hold {count} hashes, one per tensor")
        if values.dtype.kind == "i" and (values < 0).any():
            raise ValueError(f"{field} holds a negative value, not a hash in 0..2**64-1")
        return values.astype(np.uint64, copy=False)
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ValueError(f"{field} is {values!r:.60}, not a sequence of {count} hashes")
    if len(values) != count:
        raise ValueError(f"{field} must hold {count} hashes, one per tensor, not {len(values)}")
    return np.array([_uint64(f"{field}[{i}]", v) for i, v in enumerate(values)], dtype=np.uint64)


def _float_rows(field: str, values: Any, shape: Tuple[int, ...]) -> np.ndarray:
    """Numbers of `shape` as float64: ints and floats only (no str, no ragged rows)."""
    try:
        array = np.asarray(values)
    except (TypeError, ValueError):  # ragged rows
        array = None
    if array is None or array.dtype.kind not in "iuf":
        raise ValueError(f"{field} is not an array of numbers" +
                         (f" ({array.dtype})" if array is not None else " (rows of different lengths)"))
    if array.shape != shape:
        raise ValueError(f"{field} has shape {array.shape}, not {shape}" +
                         (f": every projection must hold {SKETCH_WIDTH} numbers" if shape[-1:] == (SKETCH_WIDTH,)
                          else ""))
    return array.astype(np.float64, copy=False)


def _sketch_rows(field: str, given: Any, count: int) -> Tuple[np.ndarray, np.ndarray]:
    """`count` sketches (a SketchRows, or (l2, projection) pairs) as l2 (count,) and projection (count, W)."""
    if isinstance(given, SketchRows):
        return (_float_rows(f"{field}.l2", given.l2, (count,)),
                _float_rows(f"{field}.projection", given.projection, (count, SKETCH_WIDTH)))
    if isinstance(given, (str, bytes)) or not hasattr(given, "__len__") or len(given) != count:
        raise ValueError(f"{field} must hold {count} (l2, projection) pairs, one per tensor")
    l2, projection = [], []
    for i, pair in enumerate(given):
        if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise ValueError(f"{field}[{i}] is not an (l2, projection) pair")
        l2.append(_number(f"{field}[{i}] l2", pair[0]))
        projection.append(_float_rows(f"{field}[{i}] projection", pair[1], (SKETCH_WIDTH,)))
    return np.array(l2, dtype=np.float64), np.array(projection, dtype=np.float64).reshape(count, SKETCH_WIDTH)


def utc_timestamp() -> str:
    """ISO 8601 to the second with a Z, as the C++ writes created_utc."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- writing ---------------------------------------------------------------------------------

_REQUIRED = ("lane", "engine", "budget_features", "canary", "seed", "steps_planned")
_WRITER_OWNED = ("schema_version", "schema_minor", "complete")


def _canary_json(canary: Union[str, Mapping[str, Any]]) -> str:
    """The canary as compact JSON text with sorted keys (as nlohmann's dump() writes it)."""
    if not isinstance(canary, (str, Mapping)):
        raise ValueError(f"manifest canary is a {type(canary).__name__}; give the canary JSON object (text or a dict)")
    if isinstance(canary, str):
        try:
            parsed = json.loads(canary)
        except json.JSONDecodeError as e:
            raise ValueError(f"manifest canary is not JSON: {e}") from None
        if not isinstance(parsed, dict):
            raise ValueError("manifest canary is not a JSON object")
        return canary
    try:
        return json.dumps(dict(canary), separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as e:  # a set, a NaN, a key that is no str/number ...
        raise ValueError(f"manifest canary does not convert to JSON ({e})") from None


def _check_attr_value(what: str, value: Any) -> None:
    """A manifest attribute HDF5 stores as given: str as UTF-8 without NUL, ints in int64."""
    if isinstance(value, str):
        if "\0" in value:
            raise ValueError(f"{what} holds a NUL character (a fixed-length HDF5 string ends there)")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{what} is not UTF-8 text ({e})") from None
    elif isinstance(value, (int, np.integer)) and not -2**63 <= int(value) < 2**63:
        raise ValueError(f"{what} is {value}, outside int64 (-2**63..2**63-1)")


_KIND_WORDS = {"string": "a str", "integer": "an int", "float": "a float"}


def _is_of_kind(value: Any, entry: Optional[Mapping[str, Any]]) -> bool:
    """Whether `value` has the type the description gives its attribute (any, where none is described)."""
    if entry is None:
        return True
    if entry["kind"] == "integer":
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if entry["kind"] == "float":
        return isinstance(value, (float, np.floating))
    return isinstance(value, str)


def _manifest_attrs(manifest: Mapping[str, Any], stack: StackInfo) -> Dict[str, AttrValue]:
    """Validates the caller's manifest and completes it, before anything touches the disk."""
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing:
        # budget_features above all is declared, never guessed (docs/budgets.md): "" for a bitwise lane.
        raise ValueError(f"manifest lacks {', '.join(missing)}; give every one of {', '.join(_REQUIRED)}")
    owned = [k for k in _WRITER_OWNED if k in manifest]
    if owned:
        raise ValueError(f"manifest sets {', '.join(owned)}: the writer owns these")
    attrs: Dict[str, AttrValue] = {
        "schema_version": SCHEMA_VERSION,
        "schema_minor": SCHEMA_MINOR,
        "features": "",
        "threads": 1,
        "complete": 0,
        "created_utc": utc_timestamp(),
        "git_commit": "unknown",
        **stack.as_manifest(),
    }
    for key, value in manifest.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"manifest key {key!r} is not a non-empty str")
        if key == "canary":
            value = _canary_json(value)
        elif key in ("seed", "steps_planned", "threads"):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"manifest {key} must be an int, not {type(value).__name__}")
            value = int(value)
            if value < 0 or value >= 2**63:
                raise ValueError(f"manifest {key} is {value}; give an int in 0..2**63-1")
        elif key in ("lane", "engine") and (not isinstance(value, str) or not value):
            raise ValueError(f"manifest {key} is {value!r}: a non-empty str (it names the lane's goldens and budgets)")
        elif key in ("features", "budget_features") and not isinstance(value, str):
            raise TypeError(f"manifest {key} must be a str, not {type(value).__name__}")
        elif key == "budget_features":
            try:
                parse_features(value)
            except ValueError as e:  # what `harness validate` refuses, refused before any file exists
                raise ValueError(f"manifest budget_features: {e}") from None
        elif not _is_of_kind(value, attribute_entry("/manifest", key)):
            kind = attribute_entry("/manifest", key)["kind"]  # type: ignore[index]
            raise TypeError(f"manifest {key} must be {_KIND_WORDS[kind]} (the receipt schema's type), "
                            f"not {type(value).__name__}")
        elif not isinstance(value, (str, int, float, np.integer, np.floating)):
            raise TypeError(f"manifest {key}: {type(value).__name__} is not a str, int or float")
        _check_attr_value(f"manifest {key}", value)
        attrs[key] = value
    if attrs["steps_planned"] < 0:
        raise ValueError("manifest steps_planned must be >= 0")
    return attrs


def _receipt_path(path: Any) -> str:
    """The receipt's path as str: a str or os.PathLike of str, not empty."""
    if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str) or not os.fspath(path):
        raise ReceiptError(f"{path!r}: not a receipt path; give a non-empty str or os.PathLike file path")
    return os.fspath(path)


def _tensor_names(names: Any) -> List[str]:
    if isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
        raise TypeError(f"tensor_names is {names!r:.60}; give a list of str")
    names = list(names)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError("tensor_names must be a non-empty list of non-empty strings")
    if len(set(names)) != len(names):
        raise ValueError("tensor_names has duplicates")
    for n in names:
        _check_attr_value(f"tensor name {n!r:.40}", n)
    return names


def _batch_shape(shape: Any) -> Optional[Tuple[int, int]]:
    """batch_shape: None, or (B, T+1), two positive ints."""
    if shape is None:
        return None
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__len__") or len(shape) != 2 or not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) and 0 < int(d) < 2**31 for d in shape):
        raise ValueError(f"batch_shape is {shape!r:.60}; give (B, T+1), two positive ints")
    return (int(shape[0]), int(shape[1]))


def _check_target(path: str, overwrite: bool) -> None:
    """Where the receipt goes: refused, with what to do, before anything is created."""
    if os.path.isdir(path):
        raise ReceiptError(f"{path}: is a directory; give a file path for the receipt")
    if os.path.islink(path) and not os.path.exists(path):
        raise ReceiptError(f"{path}: is a symlink to a missing file ({os.readlink(path)}); remove the link or "
                           "give another path")
    if not overwrite and os.path.lexists(path):
        raise ReceiptError(f"{path}: exists; pass overwrite=True to replace it")
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise ReceiptError(f"{path}: directory {directory} does not exist; create it first")


class ReceiptWriter:
    """Writes a receipt as the run goes, through the harness's writer library
    (receipt_native.receipt_library: a ReceiptError naming where it looked when none is
    found): the manifest first, then one flushed row per step.

    Between steps the file is in SWMR mode (single writer, multiple readers). The 1.10
    format marks a file open for write in its superblock, and a process killed with the
    mark set leaves a file that no ordinary open accepts ("file is already open for
    write"); a file marked by an SWMR writer stays readable with an SWMR-read open, which
    ReceiptReader falls back to. A write that fails part-way (a full disk) removes the file.

    `manifest` needs lane, engine, budget_features, canary (JSON text or a dict), seed and
    steps_planned; features, threads, created_utc, git_commit and the stack attributes
    have defaults; any other key is written as an extra attribute (str, int or float).
    `batch_shape` = (B, T+1) records every batch's tokens in /batches/tokens.
    """

    def __init__(self, path: PathLike, manifest: Mapping[str, Any], tensor_names: Sequence[str], *,
                 overwrite: bool = False, batch_shape: Optional[Tuple[int, int]] = None,
                 stack: Optional[StackInfo] = None) -> None:
        self.path = _receipt_path(path)
        try:  # every argument checked before anything touches the disk
            self.tensor_names: List[str] = _tensor_names(tensor_names)
            attrs = _manifest_attrs(manifest, stack or collect_stack_info())
            self._batch_shape = _batch_shape(batch_shape)
        except (TypeError, ValueError) as e:
            raise ReceiptError(f"{self.path}: {e}; nothing is written") from None
        self.steps_planned = int(attrs["steps_planned"])
        self.steps_recorded = 0
        self.finished = False
        _check_target(self.path, overwrite)
        # What step 0 fixes for every later step (set as it is written).
        self._trace_columns: Optional[List[TraceColumn]] = None  # /trace
        self._compile_names: Optional[List[str]] = None  # /compile
        self._state_shape: Optional[List[Tuple[str, List[str], List[str]]]] = None  # groups, columns, fields
        self._eval_shape: Optional[Tuple[int, ...]] = None  # /eval/logits' row
        try:
            library = receipt_library()
        except NativeWriterError as e:
            raise ReceiptError(f"{self.path}: {e}; nothing is written") from None
        self._native: NativeReceipt = library.create(self.path, overwrite, attrs, self.tensor_names,
                                                     self._batch_shape, ReceiptError)

    def _open_native(self) -> NativeReceipt:
        """The library's writer; refused once closed."""
        if self._native.closed:
            raise ReceiptError(f"{self.path}: the writer is closed")
        return self._native

    def _check_trace(self, trace: Optional[TraceRow]) -> Optional[Tuple[List[TraceColumn], np.ndarray, np.ndarray,
                                                                         np.ndarray]]:
        if trace is None:
            if self._trace_columns is not None:
                raise ValueError("this receipt traces ops: pass trace= at every step")
            return None
        if isinstance(trace, (str, bytes)) or not hasattr(trace, "__len__") or len(trace) != 3:
            raise ValueError(f"trace is {trace!r:.60}, not (columns, hashes, sketches)")
        columns, hashes, sketches = trace
        try:
            columns = [c if isinstance(c, TraceColumn) else TraceColumn(*c) for c in columns]
        except TypeError as e:
            raise ValueError(f"trace: columns are not TraceColumns ({e})") from None
        for c in columns:
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (c.op_index, c.layer)) or \
                    not all(isinstance(v, str) for v in (c.op, c.phase, c.tensor, c.kind)):
                raise ValueError(f"trace: column {tuple(c)!r:.80} is not (int, str, int, str, str, str)")
        if not columns:
            raise ValueError("trace: no traced op output")
        if self._trace_columns is None and self.steps_recorded > 0:
            raise ValueError("trace: op traces start at step 0 (a receipt traces every step or none)")
        if self._trace_columns is not None and columns != self._trace_columns:
            raise ValueError(f"trace: this step traced {len(columns)} outputs, other ones than the first step's "
                             f"{len(self._trace_columns)}; the op sequence must not change from step to step")
        R = len(columns)
        hash_row = _uint64_row("trace hashes", hashes, R)
        l2_row, projection_row = _sketch_rows("trace sketches", sketches, R)
        return columns, hash_row, l2_row, projection_row

    def _check_compile(self, compile: Optional[Mapping[str, float]]) -> Optional[Tuple[List[str], List[float]]]:
        if compile is None:
            if self._compile_names is not None:
                raise ValueError("this receipt records /compile: pass compile= at every step")
            return None
        if not isinstance(compile, Mapping):
            raise ValueError(f"compile is {compile!r:.60}, not a mapping {{counter name: number}}")
        names = list(compile)
        if not names:
            raise ValueError("compile: no counter")
        for name in names:
            if not isinstance(name, str) or not name or "/" in name:
                raise ValueError(f"compile: counter name {name!r} is not a non-empty name without '/'")
        if self._compile_names is None and self.steps_recorded > 0:
            raise ValueError("compile: /compile counters start at step 0 "
                             "(a receipt records them at every step or none)")
        if self._compile_names is not None and names != self._compile_names:
            raise ValueError(f"compile: this step gives the counters {', '.join(names)}, not step 0's "
                             f"{', '.join(self._compile_names)}")
        values = []
        for name in names:
            value = compile[name]
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise ValueError(f"compile: counter {name} is {value!r}, not a number")
            values.append(float(value))
        return names, values

    def _check_state(self, state: Optional[Sequence[StepState]]) -> Optional[List[StateRows]]:
        """The step's state groups as the rows they become (group, columns, [(field, float64
        row)]), checked against step 0's groups, columns and fields and against the receipt
        description; None where the step gives none."""
        if state is None:
            if self._state_shape is not None:
                raise ValueError("this receipt records step state: pass state= at every step")
            return None
        shape, rows = [], []
        for entry in state:
            if not isinstance(entry, StepState):
                raise ValueError(f"state: {entry!r:.60} is not a StepState")
            columns, names = [str(c) for c in entry.columns], [name for name, _ in entry.fields]
            if not columns or not names:  # the library stages values per field and column
                raise ValueError(f"state: group {entry.group!r} has {len(columns)} columns and {len(names)} fields; "
                                 "give at least one of each")
            shape.append((entry.group, columns, names))
            rows.append((entry.group, columns, []))
            for name, values in entry.fields:
                path = f"/{entry.group}/{name}"
                if dataset_entry(path) is None or dataset_entry(f"/{entry.group}/names") is None:
                    raise ValueError(f"state: {path} is not in the receipt description (receipt_schema.json)")
                row = np.asarray(values, dtype="<f8")
                if row.shape != (len(columns),):
                    raise ValueError(f"state: {path} has {row.size} values for {len(columns)} columns")
                rows[-1][2].append((name, row))
        if self._state_shape is None and self.steps_recorded > 0:
            raise ValueError("state: step state starts at step 0 (a receipt records it at every step or none)")
        if self._state_shape is not None and shape != self._state_shape:
            raise ValueError("state: this step's groups, columns or fields are not step 0's")
        return rows

    def append_step(self, *, loss: float, grad_norm: float, lr: float, batch_hash: int,
                    hashes: Mapping[str, Sequence[int]],
                    sketches: Mapping[str, Union[Sequence[SketchLike], SketchRows]],
                    batch_tokens: Any = None, trace: Optional[TraceRow] = None,
                    compile: Optional[Mapping[str, float]] = None,
                    state: Optional[Sequence[StepState]] = None) -> None:
        """One step's row in every per-step dataset, then a flush.

        hashes: family -> K hashes (ints, or a uint64 array) for every HASH_FAMILIES family;
        sketches: family -> K (l2, projection) pairs, or one SketchRows, for every
        SKETCH_FAMILIES family; tensors in tensor_names order. trace: the step's op traces,
        (columns, hashes, sketches) with one hash and one (l2, projection) per TraceColumn; the first traced step (step 0) creates /trace, and
        every later step must trace the same columns. compile: the step's /compile counters
        ({name: number}, float64 (N) datasets, as tpu-mesh's: docs/receipt-schema.md); the first
        step (step 0) creates /compile, and every later step must give the same names. state:
        the step's StepState groups (moe's /routing), described ones only, the same every step.
        Everything is checked before the first row is written, so a bad call leaves every
        dataset with the same number of rows.
        """
        native = self._open_native()
        if self.finished or self.steps_recorded >= self.steps_planned:
            raise ReceiptError(f"{self.path}: all {self.steps_planned} planned steps are recorded; no step can be added")
        try:  # every value converted and checked before the first dataset is touched
            scalars, hash_rows, l2_rows, projection_rows, tokens = self._check_step(
                loss, grad_norm, lr, batch_hash, hashes, sketches, batch_tokens)
            trace_rows = self._check_trace(trace)
            compile_row = self._check_compile(compile)
            state_rows = self._check_state(state)
        except ReceiptError:
            raise
        except ValueError as e:
            raise ReceiptError(f"{self.path}: append_step {self.steps_recorded}: {e}; no row is written") from None
        self._append_native(native, scalars, hash_rows, l2_rows, projection_rows, tokens, trace_rows, compile_row,
                            state_rows)
        self.steps_recorded += 1

    def _append_native(self, native: NativeReceipt, scalars: Dict[str, Any], hash_rows: Dict[str, np.ndarray],
                       l2_rows: Dict[str, np.ndarray], projection_rows: Dict[str, np.ndarray],
                       tokens: Optional[np.ndarray], trace_rows: Any, compile_row: Optional[Tuple[List[str], List[float]]],
                       state_rows: Optional[List[StateRows]]) -> None:
        """append_step's checked rows through the library: the step's state, /compile and trace
        staged, then the step written and flushed (a write that failed removes the file)."""
        for group, columns, fields in state_rows or []:
            native.stage_state(group, columns, fields)
        if compile_row is not None:
            native.stage_state(PATHS["compile"].lstrip("/"), [],
                               [(name, np.array([value])) for name, value in zip(*compile_row)])
        if trace_rows is not None:
            native.stage_trace(trace_rows[0] if self._trace_columns is None else None, *trace_rows[1:])
            self._trace_columns = trace_rows[0]
        native.append_step(scalars["loss"], scalars["grad_norm"], scalars["lr"], int(scalars["batch_hash"]),
                           np.stack([hash_rows[fam] for fam in HASH_FAMILIES]),
                           np.stack([l2_rows[fam] for fam in SKETCH_FAMILIES]),
                           np.stack([projection_rows[fam] for fam in SKETCH_FAMILIES]), tokens)
        if compile_row is not None:
            self._compile_names = compile_row[0]
        if state_rows is not None:
            self._state_shape = [(group, columns, [name for name, _ in fields]) for group, columns, fields in state_rows]

    def _check_step(self, loss: Any, grad_norm: Any, lr: Any, batch_hash: Any, hashes: Any, sketches: Any,
                    batch_tokens: Any) -> Tuple[Dict[str, Any], Dict[str, np.ndarray], Dict[str, np.ndarray],
                                                Dict[str, np.ndarray], Optional[np.ndarray]]:
        """append_step's values as the rows they become; a ValueError naming the field where one is bad."""
        scalars: Dict[str, Any] = {name: _number(name, value)
                                   for name, value in (("loss", loss), ("grad_norm", grad_norm), ("lr", lr))}
        scalars["batch_hash"] = np.uint64(_uint64("batch_hash", batch_hash))
        K = len(self.tensor_names)
        if not isinstance(hashes, Mapping) or not isinstance(sketches, Mapping):
            raise ValueError("hashes and sketches must be mappings {family: values}")
        hash_rows = {}
        for fam in HASH_FAMILIES:
            if fam not in hashes:
                raise ValueError(f"hashes[{fam!r}] must hold {K} hashes, one per tensor (the family is missing)")
            hash_rows[fam] = _uint64_row(f"hashes[{fam!r}]", hashes[fam], K)
        l2_rows, projection_rows = {}, {}
        for fam in SKETCH_FAMILIES:
            l2_rows[fam], projection_rows[fam] = _sketch_rows(f"sketches[{fam!r}]", sketches.get(fam), K)
        tokens = None
        if self._batch_shape is not None:
            if batch_tokens is None:
                raise ValueError("this receipt records batches: pass batch_tokens")
            tokens = np.asarray(batch_tokens)
            if tokens.shape != self._batch_shape:
                raise ValueError(f"batch_tokens has shape {tokens.shape}, not {self._batch_shape}")
        if batch_tokens is not None:
            if digest.batch_hash(batch_tokens) != int(scalars["batch_hash"]):  # also: int32 exactly, or ValueError
                raise ValueError("batch_hash is not the hash of batch_tokens")
            if tokens is not None:
                tokens = tokens.astype("<i4")
        return scalars, hash_rows, l2_rows, projection_rows, tokens

    def record_step(self, *, loss: float, grad_norm: float, lr: float, batch: Any,
                    params: Union[Mapping[str, Any], Sequence[Any]], grads: Union[Mapping[str, Any], Sequence[Any]],
                    adam_m: Union[Mapping[str, Any], Sequence[Any]],
                    adam_v: Union[Mapping[str, Any], Sequence[Any]], trace: Optional[TraceRow] = None) -> None:
        """append_step from the tensors themselves: hashes, sketches and the batch hash computed here.

        params (after the step's update), grads (after clipping), adam_m, adam_v: by name, or
        sequences in tensor_names order; numpy arrays or torch tensors. batch: the step's
        int32 tokens (B, T+1). trace: as append_step's.
        """
        families = dict(zip(HASH_FAMILIES, (params, grads, adam_m, adam_v)))
        ordered = {fam: self._in_order(fam, tensors) for fam, tensors in families.items()}
        self.append_step(
            loss=loss, grad_norm=grad_norm, lr=lr, batch_hash=digest.batch_hash(batch),
            hashes={fam: [tensor_hash(t) for t in ts] for fam, ts in ordered.items()},
            sketches={fam: [sketch(t, n) for t, n in zip(ordered[fam], self.tensor_names)] for fam in SKETCH_FAMILIES},
            batch_tokens=batch if self._batch_shape is not None else None, trace=trace)

    def _in_order(self, family: str, tensors: Union[Mapping[str, Any], Sequence[Any]]) -> List[Any]:
        if isinstance(tensors, Mapping):
            missing = [n for n in self.tensor_names if n not in tensors]
            if missing:
                raise ValueError(f"{family}: no tensor for {', '.join(missing)}")
            return [tensors[n] for n in self.tensor_names]
        tensors = list(tensors)
        if len(tensors) != len(self.tensor_names):
            raise ValueError(f"{family}: {len(tensors)} tensors for {len(self.tensor_names)} names")
        return tensors

    def declare_checkpoints(self, every: int) -> None:
        """/checkpoints held in the receipt itself (docs/receipt-schema.md, "Checkpoints in
        the receipt"): a Python canary's state every `every` steps. Before the first step."""
        if self.steps_recorded:
            raise ReceiptError(f"{self.path}: checkpoints must be declared before the first step")
        self._open_native().declare_checkpoints(every)

    def append_checkpoint(self, step: int, state: bytes) -> str:
        """The state at the start of `step` (serialized bytes), with its content hash; returns the hash."""
        return self._open_native().add_checkpoint(step, state)

    def declare_eval(self, every: int, held_out_hash: str, source: str, targets: Any, vocab: int) -> None:
        """/eval (docs/receipt-schema.md, schema 1.4): the held-out evaluation's attributes
        and targets (rows, T) int32; then append_eval() once per evaluation."""
        targets = np.ascontiguousarray(targets, dtype="<i4")
        if not isinstance(held_out_hash, str) or not re.fullmatch("[0-9a-f]{16}", held_out_hash):
            raise ReceiptError(f"{self.path}: /eval: held_out_hash is {held_out_hash!r:.40}; give the batch hash as 16 "
                               "lowercase hex digits")
        if targets.ndim != 2 or not 0 < vocab or targets.min(initial=0) < 0 or targets.max(initial=0) >= vocab:
            raise ReceiptError(f"{self.path}: /eval: targets must be (rows, T) ids below the vocabulary {vocab}")
        self._eval_shape = (*targets.shape, int(vocab))
        self._open_native().declare_eval(every, int(held_out_hash, 16), str(source), targets, vocab)

    def append_eval(self, step: int, loss: float, logits: Any, compiles: float = 0.0) -> None:
        """One evaluation: its step, the held-out loss, the recorded rows' logits (rows, T, V)."""
        native = self._open_native()
        logits = np.asarray(logits, dtype="<f4")
        if logits.shape != self._eval_shape:
            raise ReceiptError(f"{self.path}: /eval: logits of shape {logits.shape}, declared {self._eval_shape}")
        native.add_eval(step, loss, logits, compiles)

    def dump_tensors(self, step: int, tensors: Mapping[str, Any]) -> None:
        """/tensors/step_XXXXXX/<name>: float32 values with their shapes (params at the start of `step`)."""
        arrays = {name: as_float32(values) for name, values in tensors.items()}
        native = self._open_native()
        for name, values in arrays.items():  # written by finish(), as the C++ writer's dumps
            native.dump_tensor(step, name, values)

    def finish(self) -> None:
        """complete = 1: every planned step is recorded. Refused before then."""
        native = self._open_native()
        if self.steps_recorded != self.steps_planned:
            raise ReceiptError(f"{self.path}: {self.steps_recorded} of {self.steps_planned} planned steps recorded; "
                               "a receipt is complete only when every planned step is")
        native.finish()
        self.finished = True

    def close(self) -> None:
        """Closes the file; finishes it first if every planned step was recorded."""
        if self._native.closed:
            return
        try:
            if not self.finished and self.steps_recorded == self.steps_planned:
                self.finish()
        finally:
            self._close_file()

    def _close_file(self, discard: bool = False) -> None:
        self._native.close(discard)

    def discard(self, recorded_steps_too: bool = False) -> None:
        """Closes the file and deletes it: for a receipt whose run could not start (its
        owner failed before the first step). Refused once a step is recorded, unless
        `recorded_steps_too`: a run whose input broke its contract part-way (a Python
        canary's batch that changed between calls) leaves no receipt at all."""
        if self.steps_recorded and not recorded_steps_too:
            raise ReceiptError(f"{self.path}: {self.steps_recorded} steps are recorded; a receipt with steps is "
                               "closed, never discarded")
        self._close_file(discard=True)
        if os.path.lexists(self.path):
            os.unlink(self.path)

    def __enter__(self) -> "ReceiptWriter":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:  # an interrupted run stays complete = 0
            self._close_file()


# ---- reading ---------------------------------------------------------------------------------

# What h5py raises where a file is damaged: OSError mostly, but RuntimeError for a bad
# metadata checksum met while iterating or a soft link that loops, and KeyError for an
# object header it cannot parse. Caught only around h5py calls on the file being read.
HDF5_READ_ERRORS = (OSError, RuntimeError, KeyError)

def hdf5_message(error: BaseException) -> str:
    """h5py's message of one of HDF5_READ_ERRORS, without the quotes str() gives a KeyError's."""
    return str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)


def read_failure(dataset: h5py.Dataset, error: BaseException) -> str:
    """Why `dataset`'s values could not be read. Where Fletcher32 is its only filter that
    can fail (no compression), the failure is its checksum's, and it is named so: HDF5 1.10
    says "data error detected by Fletcher32 checksum", HDF5 2.0 only "filter returned failure
    during read"."""
    if dataset.fletcher32 and dataset.compression is None:
        return f"the Fletcher32 checksum failed: {hdf5_message(error)}"
    return hdf5_message(error)


# Deflate compresses at best about 1032:1: a deflated dataset cannot hold more.
DEFLATE_MAX_RATIO = 1032
_UNCOMPRESSING_FILTERS = (h5py.h5z.FILTER_SHUFFLE, h5py.h5z.FILTER_FLETCHER32)


def unstored(dataset: h5py.Dataset, file_size: int, growing: bool = False) -> Optional[str]:
    """Why `dataset` declares more values than the file can hold, or None when it can.

    h5py allocates a dataset's whole extent before it reads a byte, so a forged shape (2**40
    rows, chunked, nothing written) would be a MemoryError, or terabytes of fill values,
    rather than an error naming it. Every value of a receipt or a pack is written, so what
    the dataset stores (at most the file's size; times deflate's best ratio where its chunks
    are compressed) bounds what it may declare. `growing`: one row of chunks may be missing,
    what a writer killed between extending a dataset and flushing its row can leave.
    """
    declared = int(dataset.size) * dataset.dtype.itemsize
    if declared == 0:
        return None
    stored = min(dataset.id.get_storage_size(), file_size)
    plist = dataset.id.get_create_plist()
    filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
    ratio = 1 if all(f in _UNCOMPRESSING_FILTERS for f in filters) else DEFLATE_MAX_RATIO
    spare = 0
    if growing and dataset.chunks is not None:
        chunks_per_row = np.prod([-(-d // c) for d, c in zip(dataset.shape[1:], dataset.chunks[1:])], dtype=object)
        spare = int(chunks_per_row) * int(np.prod(dataset.chunks, dtype=object)) * dataset.dtype.itemsize
    if declared <= stored * ratio + spare:
        return None
    return (f"declares shape {dataset.shape} of {dataset.dtype} ({declared} bytes), but the file stores "
            f"{stored} bytes of it")


def _decode(value: Any) -> Any:
    """An attribute as plain Python: fixed (bytes) and variable (str) strings both to str."""
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray) and value.shape == ():
        return _decode(value[()])
    if isinstance(value, np.generic):
        return value.item()
    return value


class ReceiptReader:
    """Reads a receipt of any schema minor of major SCHEMA_VERSION, old or new file format.

    Every problem the file has, however it is damaged, is a ReceiptError whose one line
    starts with the file's path and names the dataset or attribute."""

    DAMAGED = "the receipt is damaged; rerun the job that wrote it"

    def __init__(self, path: PathLike) -> None:
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            self._fail("no such file")
        if os.path.isdir(self.path):
            self._fail("is a directory, not a receipt")
        try:
            is_hdf5 = h5py.is_hdf5(self.path)
        except OSError as e:
            self._fail(f"cannot be read ({e})")
        if not is_hdf5:
            self._fail("not an HDF5 file (give a receipt written by `harness run` or canary_harness)")
        self._file: Optional[h5py.File] = self._open()
        try:
            self._check()
        except OSError as e:  # a damaged object header or link table under /manifest, /steps, ...
            self.close()
            self._fail(f"HDF5 cannot read the receipt's layout ({e})")
        except BaseException:
            self.close()
            raise

    def _fail(self, what: str) -> NoReturn:
        raise ReceiptError(f"{self.path}: {what}") from None

    def _open(self) -> h5py.File:
        try:
            return h5py.File(self.path, "r")
        except OSError as e:
            first = e
        if "already open for write" not in str(first):
            self._fail(f"HDF5 file cannot be opened, truncated or corrupt ({first}); rerun the job that wrote it")
        # Marked open for write: a writer still running, or killed. An SWMR writer's file
        # (ReceiptWriter's) opens in SWMR-read mode and holds every step it flushed.
        try:
            return h5py.File(self.path, "r", swmr=True)
        except OSError:
            self._fail("marked open for write by a writer that is still running or was killed outside SWMR mode "
                       f"({first}); wait for the writer, or clear the mark with `h5clear -s {self.path}`")

    def _check(self) -> None:
        if not isinstance(self._get(PATHS["manifest"]), h5py.Group):
            self._fail("no /manifest group: not a harness receipt")
        self.manifest: Dict[str, Any] = self._read_manifest()
        if "schema_version" not in self.manifest:
            self._fail("/manifest has no schema_version attribute: not a harness receipt")
        self.schema_version = self._manifest_int("schema_version")
        self.schema_minor = self._manifest_int("schema_minor") if "schema_minor" in self.manifest else 0
        if self.schema_version > SCHEMA_VERSION:
            self._fail(f"schema_version {self.schema_version} is newer than this canary_harness reads "
                       f"({SCHEMA_VERSION}): upgrade canary_harness")
        if self.schema_version < SCHEMA_VERSION:
            self._fail(f"schema_version {self.schema_version} is older than this canary_harness reads "
                       f"({SCHEMA_VERSION}): re-record the receipt with a current writer")
        for required in (PATHS["loss"], PATHS["batch_hash"], PATHS["tensor_names"]):
            if not isinstance(self._get(required), h5py.Dataset):
                self._fail(f"missing dataset {required}: receipt is damaged")

    def _read_manifest(self) -> Dict[str, Any]:
        attrs = self._file[PATHS["manifest"]].attrs
        try:
            keys = list(attrs)
        except (*HDF5_READ_ERRORS, UnicodeDecodeError) as e:
            self._fail(f"HDF5 cannot read the /manifest attributes ({hdf5_message(e)}); {self.DAMAGED}")
        manifest: Dict[str, Any] = {}
        for key in keys:
            try:
                value = attrs[key]
            except HDF5_READ_ERRORS as e:
                self._fail(f"HDF5 cannot read /manifest attribute {key} ({hdf5_message(e)}); {self.DAMAGED}")
            try:
                manifest[key] = _decode(value)
            except UnicodeDecodeError as e:
                self._fail(f"/manifest attribute {key} is not UTF-8 text ({e}); {self.DAMAGED}")
        return manifest

    def _manifest_int(self, key: str) -> int:
        value = self.manifest.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            self._fail(f"/manifest attribute {key} is not an integer")
        return value

    def _get(self, name: str) -> Any:
        """The object at `name` (None where there is none); a link or header HDF5 cannot read is
        a ReceiptError naming it."""
        if self._file is None:
            self._fail("the reader is closed")
        try:  # not File.get(): it answers None for a header HDF5 cannot read (a KeyError)
            return self._file[name] if name in self._file else None
        except HDF5_READ_ERRORS as e:
            self._fail(f"HDF5 cannot read {name} ({hdf5_message(e)}); {self.DAMAGED}")

    def _members(self, group: str) -> List[str]:
        """The names in a group; one HDF5 cannot list is a ReceiptError naming it."""
        obj = self._get(group)
        if not isinstance(obj, h5py.Group):
            return []
        try:
            return list(obj)
        except (*HDF5_READ_ERRORS, UnicodeDecodeError) as e:
            self._fail(f"HDF5 cannot list {group} ({hdf5_message(e)}); {self.DAMAGED}")

    def dataset(self, name: str, ndim: Optional[int] = None) -> h5py.Dataset:
        """The dataset at `name`, checked (its rank: `ndim` where given, else the receipt
        description's; and that the file stores every value its shape declares) without reading it."""
        obj = self._get(name)
        if not isinstance(obj, h5py.Dataset):
            self._fail(f"missing dataset {name}")
        ndim = dataset_rank(name) if ndim is None else ndim
        if ndim is not None and obj.ndim != ndim:
            self._fail(f"{name} has shape {obj.shape}, where a {ndim}-D dataset belongs; {self.DAMAGED}")
        try:
            why = unstored(obj, os.path.getsize(self.path), growing=obj.maxshape[:1] == (None,))
        except HDF5_READ_ERRORS as e:  # the chunk index or the layout message is damaged
            self._fail(f"HDF5 cannot read the storage of {name} ({hdf5_message(e)}); {self.DAMAGED}")
        if why is not None:
            self._fail(f"{name} {why}; {self.DAMAGED}")
        return obj

    def read(self, name: str, ndim: Optional[int] = None) -> np.ndarray:
        """Any dataset by its path in the file (of `ndim` dimensions where given); a missing,
        misshapen or damaged one is a ReceiptError."""
        obj = self.dataset(name, ndim)
        try:
            return obj[()]
        except (OSError, RuntimeError, ValueError) as e:  # e.g. a Fletcher32 mismatch, a truncated chunk
            self._fail(f"cannot read {name} ({read_failure(obj, e)}); {self.DAMAGED}")

    @property
    def complete(self) -> bool:
        return self._manifest_int("complete") == 1

    @property
    def steps_planned(self) -> int:
        return self._manifest_int("steps_planned")

    @property
    def steps_recorded(self) -> int:
        return int(self.dataset(PATHS["loss"], ndim=1).shape[0])

    def read_strings(self, name: str) -> List[str]:
        """A string list (fixed-length or, in old receipts, variable-length) as str."""
        values = self.read(name, ndim=1)
        if h5py.check_string_dtype(self.dataset(name).dtype) is None:
            self._fail(f"{name} holds {values.dtype} values, not strings; {self.DAMAGED}")
        strings = []
        for i, value in enumerate(values):
            try:
                strings.append(_decode(value))
            except UnicodeDecodeError as e:
                self._fail(f"{name}[{i}] is not UTF-8 text ({e}); {self.DAMAGED}")
        return strings

    @property
    def tensor_names(self) -> List[str]:
        return self.read_strings(PATHS["tensor_names"])

    def _typed(self, name: str, ndim: int, dtype: str) -> np.ndarray:
        """read(), refused unless the dataset holds `dtype` (a hash read as a float is wrong bits)."""
        stored = self.dataset(name, ndim).dtype
        if stored != np.dtype(dtype):
            self._fail(f"{name} holds {stored} values, where {np.dtype(dtype)} belongs; {self.DAMAGED}")
        return self.read(name, ndim)

    def steps(self, name: str) -> np.ndarray:
        """/steps/<name>: loss, grad_norm, lr (float64) or batch_hash (uint64), one per step."""
        return self._typed(f"{PATHS['steps']}/{name}", 1, "<u8" if name == "batch_hash" else "<f8")

    def hashes(self, family: str) -> np.ndarray:
        """/hashes/<family>: uint64 (N, K)."""
        return self._typed(hashes_path(family), 2, "<u8")

    def sketches(self, family: str) -> Tuple[np.ndarray, np.ndarray]:
        """(/sketches/<family>_l2 (N, K), /sketches/<family>_projection (N, K, 16)), float64."""
        l2, projection = sketch_paths(family)
        return self._typed(l2, 2, "<f8"), self._typed(projection, 3, "<f8")

    def dumped_steps(self) -> List[int]:
        """The steps with /tensors/step_XXXXXX dumps."""
        return sorted(int(k[5:]) for k in self._members(PATHS["tensors"]) if k.startswith("step_") and k[5:].isdigit())

    def tensors(self, step: int) -> Dict[str, np.ndarray]:
        """/tensors/step_XXXXXX: parameters at the start of `step`, by name."""
        group = f"{PATHS['tensors']}/step_{int(step):06d}"
        if not isinstance(self._get(group), h5py.Group):
            self._fail(f"no tensor dump of step {step} ({group})")
        return {name: self.read(f"{group}/{name}") for name in self._members(group)}

    def trace_columns(self) -> Optional[List[TraceColumn]]:
        """/trace's columns (the traced op outputs in execution order), or None without op traces."""
        if not isinstance(self._get(PATHS["trace"]), h5py.Group):
            return None
        numbers = {name: self.read(PATHS[f"trace_{name}"], ndim=1) for name in ("op_index", "layer")}
        for name, values in numbers.items():
            if values.dtype.kind not in "iu":
                self._fail(f"{PATHS[f'trace_{name}']} holds {values.dtype} values, not integers; {self.DAMAGED}")
        fields = {name: self.read_strings(PATHS[f"trace_{name}"]) for name in TRACE_TEXT_FIELDS}
        count = len(numbers["op_index"])
        for name, values in [*numbers.items(), *fields.items()]:
            if len(values) != count:
                self._fail(f"{PATHS[f'trace_{name}']} has {len(values)} entries, {PATHS['trace_op_index']} {count}: "
                           f"one per traced output in each; {self.DAMAGED}")
        return [TraceColumn(int(numbers["op_index"][i]), fields["op"][i], int(numbers["layer"][i]),
                            fields["phase"][i], fields["tensor"][i], fields["kind"][i]) for i in range(count)]

    def stored_checkpoints(self) -> List[StoredCheckpoint]:
        """The checkpoints held in the receipt (declare_checkpoints), in step order; [] when none."""
        group = self._get(PATHS["checkpoints"])
        if not isinstance(group, h5py.Group) or group.attrs.get("storage") is None:
            return []
        storage = _decode(group.attrs["storage"])
        if storage != CHECKPOINT_STORAGE:
            self._fail(f"/checkpoints: storage '{storage}' is not '{CHECKPOINT_STORAGE}'")
        columns = {name: self._typed(PATHS[f"checkpoint_{name}"], 1, "int64") for name in ("step", "offset", "length")}
        hashes = self.read_strings(PATHS["checkpoint_content_hash"])
        state_bytes = self.dataset(PATHS["checkpoint_state"], 1).shape[0]
        rows = len(hashes)
        if any(len(v) != rows for v in columns.values()):
            self._fail("/checkpoints: step, offset, length and content_hash differ in length")
        out = []
        for step, offset, length, content_hash in zip(columns["step"], columns["offset"], columns["length"], hashes):
            if offset < 0 or length < 0 or offset + length > state_bytes or (out and step <= out[-1].step):
                self._fail(f"/checkpoints: the row of step {step} does not describe a stored state")
            out.append(StoredCheckpoint(int(step), content_hash, int(offset), int(length)))
        return out

    def checkpoint_state(self, checkpoint: "StoredCheckpoint") -> bytes:
        """The checkpoint's bytes, checked against its content hash (ReceiptError when they differ)."""
        try:
            data = self.dataset(PATHS["checkpoint_state"], 1)[checkpoint.offset:checkpoint.offset + checkpoint.length]
        except HDF5_READ_ERRORS as e:
            self._fail(f"/checkpoints/state cannot be read ({hdf5_message(e)})")
        state = bytes(np.asarray(data, dtype=np.uint8))
        if "xxh128:" + xxhash.xxh3_128_hexdigest(state) != checkpoint.content_hash:
            self._fail(f"the checkpoint of step {checkpoint.step} does not hash to its recorded content hash: the "
                       "checkpoint or the receipt was altered, not trusted")
        return state

    def batches(self) -> Optional[np.ndarray]:
        """/batches/tokens int32 (N, B, T+1), or None when batches were not recorded."""
        return self.read(PATHS["batch_tokens"], ndim=3) if self._get(PATHS["batch_tokens"]) is not None else None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "ReceiptReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
