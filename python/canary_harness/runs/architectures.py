"""The canary architectures this package runs, each described once (torch-free).

A canary JSON names its architecture (`architecture`); one without the key is the legacy
identity's, gpt2, as the C++ writes it (canaries/architecture.h, `legacy_identity`). Each
entry says where its PyTorch model lives (imported on demand: torch) and which canary JSON
keys build its tensor table; the lane, the pack reader and the models read this table and
never an architecture's name. tests/test_llama_lane.py holds it to the harness's own list.
"""
from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

from ..models.table import (gpt2_tensor_specs, gpt2_tensor_table, llama_tensor_specs, llama_tensor_table,
                           moe_tensor_specs, moe_tensor_table)


@dataclass(frozen=True)
class Architecture:
    """What the lane needs of one architecture's PyTorch model: each model module's MODEL."""

    name: str
    config_class: Any       # .from_json(canary JSON) -> config (ValueError naming the key)
    model_class: Any        # (config, init, device=) -> nn.Module with .cfg; forward(tokens, hook) -> loss
    forward_op_names: Callable[[Any], List[str]]  # the C++ op names, forward order
    tensor_table: Callable[[Any], List[Tuple[str, Tuple[int, ...]]]]  # canonical order
    lr_at: Callable[[int, Any], float]


@dataclass(frozen=True)
class ArchitectureInfo:
    name: str
    model_module: str  # canary_harness.models.<name>: its MODEL (an Architecture)
    table_keys: Tuple[str, ...]  # the canary JSON keys its tensor table is built from, in order
    table: Callable[..., List[Tuple[str, Tuple[int, ...]]]]  # table(*values of table_keys)
    specs: Callable[..., List[Any]]  # specs(*values of table_keys): each tensor's TensorSpec (init included)


ARCHITECTURES: Dict[str, ArchitectureInfo] = {
    info.name: info for info in (
        ArchitectureInfo("gpt2", "canary_harness.models.gpt2", ("vocab_size", "context_length", "channels", "layers"),
                         gpt2_tensor_table, gpt2_tensor_specs),
        ArchitectureInfo("llama", "canary_harness.models.llama",
                         ("vocab_size", "channels", "layers", "heads", "kv_heads", "mlp_hidden"), llama_tensor_table,
                         llama_tensor_specs),
        ArchitectureInfo("moe", "canary_harness.models.moe",
                         ("vocab_size", "channels", "layers", "heads", "kv_heads", "mlp_hidden", "experts"),
                         moe_tensor_table, moe_tensor_specs),
    )
}
LEGACY_IDENTITY = "gpt2"  # the architecture of a canary JSON that names none


def architecture_of(canary: Any) -> str:
    """The canary JSON's `architecture` (a dict or its text); the legacy identity's where the key is absent."""
    if isinstance(canary, (str, bytes)):
        canary = json.loads(canary)
    return str(canary.get("architecture", LEGACY_IDENTITY)) if isinstance(canary, dict) else LEGACY_IDENTITY


def described(name: str) -> ArchitectureInfo:
    """The entry of architecture `name`; ValueError naming the known ones otherwise."""
    if name not in ARCHITECTURES:
        raise ValueError(f"canary architecture '{name}' has no PyTorch implementation here "
                         f"(known: {', '.join(ARCHITECTURES)})")
    return ARCHITECTURES[name]


def model_of(name: str) -> Architecture:
    """Architecture `name`'s PyTorch model (imports torch); ValueError naming the known ones otherwise."""
    return importlib.import_module(described(name).model_module).MODEL


def canary_tensor_table(canary: Dict[str, Any]) -> List[Tuple[str, Tuple[int, ...]]]:
    """[(name, shape)] of a canary JSON in canonical order (docs/design.md's tensor tables)."""
    info = described(architecture_of(canary))
    return info.table(*(int(canary[k]) for k in info.table_keys))
