"""Autocast switched off per module: the units `harness triage` switches on a Python canary.

Under bf16 autocast, a module's ops run in bf16 where autocast casts them (matmuls,
convolutions) and then in whatever dtype their bf16 inputs have. `AutocastOff` takes a set
of modules out of it, as a team does by hand with `torch.autocast(enabled=False)` around a
layer: each one's floating-point inputs are cast to fp32 and its forward runs with autocast
disabled, so it computes in fp32 and returns fp32. Its backward runs in fp32 too: the
harness runs the whole step under autocast, backward() included, and autocast casts the
backward's matmuls as well (a backward called inside autocast is not the one a team gets
with autocast around the forward only), so the module's forward graph is built apart and
differentiated with autocast disabled (`_Fp32Region`). The ops around it stay under
autocast.

The units are found from what runs, never from names (`autocast_units`): the modules whose
own forward code (not their children's) runs an op with a reduced-precision floating-point
result under the lane's autocast, seen at the aten level (a TorchDispatchMode below
autocast, with aten_trace's module stack) in one step on copies of the model and
optimizer. A Linear is one (autocast casts its GEMM), and so is an attention module whose
functional matmuls run in bf16; ops in the root module's own forward or in the step's code
are in no module below the model, and are not units. Innermost modules come first (tried
first as groups). A unit's group is its path with the index of each nn.ModuleList or
nn.Sequential it sits in replaced by `*` (the same layer in every block: `h.*.mlp.c_fc`),
its layer the first such index (-1 for none).

docs/triage.md, "Python canaries".
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..tracing.aten_trace import ROOT, STEP, ModuleStack, traced_returns

# What triage's rerun passes (`python3 -m canary_harness rerun --autocast-off M,...`).
SWITCH_FLAG = "autocast-off"
REDUCED = (torch.bfloat16, torch.float16)


class UnknownModule(ValueError):
    """A module path that is not a module of the model."""


class _Fp32Region(torch.autograd.Function):
    """One call of a switched module, forward and backward in fp32 outside autocast.

    forward builds the module's graph apart (on detached inputs, gradients enabled,
    autocast disabled) and returns its outputs detached; backward differentiates that graph
    with autocast disabled and hands the gradients of the inputs and the module's
    parameters back to the step's graph. `tensors`: the call's floating-point tensor
    arguments (positional, then keyword), then the module's parameters (what the step's
    graph connects to)."""

    @staticmethod
    def forward(ctx: Any, region: "_Call", *tensors: torch.Tensor) -> Any:  # type: ignore[override]
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in tensors[:region.inputs]]
        with torch.enable_grad(), torch.autocast(device_type=region.device_type, enabled=False):
            out = region.run(inputs)
        outs = out if isinstance(out, tuple) else (out,)
        if not all(isinstance(o, torch.Tensor) for o in outs):
            raise UnknownModule(f"--autocast-off: module '{region.name}' returns {type(out).__name__}; a switched "
                                "module returns a tensor or a tuple of tensors")
        ctx.region, ctx.sources, ctx.outs = region, [*inputs, *tensors[region.inputs:]], outs
        stray = _leaves_beyond(outs, ctx.sources)
        if stray is not None:
            raise UnknownModule(f"--autocast-off: module '{region.name}' reads a tensor that needs a gradient and is "
                                f"neither its argument nor its parameter (shape {tuple(stray.shape)}); its gradient "
                                "would be lost: switch the module that owns it")
        detached = tuple(o.detach() for o in outs)
        return detached if isinstance(out, tuple) else detached[0]

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:  # type: ignore[override]
        pairs = [(o, g) for o, g in zip(ctx.outs, grads) if g is not None and o.requires_grad]
        wanted = [s for s in ctx.sources if s.requires_grad]
        found: Sequence[Any] = []
        if pairs and wanted:
            with torch.autocast(device_type=ctx.region.device_type, enabled=False):
                found = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
        by_source = dict(zip(map(id, wanted), found))
        return (None, *(by_source.get(id(s)) for s in ctx.sources))


def _leaves_beyond(outs: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> Optional[torch.Tensor]:
    """A leaf tensor that needs a gradient, reached from `outs`' graph, that is not one of
    `sources`: what the region could not hand a gradient back to. None when there is none."""
    known = {id(s) for s in sources}
    stack = [o.grad_fn for o in outs if o.grad_fn is not None]
    seen = set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # an AccumulateGrad: a leaf
        if variable is not None and id(variable) not in known:
            return variable
        stack.extend(next_node for next_node, _ in node.next_functions)
    return None


class _Call:
    """A switched module's forward on one call's arguments, its floating-point tensor
    arguments (positional or keyword) replaced by the region's inputs, cast to fp32."""

    def __init__(self, name: str, forward: Any, device_type: str, args: tuple, kwargs: dict) -> None:
        self.name, self.forward, self.device_type = name, forward, device_type
        self.args, self.kwargs = list(args), dict(kwargs)
        floating = lambda a: isinstance(a, torch.Tensor) and a.is_floating_point()  # noqa: E731
        self.slots: List[Any] = [i for i, a in enumerate(args) if floating(a)]
        self.slots += [k for k, a in kwargs.items() if floating(a)]
        self.inputs = len(self.slots)

    def tensors(self) -> List[torch.Tensor]:
        return [self.args[s] if isinstance(s, int) else self.kwargs[s] for s in self.slots]

    def run(self, inputs: List[torch.Tensor]) -> Any:
        args, kwargs = list(self.args), dict(self.kwargs)
        for slot, value in zip(self.slots, inputs):
            if isinstance(slot, int):
                args[slot] = value.float()
            else:
                kwargs[slot] = value.float()
        return self.forward(*args, **kwargs)


class AutocastOff:
    """`modules` of `model` run in fp32 outside autocast, forward and backward (their
    forward replaced by one that runs the original in a _Fp32Region). close() puts the
    original forwards back. UnknownModule names a path the model lacks."""

    def __init__(self, model: torch.nn.Module, modules: Sequence[str], device_type: str) -> None:
        found = dict(model.named_modules())
        missing = [m for m in modules if m not in found or not m]
        if missing:
            raise UnknownModule(f"--autocast-off: '{missing[0]}' is not a module of the model (a path of "
                                "model.named_modules(), e.g. one `triage` names)")
        self.switched = [found[name] for name in modules]
        # A forward the module already had as its own attribute (not its class's), put back by close().
        self.own = [vars(module).get("forward") for module in self.switched]
        for name, module in zip(modules, self.switched):
            module.forward = self._outside_autocast(name, module, device_type)

    @staticmethod
    def _outside_autocast(name: str, module: torch.nn.Module, device_type: str) -> Any:
        original = module.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            call = _Call(name, original, device_type, args, kwargs)
            if not torch.is_grad_enabled():
                with torch.autocast(device_type=device_type, enabled=False):
                    return call.run(call.tensors())
            params = [p for p in module.parameters() if p.requires_grad]
            return _Fp32Region.apply(call, *call.tensors(), *params)
        return forward

    def close(self) -> None:
        for module, own in zip(self.switched, self.own):
            if own is not None:
                module.forward = own
            else:
                vars(module).pop("forward", None)
        self.switched, self.own = [], []


def _block_indices(model: torch.nn.Module) -> Dict[str, List[int]]:
    """Per module path, the positions of its path's parts that index a ModuleList or Sequential."""
    lists = (torch.nn.ModuleList, torch.nn.Sequential)
    containers = {name for name, m in model.named_modules() if isinstance(m, lists)}
    out: Dict[str, List[int]] = {}
    for name, _ in model.named_modules():
        parts = name.split(".") if name else []
        out[name] = [i for i in range(len(parts)) if ".".join(parts[:i]) in containers and parts[i].isdigit()]
    return out


def unit_of(name: str, indices: List[int]) -> Dict[str, Any]:
    """A unit's JSON: its path (the flag's value), its group (block indices made `*`) and layer."""
    parts = name.split(".")
    group = ".".join("*" if i in indices else p for i, p in enumerate(parts))
    return {"value": name, "group": group, "layer": int(parts[indices[0]]) if indices else -1}


class _ReducedOps(TorchDispatchMode):
    """Notes the innermost module (aten_trace.ModuleStack) of every op that computes a
    reduced-precision floating-point result (views, which only alias an input, excepted)."""

    def __init__(self, stack: ModuleStack) -> None:
        super().__init__()
        self.stack, self.seen = stack, []  # module paths, in the order their first such op ran

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        outputs = out if isinstance(out, (tuple, list)) else [out]
        computed = [o for o, traced in zip(outputs, traced_returns(func)) if traced]
        if any(isinstance(o, torch.Tensor) and o.dtype in REDUCED for o in computed):
            path = self.stack.innermost()[0]
            if path not in (ROOT, STEP) and path not in self.seen:
                self.seen.append(path)
        return out


def autocast_units(canary: Any, batch: Any, device: torch.device, off: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """The modules whose own forward code computes in reduced precision under bf16 autocast
    in step 0 of `canary` (on copies of its model and optimizer), less those in `off`:
    innermost first, then in the order they first ran."""
    model, optimizer = copy.deepcopy((canary.model, canary.optimizer))
    stack = ModuleStack(model)
    mode = _ReducedOps(stack)
    try:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16), mode:
            canary.step(model, optimizer, batch, 0)
    finally:
        stack.close()
    indices = _block_indices(model)
    ordered = sorted(mode.seen, key=lambda path: -path.count("."))  # stable: first run first within a depth
    return [unit_of(path, indices[path]) for path in ordered if path not in off]


def switches(units: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The JSON `harness triage` reads: one switch, bf16 autocast to fp32, over `units`."""
    return [{"format": "bf16", "flag": SWITCH_FLAG, "wider": "fp32", "units": units}] if units else []


def parse_modules(text: Optional[str]) -> List[str]:
    """--autocast-off's value: module paths, comma-separated, each once, in order."""
    if text is None:
        return []
    names = [n.strip() for n in text.split(",")]
    if any(not n for n in names):
        raise ValueError(f"--autocast-off: '{text}' is not MODULE,... (module paths, comma-separated)")
    return list(dict.fromkeys(names))
