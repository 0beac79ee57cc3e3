"""Aten traces never hash memory an op did not write (canary_harness.tracing.aten_trace): what an
allocation (`empty_like`, ...) returns is whatever its memory held before, so it is no
trace column, and two traces of one step with dropout on (which draws its mask into an
empty_like) are identical whatever the allocator hands out."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, Tuple

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from canary_harness.tracing.aten_trace import ALLOCATION_OPS, AtenStep, AtenTracer
from canary_harness.runs.canary import load_canary

from test_python_canary import PACKAGE_ROOT, run

DROPOUT = str(Path(__file__).parent / "own_canaries" / "dropout.py")


class Allocates(nn.Module):
    """Allocates with each allocation call torch offers, then writes what it allocated."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        made = [torch.empty_like(h), h.new_empty(h.shape), torch.empty(h.shape),
                torch.empty_strided(h.shape, h.stride()), h.new_empty_strided(h.shape, h.stride()),
                h.new_empty(0).resize_(h.shape)]  # a resize_ that grows: memory nothing wrote
        if hasattr(torch, "empty_permuted"):  # torch >= 2.1
            made.append(torch.empty_permuted(h.shape, tuple(range(h.dim()))))
        total = h
        for buffer in made:
            total = total + buffer.copy_(h)
        return total


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.alloc = Allocates()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.alloc(self.lin(x)).square().mean()


def test_an_allocation_is_no_column_and_the_op_that_writes_its_memory_is() -> None:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracer = AtenTracer(model, optimizer)
    try:
        with tracer.step():
            model(torch.randn(3, 4)).backward()
            optimizer.step()
        columns = tracer.finish_step().columns
    finally:
        tracer.close()
    allocated = 7 if hasattr(torch, "empty_permuted") else 6
    # Inside Allocates: each buffer's copy_ (its value after the write) and the sum, nothing else.
    assert [c.tensor for c in columns if c.op == "alloc"] == ["aten.copy_.default", "aten.add.Tensor"] * allocated
    assert any(c.phase == "backward" for c in columns) and any(c.kind == "parameter" for c in columns)


class DirtyMemory(TorchDispatchMode):
    """An allocator whose blocks hold a run's own garbage: every allocation's floating-point
    output filled with `garbage`, as a block last used by other code would hold its bytes.
    Entered below the tracer (before it), so the tracer sees the dirty memory an op returns."""

    def __init__(self, garbage: float) -> None:
        super().__init__()
        self.garbage = garbage
        self.filled = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func._schema.name in ALLOCATION_OPS and isinstance(out, torch.Tensor) and out.is_floating_point():
            out.fill_(self.garbage)
            self.filled += 1
        return out


def traced_step(garbage: Optional[float]) -> Tuple[AtenStep, int]:
    """Step 0 of the dropout canary, built afresh under its seed, traced; its memory dirtied
    with `garbage` when given. Returns the trace and how many allocations were dirtied."""
    canary = load_canary(f"{DROPOUT}:canary").canary
    tracer = AtenTracer(canary.model, canary.optimizer)
    dirty = DirtyMemory(garbage) if garbage is not None else None
    try:
        with contextlib.ExitStack() as contexts:
            if dirty is not None:
                contexts.enter_context(dirty)
            contexts.enter_context(tracer.step())
            canary.step(canary.model, canary.optimizer, canary.batch(0), 0)
        return tracer.finish_step(), dirty.filled if dirty is not None else 0
    finally:
        tracer.close()


def test_a_step_with_dropout_traces_alike_whatever_its_allocations_held() -> None:
    first, dirtied = traced_step(1e30)
    second, _ = traced_step(-7.0)
    assert dirtied >= 2  # the dropout masks (nn.Dropout's and the attention's) start as allocations
    assert [c.tensor for c in first.columns].count("aten.bernoulli_.float") == 2  # the draws are traced
    assert first.columns == second.columns
    assert first.hashes == second.hashes and first.projection == second.projection


def replay_trace(receipt: Path, step: int) -> dict:
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, "-m", "canary_harness", "replay", str(receipt), "--from", str(step),
                             "--to", str(step), "--trace", "aten", "--json"],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    replayed = json.loads(result.stdout)
    assert replayed["verdict"] == "reproduced", replayed
    (trace,) = replayed["traces"]
    return trace


def test_two_replays_of_one_receipt_with_dropout_give_one_aten_trace(tmp_path: Path) -> None:
    receipt = tmp_path / "dropout.h5"
    run(f"{DROPOUT}:canary", "--out", str(receipt))
    first, second = replay_trace(receipt, 1), replay_trace(receipt, 1)
    assert first["columns"] and first["columns"] == second["columns"]
    assert first["hash"] == second["hash"] and first["projection_bits"] == second["projection_bits"]
    assert not [c for c in first["columns"] if c["tensor"].startswith("aten.empty")]
