"""Checkpoints, replay and aten traces of Python canaries (canary_harness.runs.canary_state,
.replay, .aten_trace), and `harness replay` / `harness bisect` handing them to Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import run_harness
from test_python_canary import PACKAGE_ROOT, SMALL, run

# small.py's canary, its hidden layer's output scaled by (1 + 1e-6) from step 3 on: the
# same file name and function (one canary), other code.
REGRESSED = '''

def canary() -> ch.Canary:
    made = make()
    at = {"step": 0}
    train = made.step

    def step(model, optimizer, batch, i):
        at["step"] = i
        return train(model, optimizer, batch, i)

    made.model.hidden.register_forward_hook(lambda m, args, out: out * (1 + 1e-6) if at["step"] >= 3 else out)
    made.step = step
    return made
'''


def replay(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "canary_harness", "replay", *args], capture_output=True, text=True,
                          timeout=600, env=env)


def replay_json(*args: str) -> dict:
    result = replay(*args, "--json")
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("replay") / "small.h5"
    run(f"{SMALL}:canary", "--out", str(out), "--checkpoint-every", "2")
    return out


def test_checkpoints_are_held_in_the_receipt_and_validate(checkpointed: Path, harness_bin) -> None:
    with h5py.File(checkpointed, "r") as f:
        group = f["checkpoints"]
        assert group.attrs["storage"] in (b"receipt", "receipt")
        assert list(group["step"][()]) == [2, 4]
        assert all(h.startswith(b"xxh128:") for h in group["content_hash"][()])
        assert group["state"].fletcher32
    assert not Path(str(checkpointed) + ".ckpt").exists()
    run_harness(harness_bin, "validate", str(checkpointed))


@pytest.mark.parametrize("start, resumed", [(0, 0), (1, 0), (3, 2), (5, 4)])
def test_replay_resumes_from_the_checkpoint_at_or_before_and_reproduces(checkpointed: Path, start: int,
                                                                        resumed: int) -> None:
    result = replay_json(str(checkpointed), "--from", str(start))
    assert result["verdict"] == "reproduced", result
    assert result["resumed_from"] == resumed
    assert result["steps_run"] == 6 - resumed
    assert (result["checkpoint"] is None) == (resumed == 0)


def test_an_aten_trace_names_functional_ops_and_changes_no_bit(checkpointed: Path) -> None:
    result = replay_json(str(checkpointed), "--from", "3", "--to", "3", "--trace", "aten")
    assert result["verdict"] == "reproduced"  # traced, the step still records the receipt's bits
    (traced,) = result["traces"]
    columns = traced["columns"]
    assert traced["step"] == 3 and len(traced["hash"]) == len(columns) == len(traced["l2_bits"])
    softmax = [c for c in columns if c["tensor"] == "aten._softmax.default" and c["phase"] == "forward"]
    assert [(c["op"], c["site"]) for c in softmax] == [("<model>", "small.py:25")]  # Net.forward's F.softmax
    assert {c["phase"] for c in columns} == {"forward", "backward", "optimizer"}
    assert any(c["op"] == "hidden" and c["tensor"] == "aten.addmm.default" for c in columns)
    assert any(c["kind"] == "parameter" and c["phase"] == "optimizer" for c in columns)
    assert [c["op_index"] for c in columns] == list(range(len(columns)))
    again = replay_json(str(checkpointed), "--from", "3", "--to", "3", "--trace", "aten")["traces"][0]
    assert again["hash"] == traced["hash"] and again["projection_bits"] == traced["projection_bits"]


def test_an_altered_record_is_found_and_called_altered(checkpointed: Path, tmp_path: Path) -> None:
    altered = tmp_path / "altered.h5"
    altered.write_bytes(checkpointed.read_bytes())
    with h5py.File(altered, "r+") as f:
        f["steps/loss"][4] = np.nextafter(f["steps/loss"][4], np.inf)
    result = replay_json(str(altered), "--from", "3")
    assert result["verdict"] == "record_altered"
    assert result["first_mismatch"] == {"step": 4, "what": "loss", "tensor": ""}
    assert result["mismatched_steps"] == [4]


@pytest.mark.torch_agnostic
def test_a_checkpoint_of_another_canary_is_refused(checkpointed: Path, tmp_path: Path) -> None:
    other = tmp_path / "renamed.h5"
    run(f"{SMALL}:renamed", "--out", str(other), "--checkpoint-every", "2")
    spliced = tmp_path / "spliced.h5"
    spliced.write_bytes(checkpointed.read_bytes())
    with h5py.File(other, "r") as src, h5py.File(spliced, "r+") as dst:
        for name in ("state", "offset", "length", "content_hash"):
            del dst[f"checkpoints/{name}"]
            src.copy(src[f"checkpoints/{name}"], dst["checkpoints"], name)
    result = replay(str(spliced), "--from", "3")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "of canary 'renamed'" in result.stderr, result.stderr


def test_a_checkpoint_whose_bytes_changed_is_not_trusted(checkpointed: Path, tmp_path: Path) -> None:
    tampered = tmp_path / "tampered.h5"
    tampered.write_bytes(checkpointed.read_bytes())
    with h5py.File(tampered, "r+") as f:
        hashes = f["checkpoints/content_hash"]
        hashes[0] = b"xxh128:" + b"0" * 32  # the record of the state, not the state, changed
    result = replay(str(tampered), "--from", "3")
    assert result.returncode == 2 and "not trusted" in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.torch_agnostic
@pytest.mark.parametrize("args, message", [
    (["--from", "9"], "records steps 0-5"),
    (["--from", "4", "--to", "2"], "0 <= from <= to"),
    (["--trace", "ops"], "--trace: 'ops' is not a trace level; use none or aten"),
])
def test_bad_replay_flags_are_one_line_exit_2(checkpointed: Path, args: list, message: str) -> None:
    result = replay(str(checkpointed), *args)
    assert result.returncode == 2 and message in result.stderr and result.stderr.count("\n") == 1


def test_a_receipt_of_the_harness_engines_is_not_replayed_here(cpp_receipt: Path) -> None:
    result = replay(str(cpp_receipt))
    assert result.returncode == 2 and "not a Python canary's receipt" in result.stderr


def test_harness_replay_hands_a_python_canary_to_python(checkpointed: Path, harness_bin) -> None:
    result = run_harness(harness_bin, "replay", str(checkpointed), "--from", "3", "--json")
    reply = json.loads(result.stdout)
    assert reply["verdict"] == "reproduced" and reply["resumed_from"] == 2 and reply["lane"] == "small/torch"


def test_harness_bisect_names_the_step_module_and_aten_op_of_untraced_runs(checkpointed: Path, tmp_path: Path,
                                                                           harness_bin) -> None:
    regressed_file = tmp_path / "small.py"  # one canary: the same file name and function
    regressed_file.write_text(Path(SMALL).read_text() + REGRESSED)
    regressed = tmp_path / "regressed.h5"
    run(f"{regressed_file}:canary", "--out", str(regressed), "--checkpoint-every", "2")
    result = run_harness(harness_bin, "bisect", str(regressed), str(checkpointed), "--json", check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    found = json.loads(result.stdout)
    assert found["first_divergent_step"] == 3 and found["mode"] == "bitwise"
    assert found["op_trace"] == "replay of A and B"
    op = found["first_divergent_op"]
    assert (op["name"], op["phase"], op["tensor"]) == ("hidden", "forward", "aten.mul.Tensor"), op
    assert op["site"].startswith("small.py:") and op["other"].startswith("B runs ")
    text = run_harness(harness_bin, "bisect", str(regressed), str(checkpointed), check=False).stdout
    assert "first op    hidden forward" in text and "aten.mul.Tensor" in text and "\nat          small.py:" in text


# A softmax output's element 0 is about 1/32, added to activations near 1: one ulp of it
# is lost in the add, 2**16 ulps (a relative 2**-7) is not.
@pytest.mark.parametrize("target, tensor", [
    ("<model>:aten._softmax.default,ulps=65536", "aten._softmax.default"),  # Net.forward's functional softmax
    ("<model>:aten.add.Tensor", "aten.add.Tensor"),                         # its residual add
])
def test_a_fault_in_a_functional_op_is_found_by_bisect(checkpointed: Path, tmp_path: Path, harness_bin,
                                                       target: str, tensor: str) -> None:
    faulted = tmp_path / "faulted.h5"
    run(f"{SMALL}:canary", "--out", str(faulted), "--checkpoint-every", "2", "--inject-fault", f"step=3,op={target}")
    found = json.loads(run_harness(harness_bin, "bisect", str(faulted), str(checkpointed), "--json", check=False).stdout)
    assert found["first_divergent_step"] == 3
    op = found["first_divergent_op"]
    assert (op["name"], op["phase"], op["tensor"], op["other"]) == ("<model>", "forward", tensor, None), op
    assert op["site"].startswith("small.py:")
    # Each side judged on its own operands: the softmax nudged 2^16 ulps is over its bound; the
    # add's default 1-ulp nudge is within its own (gamma_1 (|a| + |b|)): rounding, as it should be.
    verdict = found["oracle"]["verdict"]
    if "ulps=65536" in target:
        assert verdict.startswith("A exceeds its bound by") and verdict.endswith("A's op is wrong"), verdict
    else:
        assert verdict == "both within their bounds: rounding", verdict
    again = replay_json(str(faulted), "--from", "3")  # the recipe's fault happens again in the replay
    assert again["verdict"] == "reproduced"


@pytest.mark.parametrize("fault, message", [
    ("step=3,op=<model>:aten.add_.Tensor", "returns an input"),
    ("step=3,op=nowhere:aten.add.Tensor", "no module 'nowhere'"),
    ("step=3,op=hidden:aten.no_such.Tensor", "is not an aten op overload"),
    ("step=3,op=<model>:aten.add.Tensor#0", "is not a call number"),
    ("step=3,op=<model>:aten.add.Tensor#5", "was called 1 time(s) in step 3, not 5"),
])
def test_a_fault_on_an_op_call_that_cannot_happen_is_refused(tmp_path: Path, fault: str, message: str) -> None:
    assert_refused(tmp_path, message, "--inject-fault", fault)


def assert_refused(tmp_path: Path, message: str, *flags: str) -> None:
    """small.py run with `flags`: exit 2, one line on stderr holding `message`, no receipt."""
    out = tmp_path / "refused.h5"
    result = run(f"{SMALL}:canary", "--out", str(out), *flags, check=False)
    assert result.returncode == 2 and message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert not out.exists()


def test_run_trace_ops_changes_no_bit_and_bisect_reads_it_without_a_replay(checkpointed: Path, tmp_path: Path,
                                                                           harness_bin) -> None:
    traced, regressed = tmp_path / "traced.h5", tmp_path / "regressed.h5"
    run(f"{SMALL}:canary", "--out", str(traced), "--trace", "ops")
    same = run_harness(harness_bin, "compare", str(traced), str(checkpointed), check=False).stdout
    assert "budget      reference (bitwise" in same and "verdict     PASS" in same, same  # hooks change no number
    regressed_file = tmp_path / "small.py"
    regressed_file.write_text(Path(SMALL).read_text() + REGRESSED)
    run(f"{regressed_file}:canary", "--out", str(regressed), "--trace", "ops")
    found = json.loads(run_harness(harness_bin, "bisect", str(regressed), str(traced), "--json", check=False).stdout)
    assert found["first_divergent_step"] == 3 and found["op_trace"] == "receipts"  # no replay
    op = found["first_divergent_op"]
    assert (op["name"], op["phase"], op["tensor"], op["kind"]) == ("hidden", "forward", "hidden.out", "activation"), op


@pytest.mark.parametrize("level, message", [
    ("aten", "--trace aten: aten traces are taken by a replay"),
    ("all", "--trace: 'all' is not a trace level; use none or ops"),
])
def test_run_refuses_a_trace_it_cannot_record(tmp_path: Path, level: str, message: str) -> None:
    assert_refused(tmp_path, message, "--trace", level)
