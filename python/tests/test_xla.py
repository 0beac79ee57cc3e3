"""--device xla for real: the PyTorch lane and Python canaries under torch_xla (PJRT's CPU
client here), torch_xla's own per-step counters in /compile, gated by the harness
(docs/xla.md). On an interpreter without torch_xla (Debian's torch 1.13) the same commands
are refused in one line, exit 2, no file: asserted per interpreter, never skipped."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pytest

import canary_harness
from canary_harness import ReceiptReader

from conftest import assert_rounding_at_first_module, budgets_tightened, export_pack, run_harness

HAS_XLA = importlib.util.find_spec("torch_xla") is not None
STEPS = 3
PACKAGE_ROOT = str(Path(canary_harness.__file__).resolve().parents[1])
SMALL = Path(__file__).resolve().parent / "own_canaries" / "small.py"


def harness_python(module: str, *args: str, check: bool = True, env: Optional[Dict[str, str]] = None) \
        -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "PJRT_DEVICE": "CPU", **(env or {})}
    result = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=600, env=env)
    if check and result.returncode != 0:
        pytest.fail(f"{module} {' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}",
                    pytrace=False)
    return result


def counters(path: Path) -> Dict[str, List[float]]:
    with ReceiptReader(path) as r:
        return {name: list(r.read(f"/compile/{name}")) for name in
                ("UncachedCompile", "CachedCompile", "ExecuteComputation", "HostSync", "PersistentCacheMiss",
                 "PersistentCacheHit", "PersistentCacheDeserializeFailure")}


@pytest.fixture(scope="module")
def lanes(harness_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Dict[str, Path]]:
    """tiny and llama-tiny for STEPS steps: the pack, cpu-ref's receipt and the xla lane's,
    with op traces as the nightly's lanes record them; tiny's eager lane too."""
    if not HAS_XLA:
        return {}
    d = tmp_path_factory.mktemp("xla")
    runs = {}
    for canary in ("tiny", "llama-tiny"):
        pack = export_pack(harness_bin, d / f"{canary}-pack.h5", canary=canary, steps=STEPS)
        cpu, xla = d / f"{canary}-cpu.h5", d / f"{canary}-xla.h5"
        run_harness(harness_bin, "run", "--canary", canary, "--steps", str(STEPS), "--out", str(cpu))
        harness_python("canary_harness.lane", "--pack", str(pack), "--device", "xla", "--trace", "ops", "--out", str(xla))
        runs[canary] = {"pack": pack, "cpu": cpu, "xla": xla}
    runs["tiny"]["eager"] = d / "tiny-eager.h5"
    harness_python("canary_harness.lane", "--pack", str(runs["tiny"]["pack"]), "--trace", "ops",
                   "--out", str(runs["tiny"]["eager"]))
    return runs


@pytest.mark.parametrize("canary", ["tiny", "llama-tiny"])
def test_xla_lane_compiles_once_and_is_within_torch_xla_of_cpu_ref(canary: str, lanes: dict, harness_bin: Path,
                                                                    tmp_path: Path):
    if not HAS_XLA:
        pack = export_pack(harness_bin, tmp_path / "pack.h5", canary=canary, steps=STEPS)
        out = tmp_path / "xla.h5"
        result = harness_python("canary_harness.lane", "--pack", str(pack), "--device", "xla", "--out", str(out),
                                check=False)
        assert result.returncode == 2 and "--device xla: torch_xla is not importable" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()
        return
    run = lanes[canary]
    validated = run_harness(harness_bin, "validate", str(run["xla"]), "--json")
    assert json.loads(validated.stdout)["unknown"] == []
    with ReceiptReader(run["xla"]) as r:
        m = r.manifest
        assert (m["lane"], m["budget_features"], m["device"]) == (f"{canary}/torch+xla", "torch-xla", "xla:0")
        assert "pjrt=CPU" in m["kernels"] and f"xla_cpu_cores={len(os.sched_getaffinity(0))}" in m["kernels"]
        assert "PJRT_DEVICE=CPU" in m["toolchain"] and "torch_xla 2." in m["libraries"]
    # the real compiler's counters: the step's one graph compiled at step 0, found cached after
    c = counters(run["xla"])
    assert c["UncachedCompile"] == [1.0] + [0.0] * (STEPS - 1)
    assert c["CachedCompile"] == [0.0] + [1.0] * (STEPS - 1)
    assert c["ExecuteComputation"] == [1.0] * STEPS and c["HostSync"] == [0.0] * STEPS
    judged = run_harness(harness_bin, "compare", str(run["xla"]), str(run["cpu"]))  # exit 0: within torch-xla
    assert "torch-xla" in judged.stdout and "PASS  compile_stability.uncached_compiles" in judged.stdout


def test_an_xla_lane_is_captured_at_its_module_outputs_and_never_op_by_op() -> None:
    """XLA runs a step's aten ops as one graph when the step ends: the op oracle's capture of
    an XLA lane is at its module outputs (capture-ops' default there), and --level aten is
    refused in one line. The rule is the package's, the same on every interpreter."""
    from canary_harness.runs.canary import CanaryError
    from canary_harness.runs.replay import _capture_level
    from canary_harness.runs.runner import RunOptions

    assert _capture_level("r.h5", RunOptions(out="r.h5", device="xla"), None) == "modules"
    assert _capture_level("r.h5", RunOptions(out="r.h5", device="cpu"), None) == "aten"
    assert _capture_level("r.h5", RunOptions(out="r.h5", device="cpu"), "modules") == "modules"
    with pytest.raises(CanaryError, match="ran on XLA, whose aten ops run as one compiled graph"):
        _capture_level("r.h5", RunOptions(out="r.h5", device="xla"), "aten")
    assert _capture_level("r.h5", RunOptions(out="r.h5", compile=True), None) == "modules"  # Inductor's graphs too
    with pytest.raises(CanaryError, match="is a compiled run"):
        _capture_level("r.h5", RunOptions(out="r.h5", compile=True), "aten")


# Per canary: the module classes judged, and how many results: tiny's embedding, lnf, LM head
# and loss and 10 in each of 4 blocks (two layer norms, four Linears, two residual adds, the
# attention core, GELU); llama-tiny's embedding, final norm, LM head and loss and 15 in each of
# 4 blocks (two norms, two RoPEs, seven Linears, two residual adds, the attention core, SwiGLU).
JUDGED_MODULES = {"tiny": ({"Embedding", "LayerNorm", "Linear", "Residual", "LmHead", "Attention", "GELU", "Loss"},
                           4 + 10 * 4),
                  "llama-tiny": ({"Embedding", "RMSNorm", "Rope", "Linear", "Residual", "Attention", "SwiGLU", "Loss"},
                                 4 + 15 * 4)}


@pytest.mark.parametrize("canary", sorted(JUDGED_MODULES))
def test_precision_judges_an_xla_lane_at_its_module_outputs(canary: str, lanes: dict, harness_bin: Path,
                                                            monkeypatch) -> None:
    """The XLA lane replayed from its pack (built on the XLA device, as the lane built it:
    once built on the CPU and moved, its optimizer's state stayed behind and a step did not
    end in minutes) and its last step judged at its module outputs: within, every judged
    module class present; --level aten refused in one line."""
    if not HAS_XLA:
        return  # the lane cannot run here: test_xla_lane_compiles_once... asserts its refusal
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    run = lanes[canary]
    result = run_harness(harness_bin, "precision", str(run["xla"]), "--step", str(STEPS - 1), "--pack", str(run["pack"]),
                         "--json", check=False)
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["verdict"] == "within", report["over"][:3]
    assert report["lane"] == f"{canary}/torch+xla"
    classes, count = JUDGED_MODULES[canary]
    assert {j["op"] for j in report["judged"]} == classes and len(report["judged"]) == count
    if canary != "tiny":
        return
    refused = run_harness(harness_bin, "precision", str(run["xla"]), "--step", "1", "--pack", str(run["pack"]),
                          "--level", "aten", check=False)
    assert refused.returncode == 2 and "ran on XLA" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_bisect_judges_torch_eager_against_torch_xla_at_their_first_divergent_module_output(
        lanes: dict, harness_bin: Path, tmp_path: Path, monkeypatch) -> None:
    """tiny's eager lane and its torch_xla lane, under budgets a millionth of [torch-cpu]'s
    and [torch-xla]'s, part at step 0: bisect finds the first divergent module output in the
    lanes' own traces (the first layer norm: XLA fuses its reductions otherwise), replays
    that step of each side (torch_xla's with its trace, as it ran: the trace's tensors are
    outputs of the step's graph) and judges the module on each side's own inputs: both
    within their bounds, rounding."""
    if not HAS_XLA:
        return  # the lane cannot run here: test_xla_lane_compiles_once... asserts its refusal
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    run = lanes["tiny"]
    tight = budgets_tightened(tmp_path / "tight.toml", ("torch-cpu", "torch-xla"), 1e-6)
    assert_rounding_at_first_module(harness_bin, run["eager"], run["xla"], run["pack"], tight, "blocks.0.ln1")


def test_a_second_process_finds_the_persistent_cache_entry(lanes: dict, harness_bin: Path, tmp_path: Path):
    """--compile-cache DIR: the first process misses and writes the step's executable, the
    second finds it. torch_xla 2.9 cannot load an executable on PJRT's CPU client
    (UNIMPLEMENTED: "Deserializing serialized executable not supported", pytorch/xla#9094),
    so the second process counts a deserialize failure and compiles again: the receipt says
    so, and the bits are the first process's. A corrupt entry is the same failure, handled
    alike. When torch_xla loads them (PersistentCacheHit 1, UncachedCompile 0), this test
    fails and docs/xla.md changes with it."""
    cache = tmp_path / "cache"
    if not HAS_XLA:
        pack = export_pack(harness_bin, tmp_path / "pack.h5", canary="micro", steps=STEPS)
        result = harness_python("canary_harness.lane", "--pack", str(pack), "--compile-cache", str(cache),
                                "--out", str(tmp_path / "r.h5"), check=False)
        assert result.returncode == 2 and "--compile-cache: only --device xla" in result.stderr
        assert not cache.exists() and not (tmp_path / "r.h5").exists()
        return
    pack = lanes["tiny"]["pack"]
    receipts = [tmp_path / f"run{i}.h5" for i in range(3)]
    for i, out in enumerate(receipts):
        if i == 2:  # every entry truncated: a corrupt cache
            for entry in cache.iterdir():
                entry.write_bytes(entry.read_bytes()[:100])
        harness_python("canary_harness.lane", "--pack", str(pack), "--device", "xla", "--compile-cache", str(cache),
                       "--out", str(out))
        if i == 0:
            assert len(list(cache.iterdir())) == 2  # the graph that makes the initial state device data, the step's
    first, second, corrupt = (counters(r) for r in receipts)
    assert first["PersistentCacheMiss"] == [1.0, 0.0, 0.0] and first["UncachedCompile"] == [1.0, 0.0, 0.0]
    for later in (second, corrupt):
        assert later["PersistentCacheMiss"] == [0.0] * STEPS  # the entry is found ...
        assert later["PersistentCacheDeserializeFailure"] == [1.0, 0.0, 0.0]  # ... and cannot be loaded
        assert later["PersistentCacheHit"] == [0.0] * STEPS and later["UncachedCompile"] == [1.0, 0.0, 0.0]
    for later in receipts[1:]:
        run_harness(harness_bin, "compare", str(later), str(receipts[0]))  # bitwise: same platform, same graph


def test_a_weight_scale_regression_is_data_to_the_steps_one_graph(lanes: dict, harness_bin: Path, tmp_path: Path):
    """`harness power`'s weight-scale on the XLA lane, with --audit (whose dispatch mode once
    failed on autograd's device thread, where XLA's backward runs: "call stack is not deep
    enough"): the scaled weight is made device data between the steps, so the step stays one
    graph (one compile at step 0, none after) and the run moves from the regression's step."""
    fault = "kind=weight-scale,step=1,tensor=blocks.0.attn.qkv.weight,by=0.001"
    out = tmp_path / "scaled.h5"
    if not HAS_XLA:
        pack = export_pack(harness_bin, tmp_path / "pack.h5", canary="tiny", steps=STEPS)
        result = harness_python("canary_harness.lane", "--pack", str(pack), "--device", "xla", "--audit",
                                "--inject-fault", fault, "--out", str(out), check=False)
        assert result.returncode == 2 and "--device xla: torch_xla is not importable" in result.stderr
        assert not out.exists()
        return
    harness_python("canary_harness.lane", "--pack", str(lanes["tiny"]["pack"]), "--device", "xla", "--audit",
                   "--inject-fault", fault, "--out", str(out))
    c = counters(out)
    assert c["UncachedCompile"] == [1.0] + [0.0] * (STEPS - 1) and c["HostSync"] == [0.0] * STEPS
    with ReceiptReader(out) as scaled, ReceiptReader(lanes["tiny"]["xla"]) as clean:
        losses, clean_losses = list(scaled.read("/steps/loss")), list(clean.read("/steps/loss"))
    assert losses[0] == clean_losses[0] and losses[1] != clean_losses[1]


@pytest.mark.parametrize("trap,counter", [("reads_loss_in_step", "HostSync"),
                                          ("varies_batch_shape", "UncachedCompile")])
def test_the_real_compiler_catches_each_trap_and_the_harness_fails_it(trap: str, counter: str, harness_bin: Path,
                                                                       tmp_path: Path):
    """A Python canary whose step reads a value to the host, or changes a tensor's shape with
    the step: torch_xla's own counters show it at every step after the first, and the
    compile-stability gate fails the receipt (checked against itself: the gate is on the run)."""
    out = tmp_path / f"{trap}.h5"
    result = harness_python("canary_harness", "run", f"{SMALL}:{trap}", "--device", "xla", "--steps", "4",
                            "--out", str(out), check=HAS_XLA)
    if not HAS_XLA:
        assert result.returncode == 2 and "--device xla: torch_xla is not importable" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()
        return
    series = counters(out)[counter]
    assert all(v >= 1 for v in series[2:]), series  # torch.optim.AdamW's lazy state: step 1 compiles anyway
    judged = run_harness(harness_bin, "check", str(out), "--golden", str(out), check=False)
    assert judged.returncode == 1, judged.stdout + judged.stderr
    gate = "host_syncs" if counter == "HostSync" else "uncached_compiles"
    assert f"FAIL  compile_stability.{gate}" in judged.stdout


# ---- the audit held to the compiler ---------------------------------------------------------------

CASES = Path(__file__).resolve().parent / "audit_cases"
SAFE = ["safe_adamw", "safe_clip", "safe_lr", "safe_loss", "safe_mask", "safe_batch"]
# Each case: (static stable, static host reads) as the audit predicts, (stable, host reads) as
# torch_xla counts. Where they differ the compiler is right, and docs/xla.md says why:
# torch_xla uploads a Python float passed to an op as device data (no recompile), so a
# varying constant is not one there.
AGREEMENT = {
    "item_step.py:make_step": ((True, True), (True, True)),
    "batch_ramp_step.py:make_step": ((False, False), (False, False)),
    "nonzero_step.py:make_step": ((False, True), (False, True)),
    "lr_float_step.py:make_step": ((False, False), (True, False)),
    "adamw_host_step.py:make_step": ((False, False), (True, False)),
    **{f"safe_steps.py:{name}": ((True, False), (True, False)) for name in SAFE},
    "canary_lane.py:lane_step": ((True, False), (True, False)),
}


def line_of(case: str, marker: str) -> int:
    lines = (CASES / case).read_text().splitlines()
    return next(i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}"))


def audit_steps(case: str) -> int:
    return 3 if case.startswith("canary_lane") else 4  # the micro pack holds 3 batches; 4 is the audit's default


@pytest.fixture(scope="module")
def xla_audit(micro_pack: Path) -> Callable[[str], subprocess.CompletedProcess]:
    """`python3 -m canary_harness.audit CASE --xla --json` of a case, run once per module:
    the tests below read the same runs."""
    done: Dict[str, subprocess.CompletedProcess] = {}

    def audit(case: str) -> subprocess.CompletedProcess:
        if case not in done:
            done[case] = harness_python("canary_harness.audit", f"{CASES / case}", "--xla", "--json", "--steps",
                                        str(audit_steps(case)), check=False, env={"CANARY_AUDIT_PACK": str(micro_pack)})
        return done[case]
    return audit


@pytest.mark.parametrize("case", sorted(AGREEMENT))
def test_every_audit_case_under_torch_xla(case: str, xla_audit: Callable[[str], subprocess.CompletedProcess]):
    """`python3 -m canary_harness.audit CASE --xla --json`: the static verdict and torch_xla's
    real counts, each as the table says; the exit status is the compiler's (0 only where it
    compiled once and read nothing). Without torch_xla: exit 2, one line."""
    result = xla_audit(case)
    if not HAS_XLA:
        assert result.returncode == 2 and "--xla: torch_xla is not installed" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not result.stdout
        return
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(result.stdout)
    (static_stable, static_reads), (stable, reads) = AGREEMENT[case]
    xla = report["xla"]
    assert (xla["static"]["stable"], xla["static"]["host_reads"]) == (static_stable, static_reads), xla
    assert (xla["xla"]["stable"], xla["xla"]["host_reads"]) == (stable, reads), xla
    assert xla["agrees"] is ((static_stable, static_reads) == (stable, reads))
    assert xla["client"] == "CPU" and len(xla["steps"]) == audit_steps(case)
    assert result.returncode == (0 if stable and not reads and report["clean"] else 1)


def test_each_recompile_has_its_cause_and_each_transfer_its_line(xla_audit: Callable[[str], subprocess.CompletedProcess]):
    """The real compiles and transfers, located: the batch ramp's new graph at step 2 starts
    with the 16-row batch; the item's transfer is cut at its line in every step; nonzero's
    shape is read to the host at its line and each new size compiles a graph."""
    if not HAS_XLA:
        return  # the one-line refusal is asserted for every case above
    def run(case: str) -> list:
        result = xla_audit(case)
        assert result.returncode == 1, result.stderr
        return json.loads(result.stdout)["xla"]["steps"]

    ramp = run("batch_ramp_step.py:make_step")
    assert [s["uncached_compiles"] for s in ramp] == [1, 0, 1, 0]
    assert len(ramp[2]["causes"]) == 1 and "f32[16," in ramp[2]["causes"][0] and "f32[8," in ramp[2]["causes"][0]
    item = run("item_step.py:make_step")
    for s in item:
        assert s["host_syncs"] == 1 and len(s["cuts"]) == 1
        assert s["cuts"][0].endswith(f"item_step.py:{line_of('item_step.py', 'ITEM_LINE')})"), s["cuts"]
    nonzero = run("nonzero_step.py:make_step")
    line = line_of("nonzero_step.py", "NONZERO_LINE")
    assert all(s["host_syncs"] >= 1 and s["cuts"][0].endswith(f"nonzero_step.py:{line})") for s in nonzero)
    assert any(s["uncached_compiles"] >= 1 and f"nonzero_step.py:{line}" in " ".join(s["causes"]) for s in nonzero[1:])


def test_a_step_maker_without_a_device_argument_is_named(tmp_path: Path):
    maker = tmp_path / "old_style.py"
    maker.write_text("import torch\n\ndef make_step():\n    return lambda i: None\n")
    result = harness_python("canary_harness.audit", f"{maker}:make_step", "--xla", check=False)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    if HAS_XLA:
        assert "--xla calls make_step(device), and make_step() takes no argument" in result.stderr
    else:
        assert "--xla: torch_xla is not installed" in result.stderr
