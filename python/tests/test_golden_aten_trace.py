"""A golden carries its aten traces (docs/bisect.md, "A golden carries its aten traces"):
`harness golden refresh` of a Python canary replays every step with aten traces into the
candidate, so that once the team's code has changed in place, `harness bisect` against the
golden still names the step, the module and the aten op, replaying only the new run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import h5py

from conftest import run_harness
from test_python_canary import run

SCHEDULED = Path(__file__).parent / "own_canaries" / "scheduled.py"
# The regression, made in the canary's file in place: the warm-up of its cosine schedule
# from 2 steps to 1. The lr is 0 at step 0 under both, so step 1's update differs first.
CLEAN, REGRESSED = "WARMUP = 2\n", "WARMUP = 1\n"
LANE = "scheduled/torch"


def golden(harness_bin: Path, goldens: Path, *args: str) -> subprocess.CompletedProcess:
    """`harness golden ARGS` as a person runs it (goldens change outside CI only)."""
    person = {k: v for k, v in os.environ.items() if k != "CI"}
    done = subprocess.run([str(harness_bin), "golden", *args, "--goldens", str(goldens)], capture_output=True,
                          text=True, env=person, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def team_canary(tmp_path: Path) -> Path:
    """The team's canary file, in a directory of its own."""
    source = tmp_path / "scheduled.py"
    source.write_text(SCHEDULED.read_text())
    return source


def regress(source: Path) -> None:
    assert CLEAN in source.read_text()
    source.write_text(source.read_text().replace(CLEAN, REGRESSED))


def line_of(source: Path, code: str) -> int:
    (number,) = [n for n, line in enumerate(source.read_text().splitlines(), 1) if code in line]
    return number


def test_bisect_against_a_golden_whose_code_changed_in_place_reads_its_stored_trace(tmp_path: Path,
                                                                                     harness_bin: Path) -> None:
    source, goldens = team_canary(tmp_path), tmp_path / "goldens"
    clean, new = tmp_path / "clean.h5", tmp_path / "new.h5"
    run(f"{source}:cosine_declared", "--out", str(clean))
    refreshed = golden(harness_bin, goldens, "refresh", "--receipt", str(clean), "--reason", "first golden")
    assert "aten traces of steps 0-7 stored" in refreshed.stdout, refreshed.stdout
    golden(harness_bin, goldens, "approve", "--approved-by", "the test")
    stored = goldens / f"{LANE}.h5"
    with h5py.File(stored, "r") as f:
        trace = f["aten_trace"]
        assert trace["offset"].shape == trace["length"].shape == (8,)
        assert trace["hash"].shape == trace["op_index"].shape == (int(trace["length"][()].sum()),)
        assert trace["projection"].fletcher32
    report = json.loads(run_harness(harness_bin, "validate", "--json", str(stored)).stdout)
    assert report["valid"] and report["unknown"] == [], report

    regress(source)  # the code the golden was recorded with is gone
    run(f"{source}:cosine_declared", "--out", str(new))
    checked = run_harness(harness_bin, "check", str(new), "--goldens", str(goldens), check=False)
    assert checked.returncode == 1 and "first failing step 1" in checked.stdout, checked.stdout + checked.stderr
    found = run_harness(harness_bin, "bisect", str(new), str(stored), "--json", check=False)
    assert found.returncode == 1, found.stdout + found.stderr
    bisection = json.loads(found.stdout)
    assert bisection["first_divergent_step"] == 1
    assert bisection["op_trace"] == "replay of A and the aten trace B holds (recorded at golden refresh)"
    op = bisection["first_divergent_op"]
    assert (op["name"], op["phase"]) == ("<optimizer>", "optimizer") and op["tensor"].startswith("aten."), op
    assert op["site"] == f"scheduled.py:{line_of(source, 'optimizer.step()')}", op
    text = run_harness(harness_bin, "bisect", str(new), str(stored), check=False).stdout
    assert "traced by replay of A and the aten trace B holds" in text, text


def test_a_candidate_whose_replay_does_not_reproduce_gets_no_trace_and_says_why(tmp_path: Path,
                                                                                harness_bin: Path) -> None:
    source, goldens, clean = team_canary(tmp_path), tmp_path / "goldens", tmp_path / "clean.h5"
    run(f"{source}:cosine_declared", "--out", str(clean))
    regress(source)  # before refresh: today's code no longer makes the run
    refreshed = golden(harness_bin, goldens, "refresh", "--receipt", str(clean), "--reason", "too late")
    said = ("no aten trace: a replay with today's code does not reproduce step 1 (")
    assert said in refreshed.stdout and "bisect against this golden needs its code on disk" in refreshed.stdout, \
        refreshed.stdout
    assert said in (goldens / "review.md").read_text()
    with h5py.File(goldens / f"{LANE}.candidate.h5", "r") as f:
        assert "aten_trace" not in f
    assert not list(goldens.rglob("*.partial"))
