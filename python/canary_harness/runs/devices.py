"""Where a canary's tensors live: its batches and its model moved to the run's device, as
`canary_harness run`, replay, the audit and the held-out evaluation move them (one rule).

torch is imported inside the functions: importing this module (the audit does) stays torch-free.
"""

from __future__ import annotations

from typing import Any, Dict


def to_device(batch: Any, device: Any) -> Any:
    """The batch with every tensor on `device` (tuples, lists and dicts kept)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def place_on_device(canary: Any, device: Any) -> None:
    """The model on `device`, and the optimizer holding the moved parameters. On the CPU
    and CUDA .to() keeps each Parameter object; on XLA it makes new ones, which replace the
    old in the optimizer's groups and state (an optimizer left holding the CPU tensors
    would train nothing). A parameter shared by several modules (tied embeddings) is moved
    once per module there, which would untie it: every slot that held it gets the one
    moved Parameter, as it had one before."""
    slots = [(module, name, p) for module in canary.model.modules() for name, p in module._parameters.items()
             if p is not None]
    canary.model.to(device)
    moved: Dict[int, Any] = {}  # id(the parameter before) -> the one after
    for module, name, before in slots:
        after = module._parameters[name]
        if id(before) in moved:
            module._parameters[name] = moved[id(before)]  # tied again
        elif after is not before:
            moved[id(before)] = after
    if not moved:
        return
    optimizer = canary.optimizer
    for group in optimizer.param_groups:
        group["params"] = [moved.get(id(p), p) for p in group["params"]]
    for old_id, new in moved.items():
        old = next((p for p in list(optimizer.state) if id(p) == old_id), None)
        if old is not None:
            optimizer.state[new] = optimizer.state.pop(old)
