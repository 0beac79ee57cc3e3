"""Reading a canary JSON (a receipt's or pack's `canary`, as the C++ writes it) into an
architecture's config dataclass, torch-free: the parsing and key typing every architecture
shares (canary_harness.models.gpt2, .llama); each adds its own checks of the values."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any, Dict, Iterable, Mapping, Union

CanaryJson = Union[str, bytes, Mapping[str, Any]]

# The ranges canaries/canary_file.cpp allows a canary's sizes (model.vocab, ...,
# train.steps): a canary JSON outside them was not written by the harness, and a size past
# them would have a reader build tables and allocate without end before any check.
SIZE_RANGES = {
    "vocab_size": (2, 1 << 20),
    "context_length": (1, 1 << 16),
    "channels": (1, 1 << 16),
    "layers": (1, 1024),
    "heads": (1, 1 << 16),
    "kv_heads": (1, 1 << 16),
    "mlp_hidden": (1, 1 << 20),
    "batch_size": (1, 1 << 16),
    "steps": (1, 1000000),
    "experts": (2, 1024),
    "experts_per_token": (1, 1024),
}


def canary_object(canary: CanaryJson) -> Mapping[str, Any]:
    """The canary JSON as a mapping; text that does not parse or is not an object is a ValueError."""
    if isinstance(canary, (str, bytes)):
        try:
            canary = json.loads(canary)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"canary JSON does not parse ({e})") from None
        except RecursionError:  # json's parser recurses once per nested array or object
            raise ValueError("canary JSON does not parse (nested too deeply)") from None
    if not isinstance(canary, Mapping):
        raise ValueError("canary JSON is not an object")
    return canary


def typed_fields(config_class: Any, canary: Mapping[str, Any]) -> Dict[str, Any]:
    """{field: value} for every field of the dataclass `config_class`, each required (but a
    field whose metadata says `absent_means_default`: a key the C++ identity writes only when
    it is not the default) and of the field's type (an int is taken for a float, a bool never
    for a number); a ValueError names the key."""
    values = {}
    for f in fields(config_class):
        if f.name not in canary and f.metadata.get("absent_means_default"):
            values[f.name] = f.default
            continue
        if f.name not in canary:
            raise ValueError(f"canary JSON lacks key '{f.name}'")
        value = canary[f.name]
        want = {"int": int, "float": float, "str": str}[f.type if isinstance(f.type, str) else f.type.__name__]
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, want) or isinstance(value, bool):
            raise ValueError(f"canary JSON key '{f.name}' is {value!r}, not {'an' if want is int else 'a'} "
                             f"{want.__name__}")
        values[f.name] = value
    return values


def check_sizes(canary: Mapping[str, Any], keys: Iterable[str]) -> None:
    """Each of `keys` an int (never a bool) within its SIZE_RANGES; a ValueError names the key."""
    for key in keys:
        if key not in canary:
            raise ValueError(f"canary JSON lacks key '{key}'")
        value = canary[key]
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"canary JSON key '{key}' is {value!r}, not an int")
        low, high = SIZE_RANGES[key]
        if value < low:
            raise ValueError(f"canary JSON key '{key}' must be >= {low} (is {value})")
        if value > high:
            raise ValueError(f"canary JSON key '{key}' must be <= {high} (is {value}), as canary files allow")
