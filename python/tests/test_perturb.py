"""One-ulp perturbations of initial weights (canary_harness.runs.perturb, `run --perturb-init`,
`rerun`) and perturbation calibration (`harness calibrate --perturb N`) of a Python canary:
the ulp step against nextafter on every bf16 value and a million fp32 ones, bit for bit the
C++ rule (engines/numerics/perturbation.h), recorded and replayed, and a budget proposed
from the spread that a bitwise-irrelevant change (another thread count) then passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from canary_harness.runs.faults import ulps_up
from canary_harness.runs.perturb import directions_up, one_ulp_step
from conftest import run_harness
from test_python_canary import PACKAGE_ROOT, SMALL, run

def _down(x: torch.Tensor) -> torch.Tensor:
    return -ulps_up(torch, -x, 1)


@pytest.mark.parametrize("up", [True, False])
def test_the_step_is_nextafter_on_every_finite_bf16_value(up: bool) -> None:
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.bfloat16)
    finite = torch.isfinite(x.float())
    got = one_ulp_step(x, torch.full(x.shape, up))
    want = ulps_up(torch, x, 1) if up else _down(x)
    same = got[finite].view(torch.int16) == want[finite].view(torch.int16)
    # -0.0 and +0.0 moved down both land on -tiny; nextafter's two zeros agree, so compare values there
    assert bool(torch.all(same | (got[finite].float() == want[finite].float()))), x[finite][~same][:5]
    assert bool(torch.all(got[~finite].view(torch.int16) == x[~finite].view(torch.int16)))  # inf and NaN stay


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_the_step_is_nextafter_in_every_width(dtype: torch.dtype) -> None:
    info = torch.finfo(dtype)
    x = torch.tensor([0.0, -0.0, 1.0, -1.0, 3.0, -0.1, info.max, -info.max, info.tiny, -info.tiny], dtype=dtype)
    for up in (True, False):
        got = one_ulp_step(x, torch.full(x.shape, up))
        want = (ulps_up(torch, x, 1) if up else _down(x)).to(dtype)
        assert torch.equal(got, want), (dtype, up, got, want)


def test_the_step_is_nextafter_on_a_million_fp32_values() -> None:
    rng = np.random.default_rng(20261126)
    bits = rng.integers(-(1 << 31), 1 << 31, size=1_000_000, dtype=np.int64).astype(np.int32)
    x = torch.from_numpy(bits).view(torch.float32)
    x = torch.cat([x, torch.tensor([0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45, 3.4028235e38, -3.4028235e38])])
    x = x[torch.isfinite(x)]
    up = torch.from_numpy(rng.integers(0, 2, size=x.numel()).astype(bool))
    got = one_ulp_step(x, up)
    want = torch.where(up, torch.nextafter(x, torch.tensor(float("inf"))), torch.nextafter(x, torch.tensor(-float("inf"))))
    assert torch.equal(got.view(torch.int32)[got != 0], want.view(torch.int32)[got != 0])
    assert torch.equal(got == 0, want == 0)


def test_directions_are_a_fair_coin_per_name_and_seed() -> None:
    a, b, c = directions_up(1, "w", 100_000), directions_up(2, "w", 100_000), directions_up(1, "v", 100_000)
    for d in (a, b, c):
        assert 0.49 < d.mean() < 0.51
    assert (a != b).mean() > 0.45 and (a != c).mean() > 0.45
    assert np.array_equal(a[:1000], directions_up(1, "w", 1000))  # element i depends on i, not on the count


def test_the_cpp_and_python_rules_move_every_weight_alike(harness_bin, tmp_path: Path) -> None:
    plain, moved = tmp_path / "plain.h5", tmp_path / "moved.h5"
    common = ("run", "--canary", "micro", "--steps", "1", "--threads", "1", "--dump-tensors", "0")
    run_harness(harness_bin, *common, "--out", str(plain))
    run_harness(harness_bin, *common, "--perturb-init", "11", "--out", str(moved))
    with h5py.File(plain, "r") as p, h5py.File(moved, "r") as m:
        assert m["manifest"].attrs["init_perturbation_seed"] == 11 and "init_perturbation_seed" not in p["manifest"].attrs
        names = list(p["tensors/step_000000"])
        assert names
        for name in names:
            x = torch.from_numpy(p["tensors/step_000000"][name][...])
            up = torch.from_numpy(directions_up(11, name, x.numel())).reshape(x.shape)
            want = one_ulp_step(x, up).numpy().view(np.int32)
            got = m["tensors/step_000000"][name][...].view(np.int32)
            assert np.array_equal(got, want), name
            assert not np.array_equal(got, x.numpy().view(np.int32))


def _rerun(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "canary_harness", "rerun", *args], capture_output=True, text=True,
                          timeout=600, env=env)


def _series(path: Path) -> dict:
    with h5py.File(path, "r") as f:
        return {k: f[k][...] for k in ("steps/loss", "steps/grad_norm", "hashes/params", "hashes/adam_m")}


def _same(a: dict, b: dict) -> bool:
    return all(np.array_equal(a[k], b[k]) for k in a)


def test_a_perturbed_python_canary_is_recorded_replayed_and_rerun(tmp_path: Path, small_canary_receipt: Path) -> None:
    plain, moved, again = small_canary_receipt, tmp_path / "moved.h5", tmp_path / "again.h5"
    run(f"{SMALL}:canary", "--out", str(moved), "--perturb-init", "5")
    assert not _same(_series(plain), _series(moved))
    with h5py.File(moved, "r") as f:
        assert f["manifest"].attrs["init_perturbation_seed"] == 5
        assert json.loads(f["manifest"].attrs["run_options"])["perturb_init"] == 5
    result = _rerun(str(plain), "--out", str(again), "--perturb-init", "5")
    assert result.returncode == 0, result.stderr
    assert _same(_series(moved), _series(again))  # the rerun of the plain recipe, perturbed alike
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT}
    replayed = subprocess.run([sys.executable, "-m", "canary_harness", "replay", str(moved), "--json"],
                              capture_output=True, text=True, timeout=600, env=env)
    assert json.loads(replayed.stdout)["verdict"] == "reproduced", replayed.stderr  # from step 0: perturbed again


@pytest.mark.parametrize("args, message", [
    (("--perturb-init", "-1"), "--perturb-init: '-1' is not a number"),
    (("--perturb-init", "x"), "--perturb-init: 'x' is not a number"),
])
def test_a_bad_perturbation_seed_is_refused(tmp_path: Path, args: tuple, message: str) -> None:
    out = tmp_path / "r.h5"
    result = run(f"{SMALL}:canary", "--out", str(out), *args, check=False)
    assert result.returncode == 2 and message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert not out.exists()


def test_calibrate_perturb_proposes_a_budget_that_a_bitwise_irrelevant_change_passes(harness_bin, tmp_path: Path,
                                                                                     small_canary_receipt: Path) -> None:
    fp32, bf16, bf16_2 = small_canary_receipt, tmp_path / "bf16.h5", tmp_path / "bf16-threads2.h5"
    run(f"{SMALL}:canary", "--out", str(bf16), "--precision", "bf16")
    run(f"{SMALL}:canary", "--out", str(bf16_2), "--precision", "bf16", "--threads", "2")
    candidate = tmp_path / "candidate.toml"
    result = run_harness(harness_bin, "calibrate", "--perturb", "4", "--receipts", str(bf16), "--reference", str(fp32),
                         "--out", str(candidate), "--provisional", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    text = candidate.read_text()
    assert "[small.torch-bf16]" in text and 'method = "perturbation: the unperturbed run and 4 runs' in text
    report = candidate.with_suffix(".md").read_text()
    for label in ("unperturbed", "perturb seed 1", "perturb seed 4"):
        assert f"- {label}: now FAIL: no budget for canary 'small'" in report  # one line each, saying why
    envelope = json.loads(candidate.with_suffix(".envelope.json").read_text())
    assert envelope["runs"] == 4 and envelope["seeds"] == [1, 2, 3, 4]
    assert len(envelope["spread"]["loss"]) == len(envelope["drift"]["loss"]) == 6
    assert max(envelope["spread"]["params_sketch"]) > 0  # the perturbed runs moved
    # bf16 on two threads: other kernels' bits, nothing the model is entitled to notice
    judged = run_harness(harness_bin, "compare", str(bf16_2), str(fp32), "--budgets", str(candidate), check=False)
    assert judged.returncode == 0, judged.stdout
    assert run_harness(harness_bin, "compare", str(bf16_2), str(fp32), check=False).returncode == 2  # no entry before


def test_calibrate_perturb_of_a_receipt_alone_gives_its_envelope(harness_bin, tmp_path: Path,
                                                                 small_canary_receipt: Path) -> None:
    fp32 = small_canary_receipt
    out = tmp_path / "env.toml"
    result = run_harness(harness_bin, "calibrate", "--perturb", "2", "--receipts", str(fp32), "--out", str(out),
                         check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not out.exists()  # nothing to propose
    envelope = json.loads(out.with_suffix(".envelope.json").read_text())
    assert "drift" not in envelope and envelope["lane"] == "small/torch"


def test_calibrate_perturb_refuses_a_receipt_its_recipe_no_longer_makes(harness_bin, tmp_path: Path) -> None:
    source = tmp_path / "mine.py"
    source.write_text(Path(SMALL).read_text())
    receipt = tmp_path / "mine.h5"
    run(f"{source}:canary", "--out", str(receipt))
    source.write_text(Path(SMALL).read_text().replace("lr=1e-2", "lr=2e-2"))  # same model, other numbers
    out = tmp_path / "env.toml"
    result = run_harness(harness_bin, "calibrate", "--perturb", "2", "--receipts", str(receipt), "--out", str(out),
                         check=False)
    assert result.returncode == 2 and "its recipe no longer reproduces" in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and not out.with_suffix(".envelope.json").exists()
    perturbed = tmp_path / "perturbed.h5"
    run(f"{SMALL}:canary", "--out", str(perturbed), "--perturb-init", "3")
    result = run_harness(harness_bin, "calibrate", "--perturb", "2", "--receipts", str(perturbed), "--out", str(out),
                         check=False)
    assert result.returncode == 2 and "is itself a perturbed run (init_perturbation_seed 3)" in result.stderr
