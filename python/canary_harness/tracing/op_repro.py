"""One aten call of a step as files a kernel team runs without the harness (`harness repro`
of two Python canaries' runs; docs/oracle.md, "A standalone repro").

capture-ops keeps the call bisect named (op_capture.OpKey) and write_call writes it into a
side's directory: each tensor operand and the result as `.npy` (numpy's format, which torch
reads too; bf16 and fp16 values widened to float32, exactly), and `call.json`, the call as
data: the aten overload, its arguments with each tensor a reference to its file with its
dtype, device, shape and strides (the layout picks the kernel, so it is kept), every other
argument as JSON (a float as its hex form, exact), and the torch and thread count it ran
under. repro_script.py, copied beside the sides as `repro.py`, reads them back with torch
and numpy alone.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Dict, List

import numpy as np
import torch

from .op_capture import KeptCall, OpKey

# The script the sides are run by (no import of this package: it runs where the harness is not).
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "repro_script.py")

# Formats numpy has no type for: their values are held exactly by float32.
_WIDENED = (torch.bfloat16, torch.float16)


class NotWritable(ValueError):
    """An argument the call's JSON has no form for (say which)."""


def key_of(text: str) -> OpKey:
    """The call to keep from its JSON, {"op": MODULE, "phase": P, "tensor": ATEN, "occurrence":
    N}, as bisect names the op (a ValueError for anything else)."""
    try:
        key = json.loads(text)
        return OpKey(str(key["op"]), str(key["phase"]), str(key["tensor"]), int(key["occurrence"]))
    except (KeyError, TypeError) as e:
        raise ValueError(f"not an op key: {e}") from None


def _array(t: torch.Tensor) -> np.ndarray:
    host = t.detach().to("cpu")
    return (host.to(torch.float32) if host.dtype in _WIDENED else host).contiguous().numpy()


def _name(value: Any, prefix: str) -> str:
    return str(value).replace(prefix, "")


def encoded(value: Any, directory: str, files: List[str], layout: Any = None) -> Any:
    """`value` as call.json holds it; a tensor's values written to the next operand file, with
    its strides from `layout` (op_capture.operand_layout's, as the op saw them) or its own."""
    if isinstance(value, torch.Tensor):
        name = f"operand{len(files)}.npy"
        np.save(os.path.join(directory, name), _array(value))
        files.append(name)
        return {"tensor": name, "dtype": _name(value.dtype, "torch."), "device": str(value.device),
                "shape": list(value.shape), "stride": list(value.stride()) if layout is None else layout}
    if isinstance(value, (list, tuple)):
        layouts = layout if layout is not None else [None] * len(value)
        return {"list": [encoded(v, directory, files, at) for v, at in zip(value, layouts)]}
    if isinstance(value, torch.dtype):
        return {"dtype": _name(value, "torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.memory_format):
        return {"memory_format": _name(value, "torch.")}
    if isinstance(value, torch.layout):
        return {"layout": _name(value, "torch.")}
    if isinstance(value, float):
        return {"float": value.hex()}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    raise NotWritable(f"an argument of type {type(value).__name__}, which the repro's call.json has no form for")


def write_call(directory: str, kept: KeptCall, recorded_under: Dict[str, Any]) -> None:
    """The kept call into `directory` (made whole here, or not at all; it must not exist): its
    operands, its result as `result.npy`, and call.json, with the result's place among the
    op's outputs, the torch and the threads it ran under and `recorded_under` (the run's
    declared precision)."""
    parent = os.path.dirname(os.path.abspath(directory))
    building = tempfile.mkdtemp(prefix=".call-", dir=parent)
    try:
        _write_call_into(building, kept, recorded_under)
        os.rename(building, directory)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise


def _write_call_into(directory: str, kept: KeptCall, recorded_under: Dict[str, Any]) -> None:
    files: List[str] = []
    args_layout, kwargs_layout = kept.layout if kept.layout is not None else (None, {})
    call = {"op": str(kept.func), "args": encoded(kept.args, directory, files, args_layout)["list"],
            "kwargs": {k: encoded(v, directory, files, kwargs_layout.get(k)) for k, v in kept.kwargs.items()},
            "result": encoded(kept.result, directory, files), "output": kept.output, "torch": torch.__version__,
            "threads": torch.get_num_threads(), **recorded_under}
    os.replace(os.path.join(directory, call["result"]["tensor"]), os.path.join(directory, "result.npy"))
    call["result"]["tensor"] = "result.npy"
    with open(os.path.join(directory, "call.json"), "w") as f:
        json.dump(call, f, indent=1, sort_keys=True)
        f.write("\n")


def write_script(path: str) -> None:
    """repro_script.py at `path` (repro.py beside the sides)."""
    shutil.copyfile(SCRIPT, path)
