#!/usr/bin/env python3
"""The first divergent aten op of two Python canaries' runs, run again with torch and numpy
alone (written as repro.py by `harness repro`; docs/oracle.md, "A standalone repro").

Beside it: op.json (the op, its step and site, what bisect's oracle said of each side) and
a/ and b/, each side's call (call.json: the aten overload and its arguments, each tensor's
dtype, device, shape and strides) with its operands and recorded result as .npy. Prints one
JSON object: per side, its recorded result and the op run again here on the same operands
in the same formats and layout, each against the op recomputed in float64 on the CPU (at
every element, and at the element bisect's oracle named, in ulps of the precision the
oracle judged it in: the numbers bisect printed), and against the other side's result.
"""
import json
import os

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
FRACTION_BITS = {"fp32": 23, "bf16": 7}  # the formats the oracle judges a Python canary's results in
LEAST_NORMAL = -126                      # both formats' least normal binade


def call_of(side):
    with open(os.path.join(HERE, side, "call.json")) as f:
        return json.load(f)


def ulp(x, precision):
    """The spacing of the format's grid at |x| (its least spacing below the least normal, at 0 too)."""
    _, exponent = np.frexp(np.abs(x))
    binade = np.where(x == 0, LEAST_NORMAL, np.maximum(exponent - 1, LEAST_NORMAL))
    return np.ldexp(1.0, binade - FRACTION_BITS[precision])


def tensor(spec, side, float64):
    """An operand: its values in its recorded dtype, device and strides; with float64, a
    floating one in float64 on the CPU (as the oracle recomputes the op)."""
    values = torch.from_numpy(np.load(os.path.join(HERE, side, spec["tensor"])))
    floating = values.is_floating_point()
    dtype = torch.float64 if float64 and floating else getattr(torch, spec["dtype"])
    device = "cpu" if float64 else spec["device"]
    values = values.to(dtype)
    try:
        laid_out = torch.empty_strided(spec["shape"], spec["stride"], dtype=dtype, device=device)
        return laid_out.copy_(values)
    except RuntimeError:  # an expanded operand (a stride of 0): its one row, expanded again
        for dim, stride in enumerate(spec["stride"]):
            if stride == 0:
                values = values.narrow(dim, 0, 1)
        return values.to(device).expand(spec["shape"])


def decoded(value, side, float64):
    if not isinstance(value, dict):
        return value  # None, a bool, an int, a string
    if "tensor" in value:
        return tensor(value, side, float64)
    if "list" in value:
        return [decoded(v, side, float64) for v in value["list"]]
    if "float" in value:
        return float.fromhex(value["float"])
    if "device" in value:
        return torch.device(value["device"])
    kind, name = next(iter(value.items()))  # dtype, memory_format, layout: torch's own names
    return getattr(torch, name)


def run(side, float64):
    """The side's call run here: as it ran (float64 False), or in float64 on the CPU."""
    call = call_of(side)
    args = [decoded(a, side, float64) for a in call["args"]]
    kwargs = {k: decoded(v, side, float64) for k, v in call["kwargs"].items()}
    if float64:
        kwargs.pop("device", None)
        if "dtype" in kwargs:
            kwargs["dtype"] = torch.float64
    namespace, name, overload = call["op"].split(".")
    out = getattr(getattr(getattr(torch.ops, namespace), name), overload)(*args, **kwargs)
    if isinstance(out, (tuple, list)):  # the result bisect named, by its place among the op's
        out = out[call["output"]]
    return out.detach().to("cpu", torch.float64).numpy().reshape(-1)


def recorded(side):
    return np.load(os.path.join(HERE, side, "result.npy")).astype(np.float64).reshape(-1)


def distance(got, reference, precision, at=None):
    error = np.abs(got - reference)
    ulps = error / ulp(reference, precision)
    out = {"max_abs": float(error.max()), "max_ulps": float(ulps.max())}
    if at is not None:
        out["error_ulps_at_oracle_element"] = float(ulps[at])
    return out


# What a torch other than the side's raises for a call it cannot run: an op it lacks
# (AttributeError), a device it was not built for (AssertionError, RuntimeError).
NOT_HERE = (AttributeError, AssertionError, RuntimeError)


def first_line(error):
    return (str(error).splitlines() or [type(error).__name__])[0]


def side_report(side):
    call, judged = call_of(side), OP["sides"][side]
    torch.set_num_threads(call["threads"])  # a CPU kernel's order of sums, so its bits, depend on it
    stored, at, mine = judged["stored"], judged["worst_index"], recorded(side)
    report = {"from_other_side": distance(mine, recorded("b" if side == "a" else "a"), stored),
              "recorded_under": {"torch": call["torch"], "device": call["result"]["device"], "threads": call["threads"]}}
    try:
        exact = run(side, float64=True)
    except NOT_HERE as e:
        report["recorded"] = {"not_run": f"{call['op']} in float64: {first_line(e)}"}
        return report
    report["recorded"] = distance(mine, exact, stored, at)
    try:
        again = run(side, float64=False)
    except NOT_HERE as e:
        report["rerun"] = {"not_run": first_line(e)}
        return report
    report["rerun"] = {**distance(again, exact, stored, at), "equals_recorded": bool(np.array_equal(again, mine, equal_nan=True))}
    return report


if __name__ == "__main__":
    with open(os.path.join(HERE, "op.json")) as f:
        OP = json.load(f)
    print(json.dumps({"op": OP["op"], "site": OP["site"], "step": OP["step"], "torch": torch.__version__,
                      "sides": {side: side_report(side) for side in ("a", "b")}}, indent=1, sort_keys=True))
