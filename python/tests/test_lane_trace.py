"""`--trace ops` in the PyTorch lane (and canary_harness.torch.Recorder): op traces from module
hooks in the C++ engines' /trace layout, so that `harness bisect` names the first divergent op
between two torch receipts, and reads a torch receipt's traces beside cpu-ref's."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from canary_harness import ReceiptReader, tensor_hash
from canary_harness.receipts.digest import sketch
from canary_harness.runs.faults import _NudgeFirst
from canary_harness.runs.pack_step import train_step
from canary_harness.models import gpt2
from canary_harness.runs.optim import CanaryAdamW
from canary_harness.pack import read_pack
from canary_harness.receipts.receipt import ReceiptWriter, TraceColumn
from canary_harness.torch import Recorder, RecorderError
from canary_harness.tracing.trace import OpTracer, TraceError

from conftest import export_pack, run_harness
from host_reads import HostReads
from test_lane import lane
from test_torch_recorder import user_setup

STEPS = 4
FAULT_STEP, FAULT_OP = 2, "blocks.1.attn.proj"  # micro has blocks 0 and 1
COLUMNS = ("op_index", "op", "layer", "phase", "tensor", "kind")


@pytest.fixture(scope="module")
def traced(harness_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """micro for STEPS steps: the pack, cpu-ref with traces, and the fp32 torch lane untraced,
    traced, and traced with a 1-ulp fault at FAULT_STEP in FAULT_OP."""
    d = tmp_path_factory.mktemp("lane-trace")
    pack = export_pack(harness_bin, d / "pack.h5", steps=STEPS)
    cpu = d / "cpu-ref.h5"
    run_harness(harness_bin, "run", "--canary", "micro", "--steps", str(STEPS), "--trace", "ops", "--out", str(cpu))
    runs = {"dir": d, "pack": pack, "cpu": cpu}
    for name, extra in (("plain", []), ("clean", ["--trace", "ops"]),
                        ("fault", ["--trace", "ops", "--inject-fault", f"step={FAULT_STEP},op={FAULT_OP}"])):
        runs[name] = d / f"{name}.h5"
        lane("--pack", str(pack), "--out", str(runs[name]), "--threads", "1", *extra)
    return runs


def columns_of(path: Path) -> dict:
    with h5py.File(path, "r") as f:
        return {name: f["trace"][name][()] for name in COLUMNS}


def test_traced_lane_validates_and_tracing_changes_no_number(traced: dict, harness_bin: Path):
    for run in ("clean", "fault"):
        run_harness(harness_bin, "validate", str(traced[run]))
    with ReceiptReader(traced["clean"]) as r, ReceiptReader(traced["plain"]) as plain:
        assert r.manifest["trace"] == "ops" and json.loads(r.manifest["run_options"])["trace"] == "ops"
        assert plain.manifest["trace"] == "none" and plain.trace_columns() is None
        for family in ("params", "grads", "adam_m", "adam_v"):  # hooks keep references, change nothing
            assert np.array_equal(r.hashes(family), plain.hashes(family)), family
        for series in ("loss", "grad_norm", "lr"):
            assert np.array_equal(r.steps(series), plain.steps(series)), series
    # Stored as the C++ writes /trace: every dataset's type, shape, chunks and filters.
    with h5py.File(traced["clean"], "r") as t, h5py.File(traced["cpu"], "r") as c:
        assert t["trace"].attrs["level"] == c["trace"].attrs["level"] == b"ops"
        assert sorted(t["trace"]) == sorted(c["trace"])
        for name in c["trace"]:
            a, b = t["trace"][name], c["trace"][name]
            assert (a.dtype, a.shape, a.maxshape, a.chunks) == (b.dtype, b.shape, b.maxshape, b.chunks), name
            assert (a.compression, a.compression_opts, a.shuffle, a.fletcher32) == \
                (b.compression, b.compression_opts, b.shuffle, b.fletcher32), name
        assert t["trace"]["l2"].compression == "gzip" and t["trace"]["hash"].chunks == (1, t["trace"]["hash"].shape[1])


def test_trace_layout_is_cpu_refs(traced: dict, harness_bin: Path, tmp_path: Path):
    """`harness run --canary micro --steps 2 --trace ops`: the same columns in the same order."""
    cpu = tmp_path / "cpu-ref-2.h5"
    run_harness(harness_bin, "run", "--canary", "micro", "--steps", "2", "--trace", "ops", "--out", str(cpu))
    torch_cols, cpu_cols = columns_of(traced["clean"]), columns_of(cpu)
    for name in COLUMNS:
        assert np.array_equal(torch_cols[name], cpu_cols[name]), name
    ops = [op.decode() for op in torch_cols["op"]]
    assert len(ops) == 109 and ops[14] == FAULT_OP  # micro: 24 forward, 56 backward, 1 + 28 optimizer outputs
    with ReceiptReader(traced["clean"]) as r:
        assert r.trace_columns()[14] == TraceColumn(14, FAULT_OP, 1, "forward", FAULT_OP + ".out", "activation")


def test_traced_values_follow_cpu_ref_and_digest_like_the_cpp(traced: dict):
    """The same quantity in every column (within fp32 rounding of cpu-ref's), and where the
    values are the same fp32 bits, the same hash, l2 and projection as the C++ recorder."""
    with h5py.File(traced["clean"], "r") as t, h5py.File(traced["cpu"], "r") as c:
        l2, ref = t["trace/l2"][()], c["trace/l2"][()]
        assert np.max(np.abs(l2 - ref) / np.abs(ref)) < 1e-5  # measured 3e-7: fp32 rounding, nothing more
        hashes, cpu_hashes = t["trace/hash"][()], c["trace/hash"][()]
        same = hashes == cpu_hashes
        assert same[0, 0]  # step 0's embedding: wte[tok] + wpe[pos], the same fp32 sums in torch and cpu-ref
        assert np.array_equal(l2[same], ref[same])
        assert np.array_equal(t["trace/projection"][()][same], c["trace/projection"][()][same])
        assert not same.all()


def test_trace_digests_are_the_receipts_own(traced: dict):
    """The optimizer's columns hold what /steps and /hashes record, digested bit for bit alike."""
    with ReceiptReader(traced["clean"]) as r:
        cols = r.trace_columns()
        hashes, l2, projection = r.read("/trace/hash"), r.read("/trace/l2"), r.read("/trace/projection")
        param_l2, param_projection = r.sketches("params")
        where = {(c.op, c.phase, c.tensor): i for i, c in enumerate(cols)}
        for s in range(STEPS):
            loss, norm = np.float32(r.steps("loss")[s]), np.float32(r.steps("grad_norm")[s])
            assert hashes[s, where[("loss", "forward", "loss")]] == tensor_hash(np.array([loss]))
            i = where[("optimizer", "optimizer", "grad_norm")]
            assert hashes[s, i] == tensor_hash(np.array([norm]))
            assert (l2[s, i], *projection[s, i]) == (sketch(np.array([norm]), "grad_norm").l2,
                                                     *sketch(np.array([norm]), "grad_norm").projection)
            for k, name in enumerate(r.tensor_names):
                i = where[(name, "optimizer", name)]
                assert hashes[s, i] == r.hashes("params")[s, k], (s, name)
                assert l2[s, i] == param_l2[s, k] and np.array_equal(projection[s, i], param_projection[s, k])


def test_bisect_names_the_faulted_op(traced: dict, harness_bin: Path):
    """A 1-ulp fault: rounded away before anything a step records (the residual add absorbs
    it), named by the traces: step FAULT_STEP, op FAULT_OP's forward output."""
    result = run_harness(harness_bin, "bisect", str(traced["fault"]), str(traced["clean"]), "--json", check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    out = json.loads(result.stdout)
    assert (out["verdict"], out["mode"], out["op_trace"]) == ("diverged", "bitwise", "receipts")
    assert out["first_divergent_step"] == out["equal_steps"] == FAULT_STEP
    assert out["first_divergent_metric"] in ("trace", "hashes")
    assert out["first_divergent_op"] == {"index": 14, "name": FAULT_OP, "layer": 1, "phase": "forward",
                                         "tensor": FAULT_OP + ".out", "kind": "activation", "level": "ops",
                                         "site": None, "other": None}
    with h5py.File(traced["fault"], "r") as a, h5py.File(traced["clean"], "r") as b:
        assert np.array_equal(a["trace/hash"][:FAULT_STEP], b["trace/hash"][:FAULT_STEP])
        assert not np.array_equal(a["trace/hash"][FAULT_STEP], b["trace/hash"][FAULT_STEP])
    # A clean run again is bitwise the clean run, traces included: bisect calls them equivalent.
    result = run_harness(harness_bin, "bisect", str(traced["clean"]), str(traced["clean"]), "--json", check=False)
    assert result.returncode == 0 and json.loads(result.stdout)["verdict"] == "equivalent"


def test_bisect_reads_a_torch_trace_beside_cpu_refs(traced: dict, harness_bin: Path):
    result = run_harness(harness_bin, "bisect", str(traced["clean"]), str(traced["cpu"]), "--json", check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    out = json.loads(result.stdout)
    assert (out["verdict"], out["mode"], out["budget"]) == ("equivalent", "budget", ["torch-cpu"])


def test_bisect_against_cpu_ref_names_the_step_and_tensor_that_leave_the_budget(traced: dict, harness_bin: Path,
                                                                                 tmp_path: Path):
    """A fault far outside torch-cpu's budget (2**22 ulps: the value's exponent moves), bisected
    against cpu-ref in budget mode: the fault's step, the metric that left the budget, and,
    from the two stacks' traces, the faulted op's output as the first to leave it."""
    big = tmp_path / "big-fault.h5"
    lane("--pack", str(traced["pack"]), "--out", str(big), "--threads", "1", "--trace", "ops",
         "--inject-fault", f"step={FAULT_STEP},op={FAULT_OP},ulps={2**22}")
    result = run_harness(harness_bin, "bisect", str(big), str(traced["cpu"]), "--json", check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    out = json.loads(result.stdout)
    assert (out["verdict"], out["mode"], out["budget"]) == ("diverged", "budget", ["torch-cpu"])
    assert out["first_divergent_step"] == FAULT_STEP, out
    assert out["first_divergent_metric"] in ("loss", "grad_norm", "params_sketch"), out
    assert out["op_trace"] == "receipts", out
    op = out["first_divergent_op"]
    assert (op["name"], op["tensor"], op["phase"]) == (FAULT_OP, FAULT_OP + ".out", "forward"), op
    assert op["distance"] > op["allowed"] > 0, op

def test_bisect_of_untraced_torch_receipts_says_why_no_op_is_named(traced: dict, harness_bin: Path, tmp_path: Path):
    """Without traces, bisect replays the step to find the op: the package replays a lane's
    receipt from its pack, which the receipt only names; without --pack bisect says so (and
    a replay of the lane's receipt from its pack does reproduce it)."""
    big = tmp_path / "big-untraced.h5"
    lane("--pack", str(traced["pack"]), "--out", str(big), "--threads", "1",
         "--inject-fault", f"step={FAULT_STEP},op={FAULT_OP},ulps={2**22}")
    result = run_harness(harness_bin, "bisect", str(big), str(traced["plain"]), "--json", check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    out = json.loads(result.stdout)
    assert (out["verdict"], out["first_divergent_step"], out["first_divergent_op"]) == ("diverged", FAULT_STEP, None)
    assert "a PyTorch lane's receipt of the canary pack" in out["no_op_reason"], out
    assert "give that pack with --pack" in out["no_op_reason"] and "json" not in out["no_op_reason"], out
    # A replay of the lane's receipt needs its pack (the receipt names it only), and with it reproduces the run.
    replayed = run_harness(harness_bin, "replay", str(big), "--from", "0", check=False)
    assert replayed.returncode == 2 and len(replayed.stderr.strip().splitlines()) == 1, replayed.stderr
    assert "a PyTorch lane's receipt of the canary pack" in replayed.stderr and "--pack" in replayed.stderr
    replayed = run_harness(harness_bin, "replay", str(big), "--from", str(FAULT_STEP), "--pack", str(traced["pack"]))
    assert "bitwise equal to the receipt" in replayed.stdout, replayed.stdout


# ---- in process: what the hooks see -----------------------------------------------------------------

def micro(pack_path: Path):
    pack = read_pack(pack_path)
    cfg = gpt2.CanaryConfig.from_json(pack.canary_json)
    return pack, cfg


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_op_modules_compute_the_functional_model_bit_for_bit(micro_pack: Path, precision: str):
    """GPT2 runs its ops as modules (what the hooks see); forward_loss over the same parameters
    gives the same loss and every gradient bit for bit, so the lane's numbers are the ones it had."""
    pack, cfg = micro(micro_pack)
    tokens = torch.from_numpy(pack.batch(1))
    model = gpt2.GPT2(cfg, pack.init)
    params = {n: torch.from_numpy(v.copy()).requires_grad_(True) for n, v in pack.init.items()}
    autocast = torch.autocast(device_type="cpu", dtype=torch.bfloat16) if precision == "bf16" else None
    with autocast or torch.enable_grad():
        loss, functional = model(tokens), gpt2.forward_loss(params, tokens, cfg)
    loss.backward()
    functional.backward()
    assert loss.item() == functional.item()
    for name, p in model.named_parameters():
        assert torch.equal(p.grad, params[name].grad), name


def test_traced_values_are_what_autograd_computed(micro_pack: Path):
    """Each column, taken by the hooks, is bitwise the tensor autograd computed: forward outputs,
    every gradient after its last writer (retain_grad on an untraced twin), the first writer's
    own contribution (the residual stream's and tied wte's partial gradients)."""
    pack, cfg = micro(micro_pack)
    tokens = torch.from_numpy(pack.batch(0))
    model = gpt2.GPT2(cfg, pack.init)
    tracer = OpTracer(model)
    model(tokens).backward()
    sites, values = tracer.finish_step()
    tracer.close()

    twin = gpt2.GPT2(cfg, pack.init)
    outs = {}

    def keep(name, t):
        t.retain_grad()
        outs[name] = t
        return t

    twin(tokens, keep).backward()
    params = dict(twin.named_parameters())
    last = {}
    for i, (op, layer, phase, tensor, kind) in enumerate(sites):
        if phase == "forward":
            assert torch.equal(values[i], outs[op]), op
        else:
            last[(tensor, kind)] = i
    for (tensor, kind), i in last.items():  # after the last op that adds to it: the whole gradient
        want = params[tensor].grad if kind == "gradient" else outs[tensor[:-len(".out")]].grad
        assert torch.equal(values[i], want), tensor
    first = {}
    for i, site in enumerate(sites):
        if site[2] == "backward":
            first.setdefault((site[3], site[4]), (site[0], i))
    # mlp.residual adds d(out) into the stream's gradient first: its contribution is d(out) itself
    op, i = first[("blocks.1.attn.residual.out", "activation_grad")]
    assert op == "blocks.1.mlp.residual" and torch.equal(values[i], outs["blocks.1.mlp.residual"].grad)
    op, i = first[("wte", "gradient")]  # lm_head's part of the tied wte's gradient
    assert op == "lm_head"
    lm = outs["lm_head"].grad.reshape(-1, cfg.vocab_size).t() @ outs["lnf"].detach().reshape(-1, cfg.channels)
    torch.testing.assert_close(values[i], lm, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(values[i], params["wte"].grad)  # not the whole gradient: embedding adds to it


@pytest.mark.parametrize("precision, fault", [("fp32", None), ("bf16", "blocks.1.attn.proj")])
def test_the_traced_step_reads_nothing_on_the_host(micro_pack: Path, precision: str, fault):
    """Hooks keep device tensors only: forward, backward, norm, clip and AdamW with the tracer
    attached (and a fault's nudge hook, and autocast) make no .item(), float(), .cpu(), ..."""
    pack, cfg = micro(micro_pack)
    model = gpt2.GPT2(cfg, pack.init)
    optimizer = CanaryAdamW(model.named_parameters(), cfg)
    active = torch.ones((), dtype=torch.bool)
    if fault:
        model.get_submodule(fault).register_forward_hook(lambda m, args, out: _NudgeFirst.apply(out, active, 1))
    tracer = OpTracer(model)
    autocast = torch.autocast(device_type="cpu", dtype=torch.bfloat16) if precision == "bf16" else None
    for step in range(2):
        optimizer.set_lr(gpt2.lr_at(step, cfg))
        inputs = torch.from_numpy(pack.batch(step))
        with HostReads() as reads:
            train_step(model, optimizer, inputs, autocast)
        assert reads.reads == [], reads.reads
        sites, values = tracer.finish_step()
        assert len(sites) == 24 + 56 and all(isinstance(v, torch.Tensor) for v in values)
    tracer.close()


def test_recorder_traces_a_user_model_under_its_names(micro_pack: Path, cpp_trace_receipt: Path, harness_bin: Path,
                                                      tmp_path: Path):
    """Any loop: a user's module tree (the canary under net.*), torch.optim.AdamW, clip_grad_norm_.
    Op names are module paths; op_names maps them onto the canary's, and the layout is cpu-ref's."""
    pack = read_pack(micro_pack)
    outs = {}
    for label, op_names in (("paths", None), ("canary", lambda path: path.removeprefix("net."))):
        cfg, model, optimizer, name_map = user_setup(pack)
        out = outs[label] = tmp_path / f"user-{label}.h5"
        recorder = Recorder(out, model, optimizer, name_map, pack=pack, budget_features="torch-cpu", trace="ops",
                            op_names=op_names)
        for step in range(2):
            for group in optimizer.param_groups:
                group["lr"] = gpt2.lr_at(step, cfg)
            tokens = pack.batch(step)
            loss = model(torch.from_numpy(tokens))
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            recorder.step(loss=loss, grad_norm=norm, batch=tokens)
            optimizer.zero_grad()
        recorder.close()
        run_harness(harness_bin, "validate", str(out))
    with ReceiptReader(outs["paths"]) as r:
        cols = r.trace_columns()
        assert cols[14] == TraceColumn(14, "net.blocks.1.attn.proj", 1, "forward", "net.blocks.1.attn.proj.out",
                                       "activation")
        assert cols[-1] == TraceColumn(cols[-1].op_index, "lnf.bias", -1, "optimizer", "lnf.bias", "parameter")
    torch_cols, cpu_cols = columns_of(outs["canary"]), columns_of(cpp_trace_receipt)
    for name in COLUMNS:
        assert np.array_equal(torch_cols[name], cpu_cols[name]), name


def test_any_module_tree_is_traced_by_its_structure():
    """No name matching: a Sequential's leaf calls are the ops, named by path; an in-place op
    that overwrites a traced output is refused, naming the op."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x = torch.randn(3, 4)
    tracer = OpTracer(net)
    net(x).sum().backward()
    sites, values = tracer.finish_step()
    assert sites == [("0", -1, "forward", "0.out", "activation"), ("1", -1, "forward", "1.out", "activation"),
                     ("2", -1, "forward", "2.out", "activation"),
                     ("2", -1, "backward", "1.out", "activation_grad"), ("2", -1, "backward", "2.weight", "gradient"),
                     ("2", -1, "backward", "2.bias", "gradient"),
                     ("1", -1, "backward", "0.out", "activation_grad"),
                     ("0", -1, "backward", "0.weight", "gradient"), ("0", -1, "backward", "0.bias", "gradient")]
    assert torch.equal(values[4], net[2].weight.grad) and torch.equal(values[8], net[0].bias.grad)
    with torch.no_grad():  # calls with grad disabled are not ops of a step
        net(x)
    assert tracer.finish_step() == ([], [])
    tracer.close()

    inplace = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(inplace=True), torch.nn.Linear(8, 1))
    tracer = OpTracer(inplace)
    inplace(x).sum().backward()
    with pytest.raises(TraceError, match="output of op '0' was modified in place"):
        tracer.finish_step()
    tracer.close()


class _RMSNorm(torch.nn.Module):
    """Reads its argument twice (x * rsqrt(mean(x^2))), as Llama's, Mixtral's and T5's norms do."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


class _Add(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


class _Block(torch.nn.Module):
    """x + drop(proj(norm(x))): x's gradient is three reads' (the residual's, the norm's pow and
    mul), and the dropout of p=0 returns its argument as it came."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm, self.proj = _RMSNorm(channels), torch.nn.Linear(channels, channels)
        self.drop, self.residual = torch.nn.Dropout(0.0), _Add()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.residual(x, self.drop(self.proj(self.norm(x))))


class _NormedNet(torch.nn.Module):
    def __init__(self, channels: int = 24) -> None:  # C = channels
        super().__init__()
        self.embed = torch.nn.Embedding(16, channels)
        self.blocks = torch.nn.ModuleList([_Block(channels) for _ in range(2)])
        self.head = torch.nn.Linear(channels, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids (B, T) -> a 0-D loss
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x).square().mean()


def test_tracing_an_op_that_reads_its_argument_twice_changes_no_gradient():
    """Found by the zoo's nightly fault control (Llama, Mixtral, BERT, T5: the traced run left the
    untraced one at step 0): an op handed a view of its argument summed its own reads of it
    first, so a gradient of three reads was added in another order. Traced, every gradient is
    bitwise the untraced one, and the traced values are still what autograd computed."""

    def run(trace: bool):
        torch.manual_seed(0)
        net, ids = _NormedNet(), torch.randint(16, (8, 13))
        outs = {}
        if trace:
            tracer = OpTracer(net)
        else:  # the untraced twin keeps each op's output and its gradient
            for path, module in net.named_modules():
                module.register_forward_hook(lambda m, a, out, path=path: outs.setdefault(path, out).retain_grad())
        net(ids).backward()
        traced = tracer.finish_step() if trace else None
        if trace:
            tracer.close()
        return {n: p.grad for n, p in net.named_parameters()}, traced, outs

    plain, _, outs = run(False)
    grads, (sites, values), _ = run(True)
    assert [n for n in plain if not torch.equal(grads[n], plain[n])] == []
    at = {(op, phase, tensor): i for i, (op, _, phase, tensor, _) in enumerate(sites)}
    stream, proj = "blocks.0.residual.out", "blocks.1.proj.out"  # the dropout's output is proj's
    # the first to add to the stream's gradient: the residual, whose add passes its gradient on
    assert torch.equal(values[at[("blocks.1.residual", "backward", stream)]], outs["blocks.1.residual"].grad)
    # the last: the norm (its pow's and mul's parts), the whole gradient
    assert torch.equal(values[at[("blocks.1.norm", "backward", stream)]], outs["blocks.0.residual"].grad)
    assert torch.equal(values[at[("blocks.1.residual", "backward", proj)]], outs["blocks.1.residual"].grad)
    assert torch.equal(values[at[("blocks.1.drop", "backward", proj)]], outs["blocks.1.proj"].grad)
    assert ("blocks.1.drop", "forward", "blocks.1.drop.out") in at


def test_a_traced_receipt_traces_every_step(tmp_path: Path):
    """The writer: /trace from step 0 on, the same columns every step; a bad row writes nothing."""
    canary = {"preset": "x"}
    manifest = {"lane": "x/torch", "engine": "torch", "budget_features": "torch-cpu", "canary": canary, "seed": 1,
                "steps_planned": 3}
    cols = [TraceColumn(0, "op", -1, "forward", "op.out", "activation"),
            TraceColumn(1, "optimizer", -1, "optimizer", "grad_norm", "scalar")]
    step = {"loss": 1.0, "grad_norm": 1.0, "lr": 0.1, "batch_hash": 0,
            "hashes": {f: [1] for f in ("params", "grads", "adam_m", "adam_v")},
            "sketches": {f: [(1.0, np.zeros(16))] for f in ("params", "grads")}}
    row = (cols, [5, 6], [(1.0, np.zeros(16)), (2.0, np.ones(16))])
    with ReceiptWriter(tmp_path / "w.h5", manifest, ["t"]) as w:
        w.append_step(**step, trace=row)
        with pytest.raises(ValueError, match="other ones than the first step's"):
            w.append_step(**step, trace=(cols[:1], [5], [(1.0, np.zeros(16))]))
        with pytest.raises(ValueError, match="pass trace= at every step"):
            w.append_step(**step)
        w.append_step(**step, trace=row)
    with ReceiptReader(tmp_path / "w.h5") as r:
        assert r.trace_columns() == cols and r.steps_recorded == 2
        assert r.read("/trace/hash").tolist() == [[5, 6], [5, 6]]
    with ReceiptWriter(tmp_path / "late.h5", manifest, ["t"]) as w:
        w.append_step(**step)
        with pytest.raises(ValueError, match="start at step 0"):
            w.append_step(**step, trace=row)
    with pytest.raises(RecorderError, match="trace: 'all' is not a trace level"):
        Recorder(tmp_path / "r.h5", torch.nn.Linear(1, 1), torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), 0.1),
                 budget_features="x", canary=canary, tensor_names=["weight", "bias"], seed=1, steps=1, trace="all")
