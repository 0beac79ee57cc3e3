"""A kept aten call written by tracing/op_repro.py and run again by its standalone script
(repro.py, what `harness repro` writes for two Python canaries' runs; docs/oracle.md, "A
standalone repro"): for calls of every argument form the writer knows (strided and expanded
operands, column slices, bf16 ones, float scalars fp32 does not hold, dtype keywords, tensor
lists, an in-place op, one result of several), the script's call gives the recorded result
bit for bit, and its float64 call is the oracle's recomputation (tracing/op_capture.py's),
bit for bit too."""

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

from canary_harness.tracing.aten_trace import flat_outputs
from canary_harness.tracing.op_capture import KeptCall, clone, float64_on_cpu, operand_layout
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
    "sum of a column slice": lambda: (aten.sum.dim_IntList, (_randn(64, 48)[:, 5:37], [0]), {}),
    "layer norm's rstd, its third result": lambda: (
        aten.native_layer_norm.default, (_randn(6, 32), [32], _randn(32), _randn(32), 1e-5), {}),
}
# The result kept, by its place among the op's outputs, where it has several.
OUTPUT = {"layer norm's rstd, its third result": 2}


def _script(directory: Path) -> ModuleType:
    """repro.py as written beside the sides, loaded as a module (its main block not run)."""
    write_script(str(directory / "repro.py"))
    spec = importlib.util.spec_from_file_location("repro_under_test", directory / "repro.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _kept(func: Any, args: tuple, kwargs: Dict[str, Any], output: Any = None) -> KeptCall:
    """As op_capture keeps a call: clones of its operands, their layout as the op saw them."""
    before, layout = tree_map(clone, (args, kwargs)), operand_layout(args, kwargs)
    out = func(*args, **kwargs)
    return KeptCall(func, *before, out if output is None else flat_outputs(out)[output], output, layout)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_script_runs_a_written_call_to_its_recorded_bits(tmp_path: Path, case: str) -> None:
    func, args, kwargs = CASES[case]()
    kept = _kept(func, args, kwargs, OUTPUT.get(case))
    write_call(str(tmp_path / "a"), kept, {"precision": "fp32"})
    script = _script(tmp_path)
    again = script.run("a", float64=False)
    recorded = kept.result.detach().to(torch.float64).numpy().reshape(-1)
    assert again.tobytes() == recorded.tobytes(), case
    # Its float64 call is the oracle's (op_capture._recompute's conventions: floating operands
    # in float64 on the CPU, a dtype keyword float64).
    kwargs64 = {k: (torch.float64 if k == "dtype" else tree_map(float64_on_cpu, v)) for k, v in kept.kwargs.items()}
    exact = func(*tree_map(float64_on_cpu, kept.args), **kwargs64)
    exact = exact if kept.output is None else flat_outputs(exact)[kept.output]
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


def test_an_operands_layout_is_the_one_the_op_saw_not_its_clones(tmp_path: Path) -> None:
    """A clone lays an expanded or sliced operand out anew; call.json keeps the op's strides."""
    for case, strides in (("add of an expanded operand", [[5, 1], [0, 1]]), ("sum of a column slice", [[48, 1]])):
        func, args, kwargs = CASES[case]()
        write_call(str(tmp_path / case), _kept(func, args, kwargs), {"precision": "fp32"})
        call = json.loads((tmp_path / case / "call.json").read_text())
        assert [a["stride"] for a in call["args"] if isinstance(a, dict) and "tensor" in a] == strides, case


def test_an_argument_without_a_form_is_refused_and_nothing_is_left(tmp_path: Path) -> None:
    kept = KeptCall(aten.mul.Tensor, (_randn(3), object()), {}, _randn(3))
    with pytest.raises(NotWritable, match="an argument of type object"):
        write_call(str(tmp_path / "a"), kept, {"precision": "fp32"})
    assert list(tmp_path.iterdir()) == []  # no directory, no operand file
