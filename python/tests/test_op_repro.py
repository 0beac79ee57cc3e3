"""A kept aten call written by tracing/op_repro.py and run again by its standalone script
(repro.py, what `harness repro` writes for two Python canaries' runs; docs/oracle.md, "A
standalone repro"): for calls of every argument form the writer knows (strided and expanded
operands, bf16 ones, float scalars fp32 does not hold, dtype keywords, tensor lists, an
in-place op), the script's call gives the recorded result bit for bit, and its float64 call
is the oracle's recomputation (tracing/op_capture.py's), bit for bit too."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict

import numpy as np
import pytest
import torch
from torch.utils._pytree import tree_map

from canary_harness.tracing.op_capture import KeptCall, clone, float64_on_cpu
from canary_harness.tracing.op_repro import NotWritable, write_call, write_script

aten = torch.ops.aten
_G = torch.Generator().manual_seed(11)


def _randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=_G).to(dtype)


# Each case: the op and its arguments, as a dispatch mode sees them.
CASES: Dict[str, Callable[[], tuple]] = {
    "addmm, transposed weight, alpha and beta": lambda: (
        aten.addmm.default, (_randn(8), _randn(5, 16), _randn(8, 16).t()), {"beta": 0.5, "alpha": 0.1}),
    "mm in bf16": lambda: (aten.mm.default, (_randn(4, 32, dtype=torch.bfloat16), _randn(32, 3, dtype=torch.bfloat16)), {}),
    "conversion to bf16": lambda: (aten._to_copy.default, (_randn(6, 7),), {"dtype": torch.bfloat16}),
    "add of an expanded operand": lambda: (aten.add.Tensor, (_randn(4, 5), _randn(5).expand(4, 5)), {"alpha": 0.3}),
    "mul by a float fp32 does not hold": lambda: (aten.mul.Tensor, (_randn(9), 0.1), {}),
    "cat of a list": lambda: (aten.cat.default, ([_randn(2, 3), _randn(2, 4)], 1), {}),
    "in-place addcdiv": lambda: (aten.addcdiv_.default, (_randn(10), _randn(10), _randn(10).abs() + 1), {"value": -0.01}),
    "sum over a dim list": lambda: (aten.sum.dim_IntList, (_randn(3, 4, 5), [0, 2], True), {}),
}


def _script(directory: Path) -> ModuleType:
    """repro.py as written beside the sides, loaded as a module (its main block not run)."""
    write_script(str(directory / "repro.py"))
    spec = importlib.util.spec_from_file_location("repro_under_test", directory / "repro.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _kept(func: Any, args: tuple, kwargs: Dict[str, Any]) -> KeptCall:
    before = tree_map(clone, (args, kwargs))
    return KeptCall(func, *before, func(*args, **kwargs))


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_script_runs_a_written_call_to_its_recorded_bits(tmp_path: Path, case: str) -> None:
    func, args, kwargs = CASES[case]()
    kept = _kept(func, args, kwargs)
    write_call(str(tmp_path / "a"), kept, {"precision": "fp32"})
    script = _script(tmp_path)
    again = script.run("a", float64=False)
    recorded = kept.result.detach().to(torch.float64).numpy().reshape(-1)
    assert again.tobytes() == recorded.tobytes(), case
    # Its float64 call is the oracle's (op_capture._recompute's conventions: floating operands
    # in float64 on the CPU, a dtype keyword float64).
    kwargs64 = {k: (torch.float64 if k == "dtype" else tree_map(float64_on_cpu, v)) for k, v in kept.kwargs.items()}
    exact = func(*tree_map(float64_on_cpu, kept.args), **kwargs64)
    assert script.run("a", float64=True).tobytes() == exact.numpy().reshape(-1).tobytes(), case


def test_the_call_keeps_the_layout_and_formats_it_ran_in(tmp_path: Path) -> None:
    func, args, kwargs = CASES["addmm, transposed weight, alpha and beta"]()
    write_call(str(tmp_path / "a"), _kept(func, args, kwargs), {"precision": "bf16"})
    call = json.loads((tmp_path / "a" / "call.json").read_text())
    assert call["op"] == "aten.addmm.default" and call["precision"] == "bf16"
    assert [a["stride"] for a in call["args"]] == [[1], [16, 1], [1, 16]]
    assert call["kwargs"] == {"alpha": {"float": (0.1).hex()}, "beta": {"float": (0.5).hex()}}
    assert call["threads"] == torch.get_num_threads() and call["torch"] == torch.__version__
    assert np.load(tmp_path / "a" / "result.npy").shape == (5, 8)


def test_an_argument_without_a_form_is_refused_and_nothing_is_left_to_run(tmp_path: Path) -> None:
    kept = KeptCall(aten.mul.Tensor, (_randn(3), object()), {}, _randn(3))
    with pytest.raises(NotWritable, match="an argument of type object"):
        write_call(str(tmp_path / "a"), kept, {"precision": "fp32"})
    assert not (tmp_path / "a" / "call.json").exists()
