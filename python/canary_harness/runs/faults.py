"""Fault injection's shared pieces: `--inject-fault step=K,op=NAME[,ulps=N]` parsed as the C++
parses it, and the nudge of an op's first result by N units in the last place (the C++
nudge_ulps op), used by the lane, a Python canary's runner and its aten-op faults alike.
torch is imported inside the functions: importing this module stays torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional

from ..cli.usage import UsageError, all_digits


@dataclass
class FaultSpec:
    step: int
    op: str
    ulps: int

    def __str__(self) -> str:  # canonical, as the C++ writes fault_injection
        return f"step={self.step},op={self.op},ulps={self.ulps}"


def parse_fault(text: str, ops: List[str], steps: int, where: str = "see docs/canary.md",
                op_problem: Optional[Callable[[str], Optional[str]]] = None) -> FaultSpec:
    """step=K,op=NAME[,ulps=N] as the C++ parses it (canaries/fault.cpp). `op_problem`, when
    given, judges an op with a ':' (a Python canary's MODULE:ATEN[#N]: why it names no op
    call, or None) in place of the list `ops`."""
    if not text:
        raise UsageError("--inject-fault: empty; want step=K,op=NAME[,ulps=N]")
    fields = {}
    for item in text.split(","):
        key, eq, value = item.partition("=")
        if not eq:
            raise UsageError(f"--inject-fault: field '{item}' is not key=value (want step=K,op=NAME[,ulps=N])")
        if key not in ("step", "op", "ulps"):
            raise UsageError(f"--inject-fault: unknown key '{key}' (known: step, op, ulps)")
        if key in fields:
            raise UsageError(f"--inject-fault: key '{key}' is given twice; give each of step, op, ulps once")
        fields[key] = value
    if "step" not in fields or "op" not in fields:
        raise UsageError("--inject-fault: needs both step=K and op=NAME")
    numbers = {}
    for key, minimum in (("step", 0), ("ulps", 1)):
        value = fields.get(key, "1")
        if not all_digits(value) or int(value) < minimum or int(value) > 2**31 - 1:
            raise UsageError(f"--inject-fault: {key}='{value}' is not an integer >= {minimum}")
        numbers[key] = int(value)
    if op_problem is not None and ":" in fields["op"]:
        problem = op_problem(fields["op"])
        if problem:
            raise UsageError(f"--inject-fault: op '{fields['op']}': {problem}")
    elif fields["op"] not in ops:
        examples = ", ".join(ops[1:3] + ops[-1:])
        raise UsageError(f"--inject-fault: unknown op '{fields['op']}' (e.g. {examples}; {where})")
    if numbers["step"] >= steps:
        raise UsageError(f"--inject-fault: step={numbers['step']} is past the last step ({steps - 1})")
    return FaultSpec(numbers["step"], fields["op"], numbers["ulps"])


# Per float dtype name: its bits' integer dtype name, its width, and +inf's bits.
_FLOAT_BITS = {"float32": ("int32", 32, 0x7F800000), "float64": ("int64", 64, 0x7FF0000000000000),
               "bfloat16": ("int16", 16, 0x7F80), "float16": ("int16", 16, 0x7C00)}


def ulps_up(torch, x, ulps: int):
    """x moved up by `ulps` units in the last place, in one step: what `ulps` calls of
    torch.nextafter(x, +inf) give (NaN stays, +inf stays, the largest finite value goes to
    +inf, and -tiny -> -0.0 -> +tiny across zero), at any ulps. The bits, read as sign and
    magnitude, map to an ordered integer line (key = magnitude, negated for a negative
    value, so -0.0 and +0.0 both sit at 0); adding ulps there is ulps nextafters, and a key
    of 0 reached from below is -0.0."""
    if ulps == 0:  # no nextafter at all (the line below would turn +0.0 into -0.0)
        return x
    bits_dtype, width, inf_bits = _FLOAT_BITS[str(x.dtype).replace("torch.", "")]
    sign = 1 << (width - 1)
    bits = x.view(getattr(torch, bits_dtype)).to(torch.int64)
    negative = bits < 0
    magnitude = bits & (sign - 1)  # the bits without the sign bit
    key = torch.where(negative, -magnitude, magnitude)
    moved = torch.clamp(key + ulps, max=inf_bits)  # nextafter(+inf, +inf) is +inf
    below = moved <= 0  # still negative, or -0.0 (key 0 from a negative start: ulps >= 1)
    out_bits = torch.where(below, -moved + (-sign), moved)  # the sign bit set: magnitude - 2**(width-1)
    out = out_bits.to(getattr(torch, bits_dtype)).view(x.dtype)
    return torch.where(torch.isnan(x), x, out)


def _nudge_class():
    import torch

    class NudgeFirst(torch.autograd.Function):
        """Element 0 of x moved up by `ulps` units in the last place where `active` (a 0-D
        device bool) is set, as the C++ nudge_ulps op; the gradient passes unchanged. The
        op runs on every step, so a traced step is the same graph whether the fault fires."""

        @staticmethod
        def forward(ctx, x, active, ulps):
            flat = x.reshape(-1)
            first = flat[:1]
            return torch.cat([torch.where(active, ulps_up(torch, first, int(ulps)), first), flat[1:]]).view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return grad, None, None

    return NudgeFirst


class _LazyNudge:
    _cls = None

    @classmethod
    def apply(cls, *args):
        if cls._cls is None:
            cls._cls = _nudge_class()
        return cls._cls.apply(*args)


_NudgeFirst = _LazyNudge


def nudge_first_result(out, active, ulps):
    """The fault on an op's output: on its first result where it has several (a moe route's
    weights before its decisions), as the C++ moves an op's first written operand."""
    if isinstance(out, tuple):
        return (_NudgeFirst.apply(out[0], active, ulps),) + out[1:]
    return _NudgeFirst.apply(out, active, ulps)
