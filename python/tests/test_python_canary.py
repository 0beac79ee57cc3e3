"""Python canaries: `python3 -m canary_harness run FILE.py:NAME` (canary_harness.runs.canary, .runner)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from conftest import REPO, run_harness, run_module

PACKAGE_ROOT = str(REPO / "python")
SMALL = str(Path(__file__).parent / "own_canaries" / "small.py")
# The example lives in the repository, not in the package (scripts/python-venv-check.sh names it).
EXAMPLE = os.path.join(os.environ.get("CANARY_HARNESS_EXAMPLES", str(REPO / "examples")), "own-model", "canary.py")
SERIES = ("steps/loss", "steps/grad_norm", "steps/lr", "steps/batch_hash",
          "hashes/params", "hashes/grads", "hashes/adam_m", "hashes/adam_v")


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run_module("canary_harness", "run", *args, check=check)


def series(path: Path) -> dict:
    with h5py.File(path, "r") as f:
        return {name: f[name][()] for name in SERIES}


def manifest(path: Path) -> dict:
    with h5py.File(path, "r") as f:
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f["manifest"].attrs.items()}


def first_difference(a: dict, b: dict, name: str) -> int:
    """The first step at which dataset `name` differs between two receipts' series, or -1."""
    rows = np.nonzero([x.tobytes() != y.tobytes() for x, y in zip(a[name], b[name])])[0]
    return int(rows[0]) if len(rows) else -1


@pytest.fixture(scope="module")
def small_run(small_canary_receipt: Path) -> Path:
    return small_canary_receipt


def test_two_runs_are_bitwise_and_validate(small_run: Path, tmp_path: Path, harness_bin) -> None:
    again = tmp_path / "again.h5"
    run(f"{SMALL}:canary", "--out", str(again))
    a, b = series(small_run), series(again)
    for name in SERIES:
        assert a[name].tobytes() == b[name].tobytes(), name
    assert len(a["steps/loss"]) == 6 and np.all(np.isfinite(a["steps/loss"]))
    run_harness(harness_bin, "validate", str(small_run))
    m = manifest(small_run)
    assert (m["lane"], m["engine"], m["budget_features"], m["complete"], m["seed"]) == ("small/torch", "torch", "", 1, 7)


def test_seed_flag_changes_the_init_and_the_seed_recorded(small_run: Path, tmp_path: Path) -> None:
    other = tmp_path / "seed8.h5"
    run(f"{SMALL}:canary", "--out", str(other), "--seed", "8", "--steps", "2")
    assert manifest(other)["seed"] == 8
    assert series(other)["hashes/params"][0].tobytes() != series(small_run)["hashes/params"][0].tobytes()


def test_a_prefix_run_is_the_first_steps(small_run: Path, small_canary_3_steps) -> None:
    short = small_canary_3_steps("fp32")  # `--steps 3` (fp32: the default), conftest's, only read here
    a, b = series(small_run), series(short)
    for name in SERIES:
        assert a[name][:3].tobytes() == b[name].tobytes(), name
    assert manifest(short)["steps_planned"] == 3


def test_bf16_lane_declares_its_feature(small_run: Path, small_canary_3_steps) -> None:
    out = small_canary_3_steps("bf16")  # `--precision bf16 --steps 3`, conftest's, only read here
    m = manifest(out)
    assert (m["lane"], m["features"], m["budget_features"]) == ("small/torch+bf16", "bf16", "torch-bf16")
    a, b = series(small_run), series(out)
    assert a["steps/batch_hash"][:3].tobytes() == b["steps/batch_hash"].tobytes()  # the same data
    assert a["steps/loss"][0] != b["steps/loss"][0]  # other numerics


def test_a_fault_moves_the_hashes_from_its_step_on(small_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "fault.h5"
    run(f"{SMALL}:canary", "--out", str(out), "--inject-fault", "step=3,op=hidden,ulps=4096")
    a, b = series(small_run), series(out)
    assert first_difference(a, b, "hashes/grads") == 3
    assert first_difference(a, b, "hashes/params") == 3
    assert all(first_difference(a, b, name) in (-1, 3, 4) for name in SERIES)  # nothing before the fault
    assert manifest(out)["fault_injection"] == "step=3,op=hidden,ulps=4096"


def test_gradients_zeroed_after_the_update_are_recorded_as_applied(small_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "zeroed.h5"
    run(f"{SMALL}:zeroes_after_update", "--out", str(out))
    a, b = series(small_run), series(out)
    for name in SERIES:
        assert a[name].tobytes() == b[name].tobytes(), name


@pytest.mark.parametrize("function", ["canary", "zeroes_after_update"])
def test_the_digest_in_place_and_from_device_copies_record_the_same_bits(small_run: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        digest_library: str, function: str) -> None:
    """The library reads the tensors in place at the end of optimizer.step(); the Python
    digest takes copies there and digests them after the step (runner.StepCapture). Both are
    the bits of the same moment, gradients zeroed after the update included."""
    monkeypatch.setenv("CANARY_HARNESS_DIGEST", digest_library)
    in_place = tmp_path / "in_place.h5"
    run(f"{SMALL}:{function}", "--out", str(in_place))
    monkeypatch.setenv("CANARY_HARNESS_DIGEST", "python")
    copies = tmp_path / "copies.h5"
    run(f"{SMALL}:{function}", "--out", str(copies))
    a, b, reference = series(in_place), series(copies), series(small_run)
    for name in SERIES:
        assert a[name].tobytes() == b[name].tobytes() == reference[name].tobytes(), name


def test_grad_norm_returned_by_the_step_is_recorded(small_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "norm.h5"
    run(f"{SMALL}:returns_norm", "--out", str(out))
    returned, applied = series(out)["steps/grad_norm"], series(small_run)["steps/grad_norm"]
    # the norm before clipping; the one applied is at most the clip (0.5, plus clip's 1e-6 guard)
    assert np.all(applied <= 0.5 + 1e-5) and np.any(returned > 0.5)
    assert np.allclose(np.minimum(returned, 0.5), applied, rtol=1e-5)
    assert series(out)["hashes/params"].tobytes() == series(small_run)["hashes/params"].tobytes()


def test_an_optimizer_without_adam_moments_records_its_momentum(tmp_path: Path) -> None:
    from canary_harness import tensor_hash

    out = tmp_path / "sgd.h5"
    run(f"{SMALL}:sgd", "--out", str(out), "--steps", "2")
    s = series(out)
    assert s["hashes/adam_m"][1].tobytes() != s["hashes/adam_v"][1].tobytes()
    with h5py.File(out, "r") as f:
        names = [n.decode() for n in f["hashes/names"][()]]
    shape = dict(torch.nn.Embedding(32, 16).named_parameters())["weight"].shape
    assert s["hashes/adam_v"][0][names.index("embed.weight")] == tensor_hash(np.zeros(tuple(shape), np.float32))


BAD = [
    ("missing_file", f"{SMALL[:-3]}_nope.py:canary", "no file"),
    ("missing_name", f"{SMALL}:nope", "defines no 'nope'; its functions: batch, train_step, make, canary,"),
    ("not_a_function", f"{SMALL}:NOT_A_FUNCTION", "not a function"),
    ("raising", f"{SMALL}:raising", "RuntimeError: the config file is missing"),
    ("returns_other", f"{SMALL}:returns_model", "returned a Net, not a canary_harness.Canary"),
    ("flaky_batch", f"{SMALL}:flaky_batch", "two different batches"),
    ("vector_loss", f"{SMALL}:vector_loss", "loss of shape (3,)"),
    ("bad_name", f"{SMALL}:bad_name", "name='a/b'"),
    ("not_optimized", f"{SMALL}:not_optimized", "'embed.weight' is not one the optimizer updates"),
    ("no_colon", SMALL, "FILE.py:NAME"),
]


@pytest.mark.torch_agnostic
@pytest.mark.parametrize("case,spec,message", BAD, ids=[b[0] for b in BAD])
def test_bad_canaries_are_one_line_exit_2_and_no_file(tmp_path: Path, case: str, spec: str, message: str) -> None:
    out = tmp_path / f"{case}.h5"
    result = run(spec, "--out", str(out), check=False)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if not line.startswith("step ")]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not out.exists()


@pytest.mark.torch_agnostic
@pytest.mark.parametrize("flag,value,message", [
    ("--precision", "fp16", "unknown precision"), ("--steps", "7", "1..6"), ("--threads", "0", "1..1024"),
    ("--inject-fault", "step=9,op=hidden", "past the last step"), ("--inject-fault", "step=1,op=nope", "unknown op"),
    ("--device", "tpu", "unknown device"), ("--seed", "-1", "--seed"),
])
def test_bad_flags_are_one_line_exit_2_and_no_file(tmp_path: Path, flag: str, value: str, message: str) -> None:
    out = tmp_path / "flag.h5"
    result = run(f"{SMALL}:canary", "--out", str(out), flag, value, check=False)
    assert result.returncode == 2 and message in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    assert not out.exists()


@pytest.mark.torch_agnostic
@pytest.mark.parametrize("spec,fault,message", [
    ("canary", "step=2,op=embed.weight", "unknown op"),
    ("tuple_output", "step=2,op=pair", "returns a tuple whose first result is not a floating-point tensor"),
])
def test_a_fault_that_cannot_happen_is_refused(tmp_path: Path, spec: str, fault: str, message: str) -> None:
    out = tmp_path / "fault.h5"
    result = run(f"{SMALL}:{spec}", "--out", str(out), "--inject-fault", fault, check=False)
    lines = [line for line in result.stderr.splitlines() if not line.startswith("step ")]
    assert result.returncode == 2 and len(lines) == 1 and message in lines[0], result.stderr
    assert not out.exists()


@pytest.mark.torch_agnostic
def test_a_fault_on_a_module_never_called_is_refused(tmp_path: Path) -> None:
    """The example's nn.ModuleList `h` is a module path, never called itself."""
    out = tmp_path / "fault.h5"
    result = run(f"{EXAMPLE}:canary", "--out", str(out), "--steps", "3", "--inject-fault", "step=1,op=h", check=False)
    assert result.returncode == 2 and "did not run in step 1" in result.stderr, result.stderr
    assert not out.exists()


def test_a_contract_breach_after_the_first_steps_leaves_no_receipt(tmp_path: Path) -> None:
    out = tmp_path / "flaky.h5"
    result = run(f"{SMALL}:flaky_from_step_2", "--out", str(out), check=False)
    assert result.returncode == 2 and "step 2: batch(2) gave two different batches" in result.stderr, result.stderr
    assert not out.exists()


def test_the_teams_batch_error_keeps_the_finished_steps(tmp_path: Path) -> None:
    out = tmp_path / "batch.h5"
    result = run(f"{SMALL}:batch_fails_at_3", "--out", str(out), check=False)
    assert result.returncode == 2 and "ValueError: shard 3 is missing" in result.stderr, result.stderr
    assert manifest(out)["complete"] == 0 and len(series(out)["steps/loss"]) == 3


def test_a_step_that_fails_keeps_the_finished_steps(tmp_path: Path) -> None:
    out = tmp_path / "fails.h5"
    result = run(f"{SMALL}:step_fails_at_3", "--out", str(out), check=False)
    assert result.returncode == 2 and "FloatingPointError: loss went NaN" in result.stderr
    assert manifest(out)["complete"] == 0 and len(series(out)["steps/loss"]) == 3


def test_the_example_runs_bitwise_and_learns(tmp_path: Path) -> None:
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    run(f"{EXAMPLE}:canary", "--out", str(a), "--steps", "12")
    run(f"{EXAMPLE}:canary", "--out", str(b), "--steps", "12", "--threads", "1")
    sa, sb = series(a), series(b)
    for name in SERIES:
        assert sa[name].tobytes() == sb[name].tobytes(), name
    assert sa["steps/loss"][-1] < sa["steps/loss"][0] - 1.0
    assert manifest(a)["lane"] == "own-gpt/torch"


def test_the_examples_small_size_is_the_same_gpt_on_fewer_sequences() -> None:
    """examples/own-model/canary.py:small (the cost benchmark's short step): the example's
    model, optimizer and data on 2 sequences a step instead of 8, the same windows first."""
    from canary_harness.runs.canary import load_canary

    full, small = load_canary(f"{EXAMPLE}:canary").canary, load_canary(f"{EXAMPLE}:small").canary
    assert (small.config["batch"], full.config["batch"]) == (2, 8)
    assert [p.shape for p in small.model.parameters()] == [p.shape for p in full.model.parameters()]
    for i in (0, 7):
        (xs, ys), (xf, yf) = small.batch(i), full.batch(i)
        assert xs.shape == (2, 64) and xf.shape == (8, 64)
        assert torch.equal(xs, xf[:2]) and torch.equal(ys, yf[:2])


def test_batch_tree_hash_sees_structure_values_and_dtype() -> None:
    from canary_harness.receipts.digest import batch_tree_hash

    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    base = batch_tree_hash((x, x + 1))
    assert base == batch_tree_hash((torch.from_numpy(x), torch.from_numpy(x + 1)))
    assert base != batch_tree_hash((x + 1, x))
    assert base != batch_tree_hash([x, x + 1, 0])
    assert base != batch_tree_hash((x.astype(np.int32), x + 1))
    assert base != batch_tree_hash((x.reshape(3, 2), x + 1))
    assert batch_tree_hash({"b": x, "a": x + 1}) == batch_tree_hash({"a": x + 1, "b": x})
    assert batch_tree_hash((x, x + 1)) != batch_tree_hash([x, x + 1])
    assert batch_tree_hash({1: x}) != batch_tree_hash({"1": x})
    f64 = np.array([1.0, 2.0])
    assert batch_tree_hash(f64) != batch_tree_hash(f64 + 1e-12)  # no rounding to fp32 first
    assert batch_tree_hash(f64) != batch_tree_hash(f64.astype(np.float32))
    ones = torch.ones(4)
    assert batch_tree_hash(ones.bfloat16()) != batch_tree_hash(ones)
    assert batch_tree_hash(ones.bfloat16()) == batch_tree_hash(ones.bfloat16().clone())
    with pytest.raises(ValueError, match="a batch holds tensors"):
        batch_tree_hash(("text", x))


def test_adamw_eps_1e8_to_1e7_in_the_example_fails_at_step_0(tmp_path: Path, harness_bin) -> None:
    import shutil

    example = Path(EXAMPLE).parent
    changed = tmp_path / "own-model"
    shutil.copytree(example, changed)
    model = changed / "model.py"
    assert "eps=1e-8" in model.read_text()
    model.write_text(model.read_text().replace("eps=1e-8", "eps=1e-7"))
    before, after = tmp_path / "before.h5", tmp_path / "after.h5"
    run(f"{EXAMPLE}:canary", "--out", str(before), "--steps", "3")
    run(f"{changed / 'canary.py'}:canary", "--out", str(after), "--steps", "3")
    result = run_harness(harness_bin, "compare", str(after), str(before), check=False)
    assert result.returncode == 1 and "first failing step 0" in result.stdout, result.stdout


def test_the_batch_contract_is_checked_at_the_first_steps_and_every_power_of_two() -> None:
    from canary_harness.runs.runner import batch_checked_at

    checked = [i for i in range(1, 5000) if batch_checked_at(i)]
    assert batch_checked_at(0) and checked[:4] == [1, 2, 3, 4]
    assert checked[4:] == [2**k for k in range(3, 13)]


def test_a_row_that_cannot_be_written_stops_the_run_and_keeps_the_rows_before_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows are appended on a background thread (runner.ReceiptRun): a write that fails at
    step 3 is raised by the run (not lost), no later row is written, and the receipt keeps
    steps 0-2 with complete = 0."""
    from canary_harness.runs import runner
    from canary_harness.runs.canary import load_canary

    append = runner._append_row

    def full_disk_at_3(writer, record):
        if writer.steps_recorded == 3:
            raise OSError(28, "No space left on device")
        append(writer, record)

    monkeypatch.setattr(runner, "_append_row", full_disk_at_3)
    out = tmp_path / "r.h5"
    loaded = load_canary(f"{SMALL}:canary")
    with pytest.raises(OSError, match="No space left"):
        runner.run_canary(loaded, runner.RunOptions(out=str(out)), torch.device("cpu"))
    with h5py.File(out, "r") as f:
        assert len(f["steps/loss"]) == 3 and f["manifest"].attrs["complete"] == 0


# ---- --compile: torch.compile (Inductor) on torch 2.x; refused on torch 1.13 ----------------------

HAS_COMPILE = hasattr(torch, "compile")


def test_compile_is_refused_where_torch_has_no_compiler_and_runs_where_it_has(tmp_path: Path, harness_bin,
                                                                              small_canary_receipt: Path) -> None:
    """On torch 1.13: exit 2, one line, no file. On 2.x: lane small/torch+compile, budget
    torch-compile, two compiled runs bit for bit, a valid receipt, apart from the eager run
    and within the budget calibrated from the two."""
    out = tmp_path / "compiled.h5"
    first = run(f"{SMALL}:canary", "--out", str(out), "--compile", check=HAS_COMPILE)
    if not HAS_COMPILE:
        assert first.returncode == 2 and "--compile: torch 1.13" in first.stderr, first.stderr
        assert len(first.stderr.strip().splitlines()) == 1 and not out.exists()
        return
    m = manifest(out)
    assert (m["lane"], m["budget_features"], m["compile"]) == ("small/torch+compile", "torch-compile", "inductor")
    assert "No CUDA runtime" not in first.stderr
    again = tmp_path / "again.h5"
    run(f"{SMALL}:canary", "--out", str(again), "--compile")
    a, b = series(out), series(again)
    for name in SERIES:
        assert a[name].tobytes() == b[name].tobytes(), name
    run_harness(harness_bin, "validate", str(out))
    eager = small_canary_receipt
    assert series(eager)["hashes/params"].tobytes() != a["hashes/params"].tobytes()  # Inductor rounds otherwise
    # Its own budget (no default entry covers a team's canary): calibrated, then judged under it.
    candidate = tmp_path / "budgets.toml"
    run_harness(harness_bin, "calibrate", "--receipts", str(out), "--reference", str(eager), "--out", str(candidate),
                "--provisional")
    assert "[small.torch-compile]" in candidate.read_text()
    run_harness(harness_bin, "compare", str(out), str(eager), "--budgets", str(candidate))
    # A replay compiles again and reproduces the compiled bits; aten traces of a compiled step are refused.
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    replay = [sys.executable, "-m", "canary_harness", "replay", str(out)]
    replayed = subprocess.run(replay, capture_output=True, text=True, timeout=600, env=env)
    assert replayed.returncode == 0 and "bitwise equal" in replayed.stdout, replayed.stdout + replayed.stderr
    refused = subprocess.run(replay + ["--trace", "aten"], capture_output=True, text=True, timeout=600, env=env)
    assert refused.returncode == 2 and "is a compiled run" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_a_fault_in_a_compiled_run_is_found_by_bisect_at_its_step_and_module(tmp_path: Path, harness_bin) -> None:
    """Under --compile a fault's hook and the op traces' hooks are part of the compiled
    program: two runs with the same hooks (the fault's step is data) are one program, so
    bisect names the earlier fault's step and module. (torch 1.13: refused, as above.)"""
    early, late = tmp_path / "early.h5", tmp_path / "late.h5"
    for out, step in ((early, 3), (late, 5)):
        result = run(f"{SMALL}:canary", "--out", str(out), "--compile", "--trace", "ops",
                     "--inject-fault", f"step={step},op=hidden,ulps=4096", check=HAS_COMPILE)
        if not HAS_COMPILE:
            assert result.returncode == 2 and "has no torch.compile" in result.stderr and not out.exists()
            return
    result = run_harness(harness_bin, "bisect", str(early), str(late), check=False)
    assert "equal       steps 0-2 bitwise equal" in result.stdout, result.stdout
    assert "diverges    step 3" in result.stdout and "first op    hidden forward" in result.stdout, result.stdout
