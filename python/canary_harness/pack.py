"""Canary packs (`harness export`, docs/cli.md): the harness's initial weights and batches.

A pack is what any training stack needs to train on exactly the harness's init and data
(docs/design.md, "Canary packs"): nothing outside the C++ harness re-implements the
counter-based initialisation or the data generator, and a receipt written from a pack
carries the same `batch_hash` per step by construction.

    /manifest        pack_version (1), canary (JSON text), seed, data_seed, steps,
                     created_utc, git_commit
    /init/names      the parameter names in canonical order
    /init/<name>     float32 with the tensor's shape: the parameters at the start of step 0
    /batches/tokens  int32 (N, B, T+1)
    /eval/tokens     int32 (B, T+1), when the canary has [eval]: the held-out batch, attributes
                     every, rows, held_out_hash, source (docs/logit-kl.md)

read_pack() checks all of it against the canary JSON (names, shapes, dtypes, the batch
shape, token ids below the vocabulary) and reads every dataset in full, so a damaged pack
is a PackError (a ReceiptError) whose message starts with the file's path, never an h5py
traceback or a wrong value. numpy and h5py only; torch is not needed to read a pack.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, NoReturn, Optional, Tuple, Union

import h5py
import numpy as np

from .models.config import SIZE_RANGES, check_sizes
from .runs.architectures import ARCHITECTURES, architecture_of, canary_tensor_table
from .receipts.receipt import HDF5_READ_ERRORS, ReceiptError, hdf5_message, read_failure, unstored

PACK_VERSION = 1
PathLike = Union[str, "os.PathLike[str]"]
EXPORT_HINT = "export it again with `harness export`"


class PackError(ReceiptError):
    """A pack that cannot be read or does not fit; the message starts with its path."""


INT64_MAX = (1 << 63) - 1  # seeds: int64 >= 0 in a pack's manifest, as in a receipt's


@dataclass
class CanaryPack:
    """A pack read in full. `init` is ordered as `tensor_names`; `tokens` is (N, B, T+1) int32."""

    path: str
    canary_json: str            # the text exactly as the pack (and a receipt's manifest) holds it
    canary: Dict[str, Any]      # parsed
    seed: int
    data_seed: int
    steps: int
    created_utc: str
    git_commit: str
    tensor_names: List[str]
    init: Dict[str, np.ndarray] = field(repr=False)
    tokens: np.ndarray = field(repr=False)
    held_out: Optional["HeldOut"] = None  # /eval, when the canary evaluates a held-out batch

    @property
    def name(self) -> str:
        """The canary's name (its `preset`): lane names start with it."""
        return str(self.canary.get("preset", "?"))

    @property
    def batch_shape(self) -> Tuple[int, int]:
        return int(self.tokens.shape[1]), int(self.tokens.shape[2])

    def batch(self, step: int) -> np.ndarray:
        """The int32 tokens (B, T+1) of batch `step`."""
        if not 0 <= step < self.steps:
            raise IndexError(f"{self.path}: no batch {step}; the pack holds batches 0..{self.steps - 1}")
        return self.tokens[step]


@dataclass
class HeldOut:
    """A pack's held-out batch (/eval): its tokens (B, T+1) int32 and when to evaluate them."""

    tokens: np.ndarray = field(repr=False)
    every: int
    rows: int
    held_out_hash: str


def _fail(path: str, what: str) -> NoReturn:
    raise PackError(f"{path}: {what}") from None


def _get(path: str, f: h5py.File, name: str) -> Any:
    """The object at `name` (None where there is none); a link or header HDF5 cannot read is
    a PackError naming it (File.get() would answer None for a damaged header)."""
    try:
        return f[name] if name in f else None
    except HDF5_READ_ERRORS as e:
        _fail(path, f"HDF5 cannot read {name} ({hdf5_message(e)}); {EXPORT_HINT}")


def _attr(path: str, attrs: h5py.AttributeManager, key: str) -> Any:
    """/manifest attribute `key`, or None where the pack has none."""
    try:
        return attrs[key] if key in attrs else None
    except HDF5_READ_ERRORS as e:
        _fail(path, f"HDF5 cannot read /manifest attribute {key} ({hdf5_message(e)}); {EXPORT_HINT}")


def _text(path: str, value: Any, where: str) -> str:
    """A string attribute or list entry as str; `where` names it in the error."""
    if isinstance(value, np.ndarray) and value.shape == ():
        value = value[()]
    if isinstance(value, (bytes, np.bytes_)):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as e:
            _fail(path, f"{where} is not UTF-8 text ({e}); {EXPORT_HINT}")
    if not isinstance(value, str):
        _fail(path, f"{where} is {value!r}, not a string; {EXPORT_HINT}")
    return value


def _str_attr(path: str, attrs: h5py.AttributeManager, key: str) -> str:
    """A string /manifest attribute, "" where the pack has none."""
    value = _attr(path, attrs, key)
    return "" if value is None else _text(path, value, f"/manifest attribute {key}")


def _int_attr(path: str, attrs: h5py.AttributeManager, key: str, bounds: Optional[Tuple[int, int]] = None) -> int:
    value = _attr(path, attrs, key)
    if value is None:
        _fail(path, f"/manifest has no attribute {key}: pack is damaged; {EXPORT_HINT}")
    if not isinstance(value, (np.integer, int)) or isinstance(value, bool):
        _fail(path, f"/manifest attribute {key} is not an integer")
    if bounds is not None and not bounds[0] <= int(value) <= bounds[1]:
        _fail(path, f"/manifest attribute {key} is {int(value)}, outside {bounds[0]}..{bounds[1]}; {EXPORT_HINT}")
    return int(value)


def _dataset(path: str, f: h5py.File, name: str, shape: Tuple[int, ...], dtype: Optional[str],
             what: str) -> h5py.Dataset:
    """The dataset `name`, checked before a byte of it is read: its `shape`, its `dtype`
    (None: strings), and storage in the file for every value. `what` says what the canary
    has there, for the message."""
    obj = _get(path, f, name)
    if not isinstance(obj, h5py.Dataset):
        _fail(path, f"missing dataset {name}: pack is damaged; {EXPORT_HINT}")
    fits = h5py.check_string_dtype(obj.dtype) is not None if dtype is None else obj.dtype == np.dtype(dtype)
    if tuple(obj.shape) != shape or not fits:
        _fail(path, f"{name} is {obj.dtype} {tuple(obj.shape)}, {what}; {EXPORT_HINT}")
    try:
        why = unstored(obj, os.path.getsize(path))
    except HDF5_READ_ERRORS as e:  # the chunk index or the layout message is damaged
        _fail(path, f"HDF5 cannot read the storage of {name} ({hdf5_message(e)}); {EXPORT_HINT}")
    if why is not None:
        _fail(path, f"{name} {why}; {EXPORT_HINT}")
    return obj


def _values(path: str, obj: h5py.Dataset) -> np.ndarray:
    try:
        return obj[()]
    except (OSError, RuntimeError, ValueError) as e:  # a Fletcher32 mismatch, a truncated chunk
        _fail(path, f"cannot read {obj.name} ({read_failure(obj, e)}); {EXPORT_HINT}")


def _canary(path: str, canary_json: str) -> Dict[str, Any]:
    """The canary JSON parsed and its table's sizes checked, so that nothing sized from it
    (the tensor table, the datasets' expected shapes) is built from a value no canary has."""
    try:
        canary = json.loads(canary_json)
    except json.JSONDecodeError as e:
        _fail(path, f"/manifest attribute canary is not JSON ({e})")
    except RecursionError:  # json's parser recurses once per nested array or object
        _fail(path, "/manifest attribute canary is not JSON (nested too deeply)")
    if not isinstance(canary, dict):
        _fail(path, "/manifest attribute canary is not a JSON object")
    for key in ("preset", "architecture"):
        if key in canary and not isinstance(canary[key], str):
            _fail(path, f"/manifest canary JSON key '{key}' is {canary[key]!r}, not a string; {EXPORT_HINT}")
    return canary


def _check_sizes(path: str, canary: Dict[str, Any], architecture: str) -> None:
    """The sizes the tensor table and the batches are built from: ints within a canary file's ranges."""
    try:
        check_sizes(canary, dict.fromkeys(ARCHITECTURES[architecture].table_keys + ("context_length", "batch_size", "steps")))
    except ValueError as e:
        _fail(path, f"/manifest {e}; {EXPORT_HINT}")


def read_pack(path: PathLike, canary: Optional[str] = None) -> CanaryPack:
    """Reads and checks a pack; `canary` (a name) refuses a pack of any other canary."""
    path = os.fspath(path)
    if not os.path.exists(path):
        _fail(path, "no such file")
    if os.path.isdir(path):
        _fail(path, "is a directory, not a canary pack")
    try:
        is_hdf5 = h5py.is_hdf5(path)
    except OSError as e:
        _fail(path, f"cannot be read ({e})")
    if not is_hdf5:
        _fail(path, "not an HDF5 file (give a pack written by `harness export`)")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        _fail(path, f"HDF5 cannot open the pack: truncated or corrupt ({e}); {EXPORT_HINT}")
    try:
        with f:
            return _read(path, f, canary)
    except OSError as e:  # a damaged object header or link table
        _fail(path, f"HDF5 cannot read the pack's layout ({e}); {EXPORT_HINT}")


def _read(path: str, f: h5py.File, expected: Optional[str]) -> CanaryPack:
    manifest = _get(path, f, "/manifest")
    if not isinstance(manifest, h5py.Group):
        _fail(path, "no /manifest group: not a canary pack (write one with `harness export`)")
    attrs = manifest.attrs
    if _attr(path, attrs, "pack_version") is None:
        if _attr(path, attrs, "schema_version") is not None:
            _fail(path, "is a receipt, not a canary pack (write a pack with `harness export`)")
        _fail(path, "/manifest has no pack_version attribute: not a canary pack (write one with `harness export`)")
    version = _int_attr(path, attrs, "pack_version")
    if version > PACK_VERSION:
        _fail(path, f"pack_version {version} is newer than this canary_harness reads ({PACK_VERSION}): "
                    "upgrade canary_harness")
    if version < 1:
        _fail(path, f"pack_version {version} is not a pack version")
    if _attr(path, attrs, "canary") is None:
        _fail(path, f"/manifest has no attribute canary: pack is damaged; {EXPORT_HINT}")
    canary_json = _str_attr(path, attrs, "canary")
    canary = _canary(path, canary_json)
    name = canary.get("preset")
    if expected is not None and name != expected:
        _fail(path, f"a pack of canary '{name}', not '{expected}'; export one with "
                    f"`harness export --canary {expected}`")
    architecture = architecture_of(canary)
    if architecture not in ARCHITECTURES:
        _fail(path, f"canary architecture '{architecture}': this canary_harness reads {', '.join(ARCHITECTURES)} packs")
    _check_sizes(path, canary, architecture)
    seed = _int_attr(path, attrs, "seed", (0, INT64_MAX))
    data_seed = _int_attr(path, attrs, "data_seed", (0, INT64_MAX))
    steps = _int_attr(path, attrs, "steps", SIZE_RANGES["steps"])
    if steps != canary["steps"]:
        _fail(path, f"/manifest steps {steps} is not the canary JSON's steps {canary['steps']}")
    if data_seed != canary.get("data_seed", data_seed):
        _fail(path, f"/manifest data_seed {data_seed} is not the canary JSON's {canary.get('data_seed')}")
    created_utc, git_commit = (_str_attr(path, attrs, key) for key in ("created_utc", "git_commit"))

    table = canary_tensor_table(canary)  # small: the sizes are within a canary file's ranges
    names_ds = _dataset(path, f, "/init/names", (len(table),), None,
                        f"canary '{name}' has {len(table)} tensor names")
    names = [_text(path, n, f"/init/names[{i}]") for i, n in enumerate(_values(path, names_ds))]
    if names != [n for n, _ in table]:
        _fail(path, f"/init/names is not canary '{name}''s tensor table; {EXPORT_HINT}")
    init: Dict[str, np.ndarray] = {}
    for tensor, shape in table:
        obj = _dataset(path, f, f"/init/{tensor}", shape, "<f4", f"canary '{name}' has float32 {shape}")
        init[tensor] = _values(path, obj)

    want = (steps, int(canary["batch_size"]), int(canary["context_length"]) + 1)
    tokens = _values(path, _dataset(path, f, "/batches/tokens", want, "<i4", f"canary '{name}' has int32 {want}"))
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= int(canary["vocab_size"])):
        _fail(path, f"/batches/tokens holds token ids outside 0..{int(canary['vocab_size']) - 1}")

    return CanaryPack(path=path, canary_json=canary_json, canary=canary, seed=seed, data_seed=data_seed, steps=steps,
                      created_utc=created_utc, git_commit=git_commit, tensor_names=names, init=init, tokens=tokens,
                      held_out=_held_out(path, f, canary, want[1:]))


def _held_out(path: str, f: h5py.File, canary: Dict[str, Any], shape: Tuple[int, int]) -> Optional[HeldOut]:
    """/eval, checked as the batches are; None where the pack has none (no [eval])."""
    group = _get(path, f, "/eval")
    if group is None:
        return None
    if not isinstance(group, h5py.Group):
        _fail(path, f"/eval is not a group: pack is damaged; {EXPORT_HINT}")
    tokens = _values(path, _dataset(path, f, "/eval/tokens", shape, "<i4", f"the held-out batch is int32 {shape}"))
    if int(tokens.min()) < 0 or int(tokens.max()) >= int(canary["vocab_size"]):
        _fail(path, f"/eval/tokens holds token ids outside 0..{int(canary['vocab_size']) - 1}")
    every = _int_attr(path, group.attrs, "every", (1, SIZE_RANGES["steps"][1]))
    rows = _int_attr(path, group.attrs, "rows", (1, shape[0]))
    return HeldOut(tokens, every, rows, _str_attr(path, group.attrs, "held_out_hash"))
