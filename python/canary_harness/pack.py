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

read_pack() checks all of it against the canary JSON (names, shapes, dtypes, the batch
shape, token ids below the vocabulary) and reads every dataset in full, so a damaged pack
is a PackError (a ReceiptError) whose message starts with the file's path, never an h5py
traceback or a wrong value. numpy and h5py only; torch is not needed to read a pack.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

import h5py
import numpy as np

from .models.table import gpt2_tensor_table, llama_tensor_table
from .receipt import ReceiptError

PACK_VERSION = 1
PathLike = Union[str, "os.PathLike[str]"]
EXPORT_HINT = "export it again with `harness export`"


class PackError(ReceiptError):
    """A pack that cannot be read or does not fit; the message starts with its path."""


# The keys each architecture's tensor table is built from (the canary JSON's `architecture`;
# a JSON without one is gpt2, as the C++ writes it).
TABLE_KEYS = {
    "gpt2": ("vocab_size", "context_length", "channels", "layers"),
    "llama": ("vocab_size", "channels", "layers", "heads", "kv_heads", "mlp_hidden"),
}


def canary_tensor_table(canary: Dict[str, Any]) -> List[Tuple[str, Tuple[int, ...]]]:
    """[(name, shape)] of a canary JSON in canonical order (docs/design.md's tensor tables)."""
    architecture = canary.get("architecture", "gpt2")
    build = {"gpt2": gpt2_tensor_table, "llama": llama_tensor_table}[architecture]
    return build(*(int(canary[k]) for k in TABLE_KEYS[architecture]))


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


def _fail(path: str, what: str) -> None:
    raise PackError(f"{path}: {what}") from None


def _text(value: Any) -> str:
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray) and value.shape == ():
        return _text(value[()])
    return str(value)


def _int_attr(path: str, attrs: h5py.AttributeManager, key: str) -> int:
    if key not in attrs:
        _fail(path, f"/manifest has no attribute {key}: pack is damaged; {EXPORT_HINT}")
    value = attrs[key]
    if not isinstance(value, (np.integer, int)) or isinstance(value, bool):
        _fail(path, f"/manifest attribute {key} is not an integer")
    return int(value)


def _dataset(path: str, f: h5py.File, name: str) -> np.ndarray:
    obj = f.get(name)
    if not isinstance(obj, h5py.Dataset):
        _fail(path, f"missing dataset {name}: pack is damaged; {EXPORT_HINT}")
    try:
        return obj[()]
    except (OSError, ValueError) as e:  # a Fletcher32 mismatch, a truncated chunk
        _fail(path, f"cannot read {name} ({e}); {EXPORT_HINT}")


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
    manifest = f.get("manifest")
    if not isinstance(manifest, h5py.Group):
        _fail(path, "no /manifest group: not a canary pack (write one with `harness export`)")
    attrs = manifest.attrs
    if "pack_version" not in attrs:
        if "schema_version" in attrs:
            _fail(path, "is a receipt, not a canary pack (write a pack with `harness export`)")
        _fail(path, "/manifest has no pack_version attribute: not a canary pack (write one with `harness export`)")
    version = _int_attr(path, attrs, "pack_version")
    if version > PACK_VERSION:
        _fail(path, f"pack_version {version} is newer than this canary_harness reads ({PACK_VERSION}): "
                    "upgrade canary_harness")
    if version < 1:
        _fail(path, f"pack_version {version} is not a pack version")
    if "canary" not in attrs:
        _fail(path, f"/manifest has no attribute canary: pack is damaged; {EXPORT_HINT}")
    canary_json = _text(attrs["canary"])
    try:
        canary = json.loads(canary_json)
    except json.JSONDecodeError as e:
        _fail(path, f"/manifest attribute canary is not JSON ({e})")
    if not isinstance(canary, dict):
        _fail(path, "/manifest attribute canary is not a JSON object")
    name = canary.get("preset")
    if expected is not None and name != expected:
        _fail(path, f"a pack of canary '{name}', not '{expected}'; export one with "
                    f"`harness export --canary {expected}`")
    architecture = canary.get("architecture", "gpt2")
    if architecture not in TABLE_KEYS:
        _fail(path, f"canary architecture '{architecture}': this canary_harness reads {', '.join(TABLE_KEYS)} packs")
    missing = [k for k in TABLE_KEYS[architecture] + ("context_length", "batch_size", "steps")
               if not isinstance(canary.get(k), int)]
    missing = list(dict.fromkeys(missing))
    if missing:
        _fail(path, f"/manifest canary JSON lacks {', '.join(missing)}")
    seed = _int_attr(path, attrs, "seed")
    data_seed = _int_attr(path, attrs, "data_seed")
    steps = _int_attr(path, attrs, "steps")
    if steps != canary["steps"]:
        _fail(path, f"/manifest steps {steps} is not the canary JSON's steps {canary['steps']}")
    if data_seed != canary.get("data_seed", data_seed):
        _fail(path, f"/manifest data_seed {data_seed} is not the canary JSON's {canary.get('data_seed')}")

    table = canary_tensor_table(canary)
    names = [_text(n) for n in np.asarray(_dataset(path, f, "/init/names")).reshape(-1)]
    if names != [n for n, _ in table]:
        _fail(path, f"/init/names is not canary '{name}''s tensor table ({len(names)} names, "
                    f"{len(table)} expected); {EXPORT_HINT}")
    init: Dict[str, np.ndarray] = {}
    for tensor, shape in table:
        values = _dataset(path, f, f"/init/{tensor}")
        if values.dtype != np.float32 or tuple(values.shape) != shape:
            _fail(path, f"/init/{tensor} is {values.dtype} {tuple(values.shape)}, canary '{name}' has float32 {shape}")
        init[tensor] = values

    tokens = _dataset(path, f, "/batches/tokens")
    want = (steps, int(canary["batch_size"]), int(canary["context_length"]) + 1)
    if tokens.dtype != np.int32 or tuple(tokens.shape) != want:
        _fail(path, f"/batches/tokens is {tokens.dtype} {tuple(tokens.shape)}, canary '{name}' has int32 {want}")
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= int(canary["vocab_size"])):
        _fail(path, f"/batches/tokens holds token ids outside 0..{int(canary['vocab_size']) - 1}")

    return CanaryPack(path=path, canary_json=canary_json, canary=canary, seed=seed, data_seed=data_seed, steps=steps,
                      created_utc=_text(attrs.get("created_utc", "")), git_commit=_text(attrs.get("git_commit", "")),
                      tensor_names=names, init=init, tokens=tokens)
