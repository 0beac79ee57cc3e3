"""The restart gate (`python3 -m canary_harness resume-check`, canary_harness.runs.resume_check)
on examples/restart-gate/canary.py: a canary whose save keeps everything resumes bitwise; one
whose save leaves out the HF-style LambdaLR is named at `lr`, the optimizer at the moments,
the model at the parameters, the RNG (dropout's draws) as an RNG state; a canary without
save and load is refused. The same holds in bf16, and compiled (torch 2.x)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from conftest import run_module


@pytest.fixture(scope="module")
def canary_file() -> Path:
    """examples/restart-gate/canary.py (CANARY_HARNESS_EXAMPLES where the tests run away from the checkout)."""
    examples = Path(os.environ.get("CANARY_HARNESS_EXAMPLES", str(Path(__file__).resolve().parents[2] / "examples")))
    return examples / "restart-gate" / "canary.py"


def check(canary_file: Path, name: str, at: int = 2, *flags: str) -> dict:
    result = run_module("canary_harness", "resume-check", f"{canary_file}:{name}", "--at", str(at), "--json", *flags,
                        check=False)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def test_a_save_of_everything_resumes_bitwise(canary_file: Path) -> None:
    result = check(canary_file, "everything")
    assert result["verdict"] == "equal" and result["first_difference"] is None, result
    assert (result["canary"], result["at"], result["steps"]) == ("resume-demo", 2, 8)


@pytest.mark.parametrize("name, what, omission", [
    ("no_scheduler", "lr", "a learning-rate schedule"),
    ("no_optimizer", "adam_m", "the moments"),
    ("no_model", "params", "the model's weights"),
    ("no_rng", "loss", "an RNG state"),
])
def test_each_omission_is_named(canary_file: Path, name: str, what: str, omission: str) -> None:
    result = check(canary_file, name)
    difference = result["first_difference"]
    assert result["verdict"] == "differs" and difference["what"] == what, result
    assert difference["omission"].startswith(omission), difference
    assert difference["step"] >= 3, "nothing before the resume can differ"


@pytest.mark.parametrize("name, what", [("everything", None), ("no_scheduler", "lr")])
def test_a_bf16_run_is_gated_in_bf16(canary_file: Path, name: str, what: str) -> None:
    """--precision bf16: both runs under autocast, as a bf16 lane trains; a save of everything
    resumes bitwise, and the omitted schedule is named as in fp32."""
    result = check(canary_file, name, 2, "--precision", "bf16")
    assert (result["precision"], result["compile"]) == ("bf16", False), result
    if what is None:
        assert result["verdict"] == "equal", result
    else:
        assert result["verdict"] == "differs" and result["first_difference"]["what"] == what, result


HAS_COMPILE = hasattr(torch, "compile")


def test_a_compiled_run_restarts_compiled_afresh_in_its_new_process(canary_file: Path) -> None:
    """--compile (torch 2.x): both runs torch.compile the model, the new process compiles
    afresh as a restarted job does, and a save of everything resumes bitwise. Torch 1.13 has
    no compiler: exit 2, one line."""
    result = run_module("canary_harness", "resume-check", f"{canary_file}:everything", "--at", "1", "--steps", "4",
                        "--compile", "--json", check=False)
    if not HAS_COMPILE:
        assert result.returncode == 2 and "--compile: torch 1.13" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        return
    verdict = json.loads(result.stdout)
    assert result.returncode == 0 and verdict["verdict"] == "equal" and verdict["compile"] is True, verdict


def test_the_text_names_the_step_and_the_omission(canary_file: Path) -> None:
    result = run_module("canary_harness", "resume-check", f"{canary_file}:no_scheduler", "--at", "2", check=False)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith("differs     step 4: lr "), lines
    assert lines[2].startswith("omission    a learning-rate schedule: its scheduler's state is not saved"), lines


@pytest.mark.torch_agnostic
@pytest.mark.parametrize("args, message", [
    (["no_save", "--at", "2"], "the canary gives no save and load"),
    (["save_only", "--at", "2"], "give save and load together"),
    (["everything", "--at", "7"], "--at: step 7 is not in 0..6"),
    (["everything", "--at", "x"], "--at"),
    (["everything", "--at", "2", "--steps", "9"], "--steps: 9 is past the canary's 8 steps"),
    (["everything", "--at", "2", "--precision", "fp16"], "--precision"),
])
def test_refusals_are_one_line_and_exit_2(canary_file: Path, args: list, message: str) -> None:
    result = run_module("canary_harness", "resume-check", f"{canary_file}:{args[0]}", *args[1:], check=False)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_run_that_does_not_repeat_is_refused_not_blamed_on_the_save(canary_file: Path) -> None:
    """Its steps 0..K differ between two runs in one process: no omission is named."""
    result = run_module("canary_harness", "resume-check", f"{canary_file}:unrepeatable", "--at", "2", check=False)
    assert result.returncode == 2 and "the run itself does not repeat" in result.stderr, result.stderr


@pytest.mark.parametrize("name, checkpoints", [("everything", True), ("no_save", False)])
def test_describe_says_whether_the_canary_checkpoints(canary_file: Path, name: str, checkpoints: bool) -> None:
    """What a nightly lane's `resume-at` is refused by (a canary without save and load: save_only is refused when it loads)."""
    described = json.loads(run_module("canary_harness", "describe", f"{canary_file}:{name}").stdout)
    assert described["checkpoints"] is checkpoints, described
