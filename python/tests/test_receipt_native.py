"""One receipt writer: ReceiptWriter writes through the harness's own (libcanary_harness_receipt,
canary_harness.receipts.receipt_native), and what the package hands it is what the receipt holds, every
kind of content included; without a library nothing is written."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pytest

from canary_harness import ReceiptError, ReceiptReader, ReceiptWriter
from canary_harness.receipts import receipt_native
from canary_harness.receipts.receipt import StepState, TraceColumn
from canary_harness.receipts.receipt_native import ENV, receipt_library
from canary_harness.receipts.schema import PATHS

from conftest import run_harness
from test_receipt import BATCH, NAMES, STACK, manifest, tensors


COLUMNS = [TraceColumn(0, "blocks.0.attn", 0, "forward", "out", "activation"),
           TraceColumn(1, "lm_head", -1, "backward", "grad", "gradient")]


def write_everything(path: Path, steps: int = 4) -> Dict[str, Any]:
    """A receipt with every kind of content record_step takes (batches, op traces) and held
    checkpoints, /eval and tensor dumps (/compile and step state: test_receipt.py). Returns what was handed to the writer."""
    rng = np.random.default_rng(5)
    given: Dict[str, Any] = {"checkpoints": {}, "hashes": {}, "batches": [], "losses": [], "trace_hash": [],
                             "eval": []}
    with ReceiptWriter(path, manifest(steps=steps, learning_rate=0.5), NAMES, batch_shape=BATCH, stack=STACK) as w:
        w.declare_checkpoints(2)
        given["targets"] = rng.integers(0, 7, size=(2, 3))
        w.declare_eval(2, "00000000feedbeef", "held-out rows", given["targets"], 7)
        for s in range(steps):
            if s % 2 == 0:
                state_bytes = rng.bytes(100 + 50 * s)
                given["checkpoints"][s] = state_bytes
                given["hashes"][s] = w.append_checkpoint(s, state_bytes)
            batch = rng.integers(0, 50, size=BATCH).astype(np.int32)
            state = {fam: tensors(rng) for fam in ("params", "grads", "adam_m", "adam_v")}
            trace_hashes = rng.integers(0, 2**63, size=len(COLUMNS)).astype(np.uint64)
            trace = (COLUMNS, trace_hashes, [(float(s + c), rng.standard_normal(16)) for c in range(len(COLUMNS))])
            w.record_step(loss=2.0 - 0.1 * s, grad_norm=1.0 + s, lr=1e-3, batch=batch, trace=trace, **state)
            given["batches"].append(batch)
            given["losses"].append(2.0 - 0.1 * s)
            given["trace_hash"].append(trace_hashes)
            if s % 2 == 0:
                logits = rng.standard_normal((2, 3, 7)).astype(np.float32)
                w.append_eval(s, 3.0 - s, logits, float(s == 0))
                given["eval"].append((s, 3.0 - s, logits))
        given["dump"] = tensors(rng)
        w.dump_tensors(0, given["dump"])
    return given


def test_the_library_is_what_writes_where_it_is_found(writer_library: str, monkeypatch, tmp_path: Path):
    monkeypatch.setenv(ENV, "auto")
    library = receipt_library()
    assert Path(library.path).resolve() == Path(writer_library).resolve()
    with ReceiptWriter(tmp_path / "r.h5", manifest(steps=1), NAMES, stack=STACK):
        pass
    assert (tmp_path / "r.h5").is_file()  # written by the library found: the writer has no other


def test_what_the_package_hands_the_library_is_what_the_receipt_holds(writer_library: str, monkeypatch,
                                                                       tmp_path: Path, harness_bin: Path):
    """Every kind of content, handed over through ctypes and read back with h5py: the same
    values, bit for bit, and a receipt `harness validate` accepts. (That the library writes
    what `harness run`'s writer writes, byte for byte, is tests/unit/receipt_c_api_test.cpp.)"""
    monkeypatch.setenv(ENV, writer_library)
    path = tmp_path / "everything.h5"
    given = write_everything(path)
    with ReceiptReader(path) as r:
        assert r.complete and r.steps_recorded == 4 and r.dumped_steps() == [0]
        assert np.array_equal(r.read(PATHS["loss"], 1), np.array(given["losses"]))
        assert np.array_equal(r.batches(), np.stack(given["batches"]))
        assert r.trace_columns() == COLUMNS
        assert np.array_equal(r.read(PATHS["trace_hash"], 2), np.stack(given["trace_hash"]))
        checkpoints = r.stored_checkpoints()
        assert [c.step for c in checkpoints] == [0, 2]
        for c in checkpoints:  # checkpoint_state checks the content hash the library computed
            assert r.checkpoint_state(c) == given["checkpoints"][c.step] and c.content_hash == given["hashes"][c.step]
        assert np.array_equal(r.read(PATHS["eval_targets"], 2), given["targets"])
        assert np.array_equal(r.read(PATHS["eval_step"], 1), np.array([s for s, _, _ in given["eval"]]))
        assert np.array_equal(r.read(PATHS["eval_logits"], 4), np.stack([logits for _, _, logits in given["eval"]]))
        dumped = r.tensors(0)
        assert sorted(dumped) == sorted(given["dump"])
        assert all(np.array_equal(dumped[name], values) for name, values in given["dump"].items())
    run_harness(harness_bin, "validate", str(path))


def test_with_no_library_found_nothing_is_written_and_the_error_says_where_to_get_one(monkeypatch, tmp_path: Path):
    monkeypatch.setenv(ENV, "auto")
    monkeypatch.setattr(receipt_native, "library_candidates", lambda *_: [])
    monkeypatch.setattr(receipt_native, "_loaded", {})
    with pytest.raises(ReceiptError, match=r"r\.h5: no receipt writer: no libcanary_harness_receipt\.so\.1 found .*"
                                           r"install the package with pip .*HARNESS_BIN.*; nothing is written"):
        ReceiptWriter(tmp_path / "r.h5", manifest(), NAMES, stack=STACK)
    assert list(tmp_path.iterdir()) == []


def test_a_library_that_cannot_be_used_is_refused_by_name_and_nothing_is_written(digest_library: str, monkeypatch,
                                                                                  tmp_path: Path):
    monkeypatch.setenv(ENV, str(tmp_path / "missing.so"))
    with pytest.raises(ReceiptError, match=rf"{ENV}=.*missing.so: no such file .*; nothing is written"):
        ReceiptWriter(tmp_path / "r.h5", manifest(), NAMES, stack=STACK)
    monkeypatch.setenv(ENV, digest_library)  # a library, but not the writer
    with pytest.raises(ReceiptError, match="not a canary-harness receipt library"):
        ReceiptWriter(tmp_path / "r.h5", manifest(), NAMES, stack=STACK)
    assert list(tmp_path.iterdir()) == []


def test_state_the_description_lacks_is_refused_before_any_row(writer_library: str, monkeypatch, tmp_path: Path):
    monkeypatch.setenv(ENV, writer_library)
    rng = np.random.default_rng(0)
    with ReceiptWriter(tmp_path / "r.h5", manifest(steps=2), NAMES, stack=STACK) as w:
        state = {fam: tensors(rng) for fam in ("params", "grads", "adam_m", "adam_v")}
        with pytest.raises(ReceiptError, match="/nowhere/x is not in the receipt description"):
            w.append_step(loss=1.0, grad_norm=1.0, lr=1.0, batch_hash=1, hashes={f: [1] * len(NAMES) for f in state},
                          sketches={f: [(1.0, np.zeros(16))] * len(NAMES) for f in ("params", "grads")},
                          state=[StepState("nowhere", ["a"], [("x", [1.0])])])
        assert w.steps_recorded == 0


def test_each_write_is_one_foreign_call_that_releases_the_gil(writer_library: str, monkeypatch):
    """ctypes.CDLL (not PyDLL) drops the GIL around every call: the library's functions are
    bound on a CDLL, so a step's HDF5 write never holds the training thread."""
    monkeypatch.setenv(ENV, writer_library)
    library = receipt_library()
    assert isinstance(library.lib, ctypes.CDLL) and not isinstance(library.lib, ctypes.PyDLL)
