"""The llama canary in the PyTorch lane (canary_harness.models.llama): held to cpu-ref's llama
(canaries/architectures/llama/llama.cpp) on a small llama canary written next to the tests, and the model held to
a plainly written reference and to finite differences at tiny sizes."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from canary_harness import ReceiptReader
from canary_harness.runs.architectures import ARCHITECTURES, model_of
from canary_harness.runs.pack_step import CanaryStep, architecture_module, load_pack, train_step
from canary_harness.models import gpt2, llama
from canary_harness.pack import PackError

from conftest import run_harness
from host_reads import HostReads
from test_lane import lane

STEPS = 12
NAME = "llama-small"
FAULT_STEP, FAULT_OP = 3, "blocks.0.attn_norm"
TRACE_COLUMNS = ("op_index", "op", "layer", "phase", "tensor", "kind")

# canaries/llama-tiny.toml at small sizes: 6 query heads over 2 kv heads (a group of 3),
# head size 8, and warmup 3 of 12 steps so that the run covers warmup and the cosine decay.
# Written out in full (not read from the source tree: the suite also runs from an
# installed package, away from the sources).
SMALL_TOML = f"""schema_version = 1
name = "{NAME}"
architecture = "llama"
[model]
vocab = 64
context = 16
channels = 48
layers = 2
heads = 6
kv_heads = 2
mlp_hidden = 72
rope_theta = 10000.0
norm_eps = 1e-5
init_std = 0.02
[train]
batch = 4
steps = {STEPS}
seed = 1337
[optimizer]
lr = 3e-3
min_lr_ratio = 0.1
warmup_steps = 3
beta1 = 0.9
beta2 = 0.95
eps = 1e-8
weight_decay = 0.1
clip_norm = 1.0
[data]
source = "builtin"
seed = 20240611
"""


def small_toml(path: Path) -> Path:
    path.write_text(SMALL_TOML)
    return path


@pytest.fixture(scope="module")
def runs(harness_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The small llama for STEPS steps: its pack, cpu-ref's receipt (traced), and the fp32
    torch lane plain, traced, and traced with a 1-ulp fault at FAULT_STEP in FAULT_OP."""
    d = tmp_path_factory.mktemp("llama-lane")
    toml = small_toml(d / f"{NAME}.toml")
    pack = d / "pack.h5"
    run_harness(harness_bin, "export", "--canary", str(toml), "--steps", str(STEPS), "--out", str(pack))
    cpu = d / "cpu-ref.h5"
    run_harness(harness_bin, "run", "--canary", str(toml), "--steps", str(STEPS), "--trace", "ops", "--out", str(cpu))
    out = {"dir": d, "toml": toml, "pack": pack, "cpu": cpu}
    for name, extra in (("plain", []), ("traced", ["--trace", "ops"]),
                        ("fault", ["--trace", "ops", "--inject-fault", f"step={FAULT_STEP},op={FAULT_OP}"])):
        out[name] = d / f"{name}.h5"
        lane("--pack", str(pack), "--out", str(out[name]), "--threads", "1", *extra)
    return out


def test_llama_lane_is_a_valid_receipt_that_reproduces_cpu_ref(runs: dict, harness_bin: Path):
    run_harness(harness_bin, "validate", str(runs["plain"]))
    with ReceiptReader(runs["plain"]) as r, ReceiptReader(runs["cpu"]) as cpu:
        m = r.manifest
        assert (m["lane"], m["engine"], m["budget_features"]) == (f"{NAME}/torch", "torch", "torch-cpu")
        assert json.loads(m["canary"])["architecture"] == "llama"
        assert r.complete and r.steps_planned == r.steps_recorded == STEPS
        assert m["canary"] == cpu.manifest["canary"] and m["seed"] == cpu.manifest["seed"]
        assert r.tensor_names == cpu.tensor_names == [n for n, _ in llama.tensor_table(
            llama.LlamaConfig.from_json(m["canary"]))]
        assert list(r.steps("batch_hash")) == list(cpu.steps("batch_hash"))  # the data contract
        assert list(r.steps("lr")) == list(cpu.steps("lr"))  # gpt2's schedule, fp32 bit for bit
        loss, ref = r.steps("loss"), cpu.steps("loss")
        # Step 0: the same init and batch; only fp32 rounding differs (measured 1.1e-7 here, 0 on llama-tiny).
        assert abs(loss[0] - ref[0]) <= 1e-5 * abs(ref[0]), (loss[0], ref[0])
        # The trajectory: measured at most 3.0e-7 relative here (12 steps) and 2.8e-7 over
        # 100 steps of llama-tiny (mean 6.6e-8, no growth with the steps): fp32 rounding that
        # Adam carries forward. 2e-6 (gpt2's bound in test_lane.py) leaves ~7x headroom and is
        # still well below bf16's deviation on llama-tiny (2e-6 at step 0, 4e-5 by step 4).
        assert np.max(np.abs(loss - ref) / np.abs(ref)) < 2e-6
        # Gradient norms: measured 9.4e-7 here, at most 1.7e-6 over 100 steps of llama-tiny.
        np.testing.assert_allclose(r.steps("grad_norm"), cpu.steps("grad_norm"), rtol=2e-5)
        # Parameter norms (sketches): measured 7.4e-8 here, at most 3.7e-7 over 100 steps of llama-tiny.
        np.testing.assert_allclose(r.sketches("params")[0], cpu.sketches("params")[0], rtol=5e-6)
        # a real stack's own bits, not a copy of cpu-ref's
        assert not np.array_equal(r.hashes("params")[1:], cpu.hashes("params")[1:])


def test_llama_fault_moves_the_hashes_from_its_step(runs: dict, harness_bin: Path):
    run_harness(harness_bin, "validate", str(runs["fault"]))
    with ReceiptReader(runs["fault"]) as bad, ReceiptReader(runs["traced"]) as clean:
        assert bad.manifest["fault_injection"] == f"step={FAULT_STEP},op={FAULT_OP},ulps=1"
        differs = [s for s in range(STEPS) if not np.array_equal(bad.hashes("grads")[s], clean.hashes("grads")[s])]
        assert differs and differs[0] == FAULT_STEP, differs
        assert np.array_equal(bad.hashes("params")[:FAULT_STEP], clean.hashes("params")[:FAULT_STEP])
        assert not np.array_equal(bad.hashes("params")[FAULT_STEP], clean.hashes("params")[FAULT_STEP])
    # The traces name the op: bisect finds step FAULT_STEP and FAULT_OP's forward output.
    result = run_harness(harness_bin, "bisect", str(runs["fault"]), str(runs["traced"]), "--json", check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    out = json.loads(result.stdout)
    assert out["first_divergent_step"] == FAULT_STEP, out
    op = out["first_divergent_op"]
    assert (op["name"], op["tensor"], op["phase"], op["layer"]) == (FAULT_OP, FAULT_OP + ".out", "forward", 0), op


@pytest.mark.parametrize("op", ["blocks.1.attn.rope_k", "blocks.0.mlp.swiglu", "blocks.1.attn"])
def test_every_llama_op_kind_can_be_faulted(runs: dict, op: str):
    """A large fault (2**20 ulps) in a llama-only op moves the grads from its step on."""
    out = runs["dir"] / f"fault-{op}.h5"
    lane("--pack", str(runs["pack"]), "--out", str(out), "--threads", "1", "--steps", "3",
         "--inject-fault", f"step=1,op={op},ulps={2**20}")
    with ReceiptReader(out) as bad, ReceiptReader(runs["plain"]) as clean:
        assert np.array_equal(bad.hashes("grads")[0], clean.hashes("grads")[0])
        assert not np.array_equal(bad.hashes("grads")[1], clean.hashes("grads")[1])


def test_llama_traces_carry_cpu_refs_layout_and_op_names(runs: dict, harness_bin: Path):
    run_harness(harness_bin, "validate", str(runs["traced"]))
    with h5py.File(runs["traced"], "r") as t, h5py.File(runs["cpu"], "r") as c:
        for name in TRACE_COLUMNS:
            assert np.array_equal(t["trace"][name][()], c["trace"][name][()]), name
        cfg = llama.LlamaConfig.from_json(t["manifest"].attrs["canary"])
        forward = [op.decode() for op, phase in zip(t["trace/op"][()], t["trace/phase"][()]) if phase == b"forward"]
        assert forward == llama.forward_op_names(cfg)  # one output per forward op, the C++ names
        assert len(forward) == 1 + 15 * cfg.layers + 3
        l2, ref = t["trace/l2"][()], c["trace/l2"][()]
        # Every traced quantity (activations, their gradients, parameter gradients, the
        # optimizer's outputs) within fp32 rounding of cpu-ref's: measured 4.5e-6 here, 1.2e-6
        # over 3 steps of llama-tiny (gradients of near-zero activations carry the largest).
        assert np.max(np.abs(l2 - ref) / np.abs(ref)) < 2e-5
        same = t["trace/hash"][()] == c["trace/hash"][()]
        assert same[0, 0]  # step 0's embedding: a gather of the same fp32 init, bit for bit
    with ReceiptReader(runs["traced"]) as r, ReceiptReader(runs["plain"]) as plain:
        for family in ("params", "grads", "adam_m", "adam_v"):  # tracing changes no number
            assert np.array_equal(r.hashes(family), plain.hashes(family)), family


def test_the_lane_dispatches_on_the_architecture_key(runs: dict, micro_pack: Path, tmp_path: Path):
    pack = load_pack(str(runs["pack"]))
    assert architecture_module(pack).name == "llama" and architecture_module(load_pack(str(micro_pack))).name == "gpt2"
    assert pack.tensor_names == [n for n, _ in llama.tensor_table(llama.LlamaConfig.from_json(pack.canary_json))]
    with pytest.raises(PackError, match=f"a pack of canary '{NAME}', not 'tiny'"):
        load_pack(str(runs["pack"]), canary="tiny")
    # The key decides, not the name: a llama canary named like a gpt2 one is still llama.
    renamed = tmp_path / "renamed.h5"
    renamed.write_bytes(runs["pack"].read_bytes())
    with h5py.File(renamed, "r+") as f:
        canary = json.loads(f["manifest"].attrs["canary"])
        f["manifest"].attrs["canary"] = json.dumps({**canary, "preset": "tiny"})
    assert architecture_module(load_pack(str(renamed), canary="tiny")).name == "llama"
    with h5py.File(renamed, "r+") as f:
        f["manifest"].attrs["canary"] = json.dumps({**canary, "architecture": "mamba"})
    result = lane("--pack", str(renamed), "--out", str(tmp_path / "r.h5"), check=False)
    known = ", ".join(ARCHITECTURES)  # gpt2, llama, moe
    assert result.returncode == 2
    assert f"canary architecture 'mamba': this canary_harness reads {known} packs" in result.stderr
    result = lane("--pack", str(runs["pack"]), "--out", str(tmp_path / "r.h5"),
                  "--inject-fault", "step=1,op=blocks.0.ln1", check=False)  # a gpt2 op name
    assert result.returncode == 2 and "unknown op 'blocks.0.ln1'" in result.stderr
    assert not (tmp_path / "r.h5").exists()


def test_the_package_runs_the_architectures_the_harness_has(harness_bin: Path, tmp_path: Path):
    """canary_harness.runs.architectures lists the harness's architectures (canaries/architecture.h), in its order."""
    toml = small_toml(tmp_path / "other.toml")
    toml.write_text(re.sub(r'architecture = "llama"', 'architecture = "zzz"', toml.read_text()))
    result = subprocess.run([str(harness_bin), "run", "--canary", str(toml), "--out", str(tmp_path / "x.h5")],
                            capture_output=True, text=True)
    known = re.search(r"is not an architecture \(known: ([^)]*)\)", result.stderr)
    assert result.returncode == 2 and known, result.stderr
    assert known.group(1).split(", ") == list(ARCHITECTURES)
    for name in ARCHITECTURES:
        assert model_of(name).name == name


def test_llama_step_reads_nothing_on_the_host(runs: dict):
    step = CanaryStep.from_pack(str(runs["pack"]), inject_fault="step=0,op=blocks.1.attn.rope_q,ulps=2")
    assert isinstance(step.model, llama.Llama)
    for s in range(2):
        step.optimizer.set_lr(llama.lr_at(s, step.cfg))
        step.active.fill_(s == 0)
        inputs = torch.from_numpy(step.pack.batch(s))
        with HostReads() as reads:
            train_step(step.model, step.optimizer, inputs, step.autocast)
        assert reads.reads == [], reads.reads


# ---- the model at tiny sizes --------------------------------------------------------------------

def tiny_config(kv_heads: int) -> llama.LlamaConfig:
    return llama.LlamaConfig(vocab_size=11, context_length=5, channels=12, layers=2, heads=3, kv_heads=kv_heads,
                             mlp_hidden=10, batch_size=2, rope_theta=100.0, preset="t")


def random_params(cfg: llama.LlamaConfig) -> dict:
    g = torch.Generator().manual_seed(7)
    # norm weights away from 1, matrices large enough that attention is far from uniform
    return {n: (torch.randn(shape, generator=g, dtype=torch.float64) * (0.3 if len(shape) == 2 else 1.0)
                + (1.0 if len(shape) == 1 else 0.0)) for n, shape in llama.tensor_table(cfg)}


@pytest.mark.parametrize("kv_heads", [1, 3])
def test_the_module_is_the_plain_reference(kv_heads: int):
    """Llama's op modules (in float64) against reference_loss: per-head loops, RoPE angles from
    math.pow instead of the float32 tables. Within the tables' float32 rounding."""
    cfg = tiny_config(kv_heads)
    params = random_params(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.context_length + 1),
                           generator=torch.Generator().manual_seed(3))
    model = llama.Llama(cfg).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
    got, want = model(tokens).item(), llama.reference_loss(params, tokens, cfg).item()
    assert abs(got - want) <= 1e-6 * abs(want), (got, want)


def test_gradient_matches_finite_differences():
    """d loss / d p along a random direction, per tensor kind, against central differences in float64."""
    cfg = tiny_config(1)
    params = random_params(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.context_length + 1),
                           generator=torch.Generator().manual_seed(5))
    model = llama.Llama(cfg).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
    model(tokens).backward()
    g = torch.Generator().manual_seed(11)
    for name in ("wte", "blocks.0.attn_norm.weight", "blocks.0.attn.q.weight", "blocks.1.attn.k.weight",
                 "blocks.1.attn.v.weight", "blocks.0.mlp.gate.weight", "blocks.1.mlp.down.weight", "norm.weight",
                 "lm_head.weight"):
        p = model.get_parameter(name)
        d = torch.randn(p.shape, generator=g, dtype=torch.float64)
        h = 1e-6
        with torch.no_grad():
            p.add_(h * d)
            up = model(tokens).item()
            p.sub_(2 * h * d)
            down = model(tokens).item()
            p.add_(h * d)
        fd, analytic = (up - down) / (2 * h), float((p.grad * d).sum())
        assert math.isclose(fd, analytic, rel_tol=1e-6, abs_tol=1e-9), (name, fd, analytic)


def test_rope_tables_are_float64_rounded_once():
    cos, sin = llama.rope_tables(64, 32, 10000.0)
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == (64, 16)
    for t, i in ((0, 0), (1, 0), (7, 3), (63, 15), (40, 9)):
        angle = t * math.exp(-(2.0 * i / 32) * math.log(10000.0))
        assert cos[t, i].item() == float(np.float32(math.cos(angle))), (t, i)
        assert sin[t, i].item() == float(np.float32(math.sin(angle))), (t, i)


def test_config_from_json_names_what_is_wrong(runs: dict):
    canary = json.loads(load_pack(str(runs["pack"])).canary_json)
    cfg = llama.LlamaConfig.from_json(canary)
    assert (cfg.kv_heads, cfg.mlp_hidden, cfg.rope_theta, cfg.heads, cfg.head_size) == (2, 72, 10000.0, 6, 8)
    for change, pattern in (({"kv_heads": None}, "lacks key 'kv_heads'"),
                            ({"mlp_hidden": 7.5}, "key 'mlp_hidden' is 7.5, not an int"),
                            ({"kv_heads": 4}, "key 'kv_heads': 4 does not divide heads 6"),
                            ({"channels": 42, "heads": 6}, "head size 7 .* odd"),
                            ({"rope_theta": 0}, "key 'rope_theta' must be > 0"),
                            ({"architecture": "gpt2"}, "key 'architecture' is 'gpt2', not 'llama'")):
        bad = {k: v for k, v in {**canary, **change}.items() if v is not None}
        with pytest.raises(ValueError, match=pattern):
            llama.LlamaConfig.from_json(bad)
    with pytest.raises(ValueError, match="architecture 'llama'"):
        gpt2.CanaryConfig.from_json(canary)
