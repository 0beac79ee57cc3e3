"""canary_harness.models.gpt2: the package's PyTorch canary, held to the C++ harness."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import pytest

import torch  # Debian's python3-torch: the PyTorch canary needs it

from canary_harness import ReceiptReader
from canary_harness.models import gpt2
from canary_harness.pack import read_pack

from conftest import run_harness


def test_module_parameters_are_the_canary_tensor_table(micro_pack: Path):
    pack = read_pack(micro_pack)
    cfg = gpt2.CanaryConfig.from_json(pack.canary_json)
    model = gpt2.GPT2(cfg, pack.init)
    names = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert names == gpt2.tensor_table(cfg) == [(n, pack.init[n].shape) for n in pack.tensor_names]
    for name, param in model.named_parameters():
        assert param.detach().numpy().tobytes() == pack.init[name].tobytes(), name
    # the module runs the functional model: the same loss bit for bit
    tokens = torch.from_numpy(pack.batch(0))
    functional = gpt2.forward_loss({n: torch.from_numpy(v) for n, v in pack.init.items()}, tokens, cfg)
    assert model(tokens).item() == functional.item()


def test_forward_ops_carry_the_cpp_op_names(cpp_trace_receipt: Path):
    with h5py.File(cpp_trace_receipt, "r") as f:
        cfg = gpt2.CanaryConfig.from_json(f["manifest"].attrs["canary"])
        trace = f["trace"]
        cpp = [op.decode() for op, phase in zip(trace["op"][()], trace["phase"][()]) if phase == b"forward"]
    seen = []
    gpt2.forward_loss(gpt2.random_init(cfg), torch.zeros(cfg.batch_size, cfg.context_length + 1, dtype=torch.int32),
                      cfg, hook=lambda name, t: seen.append(name) or t)
    assert seen == gpt2.forward_op_names(cfg) == cpp


def test_trained_from_the_pack_it_reproduces_cpu_ref(micro_pack: Path, cpp_receipt: Path):
    """Three steps of micro from the pack: losses within 2e-6 relative, parameters within 1e-5
    (the twin's agreement, tests/twin, on the package's model)."""
    pack = read_pack(micro_pack)
    cfg = gpt2.CanaryConfig.from_json(pack.canary_json)
    params = {n: torch.from_numpy(v.copy()).requires_grad_(True) for n, v in pack.init.items()}
    opt = gpt2.AdamW(params, cfg)
    with ReceiptReader(cpp_receipt) as receipt:
        losses, norms, lrs = receipt.steps("loss"), receipt.steps("grad_norm"), receipt.steps("lr")
        for s in range(pack.steps):
            loss, norm, lr = gpt2.train_step(params, opt, torch.from_numpy(pack.batch(s)), s, cfg)
            assert abs(loss - losses[s]) <= 2e-6 * abs(losses[s]), (s, loss, losses[s])
            assert abs(norm - norms[s]) <= 1e-5 * abs(norms[s]), (s, norm, norms[s])
            assert float(torch.tensor(lr, dtype=torch.float32)) == lrs[s]  # the fp32 lr, as uploaded
        final = receipt.tensors(pack.steps)
    worst = max((params[n].detach() - torch.from_numpy(final[n])).abs().max().item() for n in final)
    assert worst <= 1e-5, worst


def test_config_from_json_names_what_is_wrong(micro_pack: Path):
    canary = read_pack(micro_pack).canary
    assert gpt2.CanaryConfig.from_json(json.dumps(canary)).preset == "micro"
    for change, message in [({"heads": 3}, "heads 3 does not divide channels 32"),
                            ({"architecture": "llama"}, "architecture 'llama' is not this model's"),
                            ({"layers": "two"}, "key 'layers' is 'two', not an int"),
                            ({"layers": 0}, "'layers' must be >= 1")]:
        with pytest.raises(ValueError, match=message):
            gpt2.CanaryConfig.from_json({**canary, **change})
    with pytest.raises(ValueError, match="lacks key 'peak_lr'"):
        gpt2.CanaryConfig.from_json({k: v for k, v in canary.items() if k != "peak_lr"})
    with pytest.raises(ValueError, match="does not parse"):
        gpt2.CanaryConfig.from_json("{")


def test_schedule_matches_the_receipt_over_a_whole_run(harness_bin: Path, tmp_path: Path):
    """Warm-up and cosine of all 20 steps of micro: the fp32 lr of every step, bit for bit."""
    path = tmp_path / "micro20.h5"
    run_harness(harness_bin, "run", "--canary", "micro", "--out", str(path))
    with ReceiptReader(path) as receipt:
        cfg = gpt2.CanaryConfig.from_json(receipt.manifest["canary"])
        lrs = receipt.steps("lr")
    assert [float(torch.tensor(gpt2.lr_at(s, cfg), dtype=torch.float32)) for s in range(len(lrs))] == list(lrs)


@pytest.mark.parametrize("architecture", ["gpt2", "llama"])
def test_random_init_draws_each_tensor_by_its_init_role(architecture: str):
    # A canary of tiny's channels, big enough for the sample deviations to be within 10%.
    from canary_harness.models import llama
    from canary_harness.models.table import NORMAL, ONES, RESIDUAL_NORMAL, ZEROS, gpt2_tensor_specs, llama_tensor_specs
    if architecture == "gpt2":
        cfg = gpt2.CanaryConfig(vocab_size=256, context_length=64, channels=128, layers=4, heads=4)
        specs = gpt2_tensor_specs(cfg.vocab_size, cfg.context_length, cfg.channels, cfg.layers)
        params, table = gpt2.random_init(cfg, seed=3), gpt2.tensor_table(cfg)
    else:
        cfg = llama.LlamaConfig(vocab_size=256, context_length=64, channels=128, layers=4, heads=4, kv_heads=2,
                                mlp_hidden=352)
        specs = llama_tensor_specs(cfg.vocab_size, cfg.channels, cfg.layers, cfg.heads, cfg.kv_heads, cfg.mlp_hidden)
        params, table = llama.random_init(cfg, seed=3), llama.tensor_table(cfg)
    assert [(s.name, s.shape) for s in specs] == table and list(params) == [s.name for s in specs]
    expected_std = {NORMAL: cfg.init_std, RESIDUAL_NORMAL: cfg.init_std / (2 * cfg.layers) ** 0.5}
    roles = {s.init for s in specs}
    assert roles >= {NORMAL, RESIDUAL_NORMAL, ONES}
    for spec in specs:
        value = params[spec.name].detach()
        assert value.dtype == torch.float32 and tuple(value.shape) == spec.shape, spec.name
        if spec.init in (ONES, ZEROS):
            assert torch.equal(value, torch.full(spec.shape, 1.0 if spec.init == ONES else 0.0)), spec.name
        else:
            assert abs(value.std().item() / expected_std[spec.init] - 1) < 0.1, spec.name
