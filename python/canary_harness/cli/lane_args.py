"""The command line the package's lanes share (`python3 -m canary_harness.lane`,
`python3 -m canary_harness run`, `python3 -m canary_harness.jax`, `canary_harness.invariance`):
their common arguments, the checks of their values and the faults they inject, so that one
flag means one thing in each of them (a refusal is a UsageError, one line)."""

from __future__ import annotations

import os
from typing import Any, List, Optional, Tuple

from ..runs.faults import parse_fault
from ..runs.regressions import is_regression, parse_regression
from .lane_stacks import lane_key, or_list, takes
from .usage import UsageError

# torch CPU threads: 1..MAX_THREADS, the range of a Python canary's `threads` key (the
# harness's run::kMaxThreads); a torch lane pins a count (its CPU kernels' bits depend on
# it), so there is no "0 = all cores".
MAX_THREADS = int(lane_key("torch-canary", "threads")["range"][1])
# What a run records beside its metrics: the harness's levels (run::TraceLevel); a replay
# takes "aten" instead of "ops" (canary_harness.runs.replay).
TRACE_LEVELS = ("none", "ops")


def trace_problem(level: str, levels: Tuple[str, ...] = TRACE_LEVELS, where: str = "--trace") -> Optional[str]:
    """None when `level` is one of `levels`, else the harness's one-line refusal of it."""
    return None if level in levels else f"{where}: '{level}' is not a trace level; use {' or '.join(levels)}"


def add_layout_arguments(ap: Any) -> None:
    """--layout and --nproc, as `canary_harness run` and `canary_harness.lane` take them."""
    ap.add_argument("--layout", help="ddp or fsdp: train on --nproc processes over gloo (DistributedDataParallel, or "
                                     "FSDP2's fully_shard on torch 2.6 on), rank 0 writing the receipt: lane "
                                     "+ddp (+fsdp), budget feature torch-ddp (torch-fsdp) (docs/own-model.md)")
    ap.add_argument("--nproc", help="processes (ranks) of --layout, 2..16 (default 2); each step's batch is split "
                                    "among them by rows")


def add_device_arguments(ap: Any) -> None:
    """--device and --compile-cache, as `canary_harness run` and `canary_harness.lane` take them."""
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or xla (torch_xla: a TPU where "
                                                    "there is one, XLA's CPU client otherwise; docs/xla.md)")
    ap.add_argument("--compile-cache", help="DIR: XLA's persistent compile cache (--device xla): a later run of the "
                                            "same graphs loads them from DIR instead of compiling")


def check_choice(key: str, value: str, noun: str, stack_id: str = "torch-pack") -> None:
    """UsageError naming --KEY unless the lane key `key` of stack `stack_id` takes `value`
    (its description: the values the matrix takes too)."""
    described = lane_key(stack_id, key)
    if not takes(described, value):
        raise UsageError(f"--{key}: unknown {noun} '{value}'; use {or_list(described['values'])}")


def check_device_name(name: str) -> None:
    check_choice("device", name, "device")


def check_precision(precision: str) -> None:
    check_choice("precision", precision, "precision")


def device_of(name: str, compile_cache: Optional[str] = None, deterministic: bool = False) -> Any:
    """The torch device --device names, UsageError where it cannot be had here (no CUDA,
    no torch_xla); on XLA with XLA's persistent compile cache in --compile-cache."""
    import torch

    check_device_name(name)
    if compile_cache is not None and name != "xla":
        raise UsageError(f"--compile-cache: only --device xla has a persistent compile cache (--device {name})")
    if name == "xla":
        from ..xla.device import XlaUnavailable, xla_device

        try:
            return xla_device(compile_cache)
        except XlaUnavailable as e:
            raise UsageError(f"--device xla: {e}") from None
        except OSError as e:
            raise UsageError(f"--compile-cache: cannot use '{compile_cache}' ({e.strerror or e})") from None
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError(f"--device {name}: no CUDA device (torch.cuda.is_available() is False)")
        if deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    device = torch.device(name)
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(f"--device {name}: there are {torch.cuda.device_count()} CUDA devices")
    return device


def add_versioned_argument(ap: Any) -> None:
    """--versioned, as `canary_harness run` and `canary_harness.lane` take it (torch_release)."""
    ap.add_argument("--versioned", action="store_true",
                    help="name the lane after torch's release too, NAME/torch@MAJOR.MINOR (a nightly lane that runs "
                         "another interpreter's torch beside Debian's, with a golden of its own)")


def check_out(path: str, force: bool) -> None:
    if not path:
        raise UsageError("--out: empty path; give the receipt's file path (.h5)")
    if os.path.isdir(path):
        raise UsageError(f"--out: '{path}' is a directory; give a file path")
    if os.path.lexists(path) and not force:
        raise UsageError(f"--out: '{path}' exists; pass --force to overwrite it or choose another path")
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise UsageError(f"--out: directory '{directory}' does not exist; create it first")
    if not os.access(directory, os.W_OK):
        raise UsageError(f"--out: directory '{directory}' is not writable; choose another path")


def parse_lane_fault(text: str, op_names: List[str], parameters: List[str], steps: int) -> Any:
    """--inject-fault of a pack's lane (this one, the JAX lane): a nudge of an op's output
    (step=K,op=NAME[,ulps=N]: a FaultSpec) or a regression of `harness power` (kind=...: a
    RegressionSpec on one of `parameters`, the canary's tensor names); UsageError, one line,
    for anything else."""
    if is_regression(text):
        return parse_regression(text, list(parameters), steps)
    return parse_fault(text, op_names, steps)
