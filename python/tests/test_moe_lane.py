"""The moe architecture in the PyTorch lane (canary_harness.models.moe): it reproduces the
harness's cpu-ref on a small moe canary (the same routing decisions, so the same loss to
fp32 rounding), its decisions are the kernel's (the lower expert on a tie, capacity rank
by rank), its value is the language-model loss while its gradient carries the balance
loss, a fault on the route op moves its weights, and a step reads nothing on the host.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from canary_harness import ReceiptReader
from canary_harness.receipts.schema import HASH_FAMILIES, SKETCH_FAMILIES
from canary_harness.models import moe

from conftest import run_harness
from host_reads import HostReads
from test_lane import lane

STEPS = 12
NAME = "moe-small"

# canaries/moe-tiny.toml at small sizes: 5 experts, 2 per token, a tight capacity (0.8 of the
# even share) so that choices are dropped every step. Written out in full, as
# test_llama_lane.py's canary (the suite also runs from an installed package).
SMALL_TOML = f"""schema_version = 1
name = "{NAME}"
architecture = "moe"
[model]
vocab = 64
context = 16
channels = 48
layers = 2
heads = 6
kv_heads = 2
mlp_hidden = 40
rope_theta = 10000.0
norm_eps = 1e-5
init_std = 0.02
experts = 5
experts_per_token = 2
capacity_factor = 0.8
balance_coef = 0.05
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


@pytest.fixture(scope="module")
def runs(harness_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The small moe canary for STEPS steps: its pack, cpu-ref's receipt, the fp32 lane, and
    the lane with a 1-ulp fault at step 3 in the route op of block 1."""
    d = tmp_path_factory.mktemp("moe-lane")
    toml = d / f"{NAME}.toml"
    toml.write_text(SMALL_TOML)
    pack, cpu = d / "pack.h5", d / "cpu-ref.h5"
    run_harness(harness_bin, "export", "--canary", str(toml), "--steps", str(STEPS), "--out", str(pack))
    run_harness(harness_bin, "run", "--canary", str(toml), "--steps", str(STEPS), "--out", str(cpu))
    out = {"pack": pack, "cpu": cpu, "lane": d / "lane.h5", "fault": d / "fault.h5"}
    lane("--pack", str(pack), "--out", str(out["lane"]), "--threads", "1")
    lane("--pack", str(pack), "--out", str(out["fault"]), "--threads", "1",
         "--inject-fault", "step=3,op=blocks.1.moe.route,ulps=64")
    return out


def test_moe_lane_reproduces_cpu_ref(runs: dict, harness_bin: Path):
    run_harness(harness_bin, "validate", str(runs["lane"]))
    with ReceiptReader(runs["lane"]) as r, ReceiptReader(runs["cpu"]) as cpu:
        m = r.manifest
        assert (m["lane"], m["engine"], m["budget_features"]) == (f"{NAME}/torch", "torch", "torch-cpu")
        assert json.loads(m["canary"])["architecture"] == "moe" and m["canary"] == cpu.manifest["canary"]
        cfg = moe.MoeConfig.from_json(m["canary"])
        assert cfg.expert_capacity == 21  # ceil(0.8 * 4*16 tokens * 2 choices / 5 experts = 20.48)
        assert r.tensor_names == cpu.tensor_names == [n for n, _ in moe.tensor_table(cfg)]
        assert list(r.steps("batch_hash")) == list(cpu.steps("batch_hash"))
        loss, ref = np.asarray(r.steps("loss")), np.asarray(cpu.steps("loss"))
        # Step 0: the same init, batch and decisions; fp32 rounding only (the bound).
        assert abs(loss[0] - ref[0]) <= 1e-5 * abs(ref[0]), (loss[0], ref[0])
        # Every step: measured at most 1.8e-7 relative on moe-small (routing never flipped);
        # a flipped decision moves a whole token's MLP output, far past 2e-6.
        assert np.all(np.abs(loss - ref) <= 2e-6 * np.abs(ref)), np.abs(loss - ref) / np.abs(ref)
        norm, ref_norm = np.asarray(r.steps("grad_norm")), np.asarray(cpu.steps("grad_norm"))
        assert np.all(np.abs(norm - ref_norm) <= 1e-5 * ref_norm), np.abs(norm - ref_norm) / ref_norm
        # The routing, recorded by both: the same decisions in every layer and step (the lane's
        # hash computed here in numpy and xxhash, cpu-ref's in the C++ kernel), choices dropped.
        assert r.read_strings("routing/names") == cpu.read_strings("routing/names") == \
            ["blocks.0.moe.route", "blocks.1.moe.route"]
        for field in ("decisions_hash", "dropped", *(f"tokens_expert_{e}" for e in range(5))):
            assert np.array_equal(r.read(f"routing/{field}", 2), cpu.read(f"routing/{field}", 2)), field
        assert r.read("routing/dropped", 2).sum() > 0
        balance, ref_balance = r.read("routing/balance_loss", 2), cpu.read("routing/balance_loss", 2)
        assert np.allclose(balance, ref_balance, rtol=1e-5, atol=0), (balance, ref_balance)


def reference_route(probs: np.ndarray, top_k: int, capacity: int):
    """The kernel's rules written as loops: the K largest (ties to the lower expert), rank by
    rank, rows in order, into buffers of `capacity`."""
    N, E = probs.shape
    expert = np.zeros((N, top_k), dtype=np.int64)
    for n in range(N):
        taken = []
        for _ in range(top_k):
            best = -1
            for e in range(E):
                if e not in taken and (best < 0 or probs[n, e] > probs[n, best]):
                    best = e
            taken.append(best)
        expert[n] = taken
    slot = np.full((N, top_k), -1, dtype=np.int64)
    count = [0] * E
    for j in range(top_k):
        for n in range(N):
            e = expert[n, j]
            if count[e] < capacity:
                slot[n, j], count[e] = count[e], count[e] + 1
    return expert, slot


@pytest.mark.parametrize("seed", range(6))
def test_routing_decisions_are_the_kernels(seed: int):
    g = torch.Generator().manual_seed(seed)
    N, E, K = 37, 5, 2
    logits = torch.randn(N, E, generator=g)
    logits[::3, 1] = logits[::3, 3]  # exact ties between experts 1 and 3 on every third row
    logits[::7] = 0.0                # rows where every expert ties
    probs = torch.softmax(logits, dim=-1)
    weights, expert, slot = moe.route(probs, K, capacity=13)
    want_expert, want_slot = reference_route(probs.numpy(), K, 13)
    assert np.array_equal(expert.numpy(), want_expert) and np.array_equal(slot.numpy(), want_slot)
    assert (slot == -1).any() and (slot >= 0).any()  # the capacity binds: both paths are taken
    chosen = torch.gather(probs, 1, expert)
    assert torch.allclose(weights, chosen / chosen.sum(-1, keepdim=True), rtol=0, atol=0)


def test_the_loss_is_the_lm_loss_and_its_gradient_carries_the_balance_loss():
    cfg = moe.MoeConfig(vocab_size=32, context_length=8, channels=16, layers=1, heads=2, kv_heads=1, mlp_hidden=12,
                        batch_size=2, experts=3, experts_per_token=2, capacity_factor=1.0, balance_coef=0.5)
    tokens = torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(1))
    init = {k: v * 5.0 if v.dim() >= 2 else v for k, v in moe.random_init(cfg, seed=3).items()}
    grads = {}
    for coef in (0.0, 0.5):
        cfg.balance_coef = coef
        model = moe.Moe(cfg, init).double()
        loss = model(tokens)
        loss.backward()
        balance = model.blocks[0].moe.route.balance
        grads[coef] = {n: p.grad.clone() for n, p in model.named_parameters()}
        if coef:
            assert float(balance) > 0.0
        # The value: the LM loss alone, bit for bit, whatever the balance loss.
        lm = moe.Moe(cfg, init).double()
        lm.blocks[0].moe.route.coef = 0.0
        assert float(loss) == float(lm(tokens))
    router = "blocks.0.moe.router.weight"
    assert not torch.equal(grads[0.0][router], grads[0.5][router])  # the balance loss trains the router
    assert torch.equal(grads[0.0]["lm_head.weight"], grads[0.5]["lm_head.weight"])  # and nothing downstream
    # The whole backward against central differences in float64 (decisions fixed: h is tiny).
    model = moe.Moe(cfg, init).double()
    model(tokens).backward()
    for name in (router, "blocks.0.moe.experts.gate.weight", "blocks.0.moe.experts.down.weight", "wte"):
        p = dict(model.named_parameters())[name]
        for index in [(0,) * p.dim(), tuple(s - 1 for s in p.shape)]:
            saved = p.data[index].item()
            values = []
            for h in (1e-6, -1e-6):
                p.data[index] = saved + h
                with torch.no_grad():
                    total = model(tokens) + model.blocks[0].moe.route.balance
                values.append(float(total))
            p.data[index] = saved
            numeric = (values[0] - values[1]) / 2e-6
            assert abs(float(p.grad[index]) - numeric) <= 1e-6 + 1e-4 * abs(numeric), (name, index)


def test_a_fault_on_the_route_op_moves_its_weights_from_its_step(runs: dict):
    """64 ulps on the first token's first weight at step 3 (the route op's first result, as
    the C++ faults its first written operand): the parameters it updates move from that step
    on and not before."""
    with ReceiptReader(runs["lane"]) as clean, ReceiptReader(runs["fault"]) as fault:
        assert fault.manifest["fault_injection"] == "step=3,op=blocks.1.moe.route,ulps=64"
        moved = [int((a != b).sum()) for a, b in zip(clean.hashes("params"), fault.hashes("params"))]
        assert moved[:3] == [0, 0, 0] and all(m > 0 for m in moved[3:]), moved


def test_moe_step_reads_nothing_on_the_host(runs: dict):
    from canary_harness.runs.pack_step import CanaryStep, train_step
    step = CanaryStep.from_pack(str(runs["pack"]))
    assert isinstance(step.model, moe.Moe)
    step.optimizer.set_lr(moe.lr_at(0, step.cfg))
    inputs = torch.from_numpy(step.pack.batch(0))
    with HostReads() as reads:
        train_step(step.model, step.optimizer, inputs, step.autocast)
    assert reads.reads == [], reads.reads


def test_the_writer_takes_only_described_step_state_the_same_every_step(tmp_path: Path):
    from canary_harness.receipts.receipt import ReceiptError, ReceiptWriter, StepState
    from canary_harness.receipts.digest import sketch

    def writer(path: Path) -> ReceiptWriter:
        manifest = {"lane": "x/torch", "engine": "torch", "budget_features": "torch-cpu", "canary": "{}", "seed": 1,
                    "steps_planned": 2}
        return ReceiptWriter(str(path), manifest, ["w"])

    def step(w: ReceiptWriter, state) -> None:
        zero = np.zeros(1, np.float32)
        w.append_step(loss=1.0, grad_norm=1.0, lr=0.1, batch_hash=1, hashes={f: [0] for f in HASH_FAMILIES},
                      sketches={f: [sketch(zero, "w")] for f in SKETCH_FAMILIES}, state=state)

    routing = StepState("routing", ["blocks.0.moe.route"], [("tokens_expert_0", [3.0]), ("dropped", [1.0])])
    with pytest.raises(ReceiptError, match="/gating/dropped is not in the receipt description"):
        step(writer(tmp_path / "a.h5"), [StepState("gating", ["l0"], [("dropped", [1.0])])])
    w = writer(tmp_path / "b.h5")
    with pytest.raises(ReceiptError, match="2 values for 1 columns"):
        step(w, [StepState("routing", ["l0"], [("dropped", [1.0, 2.0])])])
    step(w, [routing])
    with pytest.raises(ReceiptError, match="not step 0's"):
        step(w, [StepState("routing", ["blocks.0.moe.route"], [("dropped", [1.0])])])
    step(w, [routing])
    w.close()
    with ReceiptReader(tmp_path / "b.h5") as r:
        assert r.read_strings("routing/names") == ["blocks.0.moe.route"]
        assert r.read("routing/tokens_expert_0", 2).tolist() == [[3.0], [3.0]]
