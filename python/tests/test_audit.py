"""The compile-stability audit of a user's own PyTorch step (`canary_harness.audit`), and the
Recorder's /compile group: each trap found at the user's line, the safe forms and the
PyTorch canary lane clean, bad input exit 2 with one line, /compile accepted and judged by
the C++ harness, and auditing changes no number."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import canary_harness
from canary_harness import ReceiptReader, ReceiptWriter
from canary_harness.audit import AuditError, StepError, audit_step, fingerprint_value, load_step
from canary_harness.runs.pack_step import CanaryStep
from canary_harness.models import gpt2
from canary_harness.pack import read_pack
from canary_harness.receipts.schema import HASH_FAMILIES, SKETCH_FAMILIES, SKETCH_WIDTH
from canary_harness.receipts.stack import StackInfo
from canary_harness.torch import Recorder

from conftest import export_pack, run_harness

CASES = Path(__file__).resolve().parent / "audit_cases"
PACKAGE_ROOT = str(Path(canary_harness.__file__).resolve().parents[1])
STEPS = 5
# torch 2.x's zero_grad() sets gradients to None by default; 1.13's zeroes them in place,
# which step 0 (no gradient yet) does not do: there step 0 is another graph than step 1.
ZERO_GRAD_IN_PLACE = int(torch.__version__.split(".")[0]) < 2


def line_of(case: str, marker: str) -> int:
    """The line of `case` that carries the comment `# MARKER`."""
    lines = (CASES / case).read_text().splitlines()
    return next(i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}"))


def audit(case: str, steps: int = 4):
    return audit_step(load_step(f"{CASES / case}"), steps, target=case)


def only(findings, kind):
    found = [f for f in findings if f.kind == kind]
    assert found, (kind, [(f.kind, f.op, f.location) for f in findings])
    return found


def python(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, env=full_env,
                          cwd=cwd)


# ---- the traps, each at the user's line ---------------------------------------------------------

def test_torch_adamw_step_size_is_a_varying_constant_and_its_host_step_counter_no_host_read():
    """torch.optim.AdamW keeps its step counter in host memory (torch.tensor(0.0), no device:
    on an accelerator too, unless capturable or fused), so its .item() is no device read, on
    1.13 and 2.x alike; the bias-corrected step size it computes from it is a Python number
    passed to the update, a new constant every step, found at the user's optimizer line."""
    report = audit("adamw_host_step.py:make_step")
    line = line_of("adamw_host_step.py", "OPTIMIZER_LINE")
    assert not [f for f in report.findings if f.kind == "host_read"]
    constants = only(report.findings, "varying_constant")
    assert {(Path(f.file).name, f.line) for f in constants} == {("adamw_host_step.py", line)}
    assert all(f.via.startswith("torch/optim/") for f in constants)  # adamw.py on 1.13, adam.py on 2.x
    # -lr / (1 - beta1^t), compared from step 2 on: step 0 creates AdamW's state (another graph, the warm-up)
    step_size = next(f for f in constants if f.op == "aten.addcdiv_")
    assert step_size.step == 2 and step_size.steps == [2, 3] and step_size.places == 4
    assert step_size.values == pytest.approx([-1e-3 / (1 - 0.9**2), -1e-3 / (1 - 0.9**3)])
    assert not [f for f in report.findings if f.kind in ("graph_change", "dynamic_shape")]
    assert not report.clean


def test_an_lr_schedule_fed_as_a_python_float_is_a_varying_constant_with_both_values():
    report = audit("lr_float_step.py:make_step")
    (finding,) = report.findings
    assert (Path(finding.file).name, finding.line) == ("lr_float_step.py", line_of("lr_float_step.py", "LR_LINE"))
    lr = [0.1 * (1.0 - i / 10) for i in range(4)]
    if ZERO_GRAD_IN_PLACE:  # step 0, the warm-up, is another graph (no gradient to zero): from step 2 on
        assert (finding.kind, finding.op, finding.step) == ("varying_constant", "aten.add_.Tensor", 2)
        assert finding.values == [-lr[1], -lr[2]] and finding.steps == [2, 3]  # alpha=-lr, exactly
        assert f"`alpha` = {-lr[1]!r} at step 1 and {-lr[2]!r} at step 2" in finding.message
    else:  # every step one graph: from step 1 on
        assert (finding.kind, finding.op, finding.step) == ("varying_constant", "aten.add_.Tensor", 1)
        assert finding.values == [-lr[0], -lr[1]] and finding.steps == [1, 2, 3]
    assert finding.places == 4  # every parameter, every step
    # with no warm-up step, from step 1 on (and, where step 0 is another graph, that graph change)
    early = audit_step(load_step(f"{CASES / 'lr_float_step.py'}:make_step"), 3, warmup=0).findings
    changes = [("graph_change", 1)] if ZERO_GRAD_IN_PLACE else []
    assert [(f.kind, f.step) for f in early] == changes + [("varying_constant", 1)]
    assert early[-1].values == [-lr[0], -lr[1]] and early[-1].places == 4


def test_loss_item_inside_the_step_is_a_host_read_at_that_line():
    report = audit("item_step.py:make_step")
    (finding,) = report.findings
    assert (finding.kind, finding.op, finding.step, finding.steps) == ("host_read", "Tensor.item()", 0, [0, 1, 2, 3])
    assert (Path(finding.file).name, finding.line) == ("item_step.py", line_of("item_step.py", "ITEM_LINE"))
    assert all(len(g.graphs) == 2 for g in report.steps)  # the read cuts every step in two


def test_a_nonzero_mask_is_a_dynamic_shape():
    report = audit("nonzero_step.py:make_step")
    (finding,) = only(report.findings, "dynamic_shape")
    assert (finding.op, finding.step) == ("aten.nonzero", 0)
    assert (Path(finding.file).name, finding.line) == ("nonzero_step.py", line_of("nonzero_step.py", "NONZERO_LINE"))


def test_a_batch_size_ramp_is_a_graph_change_at_the_step_it_grows():
    report = audit("batch_ramp_step.py:make_step")
    (finding,) = report.findings
    assert (finding.kind, finding.step) == ("graph_change", 2)
    assert "float32[8, 6]" in finding.values[0] and "float32[16, 6]" in finding.values[1]
    fingerprints = [g.fingerprint for g in report.steps]
    assert fingerprints[2] != fingerprints[1] and fingerprints[3] == fingerprints[2]


def test_without_a_warmup_step_0_counts_too():
    """On 1.13 step 0's zero_grad() finds no gradient to zero: warmup=0 reports it as a graph
    change at step 1. On 2.x zero_grad() sets gradients to None: every step one graph."""
    report = audit_step(load_step(f"{CASES / 'item_step.py'}:make_step"), 3, warmup=0)
    changes = [("graph_change", 1)] if ZERO_GRAD_IN_PLACE else []
    assert [(f.kind, f.step) for f in report.findings if f.kind == "graph_change"] == changes


# ---- the safe forms: clean ----------------------------------------------------------------------

@pytest.mark.parametrize("function", ["safe_adamw", "safe_clip", "safe_lr", "safe_loss", "safe_mask", "safe_batch"])
def test_the_same_steps_written_the_safe_way_are_clean(function: str):
    report = audit(f"safe_steps.py:{function}")
    assert report.clean, report.format()
    assert len({g.fingerprint for g in report.steps[1:]}) == 1  # one graph from step 1 on


def test_the_pytorch_canary_lane_step_is_clean(micro_pack: Path):
    result = python("-m", "canary_harness.audit", f"{CASES / 'canary_lane.py'}:lane_step", "--steps", "3",
                    env={"CANARY_AUDIT_PACK": str(micro_pack)})  # the pack's 3 batches
    assert result.returncode == 0, result.stdout + result.stderr
    assert "result      clean" in result.stdout
    # bf16 autocast with a fault hook, in process: the same graph every step, from step 0 on
    step = CanaryStep.from_pack(str(micro_pack), precision="bf16", inject_fault="step=1,op=blocks.0.attn.proj,ulps=2")
    report = audit_step(step, 3)
    assert report.clean, report.format()
    assert len({g.fingerprint for g in report.steps}) == 1 and all(len(g.graphs) == 1 for g in report.steps)


# ---- the command ---------------------------------------------------------------------------------

def test_the_command_exits_1_with_a_report_and_json_keys():
    target = f"{CASES / 'adamw_host_step.py'}:make_step"
    text = python("-m", "canary_harness.audit", target, "--steps", "3")
    assert text.returncode == 1, text.stderr
    assert "FINDING     varying_constant at " in text.stdout and "result      " in text.stdout
    result = python("-m", "canary_harness.audit", target, "--steps", "3", "--json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"target", "torch", "clean", "warmup", "steps", "findings"}
    assert report["clean"] is False and report["warmup"] == 1 and len(report["steps"]) == 3
    assert set(report["steps"][0]) == {"step", "fingerprint", "ops", "host_reads", "graphs"}
    assert set(report["steps"][0]["graphs"][0]) == {"fingerprint", "ops"}
    finding = report["findings"][0]
    assert set(finding) == {"kind", "step", "op", "location", "file", "line", "via", "values", "steps", "places",
                            "message"}
    assert finding["location"].endswith(f"adamw_host_step.py:{line_of('adamw_host_step.py', 'OPTIMIZER_LINE')}")
    clean = python("-m", "canary_harness.audit", f"{CASES / 'safe_steps.py'}:safe_lr", "--json")
    assert clean.returncode == 0 and json.loads(clean.stdout)["findings"] == []


@pytest.mark.torch_agnostic
def test_bad_input_is_exit_2_with_one_line(tmp_path: Path):
    bad = CASES / "bad_steps.py"
    raise_line = line_of("bad_steps.py", "RAISE_LINE")
    cases = [
        ([f"{tmp_path / 'absent.py'}:make_step"], r"absent.py: no such file"),
        ([f"{bad}:absent"], r"bad_steps.py: has no function 'absent' \(its functions: maker_raises, "),
        ([f"{bad}:NOT_A_FUNCTION"], r"bad_steps.py:NOT_A_FUNCTION: is an int, not a function"),
        ([f"{bad}:returns_a_number"], r"returns_a_number\(\) returned an int, not a step function step\(i\)"),
        ([f"{bad}:maker_raises"], r"maker_raises\(\) raised RuntimeError: no data directory"),
        ([f"{bad}:step_raises"], rf"step_raises: step 1 raised ValueError: batch 1 is missing \(at .*bad_steps.py:"
                                 rf"{raise_line}\)"),
        ([str(bad)], r"give FILE.py:FUNCTION"),
        ([f"{bad}:step_raises", "--steps", "1"], r"--steps: '1' is not a number in 2..10000"),
        ([f"{bad}:step_raises", "--bogus"], r"unrecognized arguments: --bogus"),
    ]
    broken = tmp_path / "broken.py"
    broken.write_text("def make_step(:\n")
    cases.append(([f"{broken}:make_step"], r"broken.py: cannot import it: SyntaxError at line 1"))
    for args, pattern in cases:
        result = python("-m", "canary_harness.audit", *args)
        assert result.returncode == 2, (args, result.returncode, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("canary_harness.audit: error: "), (args, result.stderr)
        assert re.search(pattern, lines[0]), (args, lines[0])
        assert result.stdout == ""


def test_the_api_raises_one_line_errors():
    with pytest.raises(StepError, match=r"step 1 raised ValueError: batch 1 is missing"):
        audit("bad_steps.py:step_raises")
    with pytest.raises(AuditError, match="steps=1: audit at least 2 steps"):
        audit_step(lambda i: None, 1)
    with pytest.raises(AuditError, match="not a function"):
        audit_step(3)
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    assert _get_current_dispatch_mode() is None  # the modes are left, whatever happened


# ---- /compile: the Recorder's fingerprints and counters --------------------------------------------

def lane(*args: str) -> subprocess.CompletedProcess:
    result = python("-m", "canary_harness.lane", "--threads", "1", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def lane_runs(harness_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = tmp_path_factory.mktemp("audit")
    pack = export_pack(harness_bin, d / "pack.h5", steps=STEPS)
    plain, audited = d / "plain.h5", d / "audited.h5"
    lane("--pack", str(pack), "--out", str(plain))
    result = lane("--pack", str(pack), "--out", str(audited), "--audit")
    return {"dir": d, "pack": pack, "plain": plain, "audited": audited, "stdout": result.stdout}


def test_the_lane_with_audit_records_a_stable_compile_group(lane_runs: dict, harness_bin: Path):
    run_harness(harness_bin, "validate", str(lane_runs["audited"]))
    assert "audit       clean: 1 graph compiled over 5 steps" in lane_runs["stdout"]
    with h5py.File(lane_runs["audited"], "r") as f:
        group = {name: f["compile"][name][()] for name in f["compile"]}
        assert set(group) == {"UncachedCompile", "CachedCompile", "HostSync", "Fingerprint"}
        for name, values in group.items():
            assert values.dtype == np.float64 and values.shape == (STEPS,), name
            assert f["compile"][name].fletcher32, name
        assert list(group["UncachedCompile"]) == [1, 0, 0, 0, 0]  # compiled at step 0, never again
        assert list(group["CachedCompile"]) == [0, 1, 1, 1, 1]
        assert list(group["HostSync"]) == [0] * STEPS
        assert len(set(group["Fingerprint"])) == 1 and 0 < group["Fingerprint"][0] < 2**53
        assert group["Fingerprint"][0] == int(group["Fingerprint"][0])
        assert f["manifest"].attrs["audit"] == 1
    with h5py.File(lane_runs["plain"], "r") as f:
        assert "compile" not in f and "audit" not in f["manifest"].attrs  # off: the receipt as before


def test_auditing_changes_no_number(lane_runs: dict):
    def datasets(path):
        out = {}
        with h5py.File(path, "r") as f:
            for root in ("steps", "hashes", "sketches"):
                f[root].visititems(lambda name, obj: out.__setitem__(f"{root}/{name}", obj[()])
                                   if isinstance(obj, h5py.Dataset) else None)
        return out

    plain, audited = datasets(lane_runs["plain"]), datasets(lane_runs["audited"])
    assert plain.keys() == audited.keys()
    for name in plain:
        assert plain[name].dtype == audited[name].dtype and plain[name].tobytes() == audited[name].tobytes(), name


def test_the_harness_judges_the_compile_stability_of_torch_receipts(lane_runs: dict, harness_bin: Path,
                                                                    tmp_path: Path):
    same = run_harness(harness_bin, "compare", str(lane_runs["audited"]), str(lane_runs["plain"]))
    assert "PASS  compile_stability.uncached_compiles" in same.stdout
    assert "PASS  compile_stability.host_syncs" in same.stdout

    # A user's loop with torch.optim.AdamW and a loss.item() inside the step, recorded with
    # audit=True: a host read every step, a new graph every step (AdamW's step size);
    # `harness compare` fails both.
    pack = read_pack(lane_runs["pack"])
    cfg = gpt2.CanaryConfig.from_json(pack.canary_json)
    model = gpt2.GPT2(cfg, pack.init)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.peak_lr, betas=(cfg.beta1, cfg.beta2))
    out = tmp_path / "adamw.h5"
    recorder = Recorder(out, model, optimizer, pack=pack, budget_features="torch-cpu", audit=True)
    losses = []
    for step in range(pack.steps):
        tokens = pack.batch(step)
        loss = model(torch.from_numpy(tokens))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        losses.append(loss.item())  # LOSS_READ
        optimizer.step()
        recorder.step(loss=loss, grad_norm=norm, batch=tokens)
        optimizer.zero_grad()
    recorder.close()
    findings = recorder.audit.findings
    reads = [f for f in findings if f.kind == "host_read"]
    assert reads and Path(reads[0].file).name == "test_audit.py"
    assert Path(__file__).read_text().splitlines()[reads[0].line - 1].rstrip().endswith("# LOSS_READ")
    assert any(f.kind == "varying_constant" for f in findings)
    run_harness(harness_bin, "validate", str(out))
    with ReceiptReader(out) as r:
        assert all(v > 0 for v in r.read("/compile/HostSync"))
        assert all(v >= 1 for v in r.read("/compile/UncachedCompile"))  # a new graph every step
        assert len(set(r.read("/compile/Fingerprint"))) == STEPS
    judged = run_harness(harness_bin, "compare", str(out), str(lane_runs["audited"]), check=False)
    assert judged.returncode == 1, judged.stdout + judged.stderr
    assert "FAIL  compile_stability.host_syncs" in judged.stdout
    assert "FAIL  compile_stability.uncached_compiles" in judged.stdout


def test_the_recorder_leaves_its_modes_on_an_error(micro_pack: Path, tmp_path: Path):
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    step = CanaryStep.from_pack(str(micro_pack))
    with pytest.raises(RuntimeError, match="boom"):
        with Recorder(tmp_path / "r.h5", step.model, step.optimizer, pack=step.pack, budget_features="torch-cpu",
                      audit=True) as recorder:
            loss, norm, lr, tokens = step(0)
            recorder.step(loss=loss, grad_norm=norm, lr=lr, batch=tokens)
            raise RuntimeError("boom")
    assert _get_current_dispatch_mode() is None
    with ReceiptReader(tmp_path / "r.h5") as r:
        assert r.steps_recorded == 1 and list(r.read("/compile/UncachedCompile")) == [1.0]


def test_fingerprint_value_is_the_top_53_bits():
    assert fingerprint_value("ffffffffffffffff") == float(2**53 - 1)
    assert fingerprint_value("0000000000000800") == 1.0


# ---- /compile in the writer ------------------------------------------------------------------------

def test_the_writer_records_compile_counters_at_every_step_or_none(tmp_path: Path):
    names = ["wte", "lnf.bias"]
    stack = StackInfo(toolchain="test", libraries="test", host="test", cpu="test", kernels="none")
    manifest = {"lane": "unit/torch", "engine": "torch", "budget_features": "torch-cpu", "seed": 7,
                "canary": {"preset": "unit"}, "steps_planned": 3}
    row = {"hashes": {fam: [1, 2] for fam in HASH_FAMILIES},
           "sketches": {fam: [(1.0, np.zeros(SKETCH_WIDTH))] * 2 for fam in SKETCH_FAMILIES},
           "loss": 1.0, "grad_norm": 1.0, "lr": 1e-3, "batch_hash": 5}
    with ReceiptWriter(tmp_path / "late.h5", manifest, names, stack=stack) as w:
        w.append_step(**row)
        with pytest.raises(ValueError, match="start at step 0"):
            w.append_step(**row, compile={"HostSync": 0})
    with ReceiptWriter(tmp_path / "c.h5", manifest, names, stack=stack) as w:
        w.append_step(**row, compile={"UncachedCompile": 1, "HostSync": 0})
        with pytest.raises(ValueError, match="not step 0's"):
            w.append_step(**row, compile={"UncachedCompile": 0})
        with pytest.raises(ValueError, match="pass compile= at every step"):
            w.append_step(**row)
        with pytest.raises(ValueError, match="not a number"):
            w.append_step(**row, compile={"UncachedCompile": "0", "HostSync": 0})
        w.append_step(**row, compile={"UncachedCompile": 0, "HostSync": 2})
        w.append_step(**row, compile={"UncachedCompile": 0, "HostSync": 0})
    with ReceiptReader(tmp_path / "c.h5") as r:
        assert r.complete and list(r.read("/compile/HostSync")) == [0.0, 2.0, 0.0]
        assert list(r.read("/compile/UncachedCompile")) == [1.0, 0.0, 0.0]
