"""Regressions injected into a Python canary (canary_harness.runs.regressions: harness power's
ladders, docs/budgets.md "Detection power"): the text parsed as canaries/fault.cpp parses it
and written back in its canonical form; each kind moves the run from its step and not
before; lr-scale scales the team's own schedule without compounding it; a regressed receipt
replays bit for bit from checkpoints before and after the regression's step."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import export_pack, run_module
from test_python_canary import SMALL, first_difference, manifest, run, series

from canary_harness.runs.regressions import parse_regression
from canary_harness.cli.usage import UsageError

SCHEDULED = str(Path(__file__).parent / "own_canaries" / "scheduled.py")
PARAMETERS = ["embed.weight", "hidden.weight", "hidden.bias", "out.weight", "out.bias"]


@pytest.mark.parametrize("text, canonical", [
    ("kind=weight-scale,step=2,tensor=out.weight,by=1e-4", "kind=weight-scale,step=2,tensor=out.weight,by=0.0001"),
    ("by=0.01,tensor=hidden.weight,step=0,kind=weight-scale", "kind=weight-scale,step=0,tensor=hidden.weight,by=0.01"),
    ("kind=weight-ulps,tensor=out.bias,ulps=65536", "kind=weight-ulps,tensor=out.bias,ulps=65536"),
    ("kind=lr-scale,step=5,by=1e-05", "kind=lr-scale,step=5,by=1e-05"),
    ("kind=lr-scale,step=1,by=-0.5", "kind=lr-scale,step=1,by=-0.5"),
    ("kind=eps-scale,by=10.0", "kind=eps-scale,by=10"),
    ("kind=eps-scale,by=1e-7", "kind=eps-scale,by=1e-07"),
])
def test_a_regression_is_written_back_as_the_cpp_writes_it(text: str, canonical: str) -> None:
    spec = parse_regression(text, PARAMETERS, 6)
    assert str(spec) == canonical
    assert parse_regression(str(spec), PARAMETERS, 6) == spec


@pytest.mark.parametrize("text, says", [
    ("kind=weight-tilt,by=1", "kind='weight-tilt' is not a fault kind (nudge, weight-scale"),
    ("kind=weight-scale,step=1,by=0.1", "weight-scale needs tensor=... (it takes step, tensor, by)"),
    ("kind=lr-scale,step=1,by=0.1,tensor=out.weight", "unknown key 'tensor' for lr-scale (known: step, by)"),
    ("kind=lr-scale,step=6,by=0.1", "step=6 is past the last step (5)"),
    ("kind=lr-scale,step=1,by=-1", "by='-1' is not a relative change E > -1, E != 0"),
    ("kind=lr-scale,step=1,by=0", "by='0' is not a relative change"),
    ("kind=eps-scale,by=0", "by='0' is not a factor > 0"),
    ("kind=eps-scale,by=1_0", "by='1_0' is not a factor > 0"),
    ("kind=eps-scale,by=inf", "by='inf' is not a factor > 0"),
    ("kind=weight-ulps,tensor=out.weight,ulps=0", "ulps='0' is not an integer >= 1"),
    ("kind=weight-ulps,tensor=lm_head.weight,ulps=1", "unknown tensor 'lm_head.weight' (the model's parameters, e.g."),
    ("kind=eps-scale,by=2,by=3", "by given twice"),
    ("kind=eps-scale,by", "field 'by' is not key=value"),
])
def test_a_bad_regression_is_refused_naming_its_field(text: str, says: str) -> None:
    with pytest.raises(UsageError) as refused:
        parse_regression(text, PARAMETERS, 6)
    assert says in str(refused.value)


@pytest.fixture(scope="module")
def clean(small_canary_receipt: Path) -> Path:
    return small_canary_receipt


@pytest.mark.parametrize("fault, params_from, loss_from", [
    ("kind=weight-scale,step=2,tensor=hidden.weight,by=0.001", 2, 2),  # scaled before step 2's forward
    ("kind=weight-ulps,tensor=hidden.weight,ulps=4096", 0, 0),            # an initial weight
    ("kind=lr-scale,step=2,by=0.01", 2, 3),                               # step 2's update, step 3's loss
    ("kind=eps-scale,by=1000", 0, 1),                                     # every update, from step 0's
])
def test_each_kind_moves_the_run_from_its_step_and_not_before(clean: Path, tmp_path: Path, fault: str, params_from: int,
                                                              loss_from: int) -> None:
    out = tmp_path / "regressed.h5"
    run(f"{SMALL}:canary", "--out", str(out), "--inject-fault", fault)
    assert manifest(out)["fault_injection"] == str(parse_regression(fault, PARAMETERS, 6))
    a, b = series(clean), series(out)
    assert first_difference(a, b, "hashes/params") == params_from
    assert first_difference(a, b, "steps/loss") == loss_from


def test_lr_scale_scales_the_teams_schedule_without_compounding_it(tmp_path: Path) -> None:
    """transformers' cosine schedule with warmup (a LambdaLR stepped inside the step): from
    step 3 every recorded lr is the schedule's own times 1.25, never 1.25 squared."""
    clean, scaled = tmp_path / "clean.h5", tmp_path / "scaled.h5"
    run(f"{SCHEDULED}:cosine_declared", "--out", str(clean))
    run(f"{SCHEDULED}:cosine_declared", "--out", str(scaled), "--inject-fault", "kind=lr-scale,step=3,by=0.25")
    lr, lr_scaled = series(clean)["steps/lr"], series(scaled)["steps/lr"]
    assert np.array_equal(lr[:3], lr_scaled[:3])
    assert lr[3:].max() > 0 and np.allclose(lr_scaled[3:], lr[3:] * 1.25, rtol=1e-7, atol=0)


@pytest.mark.parametrize("fault", ["kind=weight-scale,step=3,tensor=out.weight,by=0.01", "kind=lr-scale,step=3,by=0.01",
                                   "kind=eps-scale,by=100", "kind=weight-ulps,tensor=out.weight,ulps=256"])
def test_a_regressed_receipt_replays_bit_for_bit_from_before_and_after_its_step(tmp_path: Path, fault: str) -> None:
    out = tmp_path / "regressed.h5"
    run(f"{SMALL}:canary", "--out", str(out), "--inject-fault", fault, "--checkpoint-every", "2")
    for start in ("2", "4"):  # a checkpoint before step 3 and one after it
        replayed = run_module("canary_harness", "replay", str(out), "--from", start)
        assert f"steps {start}-5 bitwise equal to the receipt" in replayed.stdout, replayed.stdout


def test_describe_lists_the_parameters_and_the_linear_weights() -> None:
    described = json.loads(run_module("canary_harness", "describe", f"{SMALL}:canary").stdout)
    assert described["parameters"] == PARAMETERS
    assert described["linear_weights"] == ["hidden.weight", "out.weight"]  # not the embedding's table


@pytest.mark.torch_agnostic
def test_eps_scale_of_an_optimizer_without_eps_exits_2_in_one_line(tmp_path: Path) -> None:
    result = run(f"{SMALL}:sgd", "--out", str(tmp_path / "r.h5"), "--inject-fault", "kind=eps-scale,by=10", check=False)
    assert result.returncode == 2, result.stderr
    assert "kind=eps-scale: the canary's optimizer (SGD) has no eps" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "r.h5").exists()


# ---- the package's lanes of a canary pack --------------------------------------------------------
# canary_harness.lane (PyTorch) and canary_harness.jax take the same regressions through their
# --inject-fault, so that `harness power` measures a nightly's real-stack lanes (docs/budgets.md,
# "Detection power"). Without JAX (Debian's torch 1.13 interpreter) the JAX lane's refusal is
# asserted instead, never skipped.
HAS_JAX = importlib.util.find_spec("jax") is not None
LANE_STEPS = 6
LAYER = "blocks.0.attn.qkv.weight"
PACK_LANES = {"canary_harness.lane": (), "canary_harness.jax": ("--mesh", "2x1", "--shard-plan", "zero3")}


def pack_lane(module: str, pack: Path, out: Path, *args: str, check: bool = True):
    return run_module(module, "--pack", str(pack), "--out", str(out), *PACK_LANES[module], *args, check=check,
                      unset=("XLA_FLAGS",))


@pytest.fixture(scope="module")
def lane_pack(harness_bin: Path, tmp_path_factory) -> Path:
    return export_pack(harness_bin, tmp_path_factory.mktemp("lanes") / "micro.h5", steps=LANE_STEPS)


@pytest.fixture(scope="module")
def clean_lanes(lane_pack: Path) -> dict:
    runs = {}
    for module in PACK_LANES:
        if module == "canary_harness.jax" and not HAS_JAX:
            continue
        runs[module] = lane_pack.parent / f"{module}.h5"
        pack_lane(module, lane_pack, runs[module])
    return runs


@pytest.mark.parametrize("module", list(PACK_LANES))
@pytest.mark.parametrize("fault, params_from, moved, moved_from", [
    (f"kind=weight-scale,step=2,tensor={LAYER},by=0.001", 2, "steps/loss", 2),
    (f"kind=weight-ulps,tensor={LAYER},ulps=65536", 0, "hashes/grads", 0),  # too small to move micro's loss
    ("kind=lr-scale,step=2,by=0.01", 2, "steps/loss", 3),                    # step 2's update, step 3's loss
    ("kind=eps-scale,by=1000", 0, "steps/loss", 1),
])
def test_the_pack_lanes_take_each_regression_from_its_step(module: str, fault: str, params_from: int, moved: str,
                                                            moved_from: int, lane_pack: Path, clean_lanes: dict,
                                                            tmp_path: Path) -> None:
    out = tmp_path / "regressed.h5"
    if module == "canary_harness.jax" and not HAS_JAX:
        refused = pack_lane(module, lane_pack, out, "--inject-fault", fault, check=False)
        assert refused.returncode == 2 and "JAX is not installed" in refused.stderr and not out.exists()
        return
    pack_lane(module, lane_pack, out, "--inject-fault", fault)
    assert manifest(out)["fault_injection"] == fault  # written in its canonical form already
    a, b = series(clean_lanes[module]), series(out)
    assert first_difference(a, b, "hashes/params") == params_from
    assert first_difference(a, b, moved) == moved_from
    lr, lr_regressed = a["steps/lr"], b["steps/lr"]
    if fault.startswith("kind=lr-scale"):  # the recorded rate is the scaled one, from its step
        assert np.array_equal(lr[:2], lr_regressed[:2]) and lr[2:].min() > 0
        assert np.allclose(lr_regressed[2:], lr[2:] * 1.01, rtol=1e-6, atol=0)
    else:
        assert np.array_equal(lr, lr_regressed)


@pytest.mark.parametrize("module", list(PACK_LANES))
def test_a_pack_lanes_regression_of_an_unknown_tensor_exits_2_in_one_line(module: str, lane_pack: Path,
                                                                          tmp_path: Path) -> None:
    out = tmp_path / "r.h5"
    refused = pack_lane(module, lane_pack, out, "--inject-fault", "kind=weight-ulps,tensor=lm_head.weight,ulps=1",
                        check=False)
    says = "unknown tensor 'lm_head.weight'" if module == "canary_harness.lane" or HAS_JAX else "JAX is not installed"
    assert refused.returncode == 2 and says in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and not out.exists()


def test_weight_scale_scales_an_fsdp_shard_from_its_step(tmp_path: Path, small_canary_fsdp: tuple) -> None:
    """FSDP2 replaces the parameters with sharded ones: the weight is found by its name at
    the regression's step and scaled shard by shard (it was refused before). Torch 1.13 has
    no FSDP2: its refusal is asserted instead."""
    from canary_harness.runs.distributed import fsdp_available

    (result, clean), scaled = small_canary_fsdp, tmp_path / "scaled.h5"  # conftest's clean run, only read here
    if not fsdp_available():
        assert result.returncode == 2 and "--layout fsdp: torch 1.13" in result.stderr, result.stderr
        return
    run(f"{SMALL}:canary", "--out", str(scaled), "--layout", "fsdp", "--inject-fault",
        "kind=weight-scale,step=2,tensor=hidden.weight,by=0.001")
    a, b = series(clean), series(scaled)
    assert first_difference(a, b, "hashes/params") == 2 and first_difference(a, b, "steps/loss") == 2
