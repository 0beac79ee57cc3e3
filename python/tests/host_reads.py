"""A TorchFunctionMode that lists every host read: what must never happen inside a step
that torch_xla is to trace as one graph (docs/python.md, "The findings": `.item()`, `float(tensor)`, data-
dependent control flow and shapes)."""

from __future__ import annotations

from typing import List

from torch.overrides import TorchFunctionMode

HOST_READS = {"item", "__float__", "__int__", "__bool__", "__index__", "tolist", "numpy", "cpu", "nonzero",
              "masked_select", "unique"}


class HostReads(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.reads: List[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in HOST_READS:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))
