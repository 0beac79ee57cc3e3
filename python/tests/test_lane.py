"""`python3 -m canary_harness.lane`: the PyTorch canary lane, held to cpu-ref and to the
receipt contract, and every bad input exit 2 with one line and no file."""

from __future__ import annotations

import json

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from canary_harness.runs.distributed import fsdp_available
from canary_harness import ReceiptReader
from canary_harness.runs.pack_step import train_step
from canary_harness.models import gpt2
from canary_harness.runs.optim import CanaryAdamW
from canary_harness.pack import read_pack

from conftest import assert_rounding_at_first_module, budgets_tightened, export_pack, run_harness, run_module
from host_reads import HostReads

STEPS = 5
HAS_FSDP = fsdp_available()


def lane(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run_module("canary_harness.lane", *args, check=check)


@pytest.fixture(scope="module")
def runs(harness_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """micro for STEPS steps: the pack, cpu-ref's receipt, and the torch lane in fp32 and bf16."""
    d = tmp_path_factory.mktemp("lane")
    pack = export_pack(harness_bin, d / "pack.h5", steps=STEPS)
    cpu = d / "cpu-ref.h5"
    run_harness(harness_bin, "run", "--canary", "micro", "--steps", str(STEPS), "--out", str(cpu))
    fp32, bf16 = d / "torch.h5", d / "torch-bf16.h5"
    lane("--pack", str(pack), "--out", str(fp32), "--threads", "1")
    lane("--pack", str(pack), "--out", str(bf16), "--precision", "bf16", "--threads", "1")
    return {"dir": d, "pack": pack, "cpu": cpu, "fp32": fp32, "bf16": bf16}


def test_fp32_lane_is_a_valid_receipt_that_reproduces_cpu_ref(runs: dict, harness_bin: Path):
    validated = run_harness(harness_bin, "validate", str(runs["fp32"]), "--json")
    assert json.loads(validated.stdout)["unknown"] == []  # every manifest extra of the lane is in the schema
    with ReceiptReader(runs["fp32"]) as r, ReceiptReader(runs["cpu"]) as cpu:
        m = r.manifest
        assert (m["lane"], m["engine"], m["features"], m["budget_features"]) == ("micro/torch", "torch", "", "torch-cpu")
        assert (m["precision"], m["device"], m["fault_injection"], m["threads"]) == ("fp32", "cpu", "none", 1)
        assert r.complete and r.steps_planned == r.steps_recorded == STEPS
        assert m["canary"] == cpu.manifest["canary"] and m["seed"] == cpu.manifest["seed"]
        assert r.tensor_names == cpu.tensor_names
        assert list(r.steps("batch_hash")) == list(cpu.steps("batch_hash"))  # the data contract
        assert list(r.steps("lr")) == list(cpu.steps("lr"))  # the schedule, fp32 bit for bit
        loss, ref = r.steps("loss"), cpu.steps("loss")
        np.testing.assert_allclose(loss, ref, rtol=1e-4)  # the twin's tolerance
        np.testing.assert_allclose(r.steps("grad_norm"), cpu.steps("grad_norm"), rtol=1e-4)
        assert np.max(np.abs(loss - ref) / np.abs(ref)) < 2e-6  # measured 2e-7: fp32 rounding, nothing more
        # not a copy of cpu-ref: a real stack's bits (by step 1 the parameters differ in the last bits)
        assert not np.array_equal(r.hashes("params")[1:], cpu.hashes("params")[1:])


@pytest.fixture(scope="module")
def compiled(runs: dict) -> tuple:
    """The lane under --compile with its op traces, made once: (the child's result, the
    receipt). Torch 1.13 has no compiler: the result is its refusal, no receipt."""
    out = runs["dir"] / "compiled.h5"
    result = lane("--pack", str(runs["pack"]), "--out", str(out), "--threads", "1", "--compile", "--trace", "ops",
                  check=hasattr(torch, "compile"))
    return result, out


def test_compiled_lane_is_within_torch_compile_of_cpu_ref(runs: dict, compiled: tuple, harness_bin: Path):
    """--compile (torch 2.x): lane micro/torch+compile, judged against cpu-ref under torch-cpu
    and torch-compile composed (canaries/budgets.toml). torch 1.13: exit 2, one line, no file."""
    result, out = compiled
    if not hasattr(torch, "compile"):
        assert result.returncode == 2 and "--compile: torch 1.13" in result.stderr and not out.exists()
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        return
    validated = run_harness(harness_bin, "validate", str(out), "--json")
    assert json.loads(validated.stdout)["unknown"] == []
    with ReceiptReader(out) as r:
        m = r.manifest
        assert (m["lane"], m["features"], m["budget_features"], m["compile"]) == \
            ("micro/torch+compile", "compile", "torch-cpu+torch-compile", "inductor")
        assert list(r.steps("batch_hash")) == list(ReceiptReader(runs["cpu"]).steps("batch_hash"))
    run_harness(harness_bin, "compare", str(out), str(runs["cpu"]))  # exit 0: within the composed budget


def test_a_compiled_lane_is_judged_at_its_module_outputs(runs: dict, compiled: tuple, harness_bin: Path) -> None:
    """Inductor's fused kernels have no aten ops a dispatch mode sees: the op oracle captures
    a compiled lane at its module outputs (its default there), the replay compiling again
    with the op trace the lane ran with and reproducing its bits: within, the judged module
    classes as eager's; --level aten refused in one line."""
    if not hasattr(torch, "compile"):
        return  # the lane cannot run here: the test above asserts its refusal
    _, out = compiled
    result = run_harness(harness_bin, "precision", str(out), "--step", str(STEPS - 1), "--pack", str(runs["pack"]),
                         "--json", check=False)
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["verdict"] == "within", report["over"][:3]
    assert {j["op"] for j in report["judged"]} == {"Embedding", "LayerNorm", "Linear", "Residual", "LmHead", "Attention",
                                                    "GELU", "Loss"}
    refused = run_harness(harness_bin, "precision", str(out), "--step", "1", "--pack", str(runs["pack"]),
                          "--level", "aten", check=False)
    assert refused.returncode == 2 and "is a compiled run" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_bisect_judges_torch_eager_against_compiled_at_their_first_divergent_module_output(
        runs: dict, compiled: tuple, harness_bin: Path) -> None:
    """micro's eager lane and its compiled one, under budgets a millionth of [torch-cpu]'s and
    [torch-compile]'s, part at step 0 at the attention core (Inductor fuses its softmax), the
    first module output bisect finds in the lanes' traces: each side replayed (the compiled
    one compiling again with its trace) and the attention core judged on its own q, k and v
    with exp at the stacks' measured worst case: both within their bounds, rounding."""
    if not hasattr(torch, "compile"):
        return  # the compiled lane cannot run here: test_compiled_lane_is_within... asserts its refusal
    eager = runs["dir"] / "eager-traced.h5"
    lane("--pack", str(runs["pack"]), "--out", str(eager), "--threads", "1", "--trace", "ops")
    tight = budgets_tightened(runs["dir"] / "tight.toml", ("torch-cpu", "torch-compile"), 1e-6)
    assert_rounding_at_first_module(harness_bin, eager, compiled[1], runs["pack"], tight, "blocks.0.attn")


def test_inductor_keeps_each_aten_isa_in_a_cache_of_its_own(tmp_path: Path):
    from canary_harness.runs.runner import inductor_cache_of_the_aten_isa

    assert inductor_cache_of_the_aten_isa({"TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}) == {}  # a native run: as it was
    theirs = {"ATEN_CPU_CAPABILITY": "avx2", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    moved = inductor_cache_of_the_aten_isa(theirs)
    assert moved == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "aten-avx2")}
    assert inductor_cache_of_the_aten_isa({**theirs, **moved}) == {}  # once, however often a process compiles
    default = inductor_cache_of_the_aten_isa({"ATEN_CPU_CAPABILITY": "default"})["TORCHINDUCTOR_CACHE_DIR"]
    assert Path(default).name == "aten-default" and Path(default).parent.name.startswith("torchinductor_")


AVX512 = "avx512f" in (Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else "")


@pytest.mark.skipif(not (hasattr(torch, "compile") and AVX512),
                    reason="only an AVX-512 CPU has an ATen ISA below its own that Inductor compiles for")
def test_a_compiled_run_under_aten_avx2_after_a_native_one_runs(runs: dict, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch):
    """On an AVX-512 CPU Inductor compiles for AVX-512 natively and for AVX2 under `aten-avx2`,
    but keyed its caches on neither: the second run loaded the first's kernels and failed in
    them (torch 2.9: "index out of bounds")."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    for isa in ("", "avx2"):
        if isa:
            monkeypatch.setenv("ATEN_CPU_CAPABILITY", isa)
        lane("--pack", str(runs["pack"]), "--out", str(tmp_path / f"compiled{isa}.h5"), "--threads", "1", "--compile")
    assert (tmp_path / "inductor" / "aten-avx2").is_dir()


def test_layout_lanes_are_within_their_budgets_and_fsdp_is_ddp_bit_for_bit(runs: dict, harness_bin: Path):
    """--layout ddp|fsdp --nproc 2: one receipt of the whole batch's data, judged against
    cpu-ref under torch-cpu and torch-ddp (torch-fsdp) composed (canaries/budgets.toml). On
    2 ranks FSDP2's receipt of the lane is DDP's bit for bit: both average the two halves'
    gradients elementwise, and the lane's AdamW is elementwise. fsdp on torch 1.13: exit 2,
    one line, no file."""
    receipts = {}
    for layout in ("ddp", "fsdp"):
        out = runs["dir"] / f"{layout}.h5"
        result = lane("--pack", str(runs["pack"]), "--out", str(out), "--layout", layout, "--nproc", "2",
                      check=layout == "ddp" or HAS_FSDP)
        if layout == "fsdp" and not HAS_FSDP:
            assert result.returncode == 2 and "--layout fsdp: torch 1.13" in result.stderr and not out.exists()
            assert len(result.stderr.strip().splitlines()) == 1, result.stderr
            continue
        validated = run_harness(harness_bin, "validate", str(out), "--json")
        assert json.loads(validated.stdout)["unknown"] == []
        with ReceiptReader(out) as r:
            m = r.manifest
            assert (m["lane"], m["features"], m["budget_features"], m["layout"], m["nproc"]) == \
                (f"micro/torch+{layout}", layout, f"torch-cpu+torch-{layout}", layout, 2)
            assert list(r.steps("batch_hash")) == list(ReceiptReader(runs["cpu"]).steps("batch_hash"))
            receipts[layout] = (r.steps("loss"), r.hashes("params"), r.hashes("adam_v"))
        run_harness(harness_bin, "compare", str(out), str(runs["cpu"]))  # exit 0: within the composed budget
    if "fsdp" in receipts:
        for ddp, fsdp in zip(receipts["ddp"], receipts["fsdp"]):
            assert np.asarray(ddp).tobytes() == np.asarray(fsdp).tobytes()


@pytest.mark.parametrize("canary", ["tiny", "llama-tiny"])
def test_layouts_pass_against_one_process_under_the_shipped_entries(harness_bin: Path, tmp_path: Path, canary: str):
    """The ddp and fsdp lanes of tiny and llama-tiny (30 steps of the canary's own pack: the
    weights its golden starts from, a sample the calibration did not see, and tiny's held-out
    evaluation at step 25) against the one-process lane under canaries/budgets.toml's
    [torch-ddp] and [torch-fsdp] (or the canary's own, [llama-tiny.torch-ddp]): the entries
    from pairs on three emulated hosts hold on this host (issue 47). The fsdp run stopped at its first evaluation before FSDP2's shards were
    gathered for it. 30 steps keep it cheap; the 100-step pairs are docs/budgets.md's
    ("Layouts"). fsdp on torch 1.13: refused, above."""
    pack = export_pack(harness_bin, tmp_path / f"{canary}.h5", canary=canary, steps=100)
    one = tmp_path / "one.h5"
    lane("--pack", str(pack), "--out", str(one), "--steps", "30")
    for layout in ("ddp", "fsdp") if HAS_FSDP else ("ddp",):
        out = tmp_path / f"{layout}.h5"
        lane("--pack", str(pack), "--out", str(out), "--steps", "30", "--layout", layout)
        verdict = json.loads(run_harness(harness_bin, "compare", str(out), str(one), "--json").stdout)
        entries = ([f"torch-{layout}"], [f"{canary}.torch-{layout}"])  # shared, or the canary's own
        assert verdict["verdict"] == "pass" and verdict["budget"]["features"] in entries, verdict["budget"]
        assert verdict["budget"]["provisional"] == [], verdict["budget"]


def test_bf16_lane_differs_from_fp32(runs: dict, harness_bin: Path):
    run_harness(harness_bin, "validate", str(runs["bf16"]))
    with ReceiptReader(runs["bf16"]) as b, ReceiptReader(runs["fp32"]) as f, ReceiptReader(runs["cpu"]) as cpu:
        m = b.manifest
        assert (m["lane"], m["features"], m["budget_features"], m["precision"], m["autocast"]) == \
            ("micro/torch+bf16", "bf16", "torch-bf16", "bf16", "bfloat16")
        assert list(b.steps("batch_hash")) == list(f.steps("batch_hash"))
        ref = cpu.steps("loss")
        bf16_dev = np.max(np.abs(b.steps("loss") - ref) / np.abs(ref))
        fp32_dev = np.max(np.abs(f.steps("loss") - ref) / np.abs(ref))
        assert bf16_dev > 1e-5 and bf16_dev > 20 * fp32_dev, (bf16_dev, fp32_dev)  # bf16 rounding shows
        assert bf16_dev < 1.6e-2  # ... and stays within bf16's own tolerance
        assert not np.array_equal(b.hashes("params"), f.hashes("params"))


def test_lane_is_deterministic_and_steps_is_a_prefix(runs: dict):
    again = runs["dir"] / "again.h5"
    lane("--pack", str(runs["pack"]), "--out", str(again), "--threads", "1", "--steps", "3")
    with ReceiptReader(again) as a, ReceiptReader(runs["fp32"]) as f:
        assert a.complete and a.steps_planned == 3 and a.manifest["canary"] == f.manifest["canary"]
        for family in ("params", "grads", "adam_m", "adam_v"):
            assert np.array_equal(a.hashes(family), f.hashes(family)[:3]), family
        assert np.array_equal(a.steps("loss"), f.steps("loss")[:3])


def test_an_injected_fault_moves_its_step_and_not_before(runs: dict):
    faulty = runs["dir"] / "fault.h5"
    lane("--pack", str(runs["pack"]), "--out", str(faulty), "--threads", "1",
         "--inject-fault", "step=2,op=blocks.0.ln1")
    with ReceiptReader(faulty) as bad, ReceiptReader(runs["fp32"]) as clean:
        assert bad.manifest["fault_injection"] == "step=2,op=blocks.0.ln1,ulps=1"
        differs = [s for s in range(STEPS) if not np.array_equal(bad.hashes("grads")[s], clean.hashes("grads")[s])]
        assert differs and differs[0] == 2, differs
        assert np.array_equal(bad.hashes("params")[:2], clean.hashes("params")[:2])


@pytest.mark.parametrize("precision, fault", [("fp32", None), ("bf16", "step=0,op=blocks.1.attn.proj,ulps=3")])
def test_the_lane_step_reads_nothing_on_the_host(micro_pack: Path, precision: str, fault):
    """The XLA-safe step: forward, backward, norm, clip and AdamW with no .item(), float(),
    bool() or .cpu() of a tensor, fault hook and autocast included."""
    from canary_harness.runs.faults import _NudgeFirst, parse_fault
    pack = read_pack(micro_pack)
    cfg = gpt2.CanaryConfig.from_json(pack.canary_json)
    model = gpt2.GPT2(cfg, pack.init)
    optimizer = CanaryAdamW(model.named_parameters(), cfg)
    autocast = torch.autocast(device_type="cpu", dtype=torch.bfloat16) if precision == "bf16" else None
    hook = None
    active = torch.ones((), dtype=torch.bool)
    if fault:
        spec = parse_fault(fault, gpt2.forward_op_names(cfg), pack.steps)
        hook = lambda name, t: _NudgeFirst.apply(t, active, spec.ulps) if name == spec.op else t  # noqa: E731
    for step in range(2):
        optimizer.set_lr(gpt2.lr_at(step, cfg))
        inputs = torch.from_numpy(pack.batch(step))
        with HostReads() as reads:
            loss, norm = train_step(model, optimizer, inputs, autocast, hook)
        assert reads.reads == [], reads.reads
    assert optimizer.step_t.item() == 2.0  # the device-side step counter


def test_nudge_moves_element_zero_by_ulps_like_the_cpp():
    from canary_harness.runs.faults import _NudgeFirst
    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    on, off = torch.ones((), dtype=torch.bool), torch.zeros((), dtype=torch.bool)
    y = _NudgeFirst.apply(x, on, 2)
    up = np.float32(np.inf)
    assert y[0].item() == float(np.nextafter(np.nextafter(np.float32(1.0), up), up)) == 1.0 + 2 * 2.0**-23
    assert torch.equal(y[1:], x[1:].detach())
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones(3))  # the gradient passes unchanged
    assert torch.equal(_NudgeFirst.apply(x, off, 2), x.detach())
    tiny = float(np.float32(1.4e-45))  # the smallest positive subnormal
    for start, want in ((-0.0, tiny), (-tiny, -0.0)):  # across zero as next_up in kernels.cpp
        got = _NudgeFirst.apply(torch.tensor([start]), on, 1)
        assert got.item() == want and np.signbit(got.item()) == np.signbit(want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_nudge_by_many_ulps_is_repeated_nextafter_in_one_step(dtype):
    """The nudge adds ulps through the bit pattern (it looped nextafter ulps times, so
    ulps=2000000000 hung): the same values as repeated nextafter, across zero and up to +inf."""
    from canary_harness.runs.faults import _NudgeFirst
    fi = torch.finfo(dtype)
    sub = torch.nextafter(torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype))  # the smallest subnormal
    starts = [0.0, -0.0, 1.0, -1.0, fi.tiny, -fi.tiny, fi.max, -fi.max, float("inf"), -float("inf"), -sub[0].item(),
              -3 * sub[0].item(), float("nan")]
    on = torch.ones((), dtype=torch.bool)
    for start in starts:
        for ulps in (0, 1, 2, 3, 7):
            expected = torch.tensor([start], dtype=dtype)
            for _ in range(ulps):
                expected = torch.nextafter(expected, torch.full_like(expected, float("inf")))
            got = _NudgeFirst.apply(torch.tensor([start], dtype=dtype), on, ulps)
            e, g = expected.item(), got.item()
            assert (np.isnan(e) and np.isnan(g)) or (e == g and np.signbit(e) == np.signbit(g)), (start, ulps, e, g)
    big = _NudgeFirst.apply(torch.tensor([1.0, -1.0], dtype=dtype), on, 2**31 - 1)  # at once, not 2**31 loops
    up = float("inf") if dtype != torch.float64 else float((np.array([1.0]).view(np.int64) + 2**31 - 1).view(np.float64)[0])
    assert big[0].item() == up and big[1].item() == -1.0  # element 0 only


@pytest.mark.torch_agnostic
def test_bad_inputs_exit_2_with_one_line_and_write_nothing(runs: dict, micro_pack: Path, cpp_receipt: Path,
                                                          tmp_path: Path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = str(out_dir / "r.h5")
    truncated = tmp_path / "truncated.h5"
    truncated.write_bytes(micro_pack.read_bytes()[:3000])
    pack = str(runs["pack"])
    cases = [
        (["--pack", pack, "--canary", "tiny", "--out", out], r"a pack of canary 'micro', not 'tiny'"),
        (["--pack", str(tmp_path / "absent.h5"), "--out", out], r"absent.h5: no such file"),
        (["--pack", str(truncated), "--out", out], r"truncated.h5: HDF5 cannot open the pack: truncated or corrupt"),
        (["--pack", str(cpp_receipt), "--out", out], r"is a receipt, not a canary pack"),
        (["--pack", pack, "--out", out, "--device", "tpu"], r"--device: unknown device 'tpu'"),
        (["--pack", pack, "--out", out, "--precision", "fp16"], r"--precision: unknown precision 'fp16'"),
        (["--pack", pack, "--out", out, "--steps", "0"], r"--steps: '0' is not a number in 1..5"),
        (["--pack", pack, "--out", out, "--steps", "6"], r"--steps: '6' is not a number in 1..5"),
        (["--pack", pack, "--out", out, "--threads", "x"], r"--threads: 'x'"),
        (["--pack", pack, "--out", out, "--inject-fault", "step=1,op=blocks.9.mlp.fc"],
         r"--inject-fault: unknown op 'blocks.9.mlp.fc'"),
        (["--pack", pack, "--out", out, "--inject-fault", "step=5,op=blocks.0.ln1"], r"step=5 is past the last step \(4\)"),
        (["--pack", pack, "--out", out, "--inject-fault", "op=blocks.0.ln1"], r"needs both step=K and op=NAME"),
        (["--pack", pack, "--out", out, "--inject-fault", "step=1,op=blocks.0.ln1,ulps=0"], r"ulps='0'"),
        (["--pack", pack, "--out", out, "--trace", "all"], r"--trace: 'all' is not a trace level; use none or ops"),
        (["--pack", pack, "--out", out, "--inject-fault", ""], r"--inject-fault: empty"),
        (["--pack", pack, "--out", out, "--inject-fault", "step=1,op=blocks.0.ln1,step=2"],
         r"--inject-fault: key 'step' is given twice"),
        (["--pack", pack, "--out", out, "--inject-fault", "step=\u00b2,op=blocks.0.ln1"], r"--inject-fault: step="),
        (["--pack", pack, "--out", out, "--steps", "\u00b2"], r"--steps: '\u00b2' is not a number"),
        (["--pack", pack, "--out", out, "--threads", "\u00b3"], r"--threads: '\u00b3' is not a number"),
        (["--pack", pack, "--out", ""], r"--out: empty path"),
        (["--pack", pack, "--out", str(tmp_path / "nowhere" / "r.h5")], r"directory .*nowhere' does not exist"),
        (["--pack", pack, "--out", str(out_dir)], r"is a directory"),
        (["--pack", pack, "--out", out, "--bogus"], r"unrecognized arguments: --bogus"),
        (["--out", out], r"the following arguments are required: --pack"),
        (["--pack", pack, "--out", pack, "--force"], r"--out: '.*pack.h5' is the pack itself"),
    ]
    for args, pattern in cases:
        result = lane(*args, check=False)
        assert result.returncode == 2, (args, result.returncode, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("canary_harness.lane: error: "), (args, result.stderr)
        assert re.search(pattern, lines[0]), (args, lines[0])
    assert list(out_dir.iterdir()) == []
    # An existing receipt stays untouched without --force.
    before = runs["fp32"].read_bytes()
    result = lane("--pack", pack, "--out", str(runs["fp32"]), check=False)
    assert result.returncode == 2 and "exists; pass --force" in result.stderr
    assert runs["fp32"].read_bytes() == before
