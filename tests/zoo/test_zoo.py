"""The zoo: public model families (tests/zoo/*.py, docs/zoo.md), each unmodified and built from
a config, trained by the loop a team writes (team.py), through every own-model feature.

Run by ctest as `zoo` with .venv/'s torch 2.9 and transformers (tests/CMakeLists.txt):
    HARNESS_BIN=build/bin/harness .venv/bin/python -m pytest tests/zoo -q
Each member is run once (fp32, checkpoints every 4 steps) and that receipt is shared by the
member's tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import shared

ZOO = Path(__file__).resolve().parent
MEMBERS = ["gpt2", "llama", "mixtral", "bert", "t5", "accumulation"]
CHECKPOINT_EVERY = 4


@dataclass
class Member:
    name: str
    spec: str        # FILE.py:canary
    receipt: Path    # its fp32 run, checkpointed
    work: Path       # the member's scratch directory


def canary_run(spec: str, out: Path, *flags: str, check: bool = True) -> subprocess.CompletedProcess:
    """`python -m canary_harness run` with this interpreter, its lane named by its torch
    (--versioned: zoo-NAME/torch@2.9, as a nightly names a lane whose matrix names `python`)."""
    return shared.run_module("canary_harness", "run", spec, "--out", str(out), "--versioned", *flags, check=check)


def harness(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return shared.run_harness(shared._harness_bin(), *args, check=check)


@pytest.fixture(scope="session")
def team_checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zoo's files as a team has them: in a directory of its own, outside this
    repository's work tree (a receipt records the git commit of its canary's tree: here none,
    never this checkout's, which a developer's edits make dirty and goldens refuse)."""
    checkout = tmp_path_factory.mktemp("team") / "zoo"
    shutil.copytree(ZOO, checkout, ignore=shutil.ignore_patterns("__pycache__", "test_*", "conftest.py", "*.sh"))
    return checkout


@pytest.fixture(scope="module", params=MEMBERS)
def member(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, team_checkout: Path) -> Member:
    work = tmp_path_factory.mktemp(request.param)
    spec = f"{team_checkout / request.param}.py:canary"
    receipt = work / "fp32.h5"
    canary_run(spec, receipt, "--checkpoint-every", str(CHECKPOINT_EVERY))
    return Member(request.param, spec, receipt, work)


def test_the_run_learns_and_validates(member: Member) -> None:
    with h5py.File(member.receipt, "r") as f:
        loss = f["steps/loss"][()]
    assert np.all(np.isfinite(loss)) and loss[-3:].mean() < loss[:3].mean(), loss
    harness("validate", str(member.receipt))


def test_replay_from_a_checkpoint_is_bitwise_schedule_included(member: Member) -> None:
    # From step 6: resumes at the checkpoint of step 4, the HF schedule's state with it.
    shown = harness("replay", str(member.receipt), "--from", "6").stdout
    assert "bitwise equal to the receipt" in shown, shown


@pytest.fixture(scope="module")
def goldens(member: Member) -> Path:
    """The member's fp32 receipt approved as its lane's golden, in a goldens directory of its
    own (on a person's machine: CI unset). Refresh replays the run with aten traces while its
    code is on disk and stores them in the golden (docs/bisect.md)."""
    directory = member.work / "goldens"
    person = {k: v for k, v in os.environ.items() if k != "CI"}  # goldens change on a person's machine only
    for args in (("refresh", "--receipt", str(member.receipt), "--reason", f"zoo {member.name}: first golden"),
                 ("approve", "--approved-by", "the zoo test")):
        done = subprocess.run([str(shared._harness_bin()), "golden", *args, "--goldens", str(directory)],
                              capture_output=True, text=True, env=person, timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr
        assert args[0] != "refresh" or "aten traces of steps 0-11 stored" in done.stdout, done.stdout
    return directory


def test_a_regression_in_the_teams_code_is_caught_at_its_step(member: Member, goldens: Path) -> None:
    # The team's code changed in place, in the checkout the golden was recorded from: the
    # schedule's warm-up from 3 steps to 2. The code the golden was recorded with is gone
    # (put back afterwards, for the tests that follow). lr is 0 at step 0 under both, so step
    # 0 is bitwise and step 1's update differs.
    team = Path(member.spec.rpartition(":")[0]).parent / "team.py"
    clean, out = team.read_text(), member.work / "regressed.h5"
    try:
        team.write_text(clean.replace("WARMUP = 3\n", "WARMUP = 2\n"))
        canary_run(member.spec, out)
        shown = harness("check", str(out), "--goldens", str(goldens), check=False)
        # bisect replays only the new run's step 1 with aten traces and reads the golden's
        # stored one: the first op that differs is the optimizer's first use of the learning
        # rate, at the team's optimizer.step() line.
        (golden,) = goldens.rglob("*.h5")
        bisect = harness("bisect", str(out), str(golden), check=False)
    finally:
        team.write_text(clean)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    assert "first failing step 1" in shown.stdout, shown.stdout
    assert bisect.returncode == 1, bisect.stdout + bisect.stderr
    lines = {line[:12].strip(): line[12:] for line in bisect.stdout.splitlines()}
    assert lines["diverges"].startswith("step 1 "), bisect.stdout
    assert lines["first op"].startswith("<optimizer> optimizer") and "aten." in lines["first op"], bisect.stdout
    assert "traced by replay of A and the aten trace B holds (recorded at golden refresh)" in lines["first op"], \
        bisect.stdout
    assert lines["at"] == f"team.py:{_line_of('optimizer.step()')}", bisect.stdout


def _line_of(code: str) -> int:
    """The line of team.py that holds `code` (the one that does)."""
    (number,) = [n for n, line in enumerate((ZOO / "team.py").read_text().splitlines(), 1) if code in line]
    return number


def test_the_stack_line_names_transformers_and_the_attention_that_ran(member: Member) -> None:
    import transformers

    shown = harness("inspect", str(member.receipt)).stdout
    libraries = next(line for line in shown.splitlines() if line.startswith("libraries"))
    kernels = next(line for line in shown.splitlines() if line.startswith("kernels"))
    assert f"transformers {transformers.__version__}" in libraries, libraries
    assert "attention=sdpa" in kernels.split(), kernels  # HF's default on torch 2.x


def test_eager_attention_is_told_apart_from_sdpa() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from canary_harness.receipts.stack import attention_implementations

    for implementation in ("eager", "sdpa"):
        model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, attn_implementation=implementation))
        assert attention_implementations(model) == [implementation]


def test_a_misspelled_name_lists_the_files_functions(tmp_path: Path) -> None:
    shown = canary_run(f"{ZOO / 'gpt2'}.py:canry", tmp_path / "x.h5", check=False)
    assert shown.returncode == 2 and not (tmp_path / "x.h5").exists()
    assert shown.stderr.strip().endswith("defines no 'canry'; its functions: config, canary"), shown.stderr


def test_a_golden_approved_from_the_receipt_holds_in_a_nightly(member: Member, goldens: Path) -> None:
    """The member's receipt approved as the golden of its fp32 lane; a nightly of the member
    (a matrix naming .venv/'s interpreter) runs the lane bitwise to it (two runs of a member
    are bitwise, its held-out logits included), and its negative
    controls (a 1-ulp fault that the golden check must see and bisect must place) pass. The
    fault control compares its traced, faulted run with the untraced lane: `--trace ops`
    must change no bit (found here on Llama, Mixtral, BERT and T5, whose norms and attention
    read one tensor several times: python/tests/test_lane_trace.py holds the mechanism), and
    a default fault on a module the forward never calls (T5's `shared`) is passed over."""
    matrix = member.work / "nightly.toml"
    matrix.write_text(f'schema_version = 1\ncanary = "{member.spec}"\npython = "{sys.executable}"\n'
                      'reference = "fp32"\n\n[[lanes]]\nid = "fp32"\nengine = "torch"\n'
                      'why = "the member\'s bitwise reference"\n')
    night = member.work / "night"
    shown = harness("nightly", "--matrix", str(matrix), "--goldens", str(goldens), "--out", str(night))
    assert "nightly     pass (1 lanes)" in shown.stdout or "nightly     pass (1 lane)" in shown.stdout, shown.stdout
    # The lane is a second run of the member: bitwise the first, its held-out logits included.
    again = night / "receipts" / "fp32.h5"
    assert "reference (bitwise" in harness("compare", str(again), str(member.receipt)).stdout
    with h5py.File(member.receipt, "r") as a, h5py.File(again, "r") as b:
        assert "eval" in a and a["eval"].keys() == b["eval"].keys()
        for name, dataset in a["eval"].items():
            if isinstance(dataset, h5py.Dataset):
                assert dataset[()].tobytes() == b["eval"][name][()].tobytes(), name


def test_bf16_drifts_from_fp32_within_its_perturbation_calibrated_budget(member: Member) -> None:
    """bf16 autocast around the team's step, judged against the fp32 run under the member's
    shipped [zoo-MEMBER.torch-bf16] entry (canaries/budgets.toml: `harness calibrate --perturb 24 --held-out 8`
    on this host kind, tests/zoo/calibrate.sh), logits included."""
    bf16 = member.work / "bf16.h5"
    canary_run(member.spec, bf16, "--precision", "bf16")
    shown = harness("compare", str(bf16), str(member.receipt), check=False)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f"zoo-{member.name}.torch-bf16" in shown.stdout and "logit_kl" in shown.stdout, shown.stdout


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_on_torch_xla_a_member_is_compile_stable_after_its_declared_warm_up(name: str, team_checkout: Path,
                                                                            tmp_path: Path) -> None:
    """--device xla on PJRT's CPU client: AdamW's lazy state makes steps 0 and 1 compile, no
    step after them compiles or reads the host, which [zoo-NAME.compile-stability]'s warm-up of
    2 declares; the check holds the receipt to it."""
    out = tmp_path / "xla.h5"
    xla = {k: v for k, v in os.environ.items() if k != "USE_TORCH_XLA"}  # transformers on XLA as a TPU user runs it
    done = subprocess.run([sys.executable, "-m", "canary_harness", "run", f"{team_checkout / name}.py:canary",
                           "--device", "xla", "--out", str(out)], capture_output=True, text=True, timeout=900,
                          env={**xla, "PJRT_DEVICE": "CPU"})
    assert done.returncode == 0, done.stdout + done.stderr
    with h5py.File(out, "r") as f:
        compiles = f["compile/UncachedCompile"][()]
        assert compiles[:2].tolist() == [1, 1] and not compiles[2:].any(), compiles
        assert not f["compile/HostSync"][()].any()
    shown = harness("check", str(out), "--golden", str(out))
    assert "PASS  compile_stability.uncached_compiles" in shown.stdout, shown.stdout
