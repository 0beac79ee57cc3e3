"""What a Python canary's replay resumes and compares beyond the model and optimizer
(canary_harness.runs.canary_state, .replay): a canary identity that survives the receipt's JSON,
replay from a checkpoint on every digest path, and the state of the schedules the step
steps (docs/own-model.md, "Bisect to the aten op" and "State beyond model and optimizer")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from test_python_canary import PACKAGE_ROOT, SMALL

SCHEDULED = str(Path(__file__).parent / "own_canaries" / "scheduled.py")


def harness_python(*args: str, digest: str = "") -> subprocess.CompletedProcess:
    """`python -m canary_harness ARGS` with this checkout's package, the digest path `digest`
    (CANARY_HARNESS_DIGEST; "" leaves the environment's)."""
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if digest:
        env["CANARY_HARNESS_DIGEST"] = digest
    return subprocess.run([sys.executable, "-m", "canary_harness", *args], capture_output=True, text=True,
                          timeout=600, env=env)


def run_ok(*args: str, digest: str = "") -> None:
    result = harness_python("run", *args, digest=digest)
    assert result.returncode == 0, result.stdout + result.stderr


def replay_json(receipt: Path, *args: str, digest: str = "") -> dict:
    result = harness_python("replay", str(receipt), *args, "--json", digest=digest)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def recorded(path: Path, name: str):
    with h5py.File(path, "r") as f:
        return f[name][()]


# --- D1: the canary identity, compared after the same JSON round trip on both sides ---

def test_an_hf_shaped_config_replays_and_reruns(tmp_path: Path) -> None:
    """int keys (id2label), tuples, 1e-5 and nested mappings come back from the receipt's JSON
    changed; the live config takes the same trip, so the canary is still itself."""
    out = tmp_path / "hf.h5"
    run_ok(f"{SCHEDULED}:hf_config", "--out", str(out), "--checkpoint-every", "3")
    result = replay_json(out, "--from", "4")
    assert (result["verdict"], result["resumed_from"]) == ("reproduced", 3), result
    again = tmp_path / "again.h5"
    rerun = harness_python("rerun", str(out), "--out", str(again))
    assert rerun.returncode == 0, rerun.stderr
    for name in ("steps/loss", "steps/lr", "hashes/params"):
        assert recorded(out, name).tobytes() == recorded(again, name).tobytes(), name


def test_a_changed_config_is_still_another_canary(tmp_path: Path) -> None:
    source = tmp_path / "scheduled.py"
    source.write_text(Path(SCHEDULED).read_text())
    out = tmp_path / "hf.h5"
    run_ok(f"{source}:hf_config", "--out", str(out), "--steps", "2")
    text = source.read_text()
    assert '"layer_norm_epsilon": 1e-5' in text
    source.write_text(text.replace('"layer_norm_epsilon": 1e-5', '"layer_norm_epsilon": 1e-6'))
    for command in (["replay", str(out), "--from", "1"], ["rerun", str(out), "--out", str(tmp_path / "x.h5")]):
        result = harness_python(*command)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "no longer builds the canary" in result.stderr and "(its config differs)" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.torch_agnostic
def test_a_config_whose_keys_collide_in_json_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "collide.h5"
    result = harness_python("run", f"{SCHEDULED}:colliding_keys", "--out", str(out))
    assert result.returncode == 2 and not out.exists()
    assert "config does not convert to JSON (two keys of one mapping are both '1' in JSON)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_canonical_json_is_what_json_gives_back() -> None:
    from canary_harness.runs.canary import canonical_json

    assert canonical_json({0: "a", "n": (1, 2.5e-5), "d": {3: None}}) == {"0": "a", "n": [1, 2.5e-5], "d": {"3": None}}
    with pytest.raises(ValueError, match="both '1'"):
        canonical_json({"x": {1: 1, "1": 2}})


# --- D4: replay from a checkpoint on every digest path ---

@pytest.fixture(scope="module", params=["python", "native"])
def digest_path(request, harness_bin) -> str:
    """CANARY_HARNESS_DIGEST for one path: the numpy digest, or the build's library (the
    digest in place, whose capture never needs the deferred copies)."""
    if request.param == "python":
        return "python"
    return request.getfixturevalue("digest_library")


@pytest.fixture(scope="module")
def checkpointed_on(digest_path: str, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("digest") / "small.h5"
    run_ok(f"{SMALL}:canary", "--out", str(out), "--checkpoint-every", "2", digest=digest_path)
    return out


@pytest.mark.parametrize("replay_digest", ["python", "native"])
def test_replay_from_a_checkpoint_reproduces_on_every_digest_path(checkpointed_on: Path, replay_digest: str,
                                                                  request) -> None:
    """Recorded on one digest path, replayed on each: the checkpoint's digests taken outside a
    step (the deferred path's copies digested too), every step after it bitwise."""
    digest = "python" if replay_digest == "python" else request.getfixturevalue("digest_library")
    result = replay_json(checkpointed_on, "--from", "3", digest=digest)
    assert (result["verdict"], result["resumed_from"], result["steps_run"]) == ("reproduced", 2, 4), result


# --- D7: state beyond model and optimizer ---

@pytest.mark.parametrize("function", ["cosine_declared", "own_in_state"])
def test_a_declared_schedule_replays_bitwise_from_the_checkpoint(tmp_path: Path, function: str) -> None:
    out = tmp_path / f"{function}.h5"
    run_ok(f"{SCHEDULED}:{function}", "--out", str(out), "--checkpoint-every", "3")
    lr = recorded(out, "steps/lr")
    assert all(a != b for a, b in zip(lr, lr[1:])), lr  # the schedule moves the lr every step
    for start in (3, 4, 6):
        result = replay_json(out, "--from", str(start))
        assert result["verdict"] == "reproduced" and result["resumed_from"] == start - start % 3, result
        assert result["diagnosis"] is None


@pytest.mark.parametrize("function", ["cosine_undeclared", "own_undeclared"])
def test_an_undeclared_schedule_is_named_in_one_line_with_the_lr_at_the_step(tmp_path: Path, function: str) -> None:
    out = tmp_path / f"{function}.h5"
    run_ok(f"{SCHEDULED}:{function}", "--out", str(out), "--checkpoint-every", "3")
    result = replay_json(out, "--from", "4")
    # The optimizer restores step 3's lr; the schedule, restarted, sets step 4's wrongly.
    assert (result["verdict"], result["resumed_from"]) == ("diverged", 3), result
    assert result["first_mismatch"] == {"step": 4, "what": "lr", "tensor": ""}
    wanted = float(recorded(out, "steps/lr")[4])
    diagnosis = result["diagnosis"]
    assert "step 4 replays lr " in diagnosis and f"where the receipt records {wanted!r}:" in diagnosis
    assert "a learning-rate schedule's state is missing from the checkpoint of step 3" in diagnosis
    assert "schedulers=[scheduler]" in diagnosis and "state={'name': obj}" in diagnosis
    text = harness_python("replay", str(out), "--from", "4")
    assert text.returncode == 1
    lines = [line for line in text.stdout.splitlines() if line.startswith("diagnosis")]
    assert len(lines) == 1 and diagnosis in lines[0], text.stdout


def test_a_declared_schedule_whose_code_changed_is_not_called_missing(tmp_path: Path) -> None:
    """The schedule was declared and restored, then its code changed (warm-up 2 -> 3 in the
    canary's file, in place): the lr still differs after the checkpoint, and the line says the
    schedule changed, never that its state is missing."""
    canary = tmp_path / "scheduled.py"
    canary.write_text(Path(SCHEDULED).read_text())
    out = tmp_path / "declared.h5"
    run_ok(f"{canary}:cosine_declared", "--out", str(out), "--checkpoint-every", "3")
    canary.write_text(canary.read_text().replace("WARMUP = 2\n", "WARMUP = 3\n"))
    result = replay_json(out, "--from", "4")
    assert result["verdict"] == "diverged" and result["first_mismatch"]["what"] == "lr", result
    diagnosis = result["diagnosis"]
    assert "restored the declared schedulers" in diagnosis and "code or settings changed" in diagnosis, diagnosis
    assert "missing" not in diagnosis, diagnosis


def test_the_replayed_lr_is_the_restarted_schedules(tmp_path: Path) -> None:
    """The lr named is the one the replay ran: the cosine schedule one step after its start."""
    out = tmp_path / "undeclared.h5"
    run_ok(f"{SCHEDULED}:cosine_undeclared", "--out", str(out), "--checkpoint-every", "3", "--steps", "5")
    diagnosis = replay_json(out, "--from", "4")["diagnosis"]
    assert f"step 4 replays lr {1e-2 * 0.5!r} where" in diagnosis, diagnosis


def test_a_receipt_without_the_declared_state_says_so_and_diverges(tmp_path: Path) -> None:
    """Recorded before the schedule was declared, replayed with it declared: the checkpoint
    holds no state of it (a note), and the lr names the schedule."""
    source = tmp_path / "scheduled.py"
    source.write_text(Path(SCHEDULED).read_text())
    out = tmp_path / "before.h5"
    run_ok(f"{source}:cosine_undeclared", "--out", str(out), "--checkpoint-every", "3")
    text = source.read_text().replace('def cosine_undeclared() -> ch.Canary:\n    return make("cosine", "")',
                                      'def cosine_undeclared() -> ch.Canary:\n    return make("cosine", "schedulers")')
    source.write_text(text)
    result = replay_json(out, "--from", "4")
    assert result["first_mismatch"]["what"] == "lr", result
    assert any("holds no state of schedulers[0]" in note for note in result["notes"]), result["notes"]


@pytest.mark.torch_agnostic
def test_a_declared_object_without_state_dict_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "bad.h5"
    result = harness_python("run", f"{SCHEDULED}:not_stateful", "--out", str(out))
    assert result.returncode == 2 and not out.exists()
    assert "schedulers[0] is a function, which has no state_dict() and load_state_dict()" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
