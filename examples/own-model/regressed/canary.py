"""The example's canary after a regression: the bf16 kernel of one layer is broken
(docs/triage.md, "Python canaries").

    python3 -m canary_harness run examples/own-model/regressed/canary.py:canary --precision bf16 --out r.h5

The same canary as ../canary.py (same file and function name, model, data and seed: its
receipts compare with the example's), with one change that only bf16 autocast sees, as a
library upgrade with a broken bf16 GEMM for one shape would make it: under autocast, block
1's MLP input projection keeps 2 significant bits of its output. In fp32 it is the example,
bit for bit. `harness triage` finds that layer without being told.
"""

from __future__ import annotations

import importlib.util
import os

import torch

import canary_harness as ch

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("own_model_canary", os.path.join(_HERE, os.pardir, "canary.py"))
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


def cpu_autocast() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")  # torch 2.4 on
    except TypeError:
        return torch.is_autocast_cpu_enabled()  # torch 1.13 (deprecated on 2.x)


class BrokenBf16Linear(torch.nn.Linear):
    """nn.Linear whose output under CPU autocast keeps 2 significant bits (a broken bf16 kernel)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if not cpu_autocast():
            return out
        mantissa, exponent = torch.frexp(out.float())
        return torch.ldexp(torch.round(mantissa * 4) / 4, exponent).to(out.dtype)


def canary() -> ch.Canary:
    c = example.canary()
    c.model.h[1].mlp.c_fc.__class__ = BrokenBf16Linear
    return c
