"""Receipts from any PyTorch training loop: `canary_harness.torch.Recorder`.

    pack = read_pack("tiny-pack.h5", canary="tiny")
    model.load_state_dict(...)                       # the pack's init (pack.init), by your names
    recorder = Recorder("run.h5", model, optimizer, pack=pack, name_map=NAME_MAP,
                        budget_features="torch-cpu")
    for step in range(pack.steps):
        tokens = pack.batch(step)
        loss = model(torch.from_numpy(tokens).to(device))
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # norm before clipping
        optimizer.step()
        recorder.step(loss=loss, grad_norm=grad_norm, lr=lr, batch=tokens)   # after the step
        optimizer.zero_grad()
    recorder.close()

What each step records (docs/design.md, the receipt contract): the loss, the gradient norm
before clipping, the learning rate, the batch hash, and the hashes and sketches of the
parameters after the update, the gradients (after clipping: `.grad` as the optimizer used
it) and Adam's moments (`optimizer.state[p]["exp_avg"]`, `["exp_avg_sq"]`, as PyTorch's
Adam and AdamW keep them; SGD's `momentum_buffer` as adam_m; zeros where the optimizer keeps
neither: recording.MOMENT_STATE, the runner's rule too) of every canary tensor, in the
canary's canonical order.

The recorder reads host values only in step(), which you call after optimizer.step(): it
installs no hooks (unless it traces ops) and touches nothing during the forward, backward
or update, so a step stays one graph under torch_xla (call `xm.mark_step()` before
`recorder.step()` there, as after any XLA step).

Where the step's tensors are on an accelerator (or no digest library is found:
canary_harness.receipts.native), step() by default (`overlap=None`) only copies what the step must
record into host buffers it reuses, and one background thread hashes, sketches and appends
the row while the next step trains; the receipt is bit for bit the one `overlap=False`
writes, and close() waits for the last row (Recorder's docstring: errors, and what a crash
loses). On the CPU with the digest library, step() digests the tensors where they are, on
every core, which costs less than that copy.

With `trace="ops"` it also writes op traces (/trace, docs/bisect.md): module hooks
(canary_harness.tracing.trace.OpTracer) keep the device tensors of every op's forward output and
of the gradients its backward writes during the step, and step() hashes and sketches
them, then the optimizer's: the gradient norm and every parameter after its update. Op
names are module paths (the package's GPT2's are the C++ op names), or `op_names`'s.

The name map ({your parameter name: canary tensor name}; None when
your names are the canary's) is checked in full before the receipt is created: a canary
tensor no parameter maps to, a parameter of the model that maps to none, a name that is
not a parameter, two parameters on one tensor, a shape that differs, or a parameter the
optimizer does not hold is a RecorderError naming it, and no file is written.

step() refuses (RecorderError, nothing recorded) any call after close(). It does not
tell a step apart from a second step() for the same update (a step an AMP GradScaler
skips leaves every parameter as it was, and is a step to record), nor gradients zeroed in
place before it (`optimizer.zero_grad(set_to_none=False)`: that step records zeros): call
it once, after optimizer.step() and before zero_grad().
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .audit import AuditError, CompileLog
from .receipts.budget_features import parse_features
from .cli.lane_args import trace_problem
from .receipts.digest import batch_hash
from .receipts.digest_plan import DigestRows
from .models.config import canary_object
from .receipts.receipt import PathLike, ReceiptError, ReceiptWriter
from .runs.recording import MomentSource, Overlap, StepDigest, host_float, host_float32
from .receipts.schema import HASH_FAMILIES
from .receipts.stack import StackInfo
from .tracing.trace import StepTraces, TraceError


class RecorderError(ValueError):
    """A recorder that cannot record this model/optimizer as asked (one line, naming the tensor)."""


# Manifest attributes the Recorder itself sets (or the writer owns): `extra` may not set them.
_RESERVED_EXTRA = ("lane", "engine", "budget_features", "canary", "seed", "steps_planned", "features", "threads",
                   "data_seed", "pack", "schema_version", "schema_minor", "complete")


def _count_arg(name: str, value: Any) -> int:
    """seed/steps: an int in 0..2**63-1 (the manifest's int64), never a float or a bool."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) < 2**63:
        raise RecorderError(f"{name}={value!r}: give an int in 0..2**63-1")
    return int(value)


def _check_extra(extra: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """`extra` as manifest attributes: str keys the recorder does not set, str/int/float values."""
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise RecorderError(f"extra: a {type(extra).__name__}, not a mapping of manifest attributes")
    for key, value in extra.items():
        if not isinstance(key, str) or not key:
            raise RecorderError(f"extra: key {key!r} is not a non-empty str")
        if key in _RESERVED_EXTRA:
            raise RecorderError(f"extra: '{key}' is set by the Recorder; pass it as its own argument or rename it")
        if isinstance(value, bool) or not isinstance(value, (str, int, float, np.integer, np.floating)):
            raise RecorderError(f"extra['{key}']: {type(value).__name__} is not a str, int or float")
    return dict(extra)


def _parameter_aliases(model: torch.nn.Module) -> Dict[str, torch.nn.Parameter]:
    """Every name a parameter has, tied ones included (named_parameters() names a tied
    parameter once, under its first name; torch 1.13 has no remove_duplicate there)."""
    names: Dict[str, torch.nn.Parameter] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        for name, param in module._parameters.items():
            if param is not None:
                names.setdefault(f"{prefix}.{name}" if prefix else name, param)
    return names


def _scalar_arg(name: str, value: Any) -> Any:
    """loss/grad_norm/lr: a real number, or a tensor/array of one element (tensors read later,
    after the audit's step ends); anything else is a RecorderError naming the argument."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex() or value.dtype == torch.bool:
            raise RecorderError(f"{name}: a tensor of shape {tuple(value.shape)} and dtype {value.dtype}; give one "
                                "real number (a 1-element tensor)")
        return value
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(())[()]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise RecorderError(f"{name}={value!r}: a {type(value).__name__}, not a number")
    return float(value)


def _check_name_map(model: torch.nn.Module, name_map: Optional[Mapping[str, str]], tensor_names: Sequence[str],
                    shapes: Optional[Mapping[str, Tuple[int, ...]]]) -> Dict[str, torch.nn.Parameter]:
    """{canary name: the model's parameter}, in canonical order; RecorderError naming what does not fit."""
    if name_map is not None and not isinstance(name_map, Mapping):
        raise RecorderError(f"name_map: a {type(name_map).__name__}; give a mapping {{model parameter name: canary "
                            "tensor name}, or None when the model's names are the canary's")
    params = dict(model.named_parameters())  # a tied parameter appears once, under its first name
    aliases = _parameter_aliases(model)
    if name_map is None:
        name_map = {n: n for n in params}
    # A tied parameter may be mapped by any of its names: each is taken as its first name.
    first_name = {id(p): n for n, p in params.items()}
    resolved: Dict[str, str] = {}
    for user, target in name_map.items():
        if not isinstance(user, str) or not isinstance(target, str):
            raise RecorderError(f"name_map: {user!r} -> {target!r}: both names must be str")
        if user not in params and user in aliases and id(aliases[user]) in first_name:
            first = first_name[id(aliases[user])]
            if first in name_map or first in resolved:
                raise RecorderError(f"name_map: '{user}' and '{first}' are one tied parameter; map only one of them")
            user = first
        resolved[user] = target
    name_map = resolved
    for user in name_map:
        if user not in params:
            known = ", ".join(list(params)[:4])
            raise RecorderError(f"name_map: '{user}' is not a parameter of the model (its parameters: {known}, ...)")
    canary = set(tensor_names)
    by_canary: Dict[str, str] = {}
    for user, target in name_map.items():
        if target not in canary:
            raise RecorderError(f"name_map: '{user}' maps to '{target}', which is not a tensor of the canary")
        if target in by_canary:
            raise RecorderError(f"name_map: '{by_canary[target]}' and '{user}' both map to canary tensor '{target}'")
        by_canary[target] = user
    unmapped = [user for user in params if user not in name_map]
    for name in tensor_names:
        if name not in by_canary:
            hint = f" (the model's unmapped parameters: {', '.join(unmapped[:3])})" if unmapped else ""
            raise RecorderError(f"name_map misses canary tensor '{name}': map the model's parameter that holds it{hint}")
    if unmapped:
        raise RecorderError(f"name_map: the model's parameter '{unmapped[0]}' maps to no canary tensor "
                            "(the canary has no such tensor: the model is not the canary)")
    mapped = {name: params[by_canary[name]] for name in tensor_names}
    if shapes is not None:
        for name, param in mapped.items():
            if tuple(param.shape) != tuple(shapes[name]):
                raise RecorderError(f"parameter '{by_canary[name]}' has shape {tuple(param.shape)}, canary tensor "
                                    f"'{name}' has {tuple(shapes[name])}")
    return mapped


def _canary_name(canary: Any, lane: Optional[str]) -> str:
    """The canary JSON's `name` (a shipped canary's JSON also has `preset`, the same name: the
    harness's canary_name reads them in that order), which the default lane and the budgets'
    [NAME.FEATURE] entries use. Without one, and without `lane`, a RecorderError."""
    try:
        definition = canary_object(canary)
    except ValueError as e:
        raise RecorderError(f"canary: {e}; give the canary JSON object (text or a dict)") from None
    name = definition.get("name", definition.get("preset"))
    if isinstance(name, str) and name and "/" not in name:
        return name
    if lane is not None:
        return ""
    raise RecorderError(f"canary: the canary JSON's 'name' is {name!r}; give a non-empty name without '/' (it names "
                        "the lane <name>/<engine>[+features] and the budgets' [<name>.FEATURE] entries), or lane=")


@dataclasses.dataclass(frozen=True)
class RecorderOptions:
    """What a Recorder records besides the loop itself, as one object: made once, checked when
    a Recorder takes it (a RecorderError naming the field), reusable for every run of a job
    (`dataclasses.replace(options, seed=...)` changes a field). `Recorder(..., options=o)`;
    Recorder's keyword arguments are the same fields, a shorthand laid over `options`.

    The canary: `pack` (canary_harness.pack.CanaryPack) gives its JSON, tensor names and
    shapes, seed and steps (`seed` and `steps` given beside it override them); without a
    pack, `canary`, `tensor_names`, `seed` and `steps`. The receipt: `budget_features`
    (declared, never defaulted), `lane`, `engine`, `features`, `extra`, `overwrite`,
    `stack`, `record_batches`. Each step: `trace` and `op_names`, `audit`, `overlap`.
    Recorder's docstring says what each does.
    """

    budget_features: Any
    pack: Any = None
    canary: Union[str, Mapping[str, Any], None] = None
    tensor_names: Optional[Sequence[str]] = None
    seed: Optional[int] = None
    steps: Optional[int] = None
    lane: Optional[str] = None
    engine: str = "torch"
    features: str = ""
    extra: Optional[Mapping[str, Any]] = None
    overwrite: bool = False
    stack: Optional[StackInfo] = None
    record_batches: bool = False
    trace: str = "none"
    op_names: Any = None
    audit: bool = False
    overlap: Optional[bool] = None


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(RecorderOptions))


def recorder_options(options: Optional[RecorderOptions], settings: Mapping[str, Any]) -> RecorderOptions:
    """`options` with the keyword `settings` laid over it (either may be missing); an unknown
    name, or an options object of another type, is a RecorderError."""
    unknown = sorted(set(settings) - set(OPTION_NAMES))
    if unknown:
        raise RecorderError(f"Recorder: no option '{unknown[0]}' (RecorderOptions' fields: {', '.join(OPTION_NAMES)})")
    if options is None:
        if "budget_features" not in settings:
            raise RecorderError("budget_features: declare it as a str (\"torch-cpu\", ...; \"\" for a bitwise lane)")
        return RecorderOptions(**settings)
    if not isinstance(options, RecorderOptions):
        raise RecorderError(f"options: a {type(options).__name__}, not a RecorderOptions")
    return dataclasses.replace(options, **settings)


def _check_declared(o: RecorderOptions) -> Dict[str, Any]:
    """The options' own values checked (budget_features, trace, extra); returns the extra attributes."""
    problem = trace_problem(o.trace, where="trace")
    if problem:
        raise RecorderError(problem)
    if not isinstance(o.budget_features, str):
        raise RecorderError(f"budget_features={o.budget_features!r}: declare it as a str (\"torch-cpu\", ...; "
                            "\"\" for a bitwise lane)")
    try:
        parse_features(o.budget_features)
    except ValueError as e:
        raise RecorderError(f"budget_features: {e}") from None
    return _check_extra(o.extra)


class CanaryIdentity(NamedTuple):
    """The canary a Recorder records, from its pack or from its options."""

    canary: Any  # its JSON (text or a dict)
    name: str  # "" where the options name the lane
    tensor_names: List[str]
    shapes: Optional[Dict[str, Tuple[int, ...]]]  # a pack's, checked against the model
    seed: int
    steps: int
    batch_shape: Optional[Tuple[int, int]]  # a pack's (B, T+1)


def canary_identity(o: RecorderOptions) -> CanaryIdentity:
    """The canary of the options: the pack's (seed and steps may narrow it), else the one given."""
    pack = o.pack
    if pack is not None:
        seed = pack.seed if o.seed is None else _count_arg("seed", o.seed)
        steps = pack.steps if o.steps is None else _count_arg("steps", o.steps)
        if steps > pack.steps:
            raise RecorderError(f"steps {steps}: the pack {pack.path} holds {pack.steps} batches")
        identity = CanaryIdentity(pack.canary_json, pack.name, pack.tensor_names,
                                  {n: tuple(pack.init[n].shape) for n in pack.tensor_names}, seed, steps,
                                  pack.batch_shape)
    else:
        missing = [k for k in ("canary", "tensor_names", "seed", "steps") if getattr(o, k) is None]
        if missing:
            raise RecorderError(f"Recorder needs a pack, or {', '.join(missing)}")
        identity = CanaryIdentity(o.canary, _canary_name(o.canary, o.lane), o.tensor_names, None,
                                  _count_arg("seed", o.seed), _count_arg("steps", o.steps), None)
    names = identity.tensor_names
    if isinstance(names, (str, bytes)) or not all(isinstance(n, str) and n for n in names):
        raise RecorderError("tensor_names: give a list of non-empty str, the canary's tensors in canonical order")
    duplicates = sorted({n for n in names if list(names).count(n) > 1})
    if duplicates:
        raise RecorderError(f"tensor_names: '{duplicates[0]}' appears more than once")
    return identity._replace(tensor_names=list(names))


def _manifest(o: RecorderOptions, identity: CanaryIdentity, extra: Mapping[str, Any]) -> Dict[str, Any]:
    """The receipt's manifest: the lane, the canary and the run's settings, then `extra`."""
    manifest: Dict[str, Any] = {
        "lane": o.lane or f"{identity.name}/{o.engine}" + (f"+{o.features}" if o.features else ""),
        "engine": o.engine, "features": o.features, "budget_features": o.budget_features, "canary": identity.canary,
        "seed": identity.seed, "steps_planned": identity.steps, "threads": torch.get_num_threads(),
    }
    if o.pack is not None:
        manifest["data_seed"] = o.pack.data_seed
        manifest["pack"] = os.path.basename(o.pack.path)
    manifest["trace"] = o.trace
    manifest.update(extra)
    return manifest


class Recorder:
    """Records a PyTorch training loop into a receipt, one step per step() call.

    What it records is a RecorderOptions (`options=`), or the same fields as keyword
    arguments laid over it. The canary (its JSON, the tensor names and shapes, the seed and the steps) comes from
    `pack` (canary_harness.pack.CanaryPack), or from `canary`, `tensor_names`, `seed` and
    `steps` when you train without one. `lane` defaults to "<canary>/<engine>[+features]".
    `budget_features` is required: what separates this run from the bitwise reference
    ("torch-cpu", "torch-bf16", ...; docs/design.md, "Budget features are declared").
    `extra` adds manifest attributes (str, int or float); `record_batches` keeps every
    batch's tokens in /batches/tokens. `trace="ops"` writes op traces (the module docstring;
    `op_names`: module path -> op name, a mapping or a function, for canary_harness.tracing.trace).
    `audit=True` records, per step, the step's op graph fingerprint and compile counters in
    /compile (canary_harness.audit.CompileLog: UncachedCompile, CachedCompile, HostSync,
    Fingerprint): from the recorder's creation to the first step() call is step 0, from
    each step() call to the next the next step. It enters torch dispatch and function modes
    for that (left in step(), in close(), and on an exception when the recorder is used as a
    context manager), which change no number.
    `recorder.audit.findings` and `.summary()` give the audit's findings so far.

    `overlap=None` (the default) is `overlap=False` when every parameter is on the CPU and
    the harness's digest library is found (canary_harness.receipts.native: step() then digests
    contiguous fp32 tensors where they are, others through a host copy, in about a
    millisecond for `tiny`, less than the snapshot below costs), and `overlap=True` otherwise.
    `overlap=True` digests each step while the next one trains: step() copies
    what the step must record (params, grads, Adam m and v, as float32 on the host, into
    buffers reused every step; on CUDA with non_blocking copies into pinned memory) and hands
    the hashing, sketching and HDF5 append to one background thread, so the training thread
    pays for the copy only (docs/performance.md, "Recorder overhead on the PyTorch step").
    The receipt is bit for bit the one `overlap=False` writes (the same code digests the same
    bytes). What that changes for you:
      - step() returns before its row is on disk; the next step(), dump_tensors(), close()
        and `with` wait for it. A process killed (SIGKILL, power) between a step() and the
        next loses that one step at most: every step the worker finished is flushed;
      - an error while writing (a full disk, say) is raised by the next step(), close() or
        `with` exit as a RecorderError naming the step and the cause (chained); nothing
        after the failed step is written, and every later step() raises it again;
      - `steps_recorded` counts the steps step() accepted; `writer.steps_recorded` the rows
        written so far.
    `trace="ops"` always records synchronously (its op outputs are read in step()).
    """

    def __init__(self, path: PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 name_map: Optional[Mapping[str, str]] = None, *, options: Optional[RecorderOptions] = None,
                 **settings: Any) -> None:
        self._closed = False  # set by close() and __exit__: no step or dump after it (RecorderError)
        o = recorder_options(options, settings)
        self.options = o
        extra = _check_declared(o)
        identity = canary_identity(o)
        self.tensor_names: List[str] = identity.tensor_names
        shapes, batch_shape = identity.shapes, identity.batch_shape
        self.parameters = _check_name_map(model, name_map, self.tensor_names, shapes)
        for name, param in self.parameters.items():
            if param.is_meta:  # no values to record: the model was never materialized
                raise RecorderError(f"canary tensor '{name}': its parameter is on the meta device (no values); "
                                    "materialize the model (to_empty() and load the init) before recording")
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for name, param in self.parameters.items():
            if id(param) not in held:
                raise RecorderError(f"canary tensor '{name}': its parameter is not one the optimizer updates")
        self.optimizer = optimizer
        self._moments = MomentSource(optimizer)  # adam_m, adam_v: the runner's rule (recording.MOMENT_STATE)
        self.steps_recorded = 0
        manifest = _manifest(o, identity, extra)
        # Every tensor of every family hashed, params and grads sketched, in one call a step
        # (digest.DigestPlan: the harness's digest library where it is found, else Python).
        # Made before the receipt: a digest library that cannot be used leaves no file behind.
        self._digest = StepDigest(self.tensor_names, [p.numel() for p in self.parameters.values()])
        self.writer = ReceiptWriter(path, manifest, self.tensor_names, overwrite=o.overwrite,
                                    batch_shape=batch_shape if o.record_batches else None, stack=o.stack)
        self.path = self.writer.path
        self._record_batches = o.record_batches and batch_shape is not None  # as the writer keeps batches
        self.tracer = None
        if o.trace == "ops":
            try:
                self.tracer = StepTraces(model, {id(p): n for n, p in self.parameters.items()}, o.op_names)
            except BaseException:
                self.writer.discard()  # no step was recorded: the receipt goes with the error
                raise
        overlap = o.overlap
        if overlap is None:  # the cheaper one for where the tensors are (class docstring)
            on_cpu = all(p.device.type == "cpu" for p in self.parameters.values())
            overlap = not (on_cpu and self._digest.native)
        self.overlap = bool(overlap) and o.trace == "none"
        self._batch_shape = tuple(batch_shape) if batch_shape is not None else None
        # The background digest and writer (with overlap): its thread starts at the first step, close() ends it.
        self._overlap = Overlap(self._digest, lambda digests, scalars, hashed, tokens, compile_row: self._write(
            digests, scalars, hashed, tokens, compile_row, None), name=f"canary-recorder:{os.path.basename(str(self.path))}")
        self._failure: Optional[RecorderError] = None  # the worker's error, once raised: raised again
        self.audit = None
        if o.audit:
            # From here to each step() call is a step: its ops, fingerprinted (canary_harness.audit).
            self.audit = CompileLog()
            self.audit.begin(0)

    def _check_open(self, call: str) -> None:
        if self._closed:
            raise RecorderError(f"{call}: {self.path}: the recorder is closed (after close() or its `with` block); "
                                "make a new Recorder to record another run")

    def _check_batch(self, batch: Any) -> None:
        """batch: integer tokens (B, T+1), the pack's batch shape where a pack gives it (no value read)."""
        if isinstance(batch, torch.Tensor):
            shape, integer = tuple(batch.shape), not (batch.is_floating_point() or batch.is_complex()
                                                      or batch.dtype == torch.bool)
        elif isinstance(batch, np.ndarray):
            shape, integer = batch.shape, batch.dtype.kind in "iu"
        else:
            raise RecorderError(f"batch: a {type(batch).__name__}; give the step's int32 tokens (B, T+1) as a "
                                "numpy array or a tensor")
        if not integer:
            raise RecorderError(f"batch: dtype {batch.dtype}; give the step's integer (int32) tokens")
        want = self._batch_shape
        if len(shape) != 2 or (want is not None and tuple(shape) != want):
            raise RecorderError(f"batch: shape {tuple(shape)}, where the step's tokens are "
                                f"{want if want is not None else '(B, T+1)'}")

    def step(self, *, loss: Any, grad_norm: Any, batch: Any, lr: Any = None) -> None:
        """Records the step just taken: call it after optimizer.step() and before zero_grad().

        loss, grad_norm (before clipping) and lr may be tensors of one element (read here,
        after the step) or numbers; lr defaults to the first param group's. batch: the step's
        int32 tokens (B, T+1), numpy or tensor. With overlap the row is written in the
        background; an error of the previous step's write is raised here (class docstring).
        Refused (RecorderError, nothing recorded): a bad argument, and a recorder closed.
        """
        self._check_open("step()")
        if self._failure is not None:  # a failed write leaves no gap: nothing after it is recorded
            raise self._failure
        # Every argument checked before the step ends: a refused call leaves it open to retry.
        loss, grad_norm = _scalar_arg("loss", loss), _scalar_arg("grad_norm", grad_norm)
        lr = _scalar_arg("lr", self.optimizer.param_groups[0]["lr"] if lr is None else lr)
        self._check_batch(batch)
        grads: Dict[str, torch.Tensor] = {}
        for name, param in self.parameters.items():
            if param.grad is None:
                raise RecorderError(f"canary tensor '{name}' has no gradient at step {self.steps_recorded}: "
                                    "call step() after optimizer.step() and before optimizer.zero_grad()")
            grads[name] = param.grad
            if "betas" in self.optimizer.defaults and not self.optimizer.state.get(param):
                # An optimizer that declares Adam's betas keeps moments once it has stepped.
                raise RecorderError(f"canary tensor '{name}': optimizer.state has no 'exp_avg' (an Adam-like "
                                    "optimizer keeps exp_avg and exp_avg_sq; call step() after optimizer.step())")
        adam_m = {name: self._moments.moment(p, "adam_m") for name, p in self.parameters.items()}
        adam_v = {name: self._moments.moment(p, "adam_v") for name, p in self.parameters.items()}
        compile_row = None
        if self.audit is not None:  # the step ends here, before anything below reads a value
            if not self.audit.active:
                raise RecorderError(f"audit: step {self.steps_recorded} was not recorded (an earlier step() failed)")
            try:
                compile_row = self.audit.end()
            except AuditError as e:
                raise RecorderError(f"audit: step {self.steps_recorded}: {e}") from None
        families = dict(zip(HASH_FAMILIES, (self.parameters, grads, adam_m, adam_v)))
        if self.overlap:
            self._hand_over(families, loss, grad_norm, lr, batch, compile_row)
        else:
            norm_value = None
            if self.tracer is not None:  # the traced norm: the fp32 value the update clipped with
                norm_value = host_float32(grad_norm.detach().to(torch.float32)).reshape(-1) \
                    if isinstance(grad_norm, torch.Tensor) else np.array([grad_norm], dtype=np.float32)
            scalars = (host_float(loss), host_float(grad_norm), host_float(lr))
            batch = batch.detach().cpu() if isinstance(batch, torch.Tensor) else batch
            # The step is recorded here, before anything can change its tensors.
            digests = self._digest.rows([family[n] for family in families.values() for n in self.tensor_names])
            trace = self._trace_row(norm_value) if self.tracer is not None else None
            self._write(digests, scalars, batch_hash(batch), batch if self._record_batches else None, compile_row,
                        trace)
        self.steps_recorded += 1
        if self.audit is not None and self.steps_recorded < self.writer.steps_planned:
            self.audit.begin(self.steps_recorded)  # the next step starts here

    def _hand_over(self, families: Mapping[str, Mapping[str, torch.Tensor]], loss: Any, grad_norm: Any, lr: Any,
                   batch: Any, compile_row: Optional[Mapping[str, float]]) -> None:
        """step() with overlap: snapshot the step, queue its digest and row for the worker."""
        # What append_step would refuse, refused here and now rather than one step late.
        if self.writer.finished or self.steps_recorded >= self.writer.steps_planned:
            raise ReceiptError(f"{self.path}: all {self.writer.steps_planned} planned steps are recorded; "
                               "no step can be added")
        batch = batch.detach().cpu() if isinstance(batch, torch.Tensor) else batch
        tokens = None
        if self._record_batches:
            # A copy: the caller may reuse its batch buffer before the worker writes it.
            tokens = np.array(batch, dtype=np.asarray(batch).dtype, copy=True)
            if tokens.shape != self._batch_shape:
                raise ValueError(f"batch_tokens has shape {tokens.shape}, not {self._batch_shape}")
        hashed_batch = batch_hash(batch)  # small (B x (T+1) int32): not worth deferring
        tensors = [tensors[n] for tensors in families.values() for n in self.tensor_names]
        self._overlap.wait()  # the previous step is written: its snapshot can be overwritten
        self._raise_worker_error()
        self._overlap.submit(self.steps_recorded, tensors, (loss, grad_norm, lr), hashed_batch, tokens, compile_row)

    def _write(self, digests: DigestRows, scalars: Sequence[float], hashed_batch: int, batch_tokens: Any,
               compile_row: Optional[Mapping[str, float]], trace: Any) -> None:
        """Appends one step's row: the same code with and without overlap, so the same bits.

        digests: DigestPlan's rows for every tensor, family-major (HASH_FAMILIES), tensors in
        canonical order: what ReceiptWriter.record_step would compute, in one call.
        """
        hashes, sketches = self._digest.split(digests)
        loss, grad_norm, lr = scalars
        self.writer.append_step(loss=loss, grad_norm=grad_norm, lr=lr, batch_hash=hashed_batch, hashes=hashes,
                                sketches=sketches, batch_tokens=batch_tokens, trace=trace, compile=compile_row)

    def _raise_worker_error(self) -> None:
        """The worker's error (after wait()), as a RecorderError; kept so every later call raises it."""
        if self._failure is None and self._overlap.error is not None:
            error = self._overlap.error
            self._failure = RecorderError(
                f"step {self._overlap.failed_step} could not be recorded (in the background writer; no later "
                f"step is recorded): {type(error).__name__}: {error}")
            self._failure.__cause__ = error
            raise self._failure

    def _drain(self) -> None:
        """Every step handed to the worker written (or failed), and the thread ended."""
        self._overlap.stop()

    def _trace_row(self, grad_norm: np.ndarray):
        """The step's /trace row (canary_harness.tracing.trace.StepTraces), with the parameters after the update."""
        try:
            return self.tracer.row(self.steps_recorded, grad_norm,
                                   [(n, p, host_float32(p)) for n, p in self.parameters.items()])
        except TraceError as e:
            raise RecorderError(str(e)) from None

    def dump_tensors(self, step: int) -> None:
        """/tensors/step_XXXXXX: the parameters now (at the start of `step`), by canary name."""
        self._check_open("dump_tensors()")
        self._overlap.wait()  # the rows before it first, in order (and their error, if any)
        self._raise_worker_error()
        if self._failure is not None:
            raise self._failure
        self.writer.dump_tensors(step, {n: p.detach() for n, p in self.parameters.items()})

    def close(self) -> None:
        """Closes the receipt: complete = 1 when every planned step was recorded (and removes
        the op tracer's hooks and the audit's modes). With overlap it first waits for the
        step in flight, and raises its error (a RecorderError) after closing the file. Closing
        again does nothing; step() and dump_tensors() after it are RecorderErrors."""
        if self._closed:
            return
        self._closed = True
        try:
            self._drain()
        finally:
            self._release_hooks()
            self.writer.close()  # complete stays 0 when a write failed: fewer rows than planned
        self._raise_worker_error()

    def _release_hooks(self) -> None:
        """Removes the op tracer's hooks and the audit's modes (the model is the user's again)."""
        if self.audit is not None:
            self.audit.abandon()
        if self.tracer is not None:
            self.tracer.close()

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._closed:  # closed already (close() in the block): its errors were raised there
            return
        self._closed = True
        try:
            self._drain()
        finally:
            self._release_hooks()
            self.writer.__exit__(exc_type, exc, tb)
        if exc is None:
            self._raise_worker_error()
        elif self._failure is None and self._overlap.error is not None:
            # The caller's exception wins, but the lost step is named on it, not dropped.
            error = self._overlap.error
            if hasattr(exc, "add_note"):  # Python >= 3.11
                exc.add_note(f"canary_harness.torch.Recorder: step {self._overlap.failed_step} could not be "
                             f"recorded either: {type(error).__name__}: {error}")
