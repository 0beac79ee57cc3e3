"""torch_xla on PJRT: the device, its persistent compile cache, and the compiler's own
per-step counters for a receipt's /compile group (docs/xla.md).

A lazy tensor device traces each step's ops into a graph, which `mark_step()` cuts,
compiles (or finds compiled) and runs. What the harness gates, "one compile at step 0,
none after, no host read inside a step" (the budgets' [compile-stability]), is read here
from torch_xla's metrics, the counters the compiler itself keeps: no emulation. On a
machine without a TPU torch_xla runs the same graphs through XLA's CPU client
(PJRT_DEVICE=CPU): the graph stability and the cache behaviour are the real compiler's;
the kernels are the CPU's, not libtpu's.
"""

from __future__ import annotations

import os
from typing import Dict, Optional

import torch

# The /compile columns of a run on torch_xla, each under the name torch_xla's metrics
# (torch_xla.debug.metrics) give it, which are tpu-mesh's (docs/engines/tpu-mesh.md).
_COUNTERS = (
    "UncachedCompile",                    # graphs compiled by XLA
    "CachedCompile",                      # graphs found in the in-memory compile cache
    "ExecuteComputation",                 # programs run on the device
    "PersistentCacheHit",                 # graphs loaded from --compile-cache
    "PersistentCacheMiss",
    "PersistentCacheDeserializeFailure",
)
# Metrics counted by their samples (how many) or summed (seconds; torch_xla keeps ns).
_TRANSFERS = "TransferFromDeviceTime"  # one sample per device-to-host transfer
_SECONDS = ("CompileTime", "ExecuteTime")
COUNTERS = _COUNTERS + ("HostSync",) + _SECONDS


class XlaUnavailable(RuntimeError):
    """torch_xla cannot be imported here (not installed, or another torch than its own)."""


def xla_device(compile_cache: Optional[str] = None) -> torch.device:
    """The XLA device (torch_xla picks the PJRT client: TPU where libtpu finds one, the CPU
    otherwise, or PJRT_DEVICE's), with XLA's persistent compile cache in `compile_cache`
    when given: set before the first graph is compiled, as torch_xla requires. PJRT_DEVICE
    is set when this returns, so the receipt's stack names the client that ran."""
    try:
        import torch_xla
        import torch_xla.runtime as xr
    except ImportError as e:
        raise XlaUnavailable(f"torch_xla is not importable ({e}); docs/python-env.md: "
                             "run it with .venv/bin/python") from None
    if compile_cache is not None:
        os.makedirs(compile_cache, exist_ok=True)
        if not torch_xla._XLAC._xla_computation_cache_is_initialized():
            xr.initialize_cache(compile_cache)
    xr.device_type()  # selects the default client and records it in PJRT_DEVICE
    return torch_xla.device()


def mark_step() -> None:
    """Cuts the step's graph and runs it, then waits for the device: its compile and
    execute counters belong to this step, not to whichever step reads them next."""
    import torch_xla
    import torch_xla.core.xla_model as xm

    torch_xla.sync()
    xm.wait_device_ops()


def _totals() -> Dict[str, float]:
    import torch_xla.debug.metrics as met

    totals = {name: float(met.counter_value(name) or 0) for name in _COUNTERS}
    transfers = met.metric_data(_TRANSFERS)
    totals["HostSync"] = float(transfers[0]) if transfers else 0.0
    for name in _SECONDS:
        data = met.metric_data(name)
        totals[name] = float(data[1]) * 1e-9 if data else 0.0
    return totals


class XlaStepCounters:
    """torch_xla's counters over each step's window, from the batch on its way to the device
    to the step's mark_step() and the device's wait (begin(), end()): the /compile row of the
    step. HostSync is the device-to-host transfers inside the window, each one a graph cut
    and a wait (a `.item()` in the step); the recorder's reads after end() are not the
    step's. Counts are exact; CompileTime and ExecuteTime are wall seconds."""

    def __init__(self) -> None:
        self._start: Optional[Dict[str, float]] = None

    def begin(self, step: int) -> None:
        del step
        self._start = _totals()

    def end(self) -> Dict[str, float]:
        if self._start is None:
            raise RuntimeError("XlaStepCounters.end() without begin()")
        now = _totals()
        row = {name: now[name] - self._start[name] for name in COUNTERS}
        self._start = None
        return row
