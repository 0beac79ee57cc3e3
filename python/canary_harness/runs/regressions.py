"""Regressions injected into a Python canary's run, as `harness power` climbs them
(docs/budgets.md, "Detection power"; the C++ canaries' kinds, canaries/fault.h):

- `kind=weight-scale,step=K,tensor=P,by=E`: parameter P times 1 + E at the start of step K
  (the layer's output scaled there; training goes on from the scaled weight);
- `kind=weight-ulps,tensor=P,ulps=N`: P's first initial value N ulps up;
- `kind=lr-scale,step=K,by=E`: every param group's learning rate times 1 + E inside each
  optimizer.step() from step K on, around the team's scheduler: the rate is scaled just
  before the optimizer's step and put back after it, so the scheduler computes its next
  rate from its own as before (the receipt's lr is the scaled one);
- `kind=eps-scale,by=F`: every param group's `eps` (AdamW's, Adam's) times F from the start.

The text is parsed as the C++ parses it and written back in its canonical form (the
manifest's fault_injection), which replay parses again: a replay from a checkpoint before
step K scales at K; one after K finds the scaled weights (and eps) in the checkpoint.
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Tuple

from .canary import CanaryError
from .faults import ulps_up
from ..cli.usage import UsageError, all_digits

# Each kind's keys, in its canonical order.
KIND_KEYS: Dict[str, Tuple[str, ...]] = {
    "weight-scale": ("step", "tensor", "by"),
    "weight-ulps": ("tensor", "ulps"),
    "lr-scale": ("step", "by"),
    "eps-scale": ("by",),
}
# A decimal number as std::from_chars reads one: no sign of +, no spaces, no underscores.
_NUMBER = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _shortest(value: float) -> str:
    """A double as the C++ writes it with fmt's "{}": the shortest text that reads back, without
    Python's ".0" on whole numbers (10, not 10.0)."""
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


@dataclass(frozen=True)
class RegressionSpec:
    kind: str
    step: int = 0
    tensor: str = ""
    by: float = 0.0
    ulps: int = 0

    def __str__(self) -> str:  # canonical, as canaries/fault.cpp's FaultSpec::to_string
        values = {"step": str(self.step), "tensor": self.tensor, "by": _shortest(self.by), "ulps": str(self.ulps)}
        return ",".join([f"kind={self.kind}"] + [f"{key}={values[key]}" for key in KIND_KEYS[self.kind]])


def is_regression(text: str) -> bool:
    """Whether --inject-fault names a regression kind (kind=..., other than the nudge)."""
    return any(item.startswith("kind=") and item != "kind=nudge" for item in text.split(","))


def _by(value: str, kind: str) -> float:
    factor = kind == "eps-scale"  # a factor, else a relative change
    number = float(value) if _NUMBER.fullmatch(value) else math.nan
    if not math.isfinite(number) or (number <= 0 if factor else (number <= -1 or number == 0)):
        want = "a factor > 0" if factor else "a relative change E > -1, E != 0 (times 1 + E)"
        raise UsageError(f"--inject-fault: by='{value}' is not {want}")
    return number


def parse_regression(text: str, parameters: List[str], steps: int) -> RegressionSpec:
    """kind=KIND,... (the module docstring); UsageError naming the field for anything else."""
    fields: Dict[str, str] = {}
    for item in text.split(","):
        key, eq, value = item.partition("=")
        if not eq:
            raise UsageError(f"--inject-fault: field '{item}' is not key=value (want step=K,op=NAME[,ulps=N] or kind=...)")
        if key in fields:
            raise UsageError(f"--inject-fault: {key} given twice")
        fields[key] = value
    kind = fields.pop("kind", "")
    if kind not in KIND_KEYS:
        raise UsageError(f"--inject-fault: kind='{kind}' is not a fault kind (nudge, {', '.join(KIND_KEYS)})")
    keys = KIND_KEYS[kind]
    for key in fields:
        if key not in keys:
            raise UsageError(f"--inject-fault: unknown key '{key}' for {kind} (known: {', '.join(keys)})")
    for key in keys:
        if key not in fields:
            raise UsageError(f"--inject-fault: {kind} needs {key}=... (it takes {', '.join(keys)})")
    numbers = {}
    for key, minimum in (("step", 0), ("ulps", 1)):
        if key in fields:
            value = fields[key]
            if not all_digits(value) or int(value) < minimum or int(value) > 2**31 - 1:
                raise UsageError(f"--inject-fault: {key}='{value}' is not an integer >= {minimum}")
            numbers[key] = int(value)
    if numbers.get("step", 0) >= steps:
        raise UsageError(f"--inject-fault: step={numbers['step']} is past the last step ({steps - 1})")
    tensor = fields.get("tensor", "")
    if "tensor" in keys and tensor not in parameters:
        examples = ", ".join(parameters[:2] + parameters[-1:])
        raise UsageError(f"--inject-fault: unknown tensor '{tensor}' (the model's parameters, e.g. {examples})")
    by = _by(fields["by"], kind) if "by" in keys else 0.0
    return RegressionSpec(kind, numbers.get("step", 0), tensor, by, numbers.get("ulps", 0))


def linear_weights(model: Any) -> List[str]:
    """The weights of the model's linear layers, as named_parameters names them, in
    registration order: each leaf module's own 2-D floating parameter (nn.Linear's weight,
    transformers' Conv1D's), but an embedding's table (nn.Embedding, nn.EmbeddingBag), which
    is indexed, not multiplied. A weight tied to another (an lm_head to its embedding) keeps
    its first name and counts once."""
    import torch

    names = {id(p): name for name, p in model.named_parameters()}
    found: List[str] = []
    for module in model.modules():
        if next(module.children(), None) is not None or isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
            continue
        for p in module.parameters(recurse=False):
            if p.dim() == 2 and p.is_floating_point() and id(p) in names and names[id(p)] not in found:
                found.append(names[id(p)])
    return found


class RegressionFault:
    """A RegressionSpec on a canary's model and optimizer, with the interface of the runner's
    faults: between_steps(step) before the step's window (weight-scale: what a bad checkpoint
    or a reloaded layer would do, not an op of the step's graph), arm(step) at its start,
    during(step) around it, check(step) after it. The initial-state kinds (weight-ulps,
    eps-scale) act when it is made, before step 0."""

    def __init__(self, model: Any, optimizer: Any, spec: RegressionSpec) -> None:
        import torch  # only here: parsing a spec stays torch-free

        self.spec = spec
        self.model = model
        self.optimizer = optimizer
        if spec.kind == "weight-ulps":
            with torch.no_grad():
                flat = dict(model.named_parameters())[spec.tensor].view(-1)
                flat[:1] = ulps_up(torch, flat[:1], spec.ulps)
        if spec.kind == "eps-scale":
            groups = [g for g in optimizer.param_groups
                      if isinstance(g.get("eps"), (int, float)) and not isinstance(g.get("eps"), bool)]
            if not groups:
                raise CanaryError(f"--inject-fault: kind=eps-scale: the canary's optimizer "
                                  f"({type(optimizer).__name__}) has no eps in its param groups")
            for group in groups:
                group["eps"] = group["eps"] * spec.by

    def between_steps(self, step: int) -> bool:
        """weight-scale at its step: the parameter times 1 + E. Returns whether it changed
        anything (the runner then cuts XLA's lazy graph, so the change is data to the step)."""
        if self.spec.kind != "weight-scale" or step != self.spec.step:
            return False
        import torch

        # Looked up now, by its name: a layout may have replaced the parameter since (FSDP2's
        # fully_shard: a sharded DTensor, which scales shard by shard).
        with torch.no_grad():
            dict(self.model.named_parameters())[self.spec.tensor].mul_(1 + self.spec.by)
        return True

    def arm(self, step: int) -> None:
        pass  # nothing to reset at a step's start

    def during(self, step: int) -> Any:
        if self.spec.kind == "lr-scale" and step >= self.spec.step:
            return self._scaled_lr()
        return contextlib.nullcontext()

    def check(self, step: int) -> None:
        pass  # every kind acts unconditionally: nothing to verify after the step

    @contextlib.contextmanager
    def _scaled_lr(self) -> Iterator[None]:
        """optimizer.step() with every group's lr times 1 + E, put back after it: the
        instance's step wrapped for the step (whatever wraps it already, a scheduler's
        counter or the digests' capture, runs inside)."""
        optimizer, factor = self.optimizer, 1 + self.spec.by
        replaced = optimizer.__dict__.get("step")
        inner = optimizer.step

        def scaled_step(*args: Any, **kwargs: Any) -> Any:
            rates = [group["lr"] for group in optimizer.param_groups]
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * factor
            try:
                return inner(*args, **kwargs)
            finally:
                for group, rate in zip(optimizer.param_groups, rates):
                    group["lr"] = rate

        optimizer.step = scaled_step
        try:
            yield
        finally:
            if replaced is None:
                optimizer.__dict__.pop("step", None)
            else:
                optimizer.step = replaced
