"""`canary_harness.hf.ReceiptCallback` on a `transformers.Trainer` run of a zoo member, and the
audit of every member (a FILE.py:NAME returning a Canary), docs/transformers.md.

The Trainer's run of gpt2 (tests/zoo/trainer.py: the member's model, AdamW groups, cosine
schedule, clipping and batches) records the receipt `canary_harness run` writes, bit for bit;
each of the three Trainer defaults that trainer.py changes moves it as docs/transformers.md
says, measured here again so that the page cannot go stale silently.

    cd tests/zoo && HARNESS_BIN=../../build/bin/harness USE_TORCH_XLA=0 PYTHONPATH=../../python \\
        ../../.venv/bin/python -m pytest -q test_hf_callback.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict

import h5py
import numpy as np
import pytest
import torch

from conftest import shared

ZOO = Path(__file__).resolve().parent
GPT2 = f"{ZOO / 'gpt2'}.py:canary"
STEPS = 12  # gpt2.py's


def harness(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return shared.run_harness(shared._harness_bin(), *args, check=check)


def trainer_run(out: Path, *defaults: str) -> Path:
    flags = [f"--trainer-default={name}" for name in defaults]
    result = subprocess.run([sys.executable, str(ZOO / "trainer.py"), GPT2, "--out", str(out), *flags],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def read(path: Path) -> Dict[str, np.ndarray]:
    """Every per-step dataset of a receipt (steps, hashes, sketches), by path."""
    found: Dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        for group in ("steps", "hashes", "sketches"):
            for name, dataset in f[group].items():
                found[f"{group}/{name}"] = dataset[()]
        found["canary"] = np.array(f["manifest"].attrs["canary"])
    return found


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf")


@pytest.fixture(scope="module")
def run_receipt(work: Path) -> Path:
    out = work / "run.h5"
    shared.run_module("canary_harness", "run", GPT2, "--out", str(out))
    return out


@pytest.fixture(scope="module")
def trainer_receipt(work: Path) -> Path:
    return trainer_run(work / "trainer.h5")


# ---- the Trainer's receipt is the run's ---------------------------------------------------------

def test_the_trainers_receipt_is_the_runs_bit_for_bit(run_receipt: Path, trainer_receipt: Path) -> None:
    harness("validate", str(trainer_receipt))
    shown = harness("compare", str(trainer_receipt), str(run_receipt)).stdout
    assert "reference (bitwise: every loss and every hash equal)" in shown and "verdict     PASS" in shown, shown
    # the golden workflow takes it too: checked against the run as its golden
    assert "verdict     PASS" in harness("check", str(trainer_receipt), "--golden", str(run_receipt)).stdout
    a, b = read(trainer_receipt), read(run_receipt)
    for name in b:  # every loss, norm, lr, batch hash, tensor hash and sketch, byte for byte
        assert a[name].tobytes() == b[name].tobytes(), name
    with h5py.File(trainer_receipt, "r") as t, h5py.File(run_receipt, "r") as r:
        for key in ("lane", "budget_features", "seed", "steps_planned", "threads", "complete"):
            assert t["manifest"].attrs[key] == r["manifest"].attrs[key], key
        assert "run_options" not in t["manifest"].attrs  # the Trainer drove it: nothing to replay
        assert "eval" not in t and "eval" in r           # the member's held-out logits are the runner's
        # One stack line for one model: the training script's imports (transformers) and the
        # attention the modules declare, as the run's from the canary file's.
        for key in ("libraries", "kernels"):
            assert t["manifest"].attrs[key] == r["manifest"].attrs[key], key
        assert b"transformers " in np.bytes_(t["manifest"].attrs["libraries"])


# ---- what each Trainer default moves (docs/transformers.md, "What differs, and why") ----------

def test_the_trainers_reseed_moves_every_dropout_mask_from_step_0(run_receipt: Path, work: Path) -> None:
    a, b = read(trainer_run(work / "seed.h5", "seed")), read(run_receipt)
    assert a["steps/batch_hash"].tobytes() == b["steps/batch_hash"].tobytes()
    assert a["steps/lr"].tobytes() == b["steps/lr"].tobytes()
    assert a["steps/loss"][0] != b["steps/loss"][0]
    assert abs(a["steps/loss"][0] / b["steps/loss"][0] - 1) < 1e-3  # the same model on other masks
    assert np.all(a["hashes/grads"][0] != b["hashes/grads"][0])  # every gradient, from step 0
    assert np.array_equal(a["hashes/params"][0], b["hashes/params"][0])  # lr is 0 at step 0: no update yet
    shown = harness("compare", str(work / "seed.h5"), str(run_receipt), check=False)
    assert shown.returncode == 1 and "first failing step 0" in shown.stdout, shown.stdout


def test_the_trainers_loss_scaling_is_15_16ths_of_the_models_mean(run_receipt: Path, work: Path) -> None:
    """GPT2LMHeadModel's loss_type is None (its class name has no "ForCausalLM"), so the Trainer
    counts num_items_in_batch over all 4 x 16 labels where the shifted loss predicts 4 x 15:
    the model divides the summed loss by 64 instead of 60."""
    a, b = read(trainer_run(work / "loss.h5", "loss")), read(run_receipt)
    np.testing.assert_allclose(a["steps/loss"] / b["steps/loss"], 15 / 16, rtol=1e-6)
    np.testing.assert_allclose(a["steps/grad_norm"] / b["steps/grad_norm"], 15 / 16, rtol=1e-6)
    # clipping at 1.0 acts at every step (norms above 1.5) and takes the scale out again:
    # the applied gradients differ by rounding only, yet in every tensor's bits
    assert np.all(b["steps/grad_norm"] > 1.5)
    np.testing.assert_allclose(a["sketches/grads_l2"], b["sketches/grads_l2"], rtol=1e-6)
    assert np.all(a["hashes/grads"][0] != b["hashes/grads"][0])


def test_use_cache_false_moves_the_backward_and_the_config(run_receipt: Path, work: Path) -> None:
    """With use_cache=True the keys and values go through DynamicCache's torch.cat, and SDPA
    gets contiguous copies; without, strided views: the forward on equal weights agrees bit for
    bit (step 0), the backward does not. From step 1 the weights differ by that rounding, and
    whether a later loss shows it depends on the host (bitwise at all 12 steps on an AVX2 EPYC,
    1e-7 apart at step 8 on an AVX-512 one), so later losses are held to the rounding's size.
    And the model's config is another one (use_cache), so another canary."""
    out = trainer_run(work / "use_cache.h5", "use_cache")
    a, b = read(out), read(run_receipt)
    assert a["steps/loss"][0] == b["steps/loss"][0]
    np.testing.assert_allclose(a["steps/loss"], b["steps/loss"], rtol=1e-6)
    assert np.any(a["hashes/grads"][0] != b["hashes/grads"][0])
    np.testing.assert_allclose(a["sketches/grads_l2"][0], b["sketches/grads_l2"][0], rtol=1e-7)
    config = json.loads(str(a["canary"].item().decode()))["config"]
    assert config["use_cache"] is False
    shown = harness("compare", str(out), str(run_receipt), check=False)
    assert shown.returncode == 2 and "ran different canaries (they differ in config)" in shown.stderr, shown.stderr


# ---- the callback's own contract ----------------------------------------------------------------

def test_gradient_accumulation_is_recorded_per_optimizer_step(tmp_path: Path) -> None:
    """Two micro-batches of 2 rows a step: one row per optimizer step, the batch hashed as
    the list of the micro-batches the model was called with."""
    from transformers import Trainer, TrainingArguments

    from canary_harness.runs.canary import load_canary
    from canary_harness.receipts.digest import batch_tree_hash
    from canary_harness.hf import ReceiptCallback

    sys.path.insert(0, str(ZOO))
    from trainer import MemberRows

    loaded = load_canary(GPT2)
    canary = loaded.canary
    out = tmp_path / "accumulated.h5"
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, train_sampling_strategy="sequential", use_cpu=True,
                             report_to=[], save_strategy="no", logging_steps=1, logging_nan_inf_filter=False,
                             disable_tqdm=True)
    Trainer(model=canary.model, args=args, train_dataset=MemberRows(loaded, 4),
            optimizers=(canary.optimizer, canary.schedulers[0]),
            callbacks=[ReceiptCallback(out, name="accumulated")]).train()
    harness("validate", str(out))
    with h5py.File(out, "r") as f:
        hashes = f["steps/batch_hash"][()]
        assert f["manifest"].attrs["complete"] == 1 and len(hashes) == 2
    for i in range(2):
        rows = canary.batch(i)
        halves = [{k: v[:2] for k, v in rows.items()}, {k: v[2:] for k, v in rows.items()}]
        assert int(hashes[i]) == batch_tree_hash(halves)


@pytest.mark.parametrize("setting, says", [
    ({"logging_steps": 10}, "logging_steps=10: give logging_strategy='steps' and logging_steps=1"),
    ({"logging_nan_inf_filter": True}, "logging_nan_inf_filter=True: give False"),
])
def test_what_the_callback_cannot_record_is_refused_in_one_line(tmp_path: Path, setting: dict, says: str) -> None:
    from transformers import TrainingArguments

    from canary_harness.hf import ReceiptCallback, ReceiptCallbackError

    arguments = {"output_dir": str(tmp_path), "use_cpu": True, "report_to": [], "logging_steps": 1,
                 "logging_nan_inf_filter": False, **setting}
    callback = ReceiptCallback(tmp_path / "r.h5", name="refused")
    with pytest.raises(ReceiptCallbackError) as refused:
        callback.on_train_begin(TrainingArguments(**arguments), None, None, model=torch.nn.Linear(2, 2),
                                optimizer=None)
    assert says in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "r.h5").exists()


def test_importing_canary_harness_imports_no_transformers() -> None:
    code = "import sys, canary_harness, canary_harness.audit; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ---- the audit of a member ------------------------------------------------------------------------

MEMBERS = ["gpt2", "llama", "mixtral", "bert", "t5", "accumulation"]


def _takes_an_attention_mask(member: str) -> bool:
    """Whether the member's batches carry an attention mask (found from a batch, not the name)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_zoo_{member}", ZOO / f"{member}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    canary = module.canary()
    return "attention_mask" in canary.batch(0)


@pytest.mark.parametrize("member", MEMBERS)
def test_the_audit_of_a_member_finds_adamws_constants_and_the_masks_host_read(member: str) -> None:
    """MEMBER.py:canary returns a Canary: the audit loads it as `run` does and audits its step.
    On every member it finds torch.optim.AdamW's (not capturable) Python numbers, which the
    schedule changes every step (weight decay's 1 - lr*wd, the bias-corrected step size), at
    team.py's optimizer.step(). Where the batch carries an attention mask (BERT), it finds one
    host read a step in transformers: the check whether the mask can be skipped
    (`padding_mask.all()` in an `if`, masking_utils), a sync a compiled step would break on.
    Nothing else: the models' forward and backward keep one graph."""
    shown = shared.run_module("canary_harness.audit", f"{ZOO / member}.py:canary", "--json", check=False)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    report = json.loads(shown.stdout)
    team = (ZOO / "team.py").read_text().splitlines()
    line = next(i + 1 for i, text in enumerate(team) if text.strip() == "optimizer.step()")
    constants = [f for f in report["findings"] if f["kind"] == "varying_constant"]
    reads = [f for f in report["findings"] if f["kind"] == "host_read"]
    assert {(Path(f["file"]).name, f["line"]) for f in constants} == {("team.py", line)}, constants
    assert all(f["via"].startswith("torch/optim/adam") for f in constants)
    assert {f["op"] for f in constants} == {"aten.mul_.Tensor", "aten.div.Tensor", "aten.addcdiv_"}
    assert len(constants) + len(reads) == len(report["findings"]), report["findings"]
    if _takes_an_attention_mask(member):
        assert [(Path(f["file"]).name, f["op"]) for f in reads] == [("masking_utils.py", "bool(tensor)")], reads
        assert "transformers" in Path(reads[0]["file"]).parts
        assert all(s["host_reads"] == 1 for s in report["steps"]), report["steps"]
    else:
        assert not reads and all(s["host_reads"] == 0 for s in report["steps"]), reads


def test_close_after_a_failed_train_removes_the_hook_and_leaves_an_incomplete_receipt(tmp_path: Path) -> None:
    """A Trainer whose train() raises calls no on_train_end: close() (in the caller's finally)
    takes the forward hook off the model and closes the receipt with complete = 0; twice is fine."""
    from types import SimpleNamespace

    from transformers import TrainingArguments

    from canary_harness.hf import ReceiptCallback

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    arguments = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], logging_steps=1,
                                  logging_nan_inf_filter=False)
    callback = ReceiptCallback(tmp_path / "r.h5", name="failed")
    callback.on_train_begin(arguments, SimpleNamespace(max_steps=3), None, model=model, optimizer=optimizer)
    assert len(model._forward_pre_hooks) == 1
    callback.close()
    callback.close()
    assert not model._forward_pre_hooks
    with h5py.File(tmp_path / "r.h5", "r") as f:
        assert int(f["manifest"].attrs["complete"]) == 0
