"""Aten op traces of a training step (`--trace aten`; docs/bisect.md, "Aten traces").

AtenTracer records the output of every aten op a step runs: the forward, the backward the
autograd engine runs, the step's own code (a functional softmax, a residual add, the loss,
clipping) and the optimizer's update. It is a TorchDispatchMode, so it sees the ops below
every module, functional call and autograd, where module hooks (canary_harness.tracing.trace) see
only modules. Each output is named by

- `op`: where it ran: the innermost module whose forward was running (its path in the
  model, `blocks.1.attn`; `<model>` for the root module's own code; ModuleStack), `<step>` for the
  step's code outside any module, `<backward>` for what autograd runs (on torch 2.x with
  the autograd node: `<backward:SoftmaxBackward0>`) and `<optimizer>` inside
  optimizer.step();
- `tensor`: the aten op overload (`aten._softmax.default`; `.out1` for its second output);
- `site`: the `file:line` of the innermost frame outside torch and this package that led to
  it: the model's line for a forward op, the step's `loss.backward()` or
  `optimizer.step()` line for backward and optimizer ops;
- `phase`: forward, backward (inside torch.autograd.backward or grad) or optimizer (inside
  optimizer.step(), or the step's code after its first backward: clipping, the lr);
- `kind`: parameter or gradient when the op wrote a parameter's or a gradient's storage,
  else by phase: activation (scalar when 0-D), activation_grad, state.

What is traced is decided from each op's schema, not its name: floating-point outputs of
ops that compute something. A return that only aliases an input (a view: `t`, `view`,
`expand`, `detach`) is the input's value again and is skipped; an in-place op's return
(an alias it writes) is traced, as its value after the op. An allocation's output
(`empty_like`: ALLOCATION_OPS, the one list of op names, as no torch tag marks them) and a
metadata-only op's (tagged inplace_view: `resize_`) hold memory the op did not write, and
are no observation: they are skipped, and the op that fills the memory is traced. Values
are cloned on the device as the op returns (the next in-place op would overwrite them) and
read to the host at the end of the step: no host read happens inside the step.

Cost: every output cloned and digested; this is a diagnosis mode (a replay of one step),
not a nightly recording.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator, List, NamedTuple, Sequence, Tuple

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..receipts.digest_plan import DigestPlan
from ..receipts.philox import stream_id
from ..receipts.receipt import TraceColumn
from .trace import module_layers

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
# The package's own frames (every room of it) are no call site of the team's.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class AtenStep(NamedTuple):
    """One step's aten trace: columns in execution order, their call sites, and digests."""

    columns: List[TraceColumn]
    sites: List[str]
    hashes: List[int]
    l2: List[float]
    projection: List[List[float]]


def user_site(skip: Sequence[str] = (_TORCH_DIR, _PACKAGE_DIR)) -> str:
    """`file:line` of the innermost frame outside torch and this package ("" when none)."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(tuple(skip)) and not filename.startswith("<"):
            return f"{os.path.basename(filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


# Where an op runs outside any module: the step's own code.
STEP = "<step>"
ROOT = "<model>"


class ModuleStack:
    """The modules whose forward is running, innermost last, from forward pre-hooks and
    hooks on every module of `model`: where an aten op runs (`h.1.attn`; ROOT for the root
    module's own code, STEP outside any module). close() removes the hooks."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._layers = module_layers(model)
        self._stack: List[Tuple[str, int]] = []  # (module path, layer)
        self._handles = []
        for path, module in model.named_modules():
            self._handles.append(module.register_forward_pre_hook(self._enter(path or ROOT, module)))
            self._handles.append(module.register_forward_hook(self._leave))
        self.paths = [path or ROOT for path, _ in model.named_modules()]

    def _enter(self, path: str, module: torch.nn.Module) -> Any:
        layer = self._layers.get(module, -1)

        def hook(mod: torch.nn.Module, args: Any) -> None:
            self._stack.append((path, layer))
        return hook

    def _leave(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if self._stack:
            self._stack.pop()

    def innermost(self) -> Tuple[str, int]:
        """(path, layer) of the innermost forward running; (STEP, -1) outside any."""
        return self._stack[-1] if self._stack else (STEP, -1)

    def reset(self) -> None:
        self._stack = []  # a step that raised inside a forward leaves its modules

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


class StepPhases:
    """Where an aten op runs inside a step, as traces name it (the module docstring): the
    innermost module's forward, `<backward:NODE>` while autograd runs, `<optimizer>` inside
    optimizer.step(), `<step>` for the step's own code (phase optimizer once backward ran).
    step() is the context of one step: torch.autograd.backward/grad and the optimizer's
    step wrapped for its length. close() removes the module hooks."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.modules = ModuleStack(model)
        self.optimizer = optimizer
        self._in_backward = 0
        self._in_optimizer = 0
        self._after_backward = False
        self._current_node = getattr(torch._C, "_current_autograd_node", None)  # torch >= 2.0

    def where(self) -> Tuple[str, int, str]:
        """(op, layer, phase) of the op running now."""
        if self._in_optimizer:
            return "<optimizer>", -1, "optimizer"
        if self._in_backward:
            node = self._current_node() if self._current_node is not None else None
            return (f"<backward:{node.name()}>" if node is not None else "<backward>"), -1, "backward"
        path, layer = self.modules.innermost()
        if path != STEP:
            return path, layer, "forward"
        return STEP, -1, "optimizer" if self._after_backward else "forward"

    def _patched(self, function: Any, counter: str) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            setattr(self, counter, getattr(self, counter) + 1)
            try:
                return function(*args, **kwargs)
            finally:
                setattr(self, counter, getattr(self, counter) - 1)
                if counter == "_in_backward":
                    self._after_backward = True
        return wrapper

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        self._after_backward = False
        self.modules.reset()
        saved = {"backward": torch.autograd.backward, "grad": torch.autograd.grad}
        own_step = self.optimizer.__dict__.get("step")
        torch.autograd.backward = self._patched(saved["backward"], "_in_backward")
        torch.autograd.grad = self._patched(saved["grad"], "_in_backward")
        self.optimizer.step = self._patched(self.optimizer.step, "_in_optimizer")
        try:
            yield
        finally:
            torch.autograd.backward, torch.autograd.grad = saved["backward"], saved["grad"]
            if own_step is None:
                self.optimizer.__dict__.pop("step", None)
            else:
                self.optimizer.step = own_step

    def close(self) -> None:
        self.modules.close()


# Ops whose outputs hold memory the op did not write: allocations. Their values are
# whatever the allocator's block held before (a freed activation of this step, or bytes of
# another run), so hashing them makes two runs of one step differ where nothing computed
# differs: dropout's mask is an empty_like that bernoulli_ then fills (the fill is traced).
# No torch tag marks an allocation (empty_like's are pt2_compliant_tag and, on some
# overloads, core or generated; zeros_like's the same), so they are named here by schema
# name, every overload of each (out= included); a name a torch build lacks never matches.
ALLOCATION_OPS = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::empty_permuted",
    "aten::new_empty", "aten::new_empty_strided",
})

# Ops tagged inplace_view change only a tensor's metadata (resize_, set_, as_strided_,
# squeeze_): they compute no value, and a resize_ that grows a tensor leaves memory unwritten.
_METADATA_ONLY = getattr(getattr(torch, "Tag", None), "inplace_view", None)


def _computes_nothing(func: Any) -> bool:
    """Whether the op writes no value of its outputs (an allocation, a metadata change)."""
    if func._schema.name in ALLOCATION_OPS:
        return True
    return _METADATA_ONLY is not None and _METADATA_ONLY in getattr(func, "tags", ())


def traced_returns(func: Any) -> List[bool]:
    """Per return of the op's schema: True when it computes a value (no alias, or an alias the
    op writes: an in-place or out= result); a pure view is the input's value again, and an
    allocation's or metadata change's output holds no value the op wrote."""
    if _computes_nothing(func):
        return [False] * len(func._schema.returns)
    flags = []
    for ret in func._schema.returns:
        alias = ret.alias_info
        flags.append(alias is None or bool(alias.is_write))
    return flags


def flat_outputs(out: Any) -> List[Any]:
    """An op's outputs as a list (one output: a list of it)."""
    return list(out) if isinstance(out, (tuple, list)) else [out]


def traced_outputs(func: Any, out: Any) -> List[Tuple[str, torch.Tensor]]:
    """The outputs of one op call that an aten trace records, each with the tensor name it is
    recorded by: the op overload (`aten._softmax.default`), `.outJ` for output J of several.
    Floating-point values the op computed (traced_returns), a Tensor[] return's every element."""
    return [(name, value) for _, name, value in traced_output_places(func, out)]


def traced_output_places(func: Any, out: Any) -> List[Tuple[int, str, torch.Tensor]]:
    """traced_outputs, each with its place J among the op's flattened outputs."""
    flags = traced_returns(func)
    outputs = flat_outputs(out)
    if len(flags) == 1 and len(outputs) > 1:  # a Tensor[] return: every element computed alike
        flags = flags * len(outputs)
    name = str(func)
    traced = []
    for j, (value, computed) in enumerate(zip(outputs, flags)):
        if computed and isinstance(value, torch.Tensor) and value.is_floating_point():
            traced.append((j, name if len(outputs) == 1 else f"{name}.out{j}", value))
    return traced


class _Mode(TorchDispatchMode):
    def __init__(self, tracer: "AtenTracer") -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.tracer._record(func, out)
        return out


class AtenTracer:
    """Traces the aten ops of `model`'s training steps (see the module docstring).

    param_names: {id(parameter): its name} (what kind=parameter/gradient outputs are named
    by in the text; the kind itself comes from the storage written). Use `with
    tracer.step():` around one whole training step, then finish_step(); close() removes the
    module hooks.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.phases = StepPhases(model, optimizer)
        self._records: List[Tuple[str, int, str, str, str, str, torch.Tensor]] = []

    def _kind(self, tensor: torch.Tensor, phase: str) -> str:
        storage = _storage_key(tensor)
        if storage in self._param_storage:
            return "parameter"
        if storage in self._grad_storage():
            return "gradient"
        if phase == "forward":
            return "scalar" if tensor.dim() == 0 else "activation"
        return "activation_grad" if phase == "backward" else "state"

    def _grad_storage(self) -> set:
        return {_storage_key(p.grad) for p in self.model.parameters() if p.grad is not None}

    # ---- recording ---------------------------------------------------------------------
    def _record(self, func: Any, out: Any) -> None:
        outputs = traced_outputs(func, out)
        if not outputs:
            return
        op, layer, phase = self.phases.where()
        site = user_site()
        for tensor, value in outputs:
            self._records.append((op, layer, phase, tensor, self._kind(value, phase), site, value.detach().clone()))

    def step(self) -> "_TracedStep":
        """The context of one traced step: the dispatch mode, and the phase boundaries
        (torch.autograd.backward/grad and the optimizer's step wrapped for its length)."""
        return _TracedStep(self)

    def finish_step(self) -> AtenStep:
        """The step's columns and digests (the clones read to the host here, after the step)."""
        records, self._records = self._records, []
        columns: List[TraceColumn] = []
        for index, (op, layer, phase, tensor, kind, _, _) in enumerate(records):
            columns.append(TraceColumn(index, op, layer, phase, tensor, kind))
        arrays = [np.ascontiguousarray(r[6].float().cpu().numpy().reshape(-1)) for r in records]
        if not arrays:
            return AtenStep([], [], [], [], [])
        plan = DigestPlan([a.size for a in arrays], [stream_id(c.tensor) for c in columns], [True] * len(arrays))
        rows = plan.rows(arrays)
        return AtenStep(columns, [r[5] for r in records], rows.hashes.tolist(), rows.l2.tolist(),
                        rows.projection.tolist())

    def close(self) -> None:
        self.phases.close()


class _TracedStep:
    def __init__(self, tracer: AtenTracer) -> None:
        self.tracer = tracer

    def __enter__(self) -> AtenTracer:
        t = self.tracer
        t._records = []
        t._param_storage = {_storage_key(p) for p in t.model.parameters()}
        self._phases = t.phases.step()
        self._phases.__enter__()
        self._mode = _Mode(t)
        self._mode.__enter__()
        return t

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)
        self._phases.__exit__(*exc)


def _storage_key(tensor: torch.Tensor) -> Tuple[int, int]:
    """Identifies the memory a tensor covers (its first element's address and its size)."""
    return tensor.data_ptr(), tensor.numel()
