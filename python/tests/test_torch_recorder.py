"""canary_harness.torch.Recorder: any PyTorch loop, recorded by the canary's names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from canary_harness import ReceiptReader, tensor_hash
from canary_harness.models import gpt2
from canary_harness.pack import read_pack
from canary_harness.torch import Recorder, RecorderError, RecorderOptions

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
    1.13's own AdamW reads its step counter with .item(), recorder or not: docs/python.md)."""
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


def test_a_digest_library_that_cannot_be_used_writes_nothing(micro_pack: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch):
    from canary_harness.receipts import native
    from canary_harness.receipts.native import NativeDigestError

    monkeypatch.setenv(native.ENV, str(tmp_path / "nowhere.so"))
    pack = read_pack(micro_pack)
    _, model, optimizer, name_map = user_setup(pack)
    out = tmp_path / "never.h5"
    with pytest.raises(NativeDigestError, match="no such file"):
        Recorder(out, model, optimizer, name_map, pack=pack, budget_features="torch-cpu")
    assert not out.exists()


def test_an_op_tracer_that_fails_to_start_takes_its_receipt_with_it(micro_pack: Path, tmp_path: Path):
    pack = read_pack(micro_pack)
    _, model, optimizer, name_map = user_setup(pack)
    out = tmp_path / "never.h5"

    def op_names(path: str) -> str:
        raise KeyError(f"no op name for '{path}'")  # a user's naming function that fails

    with pytest.raises(KeyError, match="no op name"):
        Recorder(out, model, optimizer, name_map, pack=pack, budget_features="torch-cpu", trace="ops",
                 op_names=op_names)
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
    _, model, optimizer, name_map = user_setup(pack)
    with Recorder(tmp_path / "early.h5", model, optimizer, name_map, pack=pack,
                  budget_features="torch-cpu") as recorder:
        loss = model(torch.from_numpy(pack.batch(0)))
        loss.backward()
        with pytest.raises(RecorderError, match=r"canary tensor 'wte': optimizer.state has no 'exp_avg' .*call "
                                                r"step\(\) after optimizer.step\(\)"):
            recorder.step(loss=loss, grad_norm=1.0, batch=pack.batch(0))
        optimizer.zero_grad(set_to_none=True)
        with pytest.raises(RecorderError, match=r"canary tensor 'wte' has no gradient at step 0"):
            recorder.step(loss=loss, grad_norm=1.0, batch=pack.batch(0))
    with ReceiptReader(tmp_path / "early.h5") as r:
        assert r.steps_recorded == 0 and not r.complete


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_an_optimizer_without_adam_moments_records_what_it_keeps(micro_pack: Path, tmp_path: Path, momentum: float):
    """The runner's rule (recording.MOMENT_STATE): SGD's momentum buffer is recorded as adam_m,
    and zeros where the optimizer keeps no such state (SGD without momentum keeps none)."""
    pack = read_pack(micro_pack)
    _, model, _, name_map = user_setup(pack)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    out = tmp_path / "sgd.h5"
    with Recorder(out, model, sgd, name_map, pack=pack, budget_features="torch-cpu", steps=1) as recorder:
        loss = model(torch.from_numpy(pack.batch(0)))
        loss.backward()
        sgd.step()
        recorder.step(loss=loss, grad_norm=1.0, batch=pack.batch(0))
    reader = ReceiptReader(out)
    names, adam_m, adam_v = reader.tensor_names, reader.read("hashes/adam_m")[0], reader.read("hashes/adam_v")[0]
    by_canary = {canary: user for user, canary in name_map.items()}
    params = dict(model.named_parameters())
    for i, name in enumerate(names):
        p = params[by_canary[name]]
        zeros = tensor_hash(np.zeros(tuple(p.shape), np.float32))
        assert adam_v[i] == zeros, name
        expected = tensor_hash(sgd.state[p]["momentum_buffer"].detach().numpy()) if momentum else zeros
        assert adam_m[i] == expected, name


def _toy(tmp_path: Path, **kw):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.Adam(model.parameters())
    recorder = Recorder(tmp_path / "toy.h5", model, optimizer, budget_features="torch-cpu",
                        canary={"preset": "toy"}, tensor_names=["weight", "bias"], seed=1, overwrite=True,
                        **{"steps": 3, **kw})
    return model, optimizer, recorder


def _train(model, optimizer):
    loss = model(torch.randn(2, 4)).pow(2).sum()
    loss.backward()
    optimizer.step()
    return loss


BATCH = np.zeros((2, 5), np.int32)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_closed_recorder_refuses_steps_and_closes_again_quietly(tmp_path: Path, overlap: bool):
    """Before: with overlap, a step() after close() was accepted and the next close() waited
    forever on the stopped worker."""
    model, optimizer, recorder = _toy(tmp_path, overlap=overlap)
    loss = _train(model, optimizer)
    recorder.step(loss=loss, grad_norm=1.0, batch=BATCH)
    recorder.close()
    _train(model, optimizer)
    with pytest.raises(RecorderError, match="the recorder is closed"):
        recorder.step(loss=loss, grad_norm=1.0, batch=BATCH)
    with pytest.raises(RecorderError, match="the recorder is closed"):
        recorder.dump_tensors(1)
    recorder.close()
    with recorder:
        pass
    with ReceiptReader(tmp_path / "toy.h5") as r:
        assert r.steps_recorded == 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(loss=torch.ones(3)), r"loss: a tensor of shape \(3,\)"),
    (dict(loss=None), r"loss=None: a NoneType, not a number"),
    (dict(grad_norm="abc"), r"grad_norm='abc': a str, not a number"),
    (dict(lr="x"), r"lr='x': a str, not a number"),
    (dict(batch=None), r"batch: a NoneType"),
    (dict(batch=np.zeros(5, np.int32)), r"batch: shape \(5,\)"),
    (dict(batch=np.zeros((2, 5))), r"batch: dtype float64"),
])
def test_bad_step_arguments_are_named_and_record_nothing(tmp_path: Path, kwargs: dict, message: str):
    model, optimizer, recorder = _toy(tmp_path, overlap=False)
    loss = _train(model, optimizer)
    with pytest.raises(RecorderError, match=message):
        recorder.step(**{"loss": loss, "grad_norm": 1.0, "batch": BATCH, **kwargs})
    recorder.step(loss=loss, grad_norm=1.0, batch=BATCH)  # the refused call recorded nothing: this one can
    recorder.close()
    with ReceiptReader(tmp_path / "toy.h5") as r:
        assert r.steps_recorded == 1


def test_a_batch_not_of_the_packs_shape_is_named(micro_pack: Path, tmp_path: Path):
    pack = read_pack(micro_pack)
    _, model, optimizer, name_map = user_setup(pack)
    with Recorder(tmp_path / "r.h5", model, optimizer, name_map, pack=pack, budget_features="torch-cpu") as recorder:
        loss = model(torch.from_numpy(pack.batch(0)))
        loss.backward()
        optimizer.step()
        with pytest.raises(RecorderError, match=rf"batch: shape \(2, 3\), where the step's tokens are "
                                                rf"\({pack.batch_shape[0]}, {pack.batch_shape[1]}\)"):
            recorder.step(loss=loss, grad_norm=1.0, batch=pack.batch(0)[:, :3])


@pytest.mark.parametrize("kwargs, message", [
    (dict(tensor_names=["weight", "bias", "weight"]), r"tensor_names: 'weight' appears more than once"),
    (dict(name_map=[("weight", "weight")]), r"name_map: a list; give a mapping"),
    (dict(steps=-1), r"steps=-1: give an int"),
    (dict(steps=2.5), r"steps=2.5: give an int"),
    (dict(extra={"x": [1]}), r"extra\['x'\]: list is not a str, int or float"),
    (dict(extra={"complete": 1}), r"extra: 'complete' is set by the Recorder"),
    (dict(extra={"lane": 5}), r"extra: 'lane' is set by the Recorder"),
    (dict(extra={5: 1}), r"extra: key 5 is not a non-empty str"),
    (dict(budget_features=None), r"budget_features=None: declare it as a str"),
    (dict(budget_features="torch-cpu+torch-cpu"), r"budget_features: 'torch-cpu\+torch-cpu' names feature 'torch-cpu' twice"),
    (dict(budget_features="torch cpu"), r"budget_features: 'torch cpu': feature name 'torch cpu' is not letters"),
    (dict(trace="all"), r"trace: 'all' is not a trace level; use none or ops"),
    (dict(canary={"n_layer": 2}), r"canary: the canary JSON's 'name' is None; give a non-empty name without '/'"),
    (dict(canary={"name": "a/b"}), r"canary: the canary JSON's 'name' is 'a/b'"),
    (dict(canary="[1]"), r"canary: canary JSON is not an object"),
    (dict(colour="red"), r"Recorder: no option 'colour' \(RecorderOptions' fields: budget_features, pack, canary"),
    (dict(options={"budget_features": ""}), r"options: a dict, not a RecorderOptions"),
])
def test_bad_recorder_arguments_are_named_and_write_nothing(tmp_path: Path, kwargs: dict, message: str):
    model = torch.nn.Linear(4, 4)
    args = {**dict(budget_features="torch-cpu", canary={"preset": "toy"}, tensor_names=["weight", "bias"], seed=1,
                   steps=3), **kwargs}
    name_map = args.pop("name_map", None)
    with pytest.raises(RecorderError, match=message):
        Recorder(tmp_path / "r.h5", model, torch.optim.Adam(model.parameters()), name_map, **args)
    assert not (tmp_path / "r.h5").exists()


def test_one_options_object_serves_many_runs_and_keywords_lay_over_it(tmp_path: Path):
    options = RecorderOptions(budget_features="torch-cpu", canary={"preset": "toy"}, tensor_names=["weight", "bias"],
                              seed=1, steps=1, extra={"team": "numerics"})

    def record(path: Path, **settings) -> dict:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 4)
        optimizer = torch.optim.Adam(model.parameters())
        with Recorder(path, model, optimizer, options=options, **settings) as recorder:
            assert recorder.options.seed == settings.get("seed", 1)
            recorder.step(loss=_train(model, optimizer), grad_norm=1.0, batch=BATCH)
        with ReceiptReader(path) as r:
            return {k: r.manifest[k] for k in ("lane", "seed", "budget_features", "team")}

    assert record(tmp_path / "a.h5") == {"lane": "toy/torch", "seed": 1, "budget_features": "torch-cpu",
                                         "team": "numerics"}
    assert record(tmp_path / "b.h5", seed=7, lane="toy/mine") == {"lane": "toy/mine", "seed": 7,
                                                                   "budget_features": "torch-cpu", "team": "numerics"}
    assert options.seed == 1  # frozen: a run's keywords never change the shared object
    # The keyword form is the same object's fields: it records the same manifest.
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.Adam(model.parameters())
    with Recorder(tmp_path / "c.h5", model, optimizer, budget_features="torch-cpu", canary={"preset": "toy"},
                  tensor_names=["weight", "bias"], seed=1, steps=1, extra={"team": "numerics"}) as recorder:
        assert recorder.options == options
        recorder.step(loss=_train(model, optimizer), grad_norm=1.0, batch=BATCH)
    with ReceiptReader(tmp_path / "a.h5") as a, ReceiptReader(tmp_path / "c.h5") as c:
        assert np.array_equal(a.hashes("params"), c.hashes("params"))
        assert {k: v for k, v in a.manifest.items() if k != "created_utc"} == \
            {k: v for k, v in c.manifest.items() if k != "created_utc"}


def test_budget_features_are_declared_even_without_an_options_object(tmp_path: Path):
    model = torch.nn.Linear(4, 4)
    with pytest.raises(RecorderError, match="budget_features: declare it as a str"):
        Recorder(tmp_path / "r.h5", model, torch.optim.Adam(model.parameters()), canary={"preset": "toy"},
                 tensor_names=["weight", "bias"], seed=1, steps=1)
    assert not (tmp_path / "r.h5").exists()


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)
        self.b.weight = self.a.weight


@pytest.mark.parametrize("alias", ["a.weight", "b.weight"])
def test_a_tied_parameter_maps_by_either_name(tmp_path: Path, alias: str):
    model = Tied()
    optimizer = torch.optim.Adam(model.parameters())
    recorder = Recorder(tmp_path / "t.h5", model, optimizer, {alias: "w", "a.bias": "a.bias", "b.bias": "b.bias"},
                        budget_features="torch-cpu", canary={"preset": "toy"}, tensor_names=["w", "a.bias", "b.bias"],
                        seed=1, steps=1)
    assert recorder.parameters["w"] is model.a.weight
    recorder.close()
    with pytest.raises(RecorderError, match=r"'b.weight' and 'a.weight' are one tied parameter; map only one"):
        Recorder(tmp_path / "t2.h5", model, optimizer, {"a.weight": "w", "b.weight": "w2", "a.bias": "a.bias",
                                                         "b.bias": "b.bias"}, budget_features="torch-cpu",
                 canary={"preset": "toy"}, tensor_names=["w", "w2", "a.bias", "b.bias"], seed=1, steps=1)
    assert not (tmp_path / "t2.h5").exists()


def test_meta_device_parameters_are_named_and_write_nothing(tmp_path: Path):
    model = torch.nn.Linear(4, 4).to("meta")
    with pytest.raises(RecorderError, match=r"canary tensor 'weight': its parameter is on the meta device"):
        Recorder(tmp_path / "m.h5", model, torch.optim.Adam(model.parameters()), budget_features="torch-cpu",
                 canary={"preset": "toy"}, tensor_names=["weight", "bias"], seed=1, steps=1)
    assert not (tmp_path / "m.h5").exists()


def _datasets(path: Path) -> dict:
    """Every dataset of a receipt, by path, as numpy (what `harness check` compares)."""
    import h5py

    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


def train_one_step(pack, cfg, model, optimizer, step):
    for group in optimizer.param_groups:
        group["lr"] = gpt2.lr_at(step, cfg)
    tokens = pack.batch(step)
    loss = model(torch.from_numpy(tokens))
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    optimizer.step()
    return loss, norm, tokens


def test_overlap_writes_the_receipt_the_synchronous_recorder_writes(micro_pack: Path, tmp_path: Path,
                                                                       harness_bin: Path):
    """Both recorders on one loop: the background digest of step n runs while step n + 1
    updates params, grads and moments in place (held back to make sure), so only a true
    snapshot gives the same bytes."""
    import time

    pack = read_pack(micro_pack, canary="micro")
    cfg, model, optimizer, name_map = user_setup(pack)
    kwargs = dict(pack=pack, budget_features="torch-cpu", record_batches=True)
    background = Recorder(tmp_path / "overlap.h5", model, optimizer, name_map, overlap=True, **kwargs)
    inline = Recorder(tmp_path / "sync.h5", model, optimizer, name_map, overlap=False, **kwargs)
    assert background.overlap and not inline.overlap
    write_job = background._overlap._run

    def late_write_job(job):
        time.sleep(0.05)  # the training thread is well into the next step by now
        write_job(job)

    background._overlap._run = late_write_job
    for step in range(pack.steps):
        loss, norm, tokens = train_one_step(pack, cfg, model, optimizer, step)
        background.step(loss=loss, grad_norm=norm, batch=tokens)
        inline.step(loss=loss, grad_norm=norm, batch=tokens)
        tokens[...] = 0  # the caller's batch buffer, reused: the recorded batch must not change
        optimizer.zero_grad()
    assert background.steps_recorded == pack.steps
    background.close()
    inline.close()

    run_harness(harness_bin, "validate", str(tmp_path / "overlap.h5"))
    with ReceiptReader(tmp_path / "overlap.h5") as r:
        assert r.complete and r.steps_recorded == pack.steps
    ours, theirs = _datasets(tmp_path / "overlap.h5"), _datasets(tmp_path / "sync.h5")
    assert sorted(ours) == sorted(theirs) and "hashes/params" in ours and "batches/tokens" in ours
    for name in ours:
        assert ours[name].dtype == theirs[name].dtype and ours[name].tobytes() == theirs[name].tobytes(), name


@pytest.mark.parametrize("layout", ["contiguous", "a transposed parameter"])
def test_every_digest_path_writes_the_same_receipt(micro_pack: Path, tmp_path: Path, digest_library: str,
                                                   monkeypatch: pytest.MonkeyPatch, layout: str):
    """One loop, four recorders: the default on the CPU with the digest library (inline, the
    tensors read where they are), that library on the background worker, and the pure-Python
    digest in the background (its default) and inline. Every dataset the same bytes. With a
    non-contiguous parameter (and its moments) the library falls back to host arrays."""
    from canary_harness.receipts import native

    pack = read_pack(micro_pack, canary="micro")
    cfg, model, optimizer, name_map = user_setup(pack)
    if layout != "contiguous":
        weight = next(p for p in model.parameters() if p.dim() == 2 and p.shape[0] != p.shape[1])
        weight.data = weight.data.t().contiguous().t()  # the same values, column-major
        assert not weight.is_contiguous()
    kwargs = dict(pack=pack, budget_features="torch-cpu")
    recorders = {}
    for setting, overlap in ((digest_library, None), (digest_library, True), ("python", None), ("python", False)):
        monkeypatch.setenv(native.ENV, setting)
        name = f"{'library' if setting != 'python' else 'python'}-{overlap}"
        recorders[name] = Recorder(tmp_path / f"{name}.h5", model, optimizer, name_map, overlap=overlap, **kwargs)
    assert not recorders["library-None"].overlap and recorders["python-None"].overlap  # the defaults
    in_place_calls = []
    rows_at = recorders["library-None"]._digest.plan.rows_at
    recorders["library-None"]._digest.plan.rows_at = lambda addresses: in_place_calls.append(1) or rows_at(addresses)
    for step in range(pack.steps):
        loss, norm, tokens = train_one_step(pack, cfg, model, optimizer, step)
        for recorder in recorders.values():
            recorder.step(loss=loss, grad_norm=norm, batch=tokens)
        optimizer.zero_grad()
    for recorder in recorders.values():
        recorder.close()
    # The library read the tensors where they are only when every one was contiguous fp32.
    assert len(in_place_calls) == (pack.steps if layout == "contiguous" else 0)
    reference = _datasets(tmp_path / "python-False.h5")
    for name in recorders:
        ours = _datasets(tmp_path / f"{name}.h5")
        assert sorted(ours) == sorted(reference) and "sketches/grads_projection" in ours
        for dataset in ours:
            assert ours[dataset].tobytes() == reference[dataset].tobytes(), (name, dataset)


def test_a_failed_background_write_is_raised_by_the_next_call_not_lost(micro_pack: Path, tmp_path: Path):
    pack = read_pack(micro_pack, canary="micro")
    cfg, model, optimizer, name_map = user_setup(pack)
    recorder = Recorder(tmp_path / "r.h5", model, optimizer, name_map, pack=pack, budget_features="torch-cpu",
                        overlap=True)
    append_step = recorder.writer.append_step

    def failing_append_step(**kwargs):
        if recorder.writer.steps_recorded == 1:
            raise OSError("No space left on device")
        append_step(**kwargs)

    recorder.writer.append_step = failing_append_step
    for step in range(2):
        loss, norm, tokens = train_one_step(pack, cfg, model, optimizer, step)
        recorder.step(loss=loss, grad_norm=norm, batch=tokens)  # step 1 fails in the background
        optimizer.zero_grad()
    loss, norm, tokens = train_one_step(pack, cfg, model, optimizer, 2)
    with pytest.raises(RecorderError, match=r"step 1 could not be recorded .*OSError: No space left on device") as e:
        recorder.step(loss=loss, grad_norm=norm, batch=tokens)
    assert isinstance(e.value.__cause__, OSError)
    with pytest.raises(RecorderError, match=r"step 1 could not be recorded"):  # and again: no gap in the rows
        recorder.step(loss=loss, grad_norm=norm, batch=tokens)
    recorder.close()  # already raised: closes quietly
    with ReceiptReader(tmp_path / "r.h5") as r:
        assert r.steps_recorded == 1 and not r.complete


def test_a_failed_last_write_is_raised_by_close_and_by_with(micro_pack: Path, tmp_path: Path):
    pack = read_pack(micro_pack, canary="micro")
    for use_with in (False, True):
        cfg, model, optimizer, name_map = user_setup(pack)
        out = tmp_path / f"r{int(use_with)}.h5"
        recorder = Recorder(out, model, optimizer, name_map, pack=pack, budget_features="torch-cpu", steps=1,
                            overlap=True)
        recorder.writer.append_step = lambda **kwargs: (_ for _ in ()).throw(ValueError("a bad row"))
        loss, norm, tokens = train_one_step(pack, cfg, model, optimizer, 0)
        with pytest.raises(RecorderError, match=r"step 0 could not be recorded .*ValueError: a bad row"):
            if use_with:
                with recorder:
                    recorder.step(loss=loss, grad_norm=norm, batch=tokens)
            else:
                recorder.step(loss=loss, grad_norm=norm, batch=tokens)
                recorder.close()
        with ReceiptReader(out) as r:
            assert r.steps_recorded == 0 and not r.complete


def test_a_process_that_exits_without_close_still_writes_its_last_step(micro_pack: Path, tmp_path: Path):
    """The worker is not a daemon: the step handed to it when the script ends is written."""
    import subprocess
    import sys
    import textwrap

    out = tmp_path / "unclosed.h5"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path[:0] = {[str(Path(__file__).parent), str(Path(__file__).parent.parent)]!r}
        from canary_harness.pack import read_pack
        from canary_harness.torch import Recorder
        from test_torch_recorder import user_setup, train_one_step
        pack = read_pack({str(micro_pack)!r}, canary="micro")
        cfg, model, optimizer, name_map = user_setup(pack)
        recorder = Recorder({str(out)!r}, model, optimizer, name_map, pack=pack, budget_features="torch-cpu",
                            overlap=True)
        write_job = recorder._overlap._run
        recorder._overlap._run = lambda job: (time.sleep(0.3), write_job(job))  # still busy when the script ends
        for step in range(2):
            loss, norm, tokens = train_one_step(pack, cfg, model, optimizer, step)
            recorder.step(loss=loss, grad_norm=norm, batch=tokens)
            optimizer.zero_grad()
        """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    with ReceiptReader(out) as r:
        assert r.steps_recorded == 2 and not r.complete


@pytest.mark.parametrize("canary, lane, want", [
    ({"name": "mygpt-tiny", "preset": "tiny"}, None, "mygpt-tiny/torch"),  # name first, as the harness reads it
    ({"preset": "toy"}, None, "toy/torch"),                                # the shipped canaries' older key
    ({"n_layer": 2}, "mine/torch+x", "mine/torch+x"),                      # no name: the lane given
])
def test_the_lane_comes_from_the_canary_json_name(tmp_path: Path, canary: dict, lane, want: str):
    model = torch.nn.Linear(4, 4)
    recorder = Recorder(tmp_path / "r.h5", model, torch.optim.Adam(model.parameters()), None, budget_features="torch-cpu",
                        canary=canary, tensor_names=["weight", "bias"], seed=1, steps=1, lane=lane)
    recorder.close()
    with ReceiptReader(tmp_path / "r.h5") as reader:
        assert reader.manifest["lane"] == want
