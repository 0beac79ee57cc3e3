"""canary_harness.torch.Recorder: any PyTorch loop, recorded by the canary's names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from canary_harness import ReceiptReader, tensor_hash
from canary_harness.models import gpt2
from canary_harness.pack import read_pack
from canary_harness.torch import Recorder, RecorderError

from conftest import run_harness
from host_reads import HostReads


class UserModel(torch.nn.Module):
    """A user's model: the canary under other names (net.*)."""

    def __init__(self, cfg, init):
        super().__init__()
        self.net = gpt2.GPT2(cfg, init)

    def forward(self, tokens):
        return self.net(tokens)


def user_setup(pack):
    cfg = gpt2.CanaryConfig.from_json(pack.canary_json)
    model = UserModel(cfg, pack.init)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    other = [p for n, p in model.named_parameters() if p.dim() != 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": other, "weight_decay": 0.0}],
                                  lr=cfg.peak_lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)
    name_map = {f"net.{n}": n for n in pack.tensor_names}
    return cfg, model, optimizer, name_map


def test_a_user_loop_in_a_few_lines(micro_pack: Path, cpp_receipt: Path, harness_bin: Path, tmp_path: Path):
    pack = read_pack(micro_pack, canary="micro")
    cfg, model, optimizer, name_map = user_setup(pack)
    out = tmp_path / "user.h5"
    expected = []  # what each step should have recorded, taken independently of the recorder
    recorder = Recorder(out, model, optimizer, name_map, pack=pack, budget_features="torch-cpu")
    for step in range(pack.steps):
        for group in optimizer.param_groups:
            group["lr"] = gpt2.lr_at(step, cfg)
        tokens = pack.batch(step)
        loss = model(torch.from_numpy(tokens))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.step()
        recorder.step(loss=loss, grad_norm=norm, batch=tokens)
        params = dict(model.named_parameters())
        expected.append({
            "loss": loss.item(), "norm": norm.item(), "lr": gpt2.lr_at(step, cfg),
            "params": [tensor_hash(params[f"net.{n}"]) for n in pack.tensor_names],
            "grads": [tensor_hash(params[f"net.{n}"].grad) for n in pack.tensor_names],
            "adam_m": [tensor_hash(optimizer.state[params[f"net.{n}"]]["exp_avg"]) for n in pack.tensor_names],
            "adam_v": [tensor_hash(optimizer.state[params[f"net.{n}"]]["exp_avg_sq"]) for n in pack.tensor_names]})
        optimizer.zero_grad()
    recorder.close()

    run_harness(harness_bin, "validate", str(out))
    with ReceiptReader(out) as r, ReceiptReader(cpp_receipt) as cpu:
        assert r.complete and r.steps_recorded == 3 and r.tensor_names == pack.tensor_names
        m = r.manifest
        assert (m["lane"], m["engine"], m["budget_features"], m["seed"]) == ("micro/torch", "torch", "torch-cpu", 1337)
        assert m["canary"] == cpu.manifest["canary"] and m["data_seed"] == pack.data_seed
        assert list(r.steps("batch_hash")) == list(cpu.steps("batch_hash"))  # the data contract, by construction
        for s, e in enumerate(expected):
            assert r.steps("loss")[s] == e["loss"] and r.steps("grad_norm")[s] == e["norm"]
            assert r.steps("lr")[s] == e["lr"]
            for family in ("params", "grads", "adam_m", "adam_v"):
                assert [int(h) for h in r.hashes(family)[s]] == e[family], (s, family)
        # torch.optim.AdamW on the canary: close to cpu-ref (the lane's exact optimizer is tested there)
        np.testing.assert_allclose(r.steps("loss"), cpu.steps("loss"), rtol=1e-4)


def test_the_recorder_reads_nothing_inside_the_step(micro_pack: Path, tmp_path: Path):
    """Attached, the recorder adds no host read to forward, backward or the update (torch
    1.13's own AdamW reads its step counter with .item(), recorder or not: DOMAIN.md)."""
    pack = read_pack(micro_pack)
    tokens = torch.from_numpy(pack.batch(0))

    def one_step(model, optimizer):
        with HostReads() as forward_backward:
            loss = model(tokens)
            loss.backward()
        with HostReads() as update:
            optimizer.step()
        return loss, forward_backward.reads, update.reads

    _, model, optimizer, _ = user_setup(pack)
    _, bare_forward_backward, bare_update = one_step(model, optimizer)
    _, model, optimizer, name_map = user_setup(pack)
    with Recorder(tmp_path / "r.h5", model, optimizer, name_map, pack=pack, budget_features="torch-cpu",
                  steps=1) as recorder:
        loss, forward_backward, update = one_step(model, optimizer)
        assert forward_backward == bare_forward_backward == []
        assert update == bare_update
        with HostReads() as after:
            recorder.step(loss=loss, grad_norm=1.0, batch=pack.batch(0))
        assert after.reads  # the recorder reads the values after the step
    assert not any(m._forward_hooks or m._backward_hooks or m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("change, message", [
    (lambda m: m.pop("net.blocks.1.mlp.proj.bias"), r"name_map misses canary tensor 'blocks.1.mlp.proj.bias'"),
    (lambda m: m.update({"net.wpe": "wte"}), r"'net.wte' and 'net.wpe' both map to canary tensor 'wte'|"
                                             r"'net.wpe' and 'net.wte' both map"),
    (lambda m: m.update({"head.weight": "wte"}), r"'head.weight' is not a parameter of the model"),
    (lambda m: m.update({"net.wpe": "pos_emb"}), r"'net.wpe' maps to 'pos_emb', which is not a tensor of the canary"),
])
def test_a_name_map_that_does_not_fit_is_named_and_writes_nothing(micro_pack, tmp_path, change, message):
    pack = read_pack(micro_pack)
    _, model, optimizer, name_map = user_setup(pack)
    change(name_map)
    out = tmp_path / "never.h5"
    with pytest.raises(RecorderError, match=message):
        Recorder(out, model, optimizer, name_map, pack=pack, budget_features="torch-cpu")
    assert not out.exists()


def test_models_that_are_not_the_canary_are_named(micro_pack: Path, tmp_path: Path):
    pack = read_pack(micro_pack)
    cfg, model, optimizer, name_map = user_setup(pack)
    model.extra = torch.nn.Linear(2, 2)  # a parameter the canary does not have
    with pytest.raises(RecorderError, match=r"the model's parameter 'extra.weight' maps to no canary tensor"):
        Recorder(tmp_path / "a.h5", model, optimizer, name_map, pack=pack, budget_features="torch-cpu")
    del model.extra
    with torch.no_grad():
        model.net.lnf.bias = torch.nn.Parameter(torch.zeros(cfg.channels + 1))
    with pytest.raises(RecorderError, match=r"parameter 'net.lnf.bias' has shape \(33,\), canary tensor 'lnf.bias' "
                                            r"has \(32,\)"):
        Recorder(tmp_path / "b.h5", model, optimizer, name_map, pack=pack, budget_features="torch-cpu")
    cfg, model, _, name_map = user_setup(pack)
    partial = torch.optim.AdamW([p for n, p in model.named_parameters() if n != "net.wpe"])
    with pytest.raises(RecorderError, match=r"canary tensor 'wpe': its parameter is not one the optimizer updates"):
        Recorder(tmp_path / "c.h5", model, partial, name_map, pack=pack, budget_features="torch-cpu")
    assert not any((tmp_path / n).exists() for n in ("a.h5", "b.h5", "c.h5"))


def test_recording_at_the_wrong_moment_is_named(micro_pack: Path, tmp_path: Path):
    pack = read_pack(micro_pack)
    _, model, _, name_map = user_setup(pack)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(tmp_path / "sgd.h5", model, sgd, name_map, pack=pack, budget_features="torch-cpu") as recorder:
        loss = model(torch.from_numpy(pack.batch(0)))
        loss.backward()
        sgd.step()
        with pytest.raises(RecorderError, match=r"canary tensor 'wte': optimizer.state has no 'exp_avg'"):
            recorder.step(loss=loss, grad_norm=1.0, batch=pack.batch(0))
        sgd.zero_grad(set_to_none=True)
        with pytest.raises(RecorderError, match=r"canary tensor 'wte' has no gradient at step 0"):
            recorder.step(loss=loss, grad_norm=1.0, batch=pack.batch(0))
    with ReceiptReader(tmp_path / "sgd.h5") as r:
        assert r.steps_recorded == 0 and not r.complete
