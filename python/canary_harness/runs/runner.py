"""The loop that runs a canary and records its receipt: a team's Python canary
(canary_harness.runs.canary) and the PyTorch lane of a built-in canary (canary_harness.lane,
whose pack makes a canary of the same shape: one loop, one digest path).

The harness owns the loop; the canary's `step` owns the training step:

    for i in range(steps):
        batch = canary.batch(i)                  # hashed; a second call must hash alike (checked)
        with autocast (bf16 only):
            loss = canary.step(model, optimizer, batch on the device, i)
        mark_step() (XLA only)
        record step i                            # the tensors as they were at the end of optimizer.step()

What step i records, and when. Parameters, gradients and the optimizer's moments are
taken at the end of the step's last optimizer.step() call (a post-hook on the optimizer):
at that moment the parameters are updated and the gradients are the ones the update
applied, even when the step zeroes them right after (`zero_grad()` inside the step, as
many loops do). Fp32 CPU tensors are digested there, in place, by the digest library;
anything else is copied there on its device and digested after the step (StepCapture).
A step that calls no optimizer.step() (an AMP scaler that skips it) is taken when it
returns. The loss (and the norm, if the step returns one) is read after the step returns:
no host read happens inside the step, where a lazy device would have to cut its graph.
The learning rate is the first parameter group's at the update.

Budget features (docs/budgets.md): the run on the CPU in fp32 is the canary's own
bitwise reference (""); bf16 autocast declares `torch-bf16`, another device
`torch-<device>`, --compile `torch-compile`, a distributed layout (one rank of it:
canary_harness.runs.distributed) `torch-ddp` or `torch-fsdp`. The lane is `<name>/torch`
(`<name>/torch@2.9` with --versioned), with `+<device>`, `+bf16`, `+compile` and
`+ddp`/`+fsdp` as features.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import json
import logging
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import numpy as np
import torch

from ..tracing.aten_fault import AtenFault, split_target, target_problem
from ..audit import AuditError, CompileLog
from ..receipts.budget_features import format_features
from .canary_state import capture_state
from .faults import nudge_first_result, parse_fault
from .held_out import HeldOutEval
from ..cli.lane_stacks import budget_features, lane_name, stack_options
from .canary import CanaryError, LoadedCanary
from ..receipts.digest import batch_hash, batch_tree_hash
from .devices import place_on_device, to_device
from ..receipts.digest_plan import DigestRows
from .distributed import mean_over_ranks, shard_batch, shard_model, whole, whole_for_evaluation
from .perturb import perturb_parameters
from .precision import AutocastOff, UnknownModule
from ..receipts.receipt import ReceiptReader, ReceiptWriter
from .regressions import RegressionFault, RegressionSpec, is_regression, parse_regression
from .recording import MomentSource, StepDigest, Worker, host_float, host_float32
from ..receipts.stack import StackInfo, collect_stack_info, git_commit_of, imported_distributions, with_model
from ..tracing.trace import StepTraces, TraceError
from ..xla.device import XlaStepCounters, mark_step

@dataclass
class RunOptions:
    """How to run a canary: what `python3 -m canary_harness run` takes from its flags."""

    out: str
    device: str = "cpu"
    precision: str = "fp32"
    steps: Optional[int] = None          # None: the canary's own
    threads: int = 1
    fault: Any = None                    # a canary_harness.lane.FaultSpec on a module path, or None
    overwrite: bool = False
    checkpoint_every: int = 0            # 0: no checkpoints
    perturb_init: Optional[int] = None   # a seed: every initial weight moved one ulp (perturb.py)
    trace: str = "none"                  # "ops": every module op's output into /trace (trace.StepTraces)
    audit: bool = False                  # each step's op graph and compile counters into /compile (audit.CompileLog)
    compile: bool = False                # the model under torch.compile (Inductor): compiled_model()
    rank: Any = None                     # a distributed.Rank: this process is one rank of --layout ddp|fsdp
    versioned: bool = False              # the lane named after torch's release too: NAME/torch@2.9
    autocast_off: List[str] = field(default_factory=list)  # modules run in fp32 outside bf16 autocast (precision.py)


def lane_features(device: torch.device, precision: str, compiled: bool = False, layout: Optional[str] = None) -> List[str]:
    """The lane's features: the device where it is not the CPU, then bf16, then compile,
    then the distributed layout (ddp, fsdp)."""
    return ([device.type] if device.type != "cpu" else []) + (["bf16"] if precision == "bf16" else []) + \
        (["compile"] if compiled else []) + ([layout] if layout else [])


def torch_release() -> str:
    """MAJOR.MINOR of the torch this process runs ("2.9" for 2.9.0+cu128, "1.13" for 1.13.0a0)."""
    found = re.match(r"(\d+\.\d+)", torch.__version__)
    return found.group(1) if found else torch.__version__


def compiled_model(model: torch.nn.Module) -> torch.nn.Module:
    """The model under torch.compile with its default backend (Inductor; on the CPU it
    generates C++ kernels): forward and backward compiled, the optimizer eager. The same
    parameters (an OptimizedModule around the model), so the optimizer, the digests and
    the checkpoints see no difference; hooks registered before (a fault's, op traces')
    are traced into the graph. CanaryError on a torch without torch.compile (1.13)."""
    if not hasattr(torch, "compile"):
        raise CanaryError(f"--compile: torch {torch.__version__} has no torch.compile (torch 2.x has; "
                          "docs/python-env.md: run it with .venv/bin/python)")
    # Inductor's C++ toolchain probe warns when a CUDA toolkit is installed without a GPU
    # ("No CUDA runtime is found"): nothing a CPU run needs, and not the run's to report.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    os.environ.update(inductor_cache_of_the_aten_isa(os.environ))
    return torch.compile(model)


def inductor_cache_of_the_aten_isa(env: Dict[str, str]) -> Dict[str, str]:
    """The TORCHINDUCTOR_CACHE_DIR a compiled run under ATEN_CPU_CAPABILITY=ISA takes: a
    directory of that ISA inside the one it would use (env's, or Inductor's default,
    TMPDIR/torchinductor_USER); {} without the variable or when env already points there.
    Inductor generates its kernels for ATen's ISA but does not key its caches on it: on an
    AVX-512 CPU, a run under `aten-avx2` (docs/budgets.md, "Hosts") loaded kernels a native
    run had cached and failed in them ("index out of bounds", torch 2.9)."""
    isa = env.get("ATEN_CPU_CAPABILITY")
    if not isa:
        return {}
    base = env.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(tempfile.gettempdir(),
                                                              "torchinductor_" + getpass.getuser())
    if os.path.basename(os.path.normpath(base)) == f"aten-{isa}":
        return {}
    return {"TORCHINDUCTOR_CACHE_DIR": os.path.join(base, f"aten-{isa}")}


class StepCapture:
    """Takes a canary's tensors at the end of each optimizer.step() call (the module docstring).

    One StepDigest over every tensor of params, grads, adam_m and adam_v in canonical order
    (canary_harness.runs.recording: the Recorder's digest path too). When it digests:
    - inline, at the end of optimizer.step(): where every tensor is fp32 in CPU memory and
      the digest library reads it in place. No torch op runs and nothing is copied.
    - deferred (anywhere else: another device, the Python digest): at the end of
      optimizer.step() it copies the tensors on their device (what the rest of the step
      does to them, a zero_grad() say, is not recorded, as inline), and digests the copies
      in finish(), after the step has returned (and after XLA's mark_step). No host read
      happens inside the step, where a lazy device would cut its graph.
    Both record the same bits (python/tests/test_python_canary.py).
    """

    def __init__(self, loaded: LoadedCanary, sharded: bool = False) -> None:
        canary = loaded.canary
        self.sharded = sharded  # FSDP's DTensors: each gathered whole before the digest (distributed.whole)
        self.names = loaded.tensor_names
        params = dict(canary.model.named_parameters())
        self.params = [params[n] for n in self.names]
        self.optimizer = canary.optimizer
        self.digest = StepDigest(self.names, [p.numel() for p in self.params])
        on_cpu = all(p.device.type == "cpu" for p in self.params)
        self.deferred = not (on_cpu and self.digest.native)
        self.moments = MomentSource(self.optimizer)
        self.digests: Optional[DigestRows] = None
        self._kept: Optional[List[torch.Tensor]] = None
        self.lr: Any = None
        self._hook = self._install()

    def _install(self) -> Callable[[], None]:
        """A post-hook on optimizer.step (torch 2.x's register_step_post_hook; on 1.13, which
        has none, the instance's step wrapped). Returns what removes it."""
        if hasattr(self.optimizer, "register_step_post_hook"):
            handle = self.optimizer.register_step_post_hook(lambda optimizer, args, kwargs: self.capture())
            return handle.remove
        step = self.optimizer.step
        replaced = self.optimizer.__dict__.get("step")  # an LR scheduler's counting wrapper, or None

        @functools.wraps(step)  # keeps what wrappers mark it with (an LR scheduler's _with_counter)
        def step_then_capture(*args: Any, **kwargs: Any) -> Any:
            result = step(*args, **kwargs)
            self.capture()
            return result

        self.optimizer.step = step_then_capture

        def restore() -> None:
            if replaced is None:
                self.optimizer.__dict__.pop("step", None)
            else:
                self.optimizer.step = replaced
        return restore

    def remove(self) -> None:
        self._hook()

    def begin(self) -> None:
        self.digests, self._kept, self.lr = None, None, None

    def capture(self, at_end: bool = False) -> None:
        """The step's tensors as they stand now (at the end of optimizer.step(), or at the
        step's end when no optimizer.step() ran): digested inline, or kept (class docstring)."""
        tensors = [*self.params, *(self._grad(p) for p in self.params),
                   *(self._moment(p, "adam_m") for p in self.params), *(self._moment(p, "adam_v") for p in self.params)]
        if self.sharded:  # a collective: every rank gathers, in this one order
            tensors = [whole(t) for t in tensors]
        self.lr = self.optimizer.param_groups[0]["lr"]
        if not self.deferred:
            self.digests = self.digest.rows(tensors)
            return
        if not at_end:  # copies on the device (lazy on XLA): what the rest of the step does is not recorded
            with torch.no_grad():
                tensors = [t.detach().clone() for t in tensors]
                self.lr = self.lr.detach().clone() if isinstance(self.lr, torch.Tensor) else self.lr
        self._kept = tensors

    def finish(self) -> None:
        """After the step (and the device's sync): the digests, taken now if they were deferred
        or if no optimizer.step() ran in it; the lr read to the host."""
        if self.digests is None and self._kept is None:
            self.capture(at_end=True)
        if self._kept is not None:
            self.digests, self._kept = self.digest.rows(self._kept), None
        self.lr = host_float(self.lr)

    def state_now(self) -> Dict[str, Any]:
        """row() of the tensors as they stand now, outside any step (what replay verifies a
        loaded checkpoint with), on either digest path: capture() alone leaves the deferred
        path's copies undigested, so it is taken as a step that ran no optimizer.step()."""
        self.begin()
        self.finish()
        return self.row()

    def _grad(self, p: torch.Tensor) -> torch.Tensor:
        return p.grad if p.grad is not None else self.moments.zeros_like(p)

    def _moment(self, p: torch.Tensor, family: str) -> torch.Tensor:
        return self.moments.moment(p, family)

    def grad_norm(self) -> float:
        """The L2 norm of the gradients the update applied, from their sketches' norms."""
        return self.digest.grad_norm(self.digests)

    def row(self) -> Dict[str, Any]:
        """append_step's hashes and sketches from the captured digests."""
        hashes, sketches = self.digest.split(self.digests)
        return {"hashes": hashes, "sketches": sketches}


def _loss_and_norm(result: Any, step: int) -> tuple:
    """The step's return value as (loss, norm or None); CanaryError when it is not a scalar."""
    norm = None
    if isinstance(result, tuple) and len(result) == 2:
        result, norm = result
    for what, value in (("loss", result), ("grad_norm", norm)):
        if value is None and what == "grad_norm":
            continue
        if isinstance(value, torch.Tensor):
            if value.numel() != 1 or not (value.is_floating_point() or value.dtype in (torch.int32, torch.int64)):
                raise CanaryError(f"step {step}: step() returned a {what} of shape {tuple(value.shape)} and dtype "
                                  f"{value.dtype}; return the {what} as one number (a 1-element tensor)")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CanaryError(f"step {step}: step() returned {type(value).__name__} as the {what}; return the loss "
                              "(a 1-element tensor or a number), or (loss, grad_norm)")
    return result, norm


def batch_checked_at(step: int) -> bool:
    """Whether step i calls a Python canary's batch(i) a second time to hold it to the
    contract (the same batch on every call): steps 0 to 3, then every power of two. A batch
    drawn from an unseeded generator or an iterator differs at step 0 already; checking
    every step would double the data's cost, and a batch that differs at another step
    still shows in the recorded batch hash, which every comparison of two runs checks."""
    return step < 4 or step & (step - 1) == 0


def _checked_batch(loaded: LoadedCanary, step: int) -> tuple:
    """Step i's batch and its hash under the canary's data contract (LoadedCanary.token_batches);
    CanaryError when a Python canary's batch(i) is not the same on a second call (at the
    steps batch_checked_at names)."""
    canary = loaded.canary
    if loaded.token_batches:  # a checksummed pack's tokens: read once, hashed as the C++ engines do
        batch = canary.batch(step)
        return batch, batch_hash(batch)
    batch = canary.batch(step)  # the team's code: its errors are its own
    try:
        first = batch_tree_hash(batch)
        second = batch_tree_hash(canary.batch(step)) if batch_checked_at(step) else first
    except ValueError as e:
        raise CanaryError(f"step {step}: {e}") from None
    if first != second:
        raise CanaryError(f"step {step}: batch({step}) gave two different batches on two calls; batch(i) must "
                          "return step i's inputs, the same every time (seed any sampling from i)")
    return batch, first


def _autocast_text(options: RunOptions) -> str:
    """The manifest's autocast: "none", "bfloat16", or "bfloat16 (off in: a, b)"."""
    if options.precision != "bf16":
        return "none"
    return "bfloat16" + (f" (off in: {', '.join(options.autocast_off)})" if options.autocast_off else "")


def stack_of(loaded: LoadedCanary) -> StackInfo:
    """The run's stack line: collect_stack_info's, with the distributions the canary's file
    imports (transformers and the like: what its model's code is) and the attention its
    modules declare (stack.with_model)."""
    imported = imported_distributions(loaded.module) if loaded.module is not None else []
    return with_model(collect_stack_info(include_torch=True), loaded.canary.model, imported)


def manifest_for(loaded: LoadedCanary, options: RunOptions, device: torch.device, steps: int) -> Dict[str, Any]:
    layout = options.rank.layout if options.rank is not None else None
    features = lane_features(device, options.precision, options.compile, layout)
    fault = str(options.fault) if options.fault is not None else "none"
    # The recipe `python3 -m canary_harness replay` (and `harness replay`) runs again.
    run_options = {"canary": f"{loaded.path}:{loaded.function}", "device": options.device,
                   "precision": options.precision, "steps": steps, "threads": options.threads, "seed": loaded.seed,
                   "inject_fault": str(options.fault) if options.fault is not None else None,
                   "checkpoint_every": options.checkpoint_every, "trace": options.trace, "python": sys.executable,
                   **({"compile": True} if options.compile else {}),
                   **({"layout": layout, "nproc": options.rank.world} if layout else {}),
                   **({"versioned": True} if options.versioned else {}),
                   **({"autocast_off": list(options.autocast_off)} if options.autocast_off else {})}
    perturbed = {}
    if options.perturb_init is not None:
        run_options["perturb_init"] = options.perturb_init
        perturbed = {"init_perturbation_seed": options.perturb_init}
    # Its name, and what separates it from the canary's fp32 eager one-process CPU run, its
    # bitwise reference: the stack's description (lane_stacks.py).
    described = stack_options(loaded.canary.name, release=torch_release() if options.versioned else None,
                              device=device.type, precision=options.precision, compiled=options.compile,
                              layout=layout)
    return {
        "lane": lane_name("torch-canary", described),
        "engine": "torch", "features": "+".join(features),
        "budget_features": format_features(budget_features("torch-canary", described)),
        "canary": loaded.identity(), "seed": loaded.seed, "steps_planned": steps, "threads": options.threads,
        "device": str(device), "precision": options.precision,
        "autocast": _autocast_text(options),
        "fault_injection": fault, "trace": options.trace,
        **({"compile": "inductor"} if options.compile else {}),
        **({"layout": layout, "nproc": options.rank.world} if layout else {}),
        # The team's code is what a golden of its canary stands for: the commit of the canary file's work tree.
        "git_commit": git_commit_of(loaded.path),
        "run_options": json.dumps(run_options, sort_keys=True),
        **perturbed,
    }


@dataclass
class RunSummary:
    steps: int
    losses: List[float]
    seconds: float
    audit: Optional[str] = None  # the audit's one-line summary (audit.CompileLog.summary()) with audit


@dataclass
class StepRecord:
    """What one step records: append_step's arguments."""

    loss: float
    grad_norm: float
    lr: float
    batch_hash: int
    hashes: Dict[str, Any]
    sketches: Dict[str, Any]
    trace: Any = None  # the step's /trace row (columns, hashes, sketches) with --trace ops
    compile: Any = None  # the step's /compile row (audit.CompileLog.end()) with audit
    state: Any = None  # the model's own records of the step (model_step_state: moe's /routing)


def model_step_state(model: torch.nn.Module) -> Any:
    """What the model records of each step beside the digests, read after the step: a module
    that keeps such records defines step_state() -> [receipt.StepState] (canary_harness.models.moe:
    its routing); None for any other."""
    core = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    records = getattr(core, "step_state", None)
    return records() if callable(records) else None


class CanaryLoop:
    """One step of a canary at a time, as a run and a replay both take it (module docstring):
    the model placed on the device, the fault armed, bf16 autocast around the step, the
    digests taken at the end of optimizer.step(), XLA's mark_step() after the step, the
    audit's window (when asked) from the batch on the device to that mark_step(). close()
    removes the digest hook, the trace's hooks and the audit's modes."""

    def __init__(self, loaded: LoadedCanary, options: RunOptions, device: torch.device) -> None:
        self.loaded = loaded
        self.canary = loaded.canary
        self.device = device
        torch.set_num_threads(options.threads)
        if options.perturb_init is not None:  # on the weights NAME() made, before anything runs
            perturb_parameters(self.canary.model, options.perturb_init)
        place_on_device(self.canary, device)
        try:
            self.autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16) \
                if options.precision == "bf16" else None
        except (RuntimeError, ValueError) as e:
            raise CanaryError(f"--precision bf16: no bf16 autocast on device {device.type} ({e})") from None
        self.fault = _install_fault(self.canary, options.fault, device)
        self.autocast_off = _autocast_off(self.canary.model, options, device)
        self.rank = options.rank
        # What the step is handed as its model: the model, sharded or wrapped for the layout
        # (before the capture, which takes FSDP's new parameters), compiled last (after every hook).
        self.model = shard_model(self.canary.model, self.canary.optimizer, self.rank) if self.rank is not None \
            else self.canary.model
        self.capture = StepCapture(loaded, sharded=self.rank is not None and self.rank.layout == "fsdp")
        self.mark_step = _mark_step_of(device)
        self.audit = None
        if options.audit:
            self.audit = CompileLog()
        self.xla_counters = None
        if device.type == "xla":  # the compiler's own counters: /compile on every XLA run

            self.xla_counters = XlaStepCounters()
        self.traces = None
        if options.trace == "ops":  # hooks after the fault's: the trace sees the nudged value

            params = dict(self.canary.model.named_parameters())
            self.traces = StepTraces(self.canary.model, {id(params[n]): n for n in loaded.tensor_names})
        if options.compile:
            self.model = compiled_model(self.model)
        self.held_out = None
        if self.canary.eval_batch is not None:  # docs/logit-kl.md

            counters = None
            if device.type == "xla":
                counters = XlaStepCounters()
            self.held_out = HeldOutEval(loaded, device, self.autocast, counters)
        if self.mark_step is not None:
            # What the model's and optimizer's construction left lazy on XLA (initial
            # weights moved over, pre-allocated state, zeros) becomes device data before
            # step 0: otherwise step 0 builds them into its graph and step 1, which finds
            # them as data, compiles a second one.
            self.mark_step()

    def run_step(self, i: int, traced: Any = None) -> StepRecord:
        """Runs step i (inside `traced`, a context such as AtenTracer.step(), when given)."""
        canary = self.canary
        batch, hashed = _checked_batch(self.loaded, i)  # the whole batch's hash, on every layout
        if self.rank is not None:
            batch = shard_batch(batch, self.rank, i)
        if self.fault is not None and self.fault.between_steps(i) and self.mark_step is not None:
            # What a regression changed before the step (a scaled weight) becomes device data
            # outside the step's window: the step's graph, fingerprint and compiles stay its own.
            self.mark_step()
        if self.audit is not None:  # the step starts: its ops, fingerprinted (canary_harness.audit)
            self.audit.begin(i)
        if self.xla_counters is not None:
            self.xla_counters.begin(i)
        if self.fault is not None:
            self.fault.arm(i)
        inputs = to_device(batch, self.device)
        self.capture.begin()
        with contextlib.ExitStack() as contexts:
            if self.fault is not None:  # before a trace: the trace sees the nudged value
                contexts.enter_context(self.fault.during(i))
            if traced is not None:
                contexts.enter_context(traced)
            if self.autocast is not None:
                contexts.enter_context(self.autocast)
            result = canary.step(self.model, canary.optimizer, inputs, i)
        loss, norm = _loss_and_norm(result, i)
        if self.rank is not None:  # every rank's loss, averaged: the whole batch's
            loss = mean_over_ranks(loss, self.rank)
        if self.mark_step is not None:
            self.mark_step()
        compile_row = self._compile_row(i)  # the step ends: nothing before here reads a value
        if self.fault is not None:
            self.fault.check(i)
        self.capture.finish()
        row = self.capture.row()
        grad_norm = host_float(norm) if norm is not None else self.capture.grad_norm()
        return StepRecord(host_float(loss), grad_norm, self.capture.lr, hashed, row["hashes"], row["sketches"],
                          self._trace_row(i, grad_norm), compile_row, model_step_state(self.model))

    def evaluate(self, step: int) -> Any:
        """The held-out evaluation at the start of `step` (held_out.EvalRow), outside any step:
        on the model the step is handed, torch.compile's wrapper aside (the evaluation's hooks
        and its other call would recompile the step's graph; the module runs eagerly)."""
        model = getattr(self.model, "_orig_mod", self.model)
        if self.rank is None:
            return self.held_out.evaluate(model, step)
        with whole_for_evaluation(model) as whole_model:  # a layout's: docs/own-model.md, "More than one process"
            return self.held_out.evaluate(whole_model, step)

    def _compile_row(self, step: int) -> Optional[Dict[str, float]]:
        """The step's /compile row: torch_xla's own counters on XLA, the audit's static ones
        with --audit; with both, the compiler's keep their names (what `harness check`
        gates) and the audit's prediction sits beside them as Audit<Name> (Fingerprint
        as it is), so that a receipt shows where the two disagree."""
        static = self._end_audit(step)
        if self.xla_counters is None:
            return static
        row = self.xla_counters.end()
        for name, value in (static or {}).items():
            row[name if name == "Fingerprint" else f"Audit{name}"] = value
        return row

    def _end_audit(self, step: int) -> Optional[Dict[str, float]]:
        if self.audit is None:
            return None

        try:
            return self.audit.end()
        except AuditError as e:
            raise CanaryError(f"audit: step {step}: {e}") from None

    def _trace_row(self, step: int, grad_norm: float) -> Any:
        if self.traces is None:
            return None

        params = self.capture.params
        try:
            return self.traces.row(step, np.array([grad_norm], dtype=np.float32),
                                   [(n, p, host_float32(p)) for n, p in zip(self.loaded.tensor_names, params)])
        except TraceError as e:
            raise CanaryError(f"--trace ops: {str(e).removeprefix('op trace: ')}") from None

    def close(self) -> None:
        self.capture.remove()
        if self.autocast_off is not None:
            self.autocast_off.close()
        if self.traces is not None:
            self.traces.close()
        if self.audit is not None:
            self.audit.abandon()


def _mark_step_of(device: torch.device) -> Optional[Callable[[], None]]:
    """XLA's mark_step (the step's graph cut and run there), None on an eager device."""
    if device.type != "xla":
        return None

    return mark_step


def run_canary(loaded: LoadedCanary, options: RunOptions, device: torch.device,
               progress: Optional[Callable[[int, int], None]] = None,
               manifest: Optional[Dict[str, Any]] = None) -> RunSummary:
    """Runs the canary for its steps (or options.steps) and writes the receipt to options.out
    (ReceiptRun: the failure rules are its)."""
    steps = options.steps or loaded.canary.steps
    writes = options.rank is None or options.rank.rank == 0  # rank 0 records a distributed run
    run = ReceiptRun(loaded, options, device, steps, manifest) if writes \
        else UnrecordedRun(loaded, options, device, steps)
    losses: List[float] = []
    start = time.perf_counter()
    try:
        for i in range(steps):
            losses.append(run.step(i).loss)
            if progress is not None:
                progress(i, steps)
        run.finish()
        seconds = time.perf_counter() - start
    except BaseException as e:
        run.abandon(e)
        raise
    finally:
        run.loop.close()
    audit = run.loop.audit
    return RunSummary(steps, losses, seconds, audit.summary() if audit is not None else None)


class UnrecordedRun:
    """A rank other than 0 of a distributed run (canary_harness.runs.distributed): the same steps,
    and so the same collectives (the gathers of the digest included), into no receipt."""

    def __init__(self, loaded: LoadedCanary, options: RunOptions, device: torch.device, steps: int) -> None:
        self.loop = CanaryLoop(loaded, options, device)
        self.steps = steps

    def step(self, i: int) -> StepRecord:
        self._evaluate_if_due(i)
        return self.loop.run_step(i)

    def finish(self) -> None:
        self._evaluate_if_due(self.steps)

    def _evaluate_if_due(self, step: int) -> None:
        """Rank 0's held-out evaluations, run here too: a sharded forward needs every rank."""
        if self.loop.held_out is not None and self.loop.held_out.due(step):
            self.loop.evaluate(step)

    def abandon(self, error: BaseException) -> None:
        pass


class ReceiptRun:
    """A canary's run into its receipt, one step() at a time: CanaryLoop's steps, each row
    appended on one background thread while the next step trains (recording.Worker: one row
    in flight at most, so a process killed loses that row only), the canary's state every
    options.checkpoint_every steps (canary_harness.runs.canary_state). `manifest`: the receipt's
    manifest where the caller makes it (the PyTorch lane of a built-in canary:
    canary_harness.lane), else manifest_for()'s.

    finish() writes the last row and closes the receipt. abandon(error) after a failure: a
    CanaryError (the canary breaks its contract: a batch that differs between calls, a loss
    that is not a scalar) removes the receipt; any other failure leaves it with its finished
    steps and complete = 0 (a failure before the first step removes it). The caller closes
    `loop` (run_canary)."""

    def __init__(self, loaded: LoadedCanary, options: RunOptions, device: torch.device, steps: int,
                 manifest: Optional[Dict[str, Any]] = None) -> None:
        self.loaded, self.options, self.device, self.steps = loaded, options, device, steps
        self.loop = CanaryLoop(loaded, options, device)
        writer: Optional[ReceiptWriter] = None
        try:
            writer = ReceiptWriter(options.out, manifest or manifest_for(loaded, options, device, steps),
                                   loaded.tensor_names, overwrite=options.overwrite, stack=stack_of(loaded))
            if options.checkpoint_every:
                writer.declare_checkpoints(options.checkpoint_every)
        except BaseException:
            if writer is not None:
                writer.discard()
            self.loop.close()
            raise
        self.writer = writer
        self.rows = Worker(lambda job: _append_row(writer, job.record),
                           name=f"canary-receipt:{os.path.basename(options.out)}")

    def step(self, i: int) -> StepRecord:
        """Runs and records step i (its row written in the background)."""
        self._evaluate_if_due(i)
        every = self.options.checkpoint_every
        if every and i > 0 and i % every == 0:
            _wait_for(self.rows)  # the rows before it first: a checkpoint follows its step's row
            self.writer.append_checkpoint(i, capture_state(self.loaded, i, self.device))
        record = self.loop.run_step(i)
        _wait_for(self.rows)
        self.rows.submit(RowJob(i, record))
        return record

    def finish(self) -> None:
        self.rows.stop()
        _wait_for(self.rows)
        self._evaluate_if_due(self.steps)  # the final parameters
        self.writer.close()

    def _evaluate_if_due(self, step: int) -> None:
        """The held-out evaluation at the start of `step` into /eval, declared at the first
        (docs/logit-kl.md); the rows before it written first."""
        held_out = self.loop.held_out
        if held_out is None or not held_out.due(step):
            return
        _wait_for(self.rows)
        row = self.loop.evaluate(step)
        if step == held_out.every:
            d = held_out.declaration
            self.writer.declare_eval(d.every, d.held_out_hash, d.source, d.targets, d.vocab)
        self.writer.append_eval(row.step, row.loss, row.logits, row.compiles)

    def abandon(self, error: BaseException) -> None:
        self.rows.stop()  # every row handed over is written (or failed) first
        if isinstance(error, CanaryError):
            self.writer.discard(recorded_steps_too=True)
        elif self.writer.steps_recorded == 0:
            self.writer.discard()
        else:
            self.writer.close()


class RowJob(NamedTuple):
    """A step's row for the background writer."""
    step: int
    record: StepRecord


def _append_row(writer: ReceiptWriter, record: StepRecord) -> None:
    writer.append_step(loss=record.loss, grad_norm=record.grad_norm, lr=record.lr, batch_hash=record.batch_hash,
                       hashes=record.hashes, sketches=record.sketches, trace=record.trace, compile=record.compile,
                       state=record.state)


def _wait_for(rows: Worker) -> None:
    """Until the row in flight is written; its failure (a full disk, say) raised here."""
    rows.wait()
    if rows.error is not None:
        raise rows.error


class _Fault:
    """A forward hook on the fault's module that moves element 0 of its output (of its first
    result, where it returns a tuple: a moe route's weights) up by the fault's ulps at the
    fault's step (a 0-D device flag, filled each step: data, not a constant of the graph).
    A module that never runs in the fault's step (a container such as an nn.ModuleList), or
    whose output (first result) is not a floating-point tensor, is a CanaryError: a fault
    recorded in the manifest must have happened."""

    def __init__(self, model: torch.nn.Module, spec: Any, device: torch.device) -> None:
        self.spec = spec
        self.active = torch.zeros((), dtype=torch.bool, device=device)
        self.calls = 0

        def nudge(module: torch.nn.Module, args: Any, out: Any) -> Any:
            self.calls += 1
            first = out[0] if isinstance(out, tuple) and out else out
            if not (isinstance(first, torch.Tensor) and first.is_floating_point() and first.numel() > 0):
                what = "a tuple whose first result is" if isinstance(out, tuple) else f"a {type(out).__name__},"
                raise CanaryError(f"--inject-fault: module '{spec.op}' returns {what} not a floating-point tensor; "
                                  "name a module whose output (or first result) is one")
            return nudge_first_result(out, self.active, spec.ulps)

        model.get_submodule(spec.op).register_forward_hook(nudge)

    def between_steps(self, step: int) -> bool:
        return False  # a nudge acts inside the step only

    def arm(self, step: int) -> None:
        self.active.fill_(step == self.spec.step)
        self.calls = 0

    def check(self, step: int) -> None:
        if step == self.spec.step and self.calls == 0:
            raise CanaryError(f"--inject-fault: module '{self.spec.op}' did not run in step {step} (a container "
                              "such as an nn.ModuleList is never called itself); name a module the forward calls")


    def during(self, step: int) -> Any:
        return contextlib.nullcontext()  # the hook does it


def _autocast_off(model: torch.nn.Module, options: RunOptions, device: torch.device) -> Any:
    """The modules options.autocast_off run in fp32 outside autocast (precision.AutocastOff),
    None with none; CanaryError for a module the model lacks, or with no autocast to leave."""
    if not options.autocast_off:
        return None
    if options.precision != "bf16":
        raise CanaryError("--autocast-off: needs --precision bf16 (there is no autocast to switch off)")

    try:
        return AutocastOff(model, options.autocast_off, device.type)
    except UnknownModule as e:
        raise CanaryError(str(e)) from None


def _install_fault(canary: Any, spec: Any, device: torch.device) -> Any:
    """A module fault (_Fault), an aten op call's (MODULE:ATEN[#N]: aten_fault.AtenFault), a
    regression (kind=...: regressions.RegressionFault), or None."""
    if spec is None:
        return None
    if isinstance(spec, RegressionSpec):
        return RegressionFault(canary.model, canary.optimizer, spec)

    if split_target(spec.op) is not None:
        return AtenFault(canary.model, canary.optimizer, spec)
    return _Fault(canary.model, spec, device)


def parse_canary_fault(text: str, model: torch.nn.Module, steps: int) -> Any:
    """--inject-fault of a Python canary: op=PATH (a module), MODULE:ATEN[#N] (an aten op call)
    or a regression (kind=weight-scale|weight-ulps|lr-scale|eps-scale,...: regressions.py)."""
    if is_regression(text):
        return parse_regression(text, [name for name, _ in model.named_parameters()], steps)

    paths = [name for name, _ in model.named_modules() if name]
    every = set(paths) | {"<model>"}
    return parse_fault(text, paths, steps, where="the model's module paths, or MODULE:ATEN[#N] for an aten op call",
                       op_problem=lambda op: target_problem(op, every))


def print_summary(summary: RunSummary, out: str, file: Any = sys.stdout) -> None:
    with ReceiptReader(out) as r:
        print(f"lane        {r.manifest['lane']}", file=file)
        print(f"budget      {r.manifest['budget_features'] or '(bitwise reference)'}", file=file)
    print(f"steps       {summary.steps}", file=file)
    print(f"loss        {summary.losses[0]:.6f} (step 0) -> {summary.losses[-1]:.6f} (step {summary.steps - 1})",
          file=file)
    print(f"speed       {1000 * summary.seconds / summary.steps:.2f} ms/step (recording included)", file=file)
    print(f"receipt     {os.path.abspath(out)}", file=file)
