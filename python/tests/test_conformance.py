"""Python against the C++ harness itself: the same digests bit for bit, and receipts the
harness reads (`inspect`) and judges (`check`) like its own."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from canary_harness import HASH_FAMILIES, SCHEMA_MINOR, SCHEMA_VERSION, ReceiptReader, ReceiptWriter, batch_hash, sketch, tensor_hash
from canary_harness.receipts.stack import collect_stack_info

from conftest import run_harness


def bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).reshape(-1).view(np.uint64)


def test_param_hashes_and_sketches_equal_the_cpp_rows(cpp_receipt: Path):
    with ReceiptReader(cpp_receipt) as r:
        names = r.tensor_names
        assert len(names) > 10 and r.steps_recorded == 3 and r.dumped_steps() == [0, 1, 2, 3]
        hashes = r.hashes("params")
        l2, projection = r.sketches("params")
        for s in range(3):
            params_after = r.tensors(s + 1)  # the dump at the start of step s+1 = params after step s
            assert sorted(params_after) == sorted(names)
            for k, name in enumerate(names):
                assert tensor_hash(params_after[name]) == int(hashes[s, k]), (s, name)
                ours = sketch(params_after[name], name)
                assert ours.l2 == l2[s, k], (s, name)
                assert np.array_equal(bits(ours.l2), bits(l2[s, k])) and np.array_equal(
                    bits(ours.projection), bits(projection[s, k])), (s, name)
        # And the initial dump is not what step 0 recorded: the comparison above is not vacuous.
        assert tensor_hash(r.tensors(0)["wte"]) != int(hashes[0, names.index("wte")])


def test_batch_hashes_equal_the_cpp_rows(cpp_receipt: Path):
    with ReceiptReader(cpp_receipt) as r:
        tokens = r.batches()
        assert tokens.dtype == np.int32 and tokens.shape[0] == 3
        assert [batch_hash(tokens[s]) for s in range(3)] == [int(h) for h in r.steps("batch_hash")]


def test_traced_scalars_equal_the_cpp_sketches(cpp_trace_receipt: Path):
    # The traced loss and grad_norm are 1-element tensors: one partial block, three lanes empty.
    with ReceiptReader(cpp_trace_receipt) as r:
        tensors, kinds = r.read_strings("/trace/tensor"), r.read_strings("/trace/kind")
        hashes, l2, projection = r.read("/trace/hash"), r.read("/trace/l2"), r.read("/trace/projection")
        checked = 0
        for name in ("loss", "grad_norm"):
            column = next(c for c, (t, k) in enumerate(zip(tensors, kinds)) if t == name and k == "scalar")
            for s, value in enumerate(r.steps(name)):
                scalar = np.array([value], dtype=np.float32)
                assert float(scalar[0]) == value  # the step value is that fp32 scalar, widened
                ours = sketch(scalar, name)
                assert tensor_hash(scalar) == int(hashes[s, column])
                assert np.array_equal(bits(ours.l2), bits(l2[s, column]))
                assert np.array_equal(bits(ours.projection), bits(projection[s, column]))
                checked += 1
        assert checked == 4


def mirror_receipt(cpp_receipt: Path, out: Path, perturb_step: int = -1) -> None:
    """The C++ run recorded again from Python: params digested here from the dumps, batches
    hashed here, the rest (losses, grads and moments) copied."""
    with ReceiptReader(cpp_receipt) as r:
        keys = ("lane", "engine", "features", "canary", "seed", "steps_planned", "threads", "data_seed")
        manifest = {k: r.manifest[k] for k in keys}
        manifest["budget_features"] = ""  # cpu-ref's declaration
        names, tokens = r.tensor_names, r.batches()
        copied = {fam: r.hashes(fam) for fam in HASH_FAMILIES[1:]}
        grads_l2, grads_projection = r.sketches("grads")
        with ReceiptWriter(out, manifest, names, stack=collect_stack_info(include_torch=False)) as writer:
            for s in range(r.steps_recorded):
                params = r.tensors(s + 1)
                if s == perturb_step:  # one ulp in one element of wte
                    params["wte"].flat[5] = np.nextafter(params["wte"].flat[5], np.float32(np.inf))
                writer.append_step(
                    loss=r.steps("loss")[s], grad_norm=r.steps("grad_norm")[s], lr=r.steps("lr")[s],
                    batch_hash=batch_hash(tokens[s]),
                    hashes={"params": [tensor_hash(params[n]) for n in names],
                            **{fam: copied[fam][s] for fam in copied}},
                    sketches={"params": [sketch(params[n], n) for n in names],
                              "grads": list(zip(grads_l2[s], grads_projection[s]))})


def test_harness_check_judges_a_python_receipt_like_its_own(harness_bin: Path, cpp_receipt: Path, tmp_path: Path):
    same = tmp_path / "same.h5"
    mirror_receipt(cpp_receipt, same)
    result = run_harness(harness_bin, "check", str(same), "--golden", str(cpp_receipt), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verdict     PASS" in result.stdout

    moved = tmp_path / "moved.h5"
    mirror_receipt(cpp_receipt, moved, perturb_step=1)
    result = run_harness(harness_bin, "check", str(moved), "--golden", str(cpp_receipt), check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "moved first params wte at step 1" in result.stdout


def test_harness_inspect_reads_python_receipts(harness_bin: Path, tmp_path: Path):
    manifest = {"lane": "micro/torch", "engine": "torch", "budget_features": "torch-cpu", "seed": 1,
                "canary": {"preset": "micro"}, "steps_planned": 3, "noise_seed": 4}
    rng = np.random.default_rng(0)
    state = {fam: {"wte": rng.standard_normal((4, 3)).astype(np.float32)} for fam in HASH_FAMILIES}

    complete = tmp_path / "complete.h5"
    with ReceiptWriter(complete, manifest, ["wte"]) as writer:
        for _ in range(3):
            writer.record_step(loss=1.0, grad_norm=2.0, lr=0.5, batch=np.zeros((2, 5), np.int32), **state)
    result = run_harness(harness_bin, "inspect", "--json", str(complete))
    j = json.loads(result.stdout)
    assert (j["lane"], j["engine"], j["steps_recorded"], j["complete"]) == ("micro/torch", "torch", 3, True)
    assert j["manifest"]["budget_features"] == "torch-cpu" and j["manifest"]["schema_minor"] == str(SCHEMA_MINOR)
    assert {d["path"]: d["dtype"] for d in j["datasets"]}["/hashes/names"] == "string"
    # The schema gate every judging command passes a receipt through: no problem, nothing
    # unknown (noise_seed is an engine setting the schema lists).
    result = run_harness(harness_bin, "validate", "--json", str(complete))
    v = json.loads(result.stdout)
    assert (v["valid"], v["receipt_schema"], v["legacy_format"], v["problems"]) == (True, f"{SCHEMA_VERSION}.{SCHEMA_MINOR}", False, [])
    assert v["unknown"] == [], v["unknown"]

    interrupted = tmp_path / "interrupted.h5"
    with pytest.raises(KeyboardInterrupt):
        with ReceiptWriter(interrupted, manifest, ["wte"]) as writer:
            writer.record_step(loss=1.0, grad_norm=2.0, lr=0.5, batch=np.zeros((2, 5), np.int32), **state)
            raise KeyboardInterrupt
    result = run_harness(harness_bin, "inspect", str(interrupted), check=False)
    assert result.returncode == 2 and "incomplete receipt" in result.stderr
    result = run_harness(harness_bin, "inspect", "--allow-incomplete", "--json", str(interrupted))
    j = json.loads(result.stdout)
    assert (j["steps_recorded"], j["complete"]) == (1, False)
