"""The audit of a FILE.py:NAME whose NAME() returns a canary_harness.Canary, as
`canary_harness run` takes it: loaded by canary.load_canary (seeded, checked), its step on
its batches, the batch made outside the audited step. Clean where the step is, each finding
at the team's own line, bad canaries exit 2 with one line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import canary_harness
from canary_harness.audit import AuditError, PythonCanaryStep, audit_step, load_step
from canary_harness.runs.canary import load_canary

HERE = Path(__file__).resolve().parent
SMALL = HERE / "own_canaries" / "small.py"
# The example lives in the repository, not in the package (scripts/python-venv-check.sh names it).
EXAMPLE = Path(os.environ.get("CANARY_HARNESS_EXAMPLES", str(HERE.parents[1] / "examples"))) / "own-model" / "canary.py"
PACKAGE_ROOT = str(Path(canary_harness.__file__).resolve().parents[1])


def line_of(path: Path, text: str, after: str = "") -> int:
    """The first line of `path` that is `text` (stripped), after the first line starting with `after`."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(after)) if after else 0
    return next(i + 1 for i in range(start, len(lines)) if lines[i].strip() == text)


def audit_cli(target: str, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "canary_harness.audit", target, *flags], capture_output=True,
                          text=True, timeout=600, env=env, cwd=HERE)


def test_a_canary_whose_step_is_stable_audits_clean():
    # small.py:sgd: SGD with momentum at a constant lr passes no changing Python number.
    result = audit_cli(f"{SMALL}:sgd", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["clean"] and report["findings"] == []
    assert [s["step"] for s in report["steps"]] == [0, 1, 2, 3]
    assert all(s["ops"] > 20 and s["host_reads"] == 0 for s in report["steps"])
    # the model's forward, backward and SGD's update: one graph, the same from step 1 on
    assert len({s["fingerprint"] for s in report["steps"][1:]}) == 1


def test_a_canary_is_loaded_as_run_loads_it():
    step = load_step(f"{SMALL}:canary")
    assert isinstance(step, PythonCanaryStep)
    # seeded with the canary's seed before NAME(), as `run` builds it: the same initial weights
    same = load_canary(f"{SMALL}:canary").canary.model
    for (name, a), b in zip(step.canary.model.named_parameters(), same.parameters()):
        assert torch.equal(a, b), name


def test_a_canarys_adamw_constants_are_found_at_the_teams_optimizer_line():
    """small.py:canary trains with torch.optim.AdamW as it comes: its bias-corrected step size
    is a Python number, a new one every step (test_audit.py's adamw case). The audit names
    the team's `optimizer.step()` line in train_step, torch's frame as `via`, and nothing else."""
    report = audit_step(load_step(f"{SMALL}:canary"), 4, target="small.py:canary")
    line = line_of(SMALL, "optimizer.step()", after="def train_step")
    assert report.findings and {f.kind for f in report.findings} == {"varying_constant"}
    assert {(Path(f.file).name, f.line) for f in report.findings} == {("small.py", line)}
    assert all(f.via.startswith("torch/optim/adam") for f in report.findings)  # adamw.py on 1.13, adam.py on 2.x
    assert {f.op for f in report.findings} == {"aten.div.Tensor", "aten.addcdiv_"}


def test_a_host_read_in_a_canarys_step_is_reported_at_the_users_line():
    report = audit_step(load_step(f"{SMALL}:reads_loss_in_step"), 4, target="small.py:reads_loss_in_step")
    reads = [f for f in report.findings if f.kind == "host_read"]
    assert len(reads) == 1, [(f.kind, f.op, f.location) for f in report.findings]
    read = reads[0]
    assert (Path(read.file).name, read.line) == ("small.py", line_of(SMALL, "if float(loss) > 1e6:  # a host read "
                                                                             "inside the step: XLA's .item() trap"))
    assert read.op == "float(tensor)" and read.steps == [0, 1, 2, 3]
    assert all(g.host_reads for g in report.steps)


def test_the_examples_canary_audits_with_only_adamws_constants_its_batch_outside_the_step():
    """examples/own-model: its batch(i) reads `starts.tolist()` on the host; the runner makes
    the batch before the step, and so does the audit: no host read. What remains is
    AdamW's (the example's own model.py, configure_optimizer) at model.py's optimizer.step()."""
    result = audit_cli(f"{EXAMPLE}:canary", "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    findings = report["findings"]
    model_py = EXAMPLE.parent / "model.py"
    line = line_of(model_py, "optimizer.step()", after="def train_step")
    assert findings and {f["kind"] for f in findings} == {"varying_constant"}, findings
    assert {(Path(f["file"]).name, f["line"]) for f in findings} == {("model.py", line)}
    assert all(f["via"].startswith("torch/optim/adam") for f in findings)
    assert all(s["host_reads"] == 0 for s in report["steps"])


@pytest.mark.torch_agnostic
@pytest.mark.parametrize("name, says", [
    ("bad_name", "name='a/b'"),
    ("not_optimized", "is not one the optimizer updates"),
    ("raising", "raised RuntimeError: the config file is missing"),
])
def test_a_canary_that_does_not_load_is_one_line_exit_2(name: str, says: str):
    result = audit_cli(f"{SMALL}:{name}")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("canary_harness.audit: error: ") and says in lines[0], lines[0]


def test_load_step_refuses_a_canary_that_does_not_load():
    with pytest.raises(AuditError, match="name='a/b'"):
        load_step(f"{SMALL}:bad_name")


def test_a_canary_under_xla_is_placed_on_the_device_and_agrees():
    """--xla: NAME() takes no device argument, and need not: the audit places the canary's
    model on torch_xla's device and moves each batch there, as `run --device xla` does.
    Without torch_xla (Debian's torch 1.13): exit 2, one line."""
    result = subprocess.run([sys.executable, "-m", "canary_harness.audit", f"{SMALL}:sgd", "--xla", "--json"],
                            capture_output=True, text=True, timeout=600, cwd=HERE,
                            env={**os.environ, "PJRT_DEVICE": "CPU",
                                 "PYTHONPATH": PACKAGE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    if importlib.util.find_spec("torch_xla") is None:
        assert result.returncode == 2 and "--xla: torch_xla is not installed" in result.stderr, result.stderr
        return
    assert result.returncode == 0, result.stdout + result.stderr
    xla = json.loads(result.stdout)["xla"]
    assert xla["agrees"] and xla["xla"]["stable"] and not xla["xla"]["host_reads"], xla
    assert [s["uncached_compiles"] for s in xla["steps"]][2:] == [0, 0]
