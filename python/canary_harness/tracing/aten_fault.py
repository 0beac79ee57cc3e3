"""A fault on one aten op call: `--inject-fault step=K,op=MODULE:ATEN[#N][,ulps=U]`.

Functional code has no module to hook: a softmax written `F.softmax(att, dim=-1)` inside
`h.0.attn`'s forward, a residual `x + self.attn(...)` in `h.0`'s. Such an op is named as
the aten trace names it (docs/bisect.md, "Python canaries: replay and aten traces"): the
module it runs in (`h.0.attn`; `<model>` for the root module's own code, `<step>` for the
step's code outside modules), the aten overload (`aten._softmax.default`) and, where the
module calls it more than once in a step, which call (`#2`: the second; default the
first). At step K the N-th call's output has element 0 moved up by U ulps (the same nudge
as a module fault's), below autograd: the backward is the op's own, as a hooked module's.

A TorchDispatchMode runs only during step K; its check after the step refuses a fault
that did not happen (the op never ran there, or returned no floating-point tensor).
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .aten_trace import STEP, StepPhases
from ..runs.canary import CanaryError
from ..runs.faults import ulps_up


def split_target(op: str) -> Optional[Tuple[str, str, int]]:
    """MODULE:ATEN[#N] -> (module, aten op, N); None for a plain module path."""
    module, colon, rest = op.rpartition(":")
    if not colon:
        return None
    name, hash_sign, occurrence = rest.partition("#")
    if not hash_sign:
        return module, name, 1
    return module, name, int(occurrence) if occurrence.isascii() and occurrence.isdigit() else 0


def target_problem(op: str, module_paths: Any) -> Optional[str]:
    """Why MODULE:ATEN[#N] cannot name an op call of this model, or None when it can."""
    module, name, occurrence = split_target(op)
    if module != STEP and module not in module_paths:
        return f"no module '{module}' in the model (a module path, <model> or <step>)"
    parts = name.split(".")
    overload = getattr(getattr(torch.ops.aten, parts[1], None), parts[2], None) \
        if len(parts) == 3 and parts[0] == "aten" else None
    if not isinstance(overload, torch._ops.OpOverload):
        return f"'{name}' is not an aten op overload (aten.NAME.OVERLOAD, as `replay --trace aten` names it)"
    if any(ret.alias_info is not None for ret in overload._schema.returns):
        return f"'{name}' returns an input (in place, or a view); name the op that computes the value"
    if occurrence < 1:
        return f"'#{op.partition('#')[2]}' is not a call number >= 1"
    return None


class AtenFault:
    """Nudges the output of one aten op call at the fault's step (module docstring)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, spec: Any) -> None:
        self.spec = spec
        self.module, self.name, self.occurrence = split_target(spec.op)
        self.phases = StepPhases(model, optimizer)  # where an op runs, named as the aten trace names it
        self._ulps_up = ulps_up
        self.calls = 0
        self.fired = False

    def between_steps(self, step: int) -> bool:
        return False  # it acts inside the step only

    def arm(self, step: int) -> None:
        self.calls, self.fired = 0, False

    def during(self, step: int) -> ContextManager[Any]:
        """The step's phases and the dispatch mode at the fault's step; nothing at any other."""
        if step != self.spec.step:
            return contextlib.nullcontext()
        contexts = contextlib.ExitStack()
        contexts.enter_context(self.phases.step())
        contexts.enter_context(_Mode(self))
        return contexts

    def _visit(self, func: Any, out: Any) -> Any:
        if str(func) != self.name or self.phases.where()[0] != self.module:
            return out
        self.calls += 1
        if self.calls != self.occurrence:
            return out
        if not (isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel() > 0):
            raise CanaryError(f"--inject-fault: {self.spec.op} returns a {type(out).__name__}, not one "
                              "floating-point tensor; name an op whose output is one")
        self.fired = True
        flat = out.reshape(-1)
        return torch.cat([self._ulps_up(torch, flat[:1], self.spec.ulps), flat[1:]]).view_as(out)

    def check(self, step: int) -> None:
        if step == self.spec.step and not self.fired:
            raise CanaryError(f"--inject-fault: {self.spec.op} was called {self.calls} time(s) in step {step}, not "
                              f"{self.occurrence}; name a call the step makes (`replay --trace aten` lists them)")


class _Mode(TorchDispatchMode):
    def __init__(self, fault: AtenFault) -> None:
        super().__init__()
        self.fault = fault

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.fault._visit(func, func(*args, **(kwargs or {})))
