"""Distributed layouts: one canary trained by N processes over gloo, into one receipt.

`python3 -m canary_harness run FILE.py:NAME --layout ddp|fsdp --nproc N --out R.h5` starts N
ranks of the same command on this machine (launch()), joined by torch.distributed over
gloo on the CPU:
- ddp: the model in DistributedDataParallel; each rank's gradients are all-reduced
  (averaged) in buckets during backward, so every rank holds the same parameters,
  gradients and optimizer state after each step.
- fsdp: the model under FSDP2's fully_shard (torch.distributed.fsdp, torch 2.6 on), one
  unit over the whole model: parameters, gradients and optimizer state are sharded across
  the ranks (dim 0), gathered for forward and backward, and gradients reduce-scattered.
  The canary's optimizer is kept: its parameter groups (and any state it made already) are
  pointed at the sharded parameters before its first step (shard_model), so any
  torch.optim optimizer works.

What makes the result one receipt, comparable with the single-process run's:
- Every rank builds the canary from the same seed; rank r trains on rows
  [r*B/N, (r+1)*B/N) of step i's batch (shard_batch), which must divide evenly. The batch
  hash is the whole batch's, so the hashes are bit for bit the one-process run's.
- The loss recorded is the ranks' losses averaged (an all-reduce after the step), the
  loss of the whole batch for a loss that is a mean over it.
- Rank 0 writes the receipt. The digests are of whole tensors: under fsdp each sharded
  tensor is gathered (DTensor.full_tensor(), a collective every rank joins in the same
  order at the end of optimizer.step()); under ddp rank 0's copy is the whole tensor.
- The lane is `<name>/torch+ddp` (+fsdp), budget feature `torch-ddp` (`torch-fsdp`): the
  rounding of bucketed all-reduces and of sharded reductions (docs/own-model.md).

A rank that fails or dies ends the run: the others fail at their next collective (gloo
sees the closed connection), rank 0 closes its receipt with its finished steps and
complete = 0, and the launcher exits 2 with one line naming the rank that died first.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch

from .canary import CanaryError
from ..cli.lane_stacks import lane_key
from ..cli.usage import UsageError, count_flag

LAYOUTS = tuple(lane_key("torch-pack", "layout")["values"])  # the matrix's layout key takes the same
RANK_ENV = "CANARY_HARNESS_RANK"  # set by launch() in each rank's environment: "RANK/WORLD"
MAX_PROCESSES = 16
GRACE_SECONDS = 30.0  # how long the other ranks get to fail on their own after one died


@dataclass(frozen=True)
class Rank:
    """This process's place in a distributed run."""
    layout: str
    rank: int
    world: int


def rank_from_env(layout: str) -> Optional[Rank]:
    """The Rank launch() started this process as, or None in the launcher (or a plain run)."""
    value = os.environ.get(RANK_ENV)
    if not value:
        return None
    rank, world = (int(x) for x in value.split("/"))
    return Rank(layout, rank, world)


def fsdp_available() -> bool:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401 -- FSDP2: torch 2.6 on
    except Exception:  # ImportError; torch 1.13's fsdp package does not even import on Python 3.11
        return False
    return True


def layout_processes(layout: Optional[str], nproc: Optional[str], conflicts: Dict[str, bool]) -> int:
    """The process count of --layout LAYOUT --nproc NPROC (1 without a layout); UsageError
    for an unknown layout, --nproc without one, or a flag of `conflicts` ({flag: given})
    that a layout cannot run with."""
    if layout is None:
        if nproc is not None:
            raise UsageError("--nproc: only with --layout ddp or fsdp")
        return 1
    if layout not in LAYOUTS:
        raise UsageError(f"--layout: unknown layout '{layout}'; use ddp or fsdp")
    for flag, given in conflicts.items():
        if given:
            raise UsageError(f"{flag}: not with --layout (its ranks run eager on the CPU over gloo, and replay and "
                             "traces run one process); run the layout without it")
    return count_flag("nproc", nproc, 2, MAX_PROCESSES) if nproc is not None else 2


# ---- the launcher ---------------------------------------------------------------------------------

def launch(argv: Sequence[str], nproc: int, out: str, layout: str, module: str = "canary_harness") -> int:
    """Runs `python -m MODULE *argv` as ranks 0..nproc-1 and waits for them all.
    Exit 0 when every rank finished; else 2, with one line on stderr naming the rank that
    failed first and what became of the receipt. On success rank 0's stdout (the summary)
    and stderr (progress) are passed on when the run ends, without gloo's connection lines;
    every rank's stderr is kept for the failure's line."""
    with contextlib.ExitStack() as files:
        logs = [files.enter_context(tempfile.TemporaryFile(mode="w+b")) for _ in range(nproc)]
        summary = files.enter_context(tempfile.TemporaryFile(mode="w+b"))
        return _run_ranks(argv, nproc, out, layout, module, logs, summary)


def _run_ranks(argv: Sequence[str], nproc: int, out: str, layout: str, module: str, logs: List[Any],
               summary: Any) -> int:
    """launch() with its ranks' output files open."""
    port = _free_port()
    ranks: List[subprocess.Popen] = []
    try:
        for r in range(nproc):
            env = dict(os.environ, **{RANK_ENV: f"{r}/{nproc}", "MASTER_ADDR": "127.0.0.1",
                                      "MASTER_PORT": str(port), "RANK": str(r), "WORLD_SIZE": str(nproc)})
            ranks.append(subprocess.Popen([sys.executable, "-m", module, *argv], env=env,
                                          stdout=summary if r == 0 else subprocess.DEVNULL, stderr=logs[r]))
        failed = _wait_all(ranks)
    except BaseException:
        _stop(ranks)
        raise
    if failed is None:
        for log, stream in ((logs[0], sys.stderr), (summary, sys.stdout)):
            log.seek(0)
            stream.write(_relayed(log.read().decode(errors="replace")))
        return 0
    r, code = failed
    how = f"was killed by signal {-code}" if code < 0 else f"failed (exit status {code})"
    logs[r].seek(0)
    reason = _last_line(logs[r].read().decode(errors="replace"))
    kept = f"{out} keeps its finished steps (complete = 0)" if os.path.exists(out) else "no receipt was written"
    print(f"{module}: error: --layout {layout}: rank {r} of {nproc} {how}"
          f"{': ' + reason if reason else ''}; {kept}", file=sys.stderr)
    return 2


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_all(ranks: List[subprocess.Popen]) -> Optional[tuple]:
    """Waits for every rank; (rank, exit code) of the first to fail, or None. Among ranks
    seen failing in one poll, one killed by a signal is named first: the others most
    likely failed because it went."""
    failed: Optional[tuple] = None
    deadline = None
    while True:
        codes = [p.poll() for p in ranks]
        if failed is None:
            new = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if new:
                failed = min(new, key=lambda rc: (rc[1] >= 0, rc[0]))
                deadline = time.monotonic() + GRACE_SECONDS
        if all(c is not None for c in codes):
            return failed
        if deadline is not None and time.monotonic() > deadline:
            _stop(ranks)
            return failed
        time.sleep(0.05)


def _stop(ranks: List[subprocess.Popen]) -> None:
    """SIGTERM to every rank still running, SIGKILL to those that ignore it for 5 s."""
    for p in ranks:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + 5.0
    for p in ranks:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _relayed(text: str) -> str:
    """A rank's output without gloo's connection lines (its C++ prints them to stdout)."""
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("[Gloo]"))


def _last_line(text: str) -> str:
    lines = [line.strip() for line in _relayed(text).splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    return re.sub(r"^[\w.]+: error: ", "", line)  # the rank's own "PROG: error: " goes: the launcher's line says it


# ---- inside a rank --------------------------------------------------------------------------------

def join(rank: Rank) -> None:
    """Joins the run's process group (gloo, the launcher's address in the environment)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank.rank, world_size=rank.world)


def leave() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def shard_model(model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: Rank) -> torch.nn.Module:
    """The model each step is handed: DistributedDataParallel around it (ddp), or the model
    itself sharded in place by fully_shard (fsdp), the optimizer's groups pointed at the
    sharded parameters (by their names: fully_shard makes new Parameter objects)."""
    if rank.layout == "ddp":
        # Boolean buffers (attention masks) are left out of DDP's broadcasts: torch 1.13's
        # gloo cannot carry them ("Invalid scalar type"), and every rank built them alike.
        masks = [name for name, b in model.named_buffers() if b.dtype == torch.bool]
        torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, masks)
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    before = {id(p): (name, p) for name, p in model.named_parameters()}
    fully_shard(model)
    after = dict(model.named_parameters())
    for group in optimizer.param_groups:
        group["params"] = [after[before[id(p)][0]] for p in group["params"]]
    _shard_state(optimizer, before, after)
    return model


@contextlib.contextmanager
def whole_for_evaluation(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The model an evaluation between steps runs on, whole: DDP's own module (the wrapper has
    only forward, and an evaluation may call another method: eval_logits=lambda model,
    batch: model.logits(...)); FSDP2's with its parameters gathered, sharded again after.
    FSDP2 gathers a module's parameters in its forward's hooks, which such a method never
    runs, and keeps the root's gathered after a forward for the backward that follows, which
    an evaluation has none of: left so, the next step would read the gathered parameters'
    gradients (None) while its own are reduced into the shards."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        yield model.module
        return
    unshard = getattr(model, "unshard", None)  # FSDPModule's (fully_shard's class)
    if not callable(unshard):
        yield model
        return
    unshard()
    try:
        yield model
    finally:
        model.reshard()


def _shard_state(optimizer: torch.optim.Optimizer, before: Dict[int, tuple], after: Dict[str, Any]) -> None:
    """State an optimizer made before its first step (the lane's AdamW makes its moments at
    construction) follows its parameter: keyed by the sharded parameter, each tensor of the
    parameter's shape sharded as it is (anything else, a shared step counter, kept)."""
    from torch.distributed.tensor import distribute_tensor

    state = {}
    for key, values in list(optimizer.state.items()):
        name, old = before[id(key)]
        new = after[name]
        state[new] = {k: distribute_tensor(v, new.device_mesh, new.placements)
                      if isinstance(v, torch.Tensor) and v.shape == old.shape else v for k, v in values.items()}
    optimizer.state.clear()
    optimizer.state.update(state)


def shard_batch(batch: Any, rank: Rank, step: int) -> Any:
    """Rank r's rows of every tensor in the batch (dim 0, equal shares); anything that is
    not a tensor goes to every rank as it is. CanaryError when a tensor's rows do not
    divide among the ranks."""
    if isinstance(batch, torch.Tensor):
        rows = batch.shape[0] if batch.dim() else 0
        if rows % rank.world or not rows:
            raise CanaryError(f"--nproc {rank.world}: batch({step}) has a tensor of shape {tuple(batch.shape)}, "
                              f"whose first dimension does not divide among {rank.world} ranks")
        share = rows // rank.world
        return batch[rank.rank * share:(rank.rank + 1) * share]
    if isinstance(batch, dict):
        return {k: shard_batch(v, rank, step) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(shard_batch(v, rank, step) for v in batch)
    return batch


def mean_over_ranks(value: Any, rank: Rank) -> torch.Tensor:
    """The ranks' values (a loss) averaged: an all-reduce every rank joins after its step."""
    import torch.distributed as dist

    t = value.detach().to(torch.float64).reshape(1).clone() if isinstance(value, torch.Tensor) \
        else torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t)
    return t / rank.world


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded tensor gathered whole (a collective: every rank calls it, in one order);
    any other tensor as it is."""
    full_tensor = getattr(tensor, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else tensor
