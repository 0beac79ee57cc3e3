"""Distributed layouts: `run FILE.py:NAME --layout ddp|fsdp --nproc N` (canary_harness.runs.distributed).

Run on each torch the suite runs on: DDP on 1.13 and 2.x; FSDP2 (fully_shard) on 2.x, and
refused in one line on 1.13 (asserted per version, never skipped)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import run_harness
from test_python_canary import PACKAGE_ROOT, SMALL, manifest, run, series

from canary_harness.runs.distributed import fsdp_available

HAS_FSDP = fsdp_available()


@pytest.fixture(scope="module")
def one_process(small_canary_receipt: Path) -> Path:
    return small_canary_receipt


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("layouts") / "ddp.h5"
    result = run(f"{SMALL}:canary", "--out", str(out), "--layout", "ddp", "--nproc", "2")
    assert "lane        small/torch+ddp" in result.stdout and "[Gloo]" not in result.stdout + result.stderr
    return out


def test_ddp_writes_one_valid_receipt_that_repeats_bit_for_bit(ddp_run: Path, tmp_path: Path, harness_bin) -> None:
    m = manifest(ddp_run)
    assert (m["lane"], m["features"], m["budget_features"], m["layout"], m["nproc"], m["complete"]) == \
        ("small/torch+ddp", "ddp", "torch-ddp", "ddp", 2, 1)
    run_harness(harness_bin, "validate", str(ddp_run))
    again = tmp_path / "again.h5"
    run(f"{SMALL}:canary", "--out", str(again), "--layout", "ddp", "--nproc", "2")
    a, b = series(ddp_run), series(again)
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name


def test_ddp_sees_the_same_data_and_stays_within_its_calibrated_budget(ddp_run: Path, one_process: Path,
                                                                        tmp_path: Path, harness_bin) -> None:
    """The batch hashes are the whole batches', bit for bit the one-process run's; the loss
    of step 0 (one forward on the same weights, averaged over the ranks' halves) is within
    a few ulps of it; the rest moves by DDP's bucketed all-reduce, which `compare` refuses
    without a torch-ddp budget and passes under the one calibrated from the two."""
    a, b = series(one_process), series(ddp_run)
    assert a["steps/batch_hash"].tobytes() == b["steps/batch_hash"].tobytes()
    assert abs(a["steps/loss"][0] - b["steps/loss"][0]) <= 4 * np.spacing(np.float32(a["steps/loss"][0]))
    assert a["hashes/params"].tobytes() != b["hashes/params"].tobytes()
    refused = run_harness(harness_bin, "compare", str(ddp_run), str(one_process), check=False)
    assert refused.returncode == 2 and "torch-ddp" in refused.stderr, refused.stderr
    candidate = tmp_path / "budgets.toml"
    run_harness(harness_bin, "calibrate", "--receipts", str(ddp_run), "--reference", str(one_process),
                "--out", str(candidate), "--provisional")
    assert "[small.torch-ddp]" in candidate.read_text()
    run_harness(harness_bin, "compare", str(ddp_run), str(one_process), "--budgets", str(candidate))


def test_fsdp_shards_the_model_and_agrees_with_ddp_on_step_0(ddp_run: Path, one_process: Path, tmp_path: Path,
                                                              harness_bin, small_canary_fsdp: tuple) -> None:
    """torch 2.x: FSDP2 trains the same canary into one receipt of whole tensors (gathered),
    its step-0 loss bit for bit DDP's (the same halves, the same weights), its steps apart
    from both (sharded reductions) and repeatable. torch 1.13: exit 2, one line, no file."""
    result, out = small_canary_fsdp  # conftest's run (check=HAS_FSDP), only read here
    if not HAS_FSDP:
        assert result.returncode == 2 and "--layout fsdp: torch 1.13" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()
        return
    m = manifest(out)
    assert (m["lane"], m["budget_features"], m["layout"], m["nproc"], m["complete"]) == \
        ("small/torch+fsdp", "torch-fsdp", "fsdp", 2, 1)
    run_harness(harness_bin, "validate", str(out))
    f, d, s = series(out), series(ddp_run), series(one_process)
    assert f["steps/batch_hash"].tobytes() == s["steps/batch_hash"].tobytes()
    assert f["steps/loss"][0] == d["steps/loss"][0]
    assert f["hashes/params"].shape == s["hashes/params"].shape  # whole tensors, not a rank's shards
    assert np.all(np.abs(f["steps/loss"] - s["steps/loss"]) < 1e-5)
    again = tmp_path / "fsdp-again.h5"
    run(f"{SMALL}:canary", "--out", str(again), "--layout", "fsdp")
    assert series(again)["hashes/params"].tobytes() == f["hashes/params"].tobytes()


def test_fsdp_trains_on_after_a_held_out_evaluation(tmp_path: Path) -> None:
    """An evaluation between steps that calls a method of the model (model.logits), on both
    layouts: DDP's wrapper has only forward (it failed: no attribute 'logits'); FSDP2's
    shards are gathered for it and sharded again after it (it failed: mixed Tensor and
    DTensor; and a forward's evaluation left the root gathered, so the next step read no
    gradients: 'NoneType' object has no attribute 'device', the tiny lane's fsdp run at
    step 25). Every step and evaluation runs, the two layouts' losses alike. torch 1.13:
    fsdp refused, as above."""
    out, ddp = tmp_path / "fsdp.h5", tmp_path / "ddp.h5"
    result = run(f"{SMALL}:with_eval", "--out", str(out), "--layout", "fsdp", check=HAS_FSDP)
    if not HAS_FSDP:
        assert result.returncode == 2 and "--layout fsdp: torch 1.13" in result.stderr, result.stderr
        return
    run(f"{SMALL}:with_eval", "--out", str(ddp), "--layout", "ddp")
    assert manifest(out)["complete"] == 1
    f, d = series(out), series(ddp)
    assert len(f["steps/loss"]) == len(d["steps/loss"]) and np.all(np.abs(f["steps/loss"] - d["steps/loss"]) < 1e-5)
    with h5py.File(out, "r") as fsdp_file, h5py.File(ddp, "r") as ddp_file:
        assert fsdp_file["eval/step"][()].tolist() == ddp_file["eval/step"][()].tolist() == [2, 4, 6]
        assert np.abs(fsdp_file["eval/loss"][()] - ddp_file["eval/loss"][()]).max() < 1e-5


def test_a_layout_receipt_is_not_replayed_in_one_process(ddp_run: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for command in (["replay", str(ddp_run)], ["rerun", str(ddp_run), "--out", str(tmp_path / "again.h5")]):
        result = subprocess.run([sys.executable, "-m", "canary_harness", *command], capture_output=True, text=True,
                                timeout=300, env=env)
        assert result.returncode == 2 and "a run of --layout ddp on 2 processes" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "again.h5").exists()


def test_a_rank_that_dies_leaves_an_incomplete_receipt_and_exit_2_naming_it(tmp_path: Path) -> None:
    out = tmp_path / "dies.h5"
    result = run(f"{SMALL}:rank_1_dies_at_3", "--out", str(out), "--layout", "ddp", check=False)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "rank 1 of 2 was killed by signal 9" in lines[0], result.stderr
    assert "keeps its finished steps (complete = 0)" in lines[0]
    m, s = manifest(out), series(out)
    assert m["complete"] == 0 and len(s["steps/loss"]) == 3


@pytest.mark.parametrize("flags, says", [
    (["--nproc", "2"], "--nproc: only with --layout"),
    (["--layout", "ring"], "--layout: unknown layout 'ring'"),
    (["--layout", "ddp", "--nproc", "1"], "--nproc"),
    (["--layout", "ddp", "--trace", "ops"], "--trace: not with --layout"),
    (["--layout", "ddp", "--checkpoint-every", "2"], "--checkpoint-every: not with --layout"),
])
def test_layout_flags_that_cannot_run_are_refused_in_one_line(tmp_path: Path, flags: list, says: str) -> None:
    out = tmp_path / "r.h5"
    result = run(f"{SMALL}:canary", "--out", str(out), *flags, check=False)
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()


def test_a_batch_that_does_not_divide_among_the_ranks_is_refused_naming_it(tmp_path: Path) -> None:
    out = tmp_path / "odd.h5"
    result = run(f"{SMALL}:odd_batch", "--out", str(out), "--layout", "ddp", check=False)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "batch(0) has a tensor of shape (3, 8)" in lines[0] and "2 ranks" in lines[0]
    assert not out.exists()
