"""The compile-stability audit of your own PyTorch training step (torch required).

    python3 -m canary_harness.audit FILE.py:FUNCTION [--steps N] [--warmup W] [--json] [--xla]

FUNCTION() returns `step(i)`, one training step on CPU tensors (--xla: also FUNCTION(device)
on torch_xla's device, run by canary_harness.xla.graphs beside this audit), or a
`canary_harness.Canary`, as `python3 -m canary_harness run FILE.py:NAME` takes it: the file is
then loaded as `run` loads it (canary.load_canary: seeded, NAME() called, checked) and step i
is `canary.step(model, optimizer, canary.batch(i), i)`, batch(i) made before the step's
window opens, as the runner makes it (under --xla the model is placed on the device and
each batch moved there in the step, as `run --device xla` does). What FUNCTION() returns
decides, not its name. The audit runs steps
0..N-1 (default 4) under a TorchDispatchMode, which sees every aten op the step runs
(forward, backward and optimizer) with its tensors' shapes and dtypes and its non-tensor
arguments, and a TorchFunctionMode, which sees the Python-level reads of tensor values
(`.item()`, `float(t)`, `print(t)`, ...) that no aten op shows. From what it records it
reports what makes a tracing compiler (torch_xla, the harness's tpu-mesh) cut, respecialise
or recompile the step:

- `host_read`: a device value read on the host inside the step: `.item()`, `.tolist()`,
  `float()`, `int()`, `bool()` of a tensor (an `if` on a tensor), printing or formatting a
  tensor, `.cpu()`, `.numpy()`, `numpy.asarray(t)`, and aten ops that return host values
  (ops tagged `data_dependent_output`: `_local_scalar_dense`, `equal`, `allclose`). Under
  XLA each one cuts the graph and waits for the device (tpu-mesh's `HostSync`).
- `varying_constant`: a Python number passed to an op (`alpha=`, `value=`, a scalar
  operand) that differs between two steps at the same place in the op graph: a constant of
  the traced graph that changes, so a new graph each step (tpu-mesh's `--leak-scalars`).
- `graph_change`: a step after the warm-up whose op sequence, shapes or dtypes differ from
  the previous step's, naming the first op that differs.
- `dynamic_shape`: an op whose output shape depends on tensor values: ops tagged
  `dynamic_output_shape` in their schema (`nonzero`, `masked_select`, `unique`,
  `repeat_interleave` with tensor repeats, `bincount`, ...), `aten.index` with a boolean
  mask, and, for torch builds without tags, the same ops by schema name (DYNAMIC_SHAPE_OPS).

Each finding names its step, its op and your own `file:line`: the innermost frame of the
call stack outside torch, outside this package and outside the Python standard library
(so a read inside `torch.optim.AdamW.step` is located at your `optimizer.step()` line, and
the torch frame it came from is named as `via`).

Step 0 is the warm-up (`warmup=1`): a step that creates state, e.g. `torch.optim`'s moments
on their first step, traces another graph, as it compiles another program under XLA; the
harness's compile-stability budget allows the same (`warmup_steps = 1`). Graph changes are
reported from step warmup+1 on, and so are varying constants where the warm-up step traced
another graph (otherwise from step 1); host reads and dynamic shapes at every step.

Each step's graph is fingerprinted: XXH3-64 over its ops in order (op, operand shapes and
dtypes, non-tensor arguments, Python numbers included, output shapes), host reads cutting
it into graphs as XLA cuts it. `canary_harness.torch.Recorder(audit=True)` records the same
per step into a receipt's /compile group (docs/python.md).

Exit status: 0 clean, 1 findings, 2 usage or import error (one line naming the file,
function or flag).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib.util
import json
import os
import sys
import sysconfig
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, NoReturn, Optional, Sequence, Tuple

import xxhash

from .xla import graphs as xla_graphs
from .runs.canary import Canary, CanaryError, load_canary
from .runs.devices import place_on_device, to_device  # torch-free at import

PROG = "canary_harness.audit"
FINDING_KINDS = ("host_read", "varying_constant", "graph_change", "dynamic_shape")

# Tensor methods (as the TorchFunctionMode sees them) that read a tensor's values to the host,
# and how a finding names them.
HOST_READ_METHODS = {
    "item": "Tensor.item()",
    "tolist": "Tensor.tolist()",
    "numpy": "Tensor.numpy()",
    "cpu": "Tensor.cpu()",
    "__float__": "float(tensor)",
    "__int__": "int(tensor)",
    "__bool__": "bool(tensor)",
    "__index__": "operator.index(tensor)",
    "__complex__": "complex(tensor)",
    "__repr__": "print(tensor)",
    "__str__": "str(tensor)",
    "__format__": "format(tensor)",
    "__array__": "numpy.asarray(tensor)",
}

# torch functions that make a tensor from Python data or a size: without a `device` argument
# the tensor is made in host memory, and stays there on an accelerator (StepCapture.on_host).
HOST_FACTORIES = ("tensor", "as_tensor", "scalar_tensor", "from_numpy", "zeros", "ones", "empty", "full", "arange",
                  "linspace", "logspace", "eye", "rand", "randn", "randint", "randperm")

# aten ops that hand a tensor's value to Python, by schema name: what the `data_dependent_output`
# tag marks in torch 1.13 and later (the tag decides where it exists; this set covers builds without it).
HOST_READ_OPS = frozenset({"aten::_local_scalar_dense", "aten::equal", "aten::allclose", "aten::is_nonzero"})

# aten ops whose output shape depends on tensor values, by schema name: what the
# `dynamic_output_shape` tag marks (torch 1.13: nonzero, argwhere, masked_select, _unique2,
# unique_dim, unique_consecutive, unique_dim_consecutive, bincount, repeat_interleave.Tensor,
# index.Tensor), plus the untagged `_unique` and `nonzero_numpy`. `aten::index` counts only
# with a boolean (or uint8) mask among its indices: with integer indices its shape is theirs.
DYNAMIC_SHAPE_OPS = frozenset({
    "aten::nonzero", "aten::nonzero_numpy", "aten::argwhere", "aten::masked_select", "aten::_unique",
    "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive", "aten::unique_dim_consecutive",
    "aten::bincount", "aten::index",
})
_DYNAMIC_OVERLOADS = {"aten::repeat_interleave": ("Tensor",)}  # only these overloads (tensor repeats)


class AuditError(Exception):
    """The step cannot be audited as asked (one line: exit 2)."""


# ---- where an op was called from -------------------------------------------------------------

_USER, _PACKAGE, _TOOL = 0, 1, 2


class _Locator:
    """The user's frame of a call: the innermost frame outside torch, this package and the
    standard library; failing that, the innermost frame of this package (a step written in it,
    as the lane's), failing that the innermost frame."""

    _MACHINERY = ("utils/_python_dispatch.py", "_ops.py", "overrides.py")

    def __init__(self) -> None:
        import torch

        self.torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        self.package_dir = os.path.dirname(os.path.abspath(__file__)) + os.sep
        paths = sysconfig.get_paths()
        self.stdlib = tuple({os.path.abspath(paths[k]) + os.sep for k in ("stdlib", "platstdlib") if k in paths})
        self._kinds: Dict[str, Tuple[int, bool]] = {}

    def _kind(self, filename: str) -> Tuple[int, bool]:
        """(user/package/tool, whether a torch frame worth naming as `via`)."""
        known = self._kinds.get(filename)
        if known is not None:
            return known
        path = os.path.abspath(filename) if not filename.startswith("<") else filename
        if path.startswith(self.torch_dir):
            rel = path[len(self.torch_dir):].replace(os.sep, "/")
            known = (_TOOL, rel not in self._MACHINERY)
        elif path.startswith(self.package_dir):
            known = (_PACKAGE, False)
        elif filename.startswith("<frozen") or (
                path.startswith(self.stdlib) and "site-packages" not in path and "dist-packages" not in path):
            known = (_TOOL, False)
        else:
            known = (_USER, False)
        self._kinds[filename] = known
        return known

    def locate(self, frame: Any) -> Tuple[str, int, str]:
        """(file, line, via) of the call the frame `frame` is making; via: the innermost torch
        frame below the user's ('torch/optim/adamw.py:283'), or ''."""
        fallback = None
        first = None
        via = ""
        while frame is not None:
            code = frame.f_code
            kind, named = self._kind(code.co_filename)
            if kind == _USER:
                return code.co_filename, frame.f_lineno, via
            if first is None:
                first = (code.co_filename, frame.f_lineno)
            if kind == _PACKAGE and fallback is None:
                fallback = (code.co_filename, frame.f_lineno)
            if named and not via:
                via = f"torch/{os.path.abspath(code.co_filename)[len(self.torch_dir):]}:{frame.f_lineno}".replace(
                    os.sep, "/")
            frame = frame.f_back
        file, line = fallback or first or ("?", 0)
        return file, line, via


def display_path(path: str) -> str:
    """A path relative to the working directory when under it, else as it is."""
    if path.startswith("<"):
        return path
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith(os.pardir + os.sep) or rel == os.pardir else rel


# ---- what one step ran ------------------------------------------------------------------------

@dataclass
class OpCall:
    """One op of a step's graph (or a host read, which cuts it).

    name: `aten.mul.Tensor` (`.default` left out), or for a host read how it is named
    (`Tensor.item()`); sig: the op's structure (name, operand shapes and dtypes, non-tensor
    arguments with Python numbers replaced by their type, output shapes); consts: the Python
    numbers, as (argument, value); file, line, via: where it was called (_Locator)."""

    name: str
    sig: Any
    consts: Tuple[Tuple[str, Any], ...]
    file: str
    line: int
    via: str
    kind: str = "op"  # op, host_read, dynamic_shape (an op that is also data-dependent)
    detail: str = ""  # a dynamic-shape op's output shape


@dataclass
class StepGraph:
    """What step `step` ran, in order, with its fingerprints."""

    step: int
    ops: List[OpCall]
    fingerprint: str = ""                       # 16 hex digits: XXH3-64 of the whole step
    graphs: List[Tuple[str, int]] = field(default_factory=list)  # per graph between host reads: (fingerprint, ops)

    @property
    def host_reads(self) -> List[OpCall]:
        return [o for o in self.ops if o.kind == "host_read"]

    @property
    def op_count(self) -> int:
        return sum(1 for o in self.ops if o.kind != "host_read")

    def summary(self) -> Dict[str, Any]:
        return {"step": self.step, "fingerprint": self.fingerprint, "ops": self.op_count,
                "host_reads": len(self.host_reads),
                "graphs": [{"fingerprint": fp, "ops": n} for fp, n in self.graphs]}


def _fingerprint(ops: Iterable[OpCall]) -> str:
    h = xxhash.xxh3_64()
    for o in ops:
        h.update(repr((o.name, o.sig, o.consts)).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def fingerprint_value(fingerprint: str) -> float:
    """A step's fingerprint as /compile/Fingerprint holds it: its top 53 bits, an integer a
    float64 holds exactly."""
    return float(int(fingerprint, 16) >> 11)


def _finish(graph: StepGraph) -> StepGraph:
    graph.fingerprint = _fingerprint(graph.ops)
    segment: List[OpCall] = []
    graphs = []
    for o in graph.ops:
        if o.kind == "host_read":
            if segment:
                graphs.append((_fingerprint(segment), len(segment)))
            segment = []
        else:
            segment.append(o)
    if segment or not graphs:
        graphs.append((_fingerprint(segment), len(segment)))
    graph.graphs = graphs
    return graph


def _modes():
    """The two torch modes (classes made once, torch imported only here)."""
    global _MODES
    if _MODES is not None:
        return _MODES
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    Tensor = torch.Tensor
    tag = getattr(torch, "Tag", None)
    data_dependent = getattr(tag, "data_dependent_output", None)
    dynamic_output = getattr(tag, "dynamic_output_shape", None)
    structural = (torch.dtype, torch.device, torch.layout, torch.memory_format)
    numbers = {bool: "#bool", int: "#int", float: "#float", complex: "#complex"}  # Python numbers: constants
    labels = tuple(str(i) for i in range(64))
    op_info: Dict[Any, Tuple[str, str]] = {}

    def info(func) -> Tuple[str, str]:
        """(display name, kind): kind '' (an op), 'host_read', 'dynamic', 'index' (dynamic with a bool mask)."""
        got = op_info.get(func)
        if got is not None:
            return got
        text = str(func)
        name = text[:-len(".default")] if text.endswith(".default") else text
        schema = getattr(func, "_schema", None)
        qualified = getattr(schema, "name", "") or ""
        overload = getattr(schema, "overload_name", "") or ""
        tags = set(getattr(func, "tags", ()) or ())
        kind = ""
        if (data_dependent is not None and data_dependent in tags) or qualified in HOST_READ_OPS:
            kind = "host_read"
        elif qualified == "aten::index":
            kind = "index" if overload in ("Tensor", "Tensor_hacked_twin") else ""
        elif (dynamic_output is not None and dynamic_output in tags) or qualified in DYNAMIC_SHAPE_OPS or \
                overload in _DYNAMIC_OVERLOADS.get(qualified, ()):
            kind = "dynamic"
        op_info[func] = got = (name, kind)
        return got

    def inner(x):  # inside a list: numbers are structure (sizes, dims)
        if isinstance(x, Tensor):
            return (tuple(x.shape), x.dtype)
        if x is None or type(x) in (int, float, bool, str):
            return x
        if isinstance(x, (list, tuple)):
            return tuple(inner(y) for y in x)
        if isinstance(x, structural):
            return x
        return type(x).__name__

    def arg(a, label, consts):
        t = type(a)
        if t is Tensor or isinstance(a, Tensor):
            return (tuple(a.shape), a.dtype)
        marker = numbers.get(t)
        if marker is not None:
            consts.append((label, a))
            return marker
        if a is None or t is str:
            return a
        if isinstance(a, (list, tuple)):
            return tuple(inner(x) for x in a)
        if isinstance(a, structural):
            return a
        return type(a).__name__

    def out_desc(o):
        if isinstance(o, Tensor):
            return (tuple(o.shape), o.dtype)
        if isinstance(o, (list, tuple)):
            return tuple(out_desc(x) for x in o)
        return type(o).__name__

    factories = {getattr(torch, name) for name in HOST_FACTORIES if hasattr(torch, name)}

    def tensors_in(values, into):
        for v in values:
            if isinstance(v, Tensor):
                into.append(v)
            elif isinstance(v, (list, tuple)):
                tensors_in(v, into)
        return into

    class FunctionReads(TorchFunctionMode):
        """Python-level host reads (.item(), float(t), print(t), .tolist(), .cpu(), .numpy()).
        While one runs, the dispatch mode records nothing: its ops are the read's own. A
        read of a host-resident tensor (StepCapture.on_host) is no host read. Tensors that a
        factory makes without a `device` (torch.tensor(0.0)) are marked host-resident here."""

        def __init__(self, capture: "StepCapture") -> None:
            super().__init__()
            self.capture = capture

        def __torch_function__(self, func, types, args=(), kwargs=None):
            capture = self.capture
            kwargs = kwargs or {}
            if func in factories:
                out = func(*args, **kwargs)
                if kwargs.get("device") is None:
                    capture.mark_host(tensors_in((out,), []))
                return out
            display = HOST_READ_METHODS.get(getattr(func, "__name__", None))
            if display is None or capture.reading:
                return func(*args, **kwargs)
            capture.reading += 1
            try:
                out = func(*args, **kwargs)
            finally:
                capture.reading -= 1
            if capture.on_host(tensors_in(args[:1], [])):
                capture.mark_host(tensors_in((out,), []))  # .cpu() of a host tensor stays one
            else:
                capture.host_read(display, sys._getframe(1))
                if func is Tensor.cpu:
                    capture.mark_host(tensors_in((out,), []))
            return out

    class DispatchOps(TorchDispatchMode):
        """Every aten op: its structure, its Python numbers, where it was called."""

        def __init__(self, capture: "StepCapture") -> None:
            super().__init__()
            self.capture = capture

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            capture = self.capture
            if capture.reading:
                return out
            inputs = tensors_in(args, tensors_in(kwargs.values(), []))
            if capture.on_host(inputs) and kwargs.get("device") is None:
                capture.mark_host(tensors_in((out,), []))  # host arithmetic: in no device graph
                return out
            name, kind = info(func)
            # The frame that called the op: None on autograd's device thread (XLA's backward
            # runs there, with no Python frame below the dispatch), which locate() allows.
            caller = sys._getframe(0).f_back
            if kind == "host_read":
                capture.host_read(name, caller)
                return out
            consts: List[Tuple[str, Any]] = []
            sig = (name, tuple(arg(a, labels[i] if i < 64 else str(i), consts) for i, a in enumerate(args)),
                   tuple((k, arg(v, k, consts)) for k, v in kwargs.items()), out_desc(out))
            file, line, via = capture.locator.locate(caller)
            call_kind, detail = "op", ""
            if kind == "index":
                indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
                if any(isinstance(t, Tensor) and t.dtype in (torch.bool, torch.uint8) for t in (indices or ())):
                    call_kind = "dynamic_shape"
            elif kind == "dynamic":
                call_kind = "dynamic_shape"
            if call_kind == "dynamic_shape":
                first = out[0] if isinstance(out, (list, tuple)) and out else out
                detail = str(tuple(first.shape)) if isinstance(first, Tensor) else ""
            capture.ops.append(OpCall(name, sig, tuple(consts), file, line, via, call_kind, detail))
            return out

    _MODES = (FunctionReads, DispatchOps)
    return _MODES


_MODES = None


class _IdentitySet:
    """Objects held weakly and told apart by identity alone. A weakref.WeakSet finds its
    members by hash and ==, and == of two tensors is a tensor, whose truth raises where it
    has more than one element: a set of tensors must never compare them. Each entry is
    keyed by id() and holds a weak reference whose callback drops it when the object dies;
    contains() also checks that the reference still points at the object asked about, so
    an id that a dead object's successor reuses is never taken for the dead one's."""

    def __init__(self) -> None:
        self._refs: Dict[int, Any] = {}

    def add(self, obj: Any) -> None:
        key = id(obj)
        if self.contains(obj):
            return
        refs = self._refs

        def forget(ref: Any) -> None:
            if refs.get(key) is ref:  # not a newer object's entry under a reused id
                del refs[key]
        refs[key] = weakref.ref(obj, forget)

    def contains(self, obj: Any) -> bool:
        ref = self._refs.get(id(obj))
        return ref is not None and ref() is obj

    def __len__(self) -> int:
        return len(self._refs)


class StepCapture:
    """Records what one step runs: begin() enters the two torch modes, end() leaves them and
    returns the step's StepGraph. Between begin() and end() nothing changes a number: every op
    runs as it would, the modes only look (and cost time: docs/python.md gives the figure)."""

    def __init__(self, locator: Optional[_Locator] = None) -> None:
        self.locator = locator or _Locator()
        self.ops: List[OpCall] = []
        self.reading = 0
        # Tensors that stay in host memory on an accelerator (made by a factory without a
        # device, and what is computed from them alone): torch.optim's step counter, kept on
        # the CPU unless capturable or fused, is one. Reading one is no device round trip,
        # and arithmetic on them is in no device graph. Kept across steps (state lives on).
        self._host = _IdentitySet()
        self._entered: Optional[Tuple[Any, Any]] = None
        self._step = 0

    def mark_host(self, tensors: Sequence[Any]) -> None:
        for t in tensors:
            self._host.add(t)

    def on_host(self, tensors: Sequence[Any]) -> bool:
        """True when there are tensors and every one is host-resident."""
        return bool(tensors) and all(self._host.contains(t) for t in tensors)

    def host_read(self, display: str, frame: Any) -> None:
        file, line, via = self.locator.locate(frame)
        self.ops.append(OpCall(display, ("host_read", display), (), file, line, via, "host_read"))

    @property
    def active(self) -> bool:
        return self._entered is not None

    def begin(self, step: int) -> None:
        if self._entered is not None:
            raise AuditError("StepCapture.begin: a step is already being recorded")
        function_mode, dispatch_mode = _modes()
        self.ops, self.reading, self._step = [], 0, step
        f, d = function_mode(self), dispatch_mode(self)
        f.__enter__()
        try:
            d.__enter__()
        except BaseException:
            f.__exit__(None, None, None)
            raise
        self._entered = (f, d)

    def end(self) -> StepGraph:
        """Leaves the modes (the dispatch mode first: the reverse of begin) and returns the step."""
        if self._entered is None:
            raise AuditError("StepCapture.end: no step is being recorded")
        if not self._on_top():
            raise AuditError("a torch mode entered during the step is still active at its end; leave every mode "
                             "the step enters before the step ends")
        self._leave()
        ops, self.ops = self.ops, []
        return _finish(StepGraph(self._step, ops))

    def abandon(self) -> None:
        """Leaves the modes without a result (an exception during the step). Modes that the
        step entered and left active above them are not popped: they are not the audit's."""
        if self._entered is not None:
            if self._on_top():
                self._leave()
            self._entered = None
            self.ops = []

    def _on_top(self) -> bool:
        """Whether the audit's modes are the innermost ones (the mode stacks pop from the top)."""
        from torch import overrides
        from torch.utils import _python_dispatch

        f, d = self._entered
        top_dispatch = getattr(_python_dispatch, "_get_current_dispatch_mode", lambda: d)()
        top_function = getattr(overrides, "_get_current_function_mode", lambda: f)()
        return top_dispatch is d and top_function is f

    def _leave(self) -> None:
        f, d = self._entered
        self._entered = None
        d.__exit__(None, None, None)
        f.__exit__(None, None, None)


# ---- findings ---------------------------------------------------------------------------------

@dataclass
class Finding:
    """One problem: kind (FINDING_KINDS), the first step it shows at, the op, your file:line.

    values: a varying constant's two values (at step-1 and at step), a graph change's two
    descriptions of the op that differs (at step-1 and at step), a dynamic shape's output
    shape; steps: every step it showed at; places: how many places of the graph (ops or
    reads) it covers at its first step."""

    kind: str
    step: int
    op: str
    file: str
    line: int
    message: str
    via: str = ""
    values: List[Any] = field(default_factory=list)
    steps: List[int] = field(default_factory=list)
    places: int = 1

    @property
    def location(self) -> str:
        return f"{display_path(self.file)}:{self.line}"

    def to_json(self) -> Dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "op": self.op, "location": self.location,
                "file": display_path(self.file), "line": self.line, "via": self.via,
                "values": [_json_value(v) for v in self.values], "steps": list(self.steps), "places": self.places,
                "message": self.message}


def _json_value(v: Any) -> Any:
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else repr(v)
    return repr(v)


def _describe(sig: Any) -> str:
    """An op call's structure, briefly: `aten.view(f32[8, 64, 128], [8, 64, 4, 32]) -> f32[8, 64, 4, 32]`."""
    if sig is None:
        return "nothing (the step ended)"
    if sig[0] == "host_read":
        return f"a host read, {sig[1]}"
    name, args, kwargs, out = sig

    def one(a):
        if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], tuple) and not isinstance(a[1], tuple):
            dtype = str(a[1]).replace("torch.", "")
            return f"{dtype}{list(a[0])}"
        if isinstance(a, tuple):
            return "[" + ", ".join(one(x) for x in a) + "]"
        if isinstance(a, str) and a.startswith("#"):
            return a[1:]
        return str(a)

    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs]
    return f"{name}({', '.join(parts)}) -> {one(out)}"


class Analysis:
    """Findings over a run's steps, added one at a time (only the previous step is kept)."""

    def __init__(self, warmup: int = 1) -> None:
        self.warmup = warmup
        self.findings: List[Finding] = []
        self._index: Dict[Tuple[Any, ...], Finding] = {}
        self._previous: Optional[StepGraph] = None

    def _add(self, key: Tuple[Any, ...], step: int, make: Callable[[], Finding]) -> Optional[Finding]:
        found = self._index.get(key)
        if found is None:
            found = self._index[key] = make()
            found.steps = [step]
            self.findings.append(found)
            return found
        if found.steps[-1] != step:
            found.steps.append(step)
        elif found.step == step:
            found.places += 1
        return None

    def add(self, graph: StepGraph) -> None:
        s = graph.step
        for o in graph.ops:
            if o.kind == "host_read":
                via = f" (in {o.via})" if o.via else ""
                self._add(("host_read", o.name, o.file, o.line), s, lambda o=o, via=via: Finding(
                    "host_read", s, o.name, o.file, o.line, via=o.via,
                    message=f"{o.name}{via} reads a device value to the host inside step {s}: under XLA it cuts "
                            "the step's graph there and waits for the device. Keep the value on the device, or "
                            "read it after the step"))
            elif o.kind == "dynamic_shape":
                shape = f"output {o.detail}" if o.detail else "data-dependent"
                self._add(("dynamic_shape", o.name, o.file, o.line), s, lambda o=o, shape=shape: Finding(
                    "dynamic_shape", s, o.name, o.file, o.line, via=o.via, values=[o.detail] if o.detail else [],
                    message=f"{o.name} gives an output whose shape depends on tensor values ({shape} at step {s}): "
                            "a compiler with static shapes must read the values first. Keep the shape fixed: "
                            "torch.where(mask, x, 0), x * mask, or masked reductions"))
        previous = self._previous
        if previous is not None:
            self._compare(previous, graph)
        self._previous = graph

    def _compare(self, a: StepGraph, b: StepGraph) -> None:
        sa, sb = [o.sig for o in a.ops], [o.sig for o in b.ops]
        if sa == sb:
            pairs: Iterable[Tuple[int, int]] = ((i, i) for i in range(len(sa)))
        elif b.step > self.warmup:  # after the warm-up: step warmup+1 against step warmup, ...
            self._graph_change(a, b, sa, sb)
            # the constants of the ops both graphs share, along their longest common op sequence
            matcher = difflib.SequenceMatcher(None, sa, sb, autojunk=False)
            pairs = ((m.a + k, m.b + k) for m in matcher.get_matching_blocks() for k in range(m.size))
        else:  # a warm-up step that traced another graph (state created): its constants are not compared
            pairs = ()
        s = b.step
        for i, j in pairs:
            oa, ob = a.ops[i], b.ops[j]
            if oa.consts == ob.consts:
                continue
            for (label, va), (_, vb) in zip(oa.consts, ob.consts):
                if repr(va) == repr(vb):
                    continue
                via = f" (in {ob.via})" if ob.via else ""
                self._add(("varying_constant", ob.name, label, ob.file, ob.line), s, lambda ob=ob, va=va, vb=vb,
                          label=label, via=via: Finding(
                    "varying_constant", s, ob.name, ob.file, ob.line, via=ob.via, values=[va, vb],
                    message=f"{ob.name}{via} takes the Python number {_argument(label)} = {va!r} at step {s - 1} and "
                            f"{vb!r} at step {s}: a constant baked into the traced graph that changes, so a new "
                            "graph to compile each time on a compiler that bakes Python numbers (tpu-mesh; torch_xla "
                            "uploads them as data except 0 and 1: --xla shows which, docs/xla.md). Keep it in a 0-D "
                            "device tensor updated in place from host data (t.copy_(torch.tensor(x))), or compute it "
                            "on the device"))

    def _graph_change(self, a: StepGraph, b: StepGraph, sa: List[Any], sb: List[Any]) -> None:
        n = min(len(sa), len(sb))
        i = next((k for k in range(n) if sa[k] != sb[k]), n)
        before = sa[i] if i < len(sa) else None
        after = sb[i] if i < len(sb) else None
        where = b.ops[i] if i < len(sb) else (b.ops[-1] if b.ops else None)
        op = where.name if i < len(sb) and where is not None else "(end of step)"
        file, line = (where.file, where.line) if where is not None else ("?", 0)
        s = b.step
        self._add(("graph_change", s), s, lambda: Finding(
            "graph_change", s, op, file, line, via=where.via if where is not None else "",
            values=[_describe(before), _describe(after)],
            message=f"step {s}'s op graph differs from step {s - 1}'s at op {i + 1} of {len(sb)} (step {s - 1}: "
                    f"{len(sa)}): {_describe(after)} where step {s - 1} ran {_describe(before)}. A changed graph is "
                    "compiled again: keep shapes (batch size, sequence length) and the op sequence fixed from step to "
                    "step"))

    @property
    def clean(self) -> bool:
        return not self.findings


def _argument(label: str) -> str:
    return f"argument {label}" if label.isdigit() else f"`{label}`"


# ---- per-step compile counters for a receipt (canary_harness.torch.Recorder(audit=True)) --------

class CompileLog:
    """The audit of a recorded run, step by step: begin(step) before the step's first op,
    end() after its last (Recorder.step(), before it reads anything), which returns the step's
    /compile row, in the counters tpu-mesh records (docs/engines/tpu-mesh.md):

    - UncachedCompile: the step's graphs (cut by its host reads) whose fingerprint no earlier
      graph of the run had: what a compile cache would compile;
    - CachedCompile: the step's graphs found among the run's earlier ones;
    - HostSync: host reads inside the step;
    - Fingerprint: the step's fingerprint (XXH3-64 of its op graph, constants included), its
      top 53 bits as a float64 integer (fingerprint_value), so that two runs' graphs compare
      step by step.

    A compile-stable step has UncachedCompile 1 at step 0 and 0 after, HostSync 0: what
    `harness check` and `compare` judge under the budgets' [compile-stability].
    The findings (Analysis) accumulate as the run goes: `findings`, `summary()`.
    """

    COUNTERS = ("UncachedCompile", "CachedCompile", "HostSync", "Fingerprint")

    def __init__(self, warmup: int = 1) -> None:
        self.capture = StepCapture()
        self.analysis = Analysis(warmup)
        self.steps = 0
        self.graphs_compiled = 0
        self.host_reads = 0
        self._seen: Dict[str, int] = {}
        self._step_fingerprints: Dict[str, int] = {}

    @property
    def active(self) -> bool:
        return self.capture.active

    @property
    def findings(self) -> List[Finding]:
        return self.analysis.findings

    def begin(self, step: int) -> None:
        self.capture.begin(step)

    def end(self) -> Dict[str, float]:
        graph = self.capture.end()
        self.analysis.add(graph)
        uncached = cached = 0
        for fp, _ in graph.graphs:
            if fp in self._seen:
                cached += 1
            else:
                self._seen[fp] = graph.step
                uncached += 1
        self.steps += 1
        self.graphs_compiled += uncached
        self.host_reads += len(graph.host_reads)
        self._step_fingerprints[graph.fingerprint] = self._step_fingerprints.get(graph.fingerprint, 0) + 1
        return {"UncachedCompile": float(uncached), "CachedCompile": float(cached),
                "HostSync": float(len(graph.host_reads)), "Fingerprint": fingerprint_value(graph.fingerprint)}

    def abandon(self) -> None:
        self.capture.abandon()

    def summary(self) -> str:
        """One line: clean, or the findings by kind and the first one."""
        distinct = len(self._step_fingerprints)
        graphs = (f"{_n(self.graphs_compiled, 'graph')} compiled over {_n(self.steps, 'step')}, "
                  f"{_n(distinct, 'distinct step fingerprint')}, {_n(self.host_reads, 'host read')}")
        if not self.findings:
            return f"clean: {graphs}"
        counts = {k: sum(1 for f in self.findings if f.kind == k) for k in FINDING_KINDS}
        first = self.findings[0]
        return (f"{len(self.findings)} finding{'s' if len(self.findings) != 1 else ''} "
                f"({', '.join(f'{n} {k}' for k, n in counts.items() if n)}; first: {first.kind} {first.op} at "
                f"{first.location}, step {first.step}): {graphs}")


# ---- the audit --------------------------------------------------------------------------------

@dataclass
class AuditReport:
    target: str
    steps: List[StepGraph]
    findings: List[Finding]
    warmup: int

    @property
    def clean(self) -> bool:
        return not self.findings

    def to_json(self) -> Dict[str, Any]:
        import torch

        return {"target": self.target, "torch": torch.__version__, "clean": self.clean, "warmup": self.warmup,
                "steps": [g.summary() for g in self.steps], "findings": [f.to_json() for f in self.findings]}

    def format(self) -> str:
        import torch

        lines = [f"target      {self.target}",
                 f"torch       {torch.__version__}, {len(self.steps)} steps on CPU (warm-up: step"
                 f"{'s' if self.warmup != 1 else ''} {', '.join(str(s) for s in range(self.warmup)) or 'none'})"]
        for g in self.steps:
            reads = len(g.host_reads)
            graphs = f"{len(g.graphs)} graph{'s' if len(g.graphs) != 1 else ''}"
            extra = f", {reads} host read{'s' if reads != 1 else ''}" if reads else ""
            lines.append(f"step {g.step:<6} {graphs}  {g.fingerprint} ({g.op_count} ops{extra})")
        for f in self.findings:
            more = f" (steps {', '.join(str(s) for s in f.steps)})" if len(f.steps) > 1 else ""
            places = f" [{f.places} places]" if f.places > 1 else ""
            lines.append(f"FINDING     {f.kind} at {f.location}, step {f.step}{more}{places}: {f.message}")
        if self.clean:
            lines.append(f"result      clean: no host read, varying constant, graph change or dynamic shape in "
                         f"{len(self.steps)} steps")
        else:
            counts = {k: sum(1 for f in self.findings if f.kind == k) for k in FINDING_KINDS}
            lines.append(f"result      {len(self.findings)} finding{'s' if len(self.findings) != 1 else ''}: " +
                         ", ".join(f"{n} {k}" for k, n in counts.items() if n))
        return "\n".join(lines)


class StepError(AuditError):
    """The step raised: one line naming the step, the exception and where it was raised."""


def audit_step(step: Callable[[int], Any], steps: int = 4, *, warmup: int = 1, target: str = "") -> AuditReport:
    """Runs step(0) .. step(steps-1) under the audit's modes and returns the AuditReport.

    step(i) is one training step on CPU tensors (its return value is ignored). Graph changes
    are compared from step warmup+1 on (step 0 may create state: warmup=1); steps must leave
    at least two steps to compare after the warm-up for a graph change to show. A step that
    raises is a StepError naming it."""
    if not callable(step):
        raise AuditError(f"the step is {_a(type(step).__name__)}, not a function step(i)")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise AuditError(f"steps={steps!r}: audit at least 2 steps")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup < steps:
        raise AuditError(f"warmup={warmup!r}: a number in 0..{steps - 1}")
    capture = StepCapture()
    analysis = Analysis(warmup)
    graphs: List[StepGraph] = []
    for i in range(steps):
        if isinstance(step, PythonCanaryStep):
            _prepare(step, i)  # the canary's batch(i), outside the step's window
        capture.begin(i)
        try:
            step(i)
        except Exception as e:
            capture.abandon()
            raise StepError(f"step {i} raised {type(e).__name__}: {_first_line(e)}{_where(e, capture.locator)}") from e
        except BaseException:
            capture.abandon()
            raise
        graph = capture.end()
        analysis.add(graph)
        graphs.append(graph)
    return AuditReport(target or getattr(step, "__qualname__", repr(step)), graphs, analysis.findings, warmup)


def _prepare(step: "PythonCanaryStep", i: int) -> None:
    try:
        step.prepare(i)
    except Exception as e:
        raise StepError(f"batch({i}) raised {type(e).__name__}: {_first_line(e)}{_where(e, _Locator())}") from e


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else "(no message)"


def _where(e: BaseException, locator: _Locator) -> str:
    tb = e.__traceback__
    last = None
    while tb is not None:
        if locator._kind(tb.tb_frame.f_code.co_filename)[0] == _USER:
            last = (tb.tb_frame.f_code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return f" (at {display_path(last[0])}:{last[1]})" if last else ""


# ---- the command ------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own errors: one line, exit 2
        print(f"{PROG}: error: {message} (see `python3 -m {PROG} --help`)", file=sys.stderr)
        sys.exit(2)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = _Parser(prog=f"python3 -m {PROG}",
                 description="Audit a PyTorch training step for what makes a tracing compiler (XLA) recompile: "
                             "host reads, varying Python constants, graph changes, data-dependent shapes.")
    ap.add_argument("target", help="FILE.py:FUNCTION, where FUNCTION() returns step(i), one training step on CPU, "
                                   "or a canary_harness.Canary (its step on its batches, as `canary_harness run` "
                                   "runs it)")
    ap.add_argument("--steps", default="4", help="steps to run, at least 2 (default 4)")
    ap.add_argument("--warmup", default="1",
                    help="warm-up steps whose graph may differ from the next one's (default 1: step 0 may create "
                         "optimizer state)")
    ap.add_argument("--json", action="store_true", help="the report as JSON on stdout (keys: docs/python.md)")
    ap.add_argument("--xla", action="store_true",
                    help="also run the step under torch_xla (PJRT's CPU client where there is no TPU): FUNCTION(device) "
                         "makes it on torch_xla's device, and the report gives the real compiles and host transfers of "
                         "each step, each recompile with its cause, beside the static findings (docs/xla.md)")
    return ap.parse_args(argv)


def _number(flag: str, text: str, low: int, high: int) -> int:
    if not text.isdigit() or not low <= int(text) <= high:
        raise AuditError(f"--{flag}: '{text}' is not a number in {low}..{high}")
    return int(text)


def parse_target(target: str) -> Tuple[str, str]:
    """FILE.py:FUNCTION -> (FILE.py, FUNCTION), the file there; AuditError (one line) otherwise."""
    path, colon, function = target.rpartition(":")
    if not colon or not path or not function:
        raise AuditError(f"'{target}': give FILE.py:FUNCTION (FUNCTION() returns step(i) or a canary_harness.Canary)")
    if not os.path.exists(path):
        raise AuditError(f"{path}: no such file")
    if os.path.isdir(path):
        raise AuditError(f"{path}: is a directory; give a Python file")
    if not function.isidentifier():
        raise AuditError(f"{target}: '{function}' is not a Python function name")
    return path, function


def load_step(target: str, *device: Any) -> Callable[[int], Any]:
    """FILE.py:FUNCTION -> the step function FUNCTION() returns (FUNCTION(device) with a
    device), or, where FUNCTION() returns a canary_harness.Canary, its PythonCanaryStep (the file
    loaded again as `canary_harness run` loads it: canary.load_canary); AuditError (one
    line) otherwise: no such file, an import that fails, no such function, a FUNCTION() that
    raises or returns neither, a Canary that does not load."""
    path, function = parse_target(target)
    directory = os.path.dirname(os.path.abspath(path))
    if directory not in sys.path:
        sys.path.insert(0, directory)  # the file's own imports of its neighbours
    name = "_canary_audit_" + "".join(c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise AuditError(f"{path}: cannot be imported as a Python module (give a .py file)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise AuditError(f"{path}: cannot import it: SyntaxError at line {e.lineno}: {e.msg}") from None
    except Exception as e:
        raise AuditError(f"{path}: cannot import it: {type(e).__name__}: {_first_line(e)}") from None
    if not hasattr(module, function):
        functions = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                           and getattr(v, "__module__", None) == name)
        known = f" (its functions: {', '.join(functions[:6])})" if functions else ""
        raise AuditError(f"{path}: has no function '{function}'{known}")
    maker = getattr(module, function)
    if not callable(maker):
        raise AuditError(f"{target}: is {_a(type(maker).__name__)}, not a function")
    # A function without an argument is called as it is, also under --xla: what it returns
    # decides (a Canary is placed on the device by the audit; a step function needs FUNCTION(device)).
    made = _make(maker, target, function, *(device if _takes_an_argument(maker) else ()))
    if isinstance(made, Canary):
        return PythonCanaryStep(_load_canary(target), *device)
    if device and not _takes_an_argument(maker):
        raise AuditError(f"{target}: --xla calls {function}(device), and {function}() takes no argument: give it one "
                         f"(def {function}(device=\"cpu\")) and make the model, optimizer and tensors on it")
    if not callable(made):
        raise AuditError(f"{target}: {function}() returned {_a(type(made).__name__)}, not a step function step(i) "
                         "or a canary_harness.Canary")
    return made


def _make(maker: Callable[..., Any], target: str, function: str, *device: Any) -> Any:
    """FUNCTION(*device); an exception it raises is an AuditError naming it."""
    try:
        return maker(*device)
    except Exception as e:
        raise AuditError(f"{target}: {function}() raised {type(e).__name__}: {_first_line(e)}") from None


def _load_canary(target: str) -> Any:
    """The Canary FILE.py:NAME returns, as `canary_harness run` loads it (canary.load_canary:
    the file imported afresh, torch, random and numpy seeded, NAME() called, every field
    checked); a CanaryError is an AuditError."""
    try:
        return load_canary(target)
    except CanaryError as e:
        raise AuditError(str(e)) from None


class PythonCanaryStep:
    """step(i) of a canary_harness.Canary as `canary_harness run` runs it:
    canary.step(model, optimizer, batch, i) on canary.batch(i). audit_step makes the batch
    before the step's window opens (prepare), as the runner makes it before its audit's
    window: the data pipeline is not the training step. Under --xla the model is placed on
    the device (devices.place_on_device) and each batch moved there inside the step, as the
    runner moves it."""

    def __init__(self, loaded: Any, device: Any = None) -> None:
        self.canary = loaded.canary
        self.device = device
        self._prepared: Dict[int, Any] = {}
        if device is not None:
            place_on_device(self.canary, device)

    def prepare(self, i: int) -> None:
        self._prepared[i] = self.canary.batch(i)

    def __call__(self, i: int) -> Any:
        batch = self._prepared.pop(i) if i in self._prepared else self.canary.batch(i)
        if self.device is not None:
            batch = to_device(batch, self.device)
        return self.canary.step(self.canary.model, self.canary.optimizer, batch, i)


def _takes_an_argument(function: Callable[..., Any]) -> bool:
    import inspect

    try:
        inspect.signature(function).bind(None)
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): let the call say
        return True
    return True


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        steps = _number("steps", args.steps, 2, 10_000)
        warmup = _number("warmup", args.warmup, 0, steps - 1)
        parse_target(args.target)  # before torch loads: a wrong path is named at once
        if importlib.util.find_spec("torch") is None:
            raise AuditError("torch is not installed: the audit runs the step in PyTorch")
        if args.xla and importlib.util.find_spec("torch_xla") is None:
            raise AuditError("--xla: torch_xla is not installed here; run the audit with .venv/bin/python "
                             "(docs/python-env.md)")
        with contextlib.ExitStack() as scope:
            scope.enter_context(contextlib.redirect_stdout(sys.stderr))  # the step's own prints stay off the report
            xla = _XlaRun(scope) if args.xla else None  # before torch_xla is imported
            step = load_step(args.target)
            try:
                report = audit_step(step, steps, warmup=warmup, target=args.target)
                if xla is not None:
                    xla.run(load_step(args.target, xla.device()), steps, report)
            except StepError as e:
                raise AuditError(f"{args.target}: {e}") from None
    except AuditError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**report.to_json(), **(xla.to_json() if xla else {})}, indent=2))
    else:
        print(report.format() + ("\n" + xla.format() if xla else ""))
    return 0 if report.clean and (xla is None or xla.verdict.xla_clean) else 1


class _XlaRun:
    """--xla: torch_xla told to dump its graphs into a scratch directory (before it is
    imported), the step made on its device and run (canary_harness.xla.graphs)."""

    def __init__(self, scope: contextlib.ExitStack) -> None:
        from .xla.device import XlaUnavailable, xla_device

        self.directory = scope.enter_context(xla_graphs.scratch_directory())
        self.dump = xla_graphs.GraphDump(xla_graphs.prepare(self.directory))
        try:  # before any backward on the CPU: autograd sizes its device queues on its first use
            self._device = xla_device()
        except XlaUnavailable as e:
            raise AuditError(f"--xla: {e}") from None
        self.rows: List[Any] = []
        self.verdict: Any = None

    def device(self) -> Any:
        return self._device

    def run(self, step: Callable[[int], Any], steps: int, report: "AuditReport") -> None:
        try:
            self.rows = xla_graphs.run_steps(step, steps, self.dump)
        except Exception as e:
            raise StepError(f"under torch_xla: {type(e).__name__}: {_first_line(e)}") from e
        self.verdict = xla_graphs.agreement(report.findings, self.rows, report.warmup)

    def to_json(self) -> Dict[str, Any]:
        return {"xla": {"client": os.environ.get("PJRT_DEVICE", ""), "steps": [r.to_json() for r in self.rows],
                        **self.verdict.to_json()}}

    def format(self) -> str:
        return xla_graphs.format_rows(self.rows, self.verdict, os.environ.get("PJRT_DEVICE", ""))


if __name__ == "__main__":
    sys.exit(main())
