"""The held-out evaluation of Python canaries and the PyTorch lane (docs/logit-kl.md): it
changes no trained bit, records /eval as the C++ engines do, and `harness compare` judges
the logits: exactly equal for two runs of one lane, compared with cpu-ref's for the lane."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from conftest import export_pack, run_harness, run_module

SMALL = str(Path(__file__).parent / "own_canaries" / "small.py")
TRAINED = ("steps/loss", "steps/grad_norm", "hashes/params", "hashes/grads", "hashes/adam_m", "hashes/adam_v")
LOGIT_METRICS = ("logit_kl", "logprob_delta", "top1_mismatch")
MICRO_WITH_EVAL = """schema_version = 1
name = "micro"
architecture = "gpt2"

[model]
vocab = 128
context = 16
channels = 32
layers = 2
heads = 2

[train]
batch = 2
steps = 20

[optimizer]
warmup_steps = 4

[data]
source = "builtin"

[eval]
every = 2
"""


def trained(path: Path) -> dict:
    with h5py.File(path, "r") as f:
        return {name: f[name][()] for name in TRAINED}


def evaluation(path: Path) -> dict:
    with h5py.File(path, "r") as f:
        e = f["eval"]
        return {"step": e["step"][()], "loss": e["loss"][()], "logits": e["logits"][()], "targets": e["targets"][()],
                "held_out_hash": e.attrs["held_out_hash"], "every": int(e.attrs["every"])}


def logit_verdicts(harness_bin: Path, a: Path, b: Path, *more: str) -> dict:
    result = run_harness(harness_bin, "compare", str(a), str(b), "--json", *more, check=False)
    verdict = json.loads(result.stdout)
    assert verdict["logits_not_compared"] is None, verdict
    return {m["metric"]: m for m in verdict["metrics"] if m["metric"] in LOGIT_METRICS}


@pytest.fixture(scope="module")
def with_eval_receipt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`small.py:with_eval` run once as it is (fp32, no flag), for the tests that only read it."""
    out = tmp_path_factory.mktemp("with-eval") / "eval.h5"
    run_module("canary_harness", "run", f"{SMALL}:with_eval", "--out", str(out))
    return out


def test_a_python_canary_records_its_held_out_logits_and_trains_alike(tmp_path: Path, harness_bin: Path,
                                                                      small_canary_receipt: Path,
                                                                      with_eval_receipt: Path) -> None:
    with_eval, plain = with_eval_receipt, small_canary_receipt
    a, b = trained(with_eval), trained(plain)
    assert all(a[k].tobytes() == b[k].tobytes() for k in TRAINED)  # the evaluation moved no trained bit
    e = evaluation(with_eval)
    assert list(e["step"]) == [2, 4, 6] and e["every"] == 2  # the last: the final parameters (6 steps)
    assert e["logits"].shape == (3, 3, 8, 32) and e["logits"].dtype == np.float32  # every row, T 8, V 32
    # The recorded loss is the mean cross-entropy of the recorded logits (every row recorded here).
    z = e["logits"].astype(np.float64)
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_p, e["targets"][None, :, :, None].astype(np.int64), -1)[..., 0]
    assert np.all(np.abs(-picked.mean(axis=(1, 2)) - e["loss"]) < 1e-5)
    assert e["loss"][-1] < e["loss"][0]  # it learns
    run_harness(harness_bin, "validate", str(with_eval))
    one_row = tmp_path / "one-row.h5"
    run_module("canary_harness", "run", f"{SMALL}:with_eval_one_row", "--out", str(one_row))
    assert np.array_equal(evaluation(one_row)["logits"], e["logits"][:, :1])  # the first rows, bit for bit


def test_two_runs_of_a_python_canary_have_exactly_equal_logits(tmp_path: Path, harness_bin: Path,
                                                               with_eval_receipt: Path) -> None:
    a, b = with_eval_receipt, tmp_path / "b.h5"  # the module's run and a second one
    run_module("canary_harness", "run", f"{SMALL}:with_eval", "--out", str(b))
    metrics = logit_verdicts(harness_bin, a, b)
    assert set(metrics) == set(LOGIT_METRICS)
    assert all(m["judged"] and m["pass"] and m["max_deviation"] == 0 for m in metrics.values()), metrics


def test_the_bf16_lane_of_a_python_canary_moves_its_logits(tmp_path: Path, harness_bin: Path,
                                                           with_eval_receipt: Path) -> None:
    fp32, bf16 = with_eval_receipt, tmp_path / "bf16.h5"
    run_module("canary_harness", "run", f"{SMALL}:with_eval", "--out", str(bf16), "--precision", "bf16")
    assert evaluation(fp32)["held_out_hash"] == evaluation(bf16)["held_out_hash"]
    # small's own bf16 entry, with no logit windows: the logit metrics are reported, not judged.
    budgets = tmp_path / "budgets.toml"
    budgets.write_text("""schema_version = 1

[reference]
form = "bitwise"
rationale = "this test's"

[compile-stability]
rationale = "this test's"

[memory]
rationale = "this test's"
rtol = 0.0

[data]
form = "bitwise"
rationale = "this test's"

[small.torch-bf16]
form = "tolerance"
rationale = "this test's: any loss"
calibrated = "2026-11-28"
loss = [ { steps = "0-", atol = 1e9 } ]
""")
    metrics = logit_verdicts(harness_bin, bf16, fp32, "--budgets", str(budgets))
    assert not any(m["judged"] for m in metrics.values()), metrics
    assert metrics["logit_kl"]["max_deviation"] > 0 and metrics["logprob_delta"]["max_deviation"] > 0, metrics


@pytest.mark.torch_agnostic
@pytest.mark.parametrize("spec,message", [
    ("eval_without_batch", "eval_every=2 is given without eval_batch"),
    ("eval_float_targets", "eval_targets: give the held-out batch's next tokens as an integer tensor"),
    ("eval_no_such_module", "eval_logits: the model has no module 'lm_head'"),
])
def test_a_bad_evaluation_is_one_line_exit_2_and_no_file(tmp_path: Path, spec: str, message: str) -> None:
    out = tmp_path / "bad.h5"
    result = run_module("canary_harness", "run", f"{SMALL}:{spec}", "--out", str(out), check=False)
    lines = [line for line in result.stderr.splitlines() if not line.startswith("step ")]
    assert result.returncode == 2 and len(lines) == 1 and message in lines[0], result.stderr
    assert not out.exists()


def test_the_lane_evaluates_the_packs_held_out_batch_as_cpu_ref_does(tmp_path: Path, harness_bin: Path) -> None:
    canary = tmp_path / "micro-eval.toml"  # micro (canaries/micro.toml) with a held-out batch every 2 steps
    canary.write_text(MICRO_WITH_EVAL)
    pack = export_pack(harness_bin, tmp_path / "pack.h5", canary=str(canary), steps=4)
    cpu, lane, again = tmp_path / "cpu.h5", tmp_path / "lane.h5", tmp_path / "again.h5"
    run_harness(harness_bin, "run", "--canary", str(canary), "--steps", "4", "--threads", "1", "--out", str(cpu))
    for out in (lane, again):
        run_module("canary_harness.lane", "--pack", str(pack), "--out", str(out), "--threads", "1")
    ours, theirs = evaluation(lane), evaluation(cpu)
    assert ours["held_out_hash"] == theirs["held_out_hash"] and list(ours["step"]) == list(theirs["step"]) == [2, 4]
    assert np.array_equal(ours["targets"], theirs["targets"])
    assert np.all(np.abs(ours["loss"] - theirs["loss"]) < 1e-5)
    metrics = logit_verdicts(harness_bin, lane, cpu)
    assert set(metrics) == set(LOGIT_METRICS) and metrics["logit_kl"]["max_deviation"] < 1e-9, metrics
    assert all(m["max_deviation"] == 0 for m in logit_verdicts(harness_bin, again, lane).values())
    jax_out = tmp_path / "jax.h5"  # JAX SPMD over 2 virtual CPU devices: a second jitted program, once
    result = run_module("canary_harness.jax", "--pack", str(pack), "--mesh", "2x1", "--shard-plan", "dp",
                        "--out", str(jax_out), check=False, unset=("XLA_FLAGS",))
    if importlib.util.find_spec("jax") is None:
        assert result.returncode == 2 and "JAX is not installed here" in result.stderr, result.stderr
    else:
        assert result.returncode == 0, result.stderr
        evaluated = evaluation(jax_out)
        assert evaluated["held_out_hash"] == theirs["held_out_hash"] and list(evaluated["step"]) == [2, 4]
        with h5py.File(jax_out, "r") as f:
            assert f["eval/compiles"][()].tolist()[1:] == [0.0]  # the first evaluation compiles, the next reuses
        assert logit_verdicts(harness_bin, jax_out, cpu)["logit_kl"]["max_deviation"] < 1e-9
    if hasattr(torch, "compile"):  # torch 2.x: a compiled lane evaluates its module eagerly, beside its graph
        compiled = tmp_path / "compiled.h5"
        run_module("canary_harness.lane", "--pack", str(pack), "--out", str(compiled), "--threads", "1", "--compile")
        assert list(evaluation(compiled)["step"]) == [2, 4]
        assert logit_verdicts(harness_bin, compiled, cpu)["logit_kl"]["max_deviation"] < 1e-9
