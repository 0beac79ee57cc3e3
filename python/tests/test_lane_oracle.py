"""The op oracle and replay on the built-in canary's PyTorch lane (`python3 -m canary_harness.lane`;
docs/oracle.md, "PyTorch lanes"): the package builds the lane's canary again from the pack
it ran (`--pack`), replays its steps bit for bit and captures one step's aten ops, which the
harness judges. A clean fp32 lane has no op over its bound, a clean bf16 lane neither but
where its torch's bf16 kernels round inside (torch 1.13's matmuls on a CPU without
AVX512-BF16 and its softmax backward: then they alone are named); a bf16 lane judged as
fp32 has its bf16 results named below fp32; a receipt without its pack, with another pack,
or --pack with a receipt that is not a lane's, is refused in one line (exit 2). At module
outputs (`--level modules`, torch_xla's level) a clean lane is within and a nudged module
is named alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

import pytest

from conftest import bf16_ops_rounding_inside, export_pack, precision_report, run_harness, run_module

STEPS = 3


@pytest.fixture(scope="module")
def pack(harness_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_pack(harness_bin, tmp_path_factory.mktemp("lane-oracle") / "pack.h5", steps=STEPS)


def _lane(pack: Path, out: Path, precision: str = "fp32") -> Path:
    run_module("canary_harness.lane", "--pack", str(pack), "--out", str(out), "--precision", precision)
    return out


@pytest.fixture(scope="module")
def lanes(pack: Path) -> dict:
    """The clean lanes, fp32 and bf16, made once: every test here only reads them."""
    return {precision: _lane(pack, pack.parent / f"{precision}.h5", precision) for precision in ("fp32", "bf16")}


def _precision(harness_bin: Path, receipt: Path, *flags: str) -> tuple:
    return precision_report(harness_bin, receipt, STEPS - 1, *flags)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_lanes_ops_are_over_their_bounds_only_where_its_kernels_are(harness_bin: Path, pack: Path, lanes: dict,
                                                                       precision: str) -> None:
    """A clean fp32 lane is within; a clean bf16 lane too, but where this torch's bf16 kernels
    round inside (conftest.py's probes: matmuls' partial sums, softmax backward's
    intermediates): then those ops, and nothing else, are over."""
    code, report = _precision(harness_bin, lanes[precision], "--pack", str(pack))
    assert report["lane"] == ("micro/torch" if precision == "fp32" else "micro/torch+bf16")
    judged = report["judged"]
    assert len(judged) > 100
    # the model's GEMMs forward and backward, and the optimizer's update, are among what is judged
    phases = {j["phase"] for j in judged if j["op"] in ("aten.addmm.default", "aten.mm.default", "aten.bmm.default")}
    assert {"forward", "backward"} <= phases, phases
    assert any(j["phase"] == "optimizer" for j in judged)
    rounding_inside = bf16_ops_rounding_inside() if precision == "bf16" else set()
    if not rounding_inside:
        assert code == 0 and report["verdict"] == "within" and report["over"] == [], report["over"][:3]
        return
    assert code == 1 and report["over"], "the probes' kernels are over their bounds, and the lane runs them"
    assert {j["op"] for j in report["over"]} <= rounding_inside, report["over"][:3]
    assert all(j["stored"] == "bf16" and j["operands"] == "bf16" for j in report["over"])


def test_a_bf16_lane_judged_as_fp32_is_named_below_it(harness_bin: Path, pack: Path, lanes: dict) -> None:
    code, report = _precision(harness_bin, lanes["bf16"], "--pack", str(pack), "--against", "fp32")
    assert code == 1 and report["verdict"] == "over"
    assert {j["below"] for j in report["over"]} == {"its result is bf16, below the fp32 the run declares"}
    assert any(j["op"] == "aten.mm.default" or j["op"] == "aten.addmm.default" for j in report["over"])


def test_at_module_outputs_a_clean_lane_is_within_and_a_nudged_module_is_named_alone(harness_bin: Path, pack: Path,
                                                                                    lanes: dict, tmp_path: Path) -> None:
    """`--level modules`: each op module judged from its own inputs and parameters (what
    torch_xla's lanes are judged by); a 2^12-ulp nudge of one Linear's output is that module
    over its bound and nothing else (the next module reads the nudged value as its input)."""
    code, report = _precision(harness_bin, lanes["fp32"], "--pack", str(pack), "--level", "modules")
    assert code == 0 and report["verdict"] == "within", report["over"][:3]
    kinds = {j["op"] for j in report["judged"]}
    assert kinds == {"Embedding", "LayerNorm", "Linear", "Residual", "LmHead", "Attention", "GELU", "Loss"}, kinds
    assert all(j["phase"] == "forward" and j["result"] == "out" for j in report["judged"])
    assert report["not_judged"] == {}, report["not_judged"]  # every op module of the canary has its bound
    faulted = tmp_path / "faulted.h5"
    run_module("canary_harness.lane", "--pack", str(pack), "--out", str(faulted),
               "--inject-fault", f"step={STEPS - 1},op=blocks.0.mlp.fc,ulps=4096")
    code, report = _precision(harness_bin, faulted, "--pack", str(pack), "--level", "modules")
    assert code == 1 and [(j["site"], j["op"]) for j in report["over"]] == [("blocks.0.mlp.fc", "Linear")], report["over"]
    assert report["over"][0]["worst_index"] == 0


@pytest.fixture(scope="module")
def llama_lane(harness_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    """llama-tiny's pack and its clean fp32 lane, made once."""
    d = tmp_path_factory.mktemp("llama-oracle")
    llama_pack = export_pack(harness_bin, d / "pack.h5", canary="llama-tiny", steps=STEPS)
    return {"pack": llama_pack, "clean": _lane(llama_pack, d / "clean.h5")}


def test_llamas_modules_are_judged_at_their_outputs(harness_bin: Path, llama_lane: Dict[str, Path]) -> None:
    """llama-tiny's lane at module outputs: its RMSNorms (a layer norm's bound, of a mean that
    is exactly 0), its RoPEs (two roundings), its embedding (a copy, exact), Linears and
    residual adds, grouped-query attention cores, SwiGLUs and the loss judged, within: nothing unjudged."""
    code, report = _precision(harness_bin, llama_lane["clean"], "--pack", str(llama_lane["pack"]), "--level", "modules")
    assert code == 0 and report["verdict"] == "within", report["over"][:3]
    kinds = {j["op"] for j in report["judged"]}
    assert kinds == {"Embedding", "RMSNorm", "Rope", "Linear", "Residual", "Attention", "SwiGLU", "Loss"}, kinds
    assert report["not_judged"] == {}, report["not_judged"]


@pytest.mark.parametrize("nudged, ulps, module", [("blocks.1.mlp_norm", 4096, "RMSNorm"),
                                                   ("blocks.1.attn.rope_k", 64, "Rope"),
                                                   ("blocks.0.attn", 1024, "Attention"),
                                                   ("blocks.1.mlp.swiglu", 64, "SwiGLU"),
                                                   ("loss", 4096, "Loss")])
def test_a_nudged_llama_module_is_named_alone(harness_bin: Path, llama_lane: Dict[str, Path], tmp_path: Path,
                                              nudged: str, ulps: int, module: str) -> None:
    """A nudge of one RMSNorm's output by 2^12 ulps, of one RoPE's or SwiGLU's by 64, of one
    attention core's by 2^10 or of the loss by 2^12, is that module over its bound and nothing
    else."""
    faulted = tmp_path / "faulted.h5"
    run_module("canary_harness.lane", "--pack", str(llama_lane["pack"]), "--out", str(faulted),
               "--inject-fault", f"step={STEPS - 1},op={nudged},ulps={ulps}")
    code, report = _precision(harness_bin, faulted, "--pack", str(llama_lane["pack"]), "--level", "modules")
    assert code == 1 and [(j["site"], j["op"]) for j in report["over"]] == [(nudged, module)], report["over"]


def test_a_step_of_which_nothing_is_judged_is_no_verdict(harness_bin: Path, pack: Path, lanes: dict) -> None:
    """A bf16 lane at its module outputs: autocast rounds every module's operands inside it,
    so none is judged, and that is exit 2 with one line, never "within"."""
    result = run_harness(harness_bin, "precision", str(lanes["bf16"]), "--step", "1", "--pack", str(pack),
                         "--level", "modules", check=False)
    assert result.returncode == 2 and "no result of step 1 could be judged" in result.stderr, result.stderr
    assert "under bf16 autocast" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_the_level_is_refused_in_one_line_where_it_has_no_meaning(harness_bin: Path, pack: Path,
                                                                  cpp_receipt: Path) -> None:
    refused = run_harness(harness_bin, "precision", str(cpp_receipt), "--step", "1", "--level", "modules", check=False)
    assert refused.returncode == 2 and "--level" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    refused = run_harness(harness_bin, "precision", str(cpp_receipt), "--step", "1", "--level", "ops", check=False)
    assert refused.returncode == 2 and "--level" in refused.stderr, refused.stderr


def test_a_lane_replays_bit_for_bit_from_its_pack(harness_bin: Path, pack: Path, lanes: dict) -> None:
    replayed = run_harness(harness_bin, "replay", str(lanes["fp32"]), "--from", "1", "--pack", str(pack), "--json")
    result = json.loads(replayed.stdout)
    assert result["verdict"] == "reproduced" and (result["from"], result["to"]) == (1, STEPS - 1), result


def test_a_lane_without_its_pack_or_with_another_is_refused(harness_bin: Path, pack: Path, lanes: dict,
                                                            tmp_path: Path) -> None:
    receipt = lanes["fp32"]
    other = export_pack(harness_bin, tmp_path / "other.h5", steps=STEPS, seed=7)
    for command, flags, message in (
            ("precision", ("--step", "1"), "a PyTorch lane's receipt of the canary pack pack.h5: give that pack with --pack"),
            ("replay", ("--from", "1"), "give that pack with --pack"),
            ("precision", ("--step", "1", "--pack", str(other)), f"--pack: {other} is not the pack {receipt} was run "
                                                                 "from (its seed differs)"),
            ("replay", ("--pack", str(pack)), None)):
        if message is None:  # --pack with a receipt of another kind: a harness engine's
            cpp = tmp_path / "cpp.h5"
            run_harness(harness_bin, "run", "--canary", "micro", "--steps", "2", "--out", str(cpp))
            result = run_harness(harness_bin, command, str(cpp), *flags, check=False)
            message = f"--pack: {cpp} is not a PyTorch lane's receipt of a canary pack; drop --pack"
        else:
            result = run_harness(harness_bin, command, str(receipt), *flags, check=False)
        assert result.returncode == 2 and message in result.stderr, (command, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_bisect_replays_lanes_from_their_pack_and_never_calls_a_fault_rounding(harness_bin: Path, pack: Path,
                                                                               lanes: dict, tmp_path: Path) -> None:
    """Two fp32 lanes, one with a module's output nudged at step 1: with --pack, bisect replays
    both with aten traces and names the step and where the runs part. The nudge is an op of
    its own (torch.where) that the clean run does not run: the oracle says so, where judging
    the op after it on each side's operands once said "both within their bounds: rounding"."""
    clean = lanes["fp32"]
    nudged = tmp_path / "nudged.h5"
    run_module("canary_harness.lane", "--pack", str(pack), "--out", str(nudged), "--inject-fault",
               "step=1,op=blocks.1.attn.proj,ulps=4194304")
    result = run_harness(harness_bin, "bisect", str(clean), str(nudged), "--pack", str(pack), "--json", check=False)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["first_divergent_step"] == 1
    op = report["first_divergent_op"]
    assert op is not None and "blocks.1.attn.proj forward aten.where.self" in op["other"], op
    verdict = report["oracle"]["verdict"]
    assert verdict.startswith("not a question of rounding: the runs run different ops here"), verdict
    # repro writes one op (an engine's, a Python canary's aten op): a lane's receipt, judged at
    # module outputs, is refused, saying where its verdict is
    repro = run_harness(harness_bin, "repro", str(clean), str(nudged), "--out", str(tmp_path / "repro"), check=False)
    assert repro.returncode == 2 and "a PyTorch lane's receipt, whose steps are judged at module outputs" in repro.stderr
    assert len(repro.stderr.strip().splitlines()) == 1 and not (tmp_path / "repro").exists(), repro.stderr
