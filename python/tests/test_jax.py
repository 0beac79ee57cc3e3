"""`python3 -m canary_harness.jax`: the canary contract in JAX on meshes of virtual CPU
devices, through XLA's real SPMD partitioner, held to cpu-ref under its budgets (docs/xla.md,
"JAX SPMD"). Without JAX (Debian's torch 1.13 interpreter): exit 2, one line, no file;
asserted per interpreter, never skipped."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from canary_harness import ReceiptReader
from canary_harness.models.table import gpt2_tensor_specs

from conftest import export_pack, run_harness, run_module

HAS_JAX = importlib.util.find_spec("jax") is not None
STEPS = 6


def jax_lane(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run_module("canary_harness.jax", *args, check=check, unset=("XLA_FLAGS",))


def canary_runs(harness_bin: Path, d: Path, canary: str) -> dict:
    pack = export_pack(harness_bin, d / f"{canary}-pack.h5", canary=canary, steps=STEPS)
    cpu = d / f"{canary}-cpu-ref.h5"
    run_harness(harness_bin, "run", "--canary", canary, "--steps", str(STEPS), "--out", str(cpu))
    return {"dir": d, "pack": pack, "cpu": cpu}


@pytest.fixture(scope="module")
def tiny(harness_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return canary_runs(harness_bin, tmp_path_factory.mktemp("jax"), "tiny")


@pytest.fixture(scope="module")
def llama_tiny(harness_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return canary_runs(harness_bin, tmp_path_factory.mktemp("jax-llama"), "llama-tiny")


@pytest.fixture(scope="module")
def plan_run():
    """`--pack RUNS' pack --mesh M --shard-plan P --precision X` into RUNS' folder, run once a
    module per (runs, M, P, X) for the tests that only read it: a function -> (result, receipt).
    The result is not checked here (check=HAS_JAX): each test asserts it."""
    made = {}

    def plan(runs: dict, mesh: str, shard_plan: str, precision: str) -> tuple:
        key = (str(runs["dir"]), mesh, shard_plan, precision)
        if key not in made:
            out = runs["dir"] / f"{mesh}-{shard_plan}-{precision}.h5"
            made[key] = jax_lane("--pack", str(runs["pack"]), "--mesh", mesh, "--shard-plan", shard_plan, "--precision",
                                 precision, "--out", str(out), check=HAS_JAX), out
        return made[key]

    return plan


@pytest.mark.parametrize("canary,mesh,plan,precision,features", [
    ("tiny", "1x1", "dp", "fp32", "jax"),
    ("tiny", "2x2", "tp", "fp32", "jax+mesh-fp32"),
    ("tiny", "2x2", "zero3", "bf16", "jax+jax-bf16+mesh-bf16"),
    ("llama-tiny", "1x1", "dp", "fp32", "jax"),
    ("llama-tiny", "2x2", "tp", "fp32", "jax+mesh-fp32"),
    ("llama-tiny", "2x2", "zero3", "bf16", "jax+jax-bf16+mesh-bf16"),
])
def test_each_plan_is_a_valid_receipt_within_its_budget_of_cpu_ref(canary: str, mesh: str, plan: str, precision: str,
                                                                   features: str, request: pytest.FixtureRequest,
                                                                   harness_bin: Path, plan_run):
    """The receipt validates and holds cpu-ref's data; `compare` judges it under the declared
    features' entries (the canary's own, [llama-tiny.jax], where it has one)."""
    tiny = request.getfixturevalue(canary.replace("-", "_"))
    result, out = plan_run(tiny, mesh, plan, precision)
    if not HAS_JAX:
        assert result.returncode == 2 and "JAX is not installed here" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()
        return
    validated = run_harness(harness_bin, "validate", str(out), "--json")
    assert json.loads(validated.stdout)["unknown"] == []
    with ReceiptReader(out) as r, ReceiptReader(tiny["cpu"]) as cpu:
        m = r.manifest
        assert (m["lane"], m["engine"], m["budget_features"]) == (f"{canary}/jax@{mesh}+{plan}" +
                                                                  ("+bf16" if precision == "bf16" else ""), "jax", features)
        assert r.complete and r.steps_recorded == STEPS and r.tensor_names == cpu.tensor_names
        assert list(r.steps("batch_hash")) == list(cpu.steps("batch_hash"))
        # jit's own account: one traced program, missed once (never seen) at step 0, never again
        assert list(r.read("/compile/TracingCacheMiss")) == [1.0] + [0.0] * (STEPS - 1)
        assert list(r.read("/compile/UncachedCompile")) == [1.0] + [0.0] * (STEPS - 1)
    misses = [line for line in result.stdout.splitlines() if line.startswith("cache miss  ")]
    assert len(misses) == 1 and misses[0].startswith("cache miss  step 0: TRACING CACHE MISS") and \
        "never seen function" in misses[0], result.stdout
    assert "jax 0." in m["libraries"] and "jaxlib 0." in m["libraries"], m["libraries"]
    assert f"xla_force_host_platform_device_count={4 if mesh == '2x2' else 1}" in m["toolchain"], m["toolchain"]
    judged = run_harness(harness_bin, "compare", str(out), str(tiny["cpu"]))  # exit 0: within the composed budget
    own = (lambda f: f"llama-tiny.{f}") if canary == "llama-tiny" else (lambda f: f)  # its entries, where it has them
    assert f"budget      {' + '.join(own(f) for f in features.split('+'))} (" in judged.stdout, judged.stdout


def test_the_plans_shard_by_role_not_by_name():
    """tp puts a column-parallel weight's output dimension and a row-parallel weight's input
    dimension on model, zero3 every dimension 0 on data; a tensor renamed keeps its role's split."""
    from canary_harness.jax import partition_specs

    specs = gpt2_tensor_specs(256, 64, 128, 1)
    tp = partition_specs(specs, "tp", (2, 2))
    assert tp["blocks.0.attn.qkv.weight"] == ("model", None) and tp["blocks.0.attn.qkv.bias"] == ("model",)
    assert tp["blocks.0.attn.proj.weight"] == (None, "model") and tp["blocks.0.mlp.proj.weight"] == (None, "model")
    assert tp["wte"] == (None, None) and tp["blocks.0.ln1.weight"] == (None,)
    assert all(entries[0] == "data" for entries in partition_specs(specs, "zero3", (2, 1)).values())
    assert all(set(entries) == {None} for entries in partition_specs(specs, "dp", (4, 1)).values())
    renamed = [s._replace(name=f"t{i}") for i, s in enumerate(specs)]
    assert list(partition_specs(renamed, "tp", (2, 2)).values()) == list(tp.values())


def test_bad_input_is_exit_2_with_one_line(tiny: dict):
    out = tiny["dir"] / "bad.h5"
    cases = [(["--mesh", "3x1"], "does not divide into 3 shards" if HAS_JAX else "JAX is not installed"),
             (["--mesh", "2by2"], "--mesh: '2by2' is not DxM"),
             (["--shard-plan", "fsdp"], "--shard-plan: unknown plan 'fsdp'"),
             (["--precision", "fp8"], "--precision: unknown precision 'fp8'")]
    for extra, message in cases:
        result = jax_lane("--pack", str(tiny["pack"]), "--out", str(out), *extra, check=False)
        assert result.returncode == 2 and message in result.stderr, (extra, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()


def test_the_persistent_cache_makes_a_second_process_compile_nothing(tiny: dict, harness_bin: Path):
    """--compile-cache DIR: the first process misses and compiles the step at step 0; a second
    process loads it (PersistentCacheHit 1, UncachedCompile 0 at every step); a corrupt entry
    is a miss and a compile again, with a warning, never an error. The three receipts are the
    same bits, and each passes the compile-stability gate (compared with the first)."""
    cache = tiny["dir"] / "cache"
    outs = [tiny["dir"] / f"cached{i}.h5" for i in range(3)]
    for i, out in enumerate(outs):
        if i == 2:
            for entry in cache.iterdir():
                entry.write_bytes(entry.read_bytes()[:64])
        result = jax_lane("--pack", str(tiny["pack"]), "--steps", "3", "--compile-cache", str(cache), "--out", str(out),
                          check=HAS_JAX)
        if not HAS_JAX:
            assert result.returncode == 2 and not out.exists() and not cache.exists()
            return
    rows = []
    for out in outs:
        with ReceiptReader(out) as r:
            rows.append({k: list(r.read(f"/compile/{k}")) for k in
                         ("UncachedCompile", "CachedCompile", "PersistentCacheHit", "PersistentCacheMiss", "HostSync")})
    first, warm, corrupt = rows
    assert first["UncachedCompile"] == [1.0, 0.0, 0.0] and first["PersistentCacheMiss"][0] >= 1.0
    assert warm["UncachedCompile"] == [0.0, 0.0, 0.0] and warm["PersistentCacheHit"][0] >= 1.0
    assert warm["PersistentCacheMiss"] == [0.0] * 3
    assert corrupt["UncachedCompile"] == [1.0, 0.0, 0.0] and corrupt["PersistentCacheMiss"][0] >= 1.0
    for row in rows:
        assert row["CachedCompile"] == [0.0, 1.0, 1.0] and row["HostSync"] == [0.0] * 3
    for out in outs[1:]:
        judged = run_harness(harness_bin, "compare", str(out), str(outs[0]))
        assert "budget      reference (bitwise" in judged.stdout and "PASS  compile_stability.uncached_compiles" \
            in judged.stdout


def test_a_one_ulp_fault_is_found_by_bisect_at_its_step(tiny: dict, harness_bin: Path, plan_run):
    """--inject-fault step=3,op=blocks.2.mlp.fc on 2x2 tp: one ulp on element 0 of that op's
    output at step 3 (a traced flag: the same program every step). `harness bisect` finds
    steps 0-2 bitwise equal and step 3 the first that differs, naming its tensor; the fault
    is in the manifest."""
    result, clean = plan_run(tiny, "2x2", "tp", "fp32")  # fp32: the default; the plan test's run, only read here
    if not HAS_JAX:
        assert result.returncode == 2 and not clean.exists()
        return
    moved = tiny["dir"] / "tp-moved.h5"
    jax_lane("--pack", str(tiny["pack"]), "--mesh", "2x2", "--shard-plan", "tp", "--out", str(moved), "--inject-fault",
             "step=3,op=blocks.2.mlp.fc")
    with ReceiptReader(moved) as r:
        assert r.manifest["fault_injection"] == "step=3,op=blocks.2.mlp.fc,ulps=1"
    found = run_harness(harness_bin, "bisect", str(moved), str(clean), check=False)
    assert found.returncode == 1, found.stdout + found.stderr
    assert "equal       steps 0-2 bitwise equal" in found.stdout, found.stdout
    assert "diverges    step 3 differs first in params " in found.stdout, found.stdout
    bad = jax_lane("--pack", str(tiny["pack"]), "--inject-fault", "step=3,op=blocks.9.mlp.fc", "--out",
                   str(tiny["dir"] / "bad-fault.h5"), check=False)
    assert bad.returncode == 2 and "--inject-fault: unknown op 'blocks.9.mlp.fc'" in bad.stderr, bad.stderr
