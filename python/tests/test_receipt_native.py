"""One receipt writer: ReceiptWriter writes through the harness's own (libcanary_harness_receipt,
canary_harness.receipt_native) wherever the library is found, and the receipts are those the
package's h5py writer wrote, bit for bit, every kind of content included."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Dict

import h5py
import numpy as np
import pytest

from canary_harness import ReceiptError, ReceiptReader, ReceiptWriter
from canary_harness.receipt import StepState, TraceColumn
from canary_harness.receipt_native import ENV, receipt_library

from test_receipt import BATCH, NAMES, STACK, manifest, tensors


COLUMNS = [TraceColumn(0, "blocks.0.attn", 0, "forward", "out", "activation"),
           TraceColumn(1, "lm_head", -1, "backward", "grad", "gradient")]


def write_everything(path: Path, steps: int = 4) -> Dict[str, str]:
    """A receipt with every kind of content the writer takes: batches, op traces, /compile,
    held checkpoints, /eval, tensor dumps. Returns the checkpoints' content hashes."""
    rng = np.random.default_rng(5)
    hashes = {}
    with ReceiptWriter(path, manifest(steps=steps, learning_rate=0.5), NAMES, batch_shape=BATCH, stack=STACK) as w:
        w.declare_checkpoints(2)
        targets = rng.integers(0, 7, size=(2, 3))
        w.declare_eval(2, "00000000feedbeef", "held-out rows", targets, 7)
        for s in range(steps):
            if s % 2 == 0:
                hashes[s] = w.append_checkpoint(s, rng.bytes(100 + 50 * s))
            batch = rng.integers(0, 50, size=BATCH).astype(np.int32)
            state = {fam: tensors(rng) for fam in ("params", "grads", "adam_m", "adam_v")}
            trace = (COLUMNS, rng.integers(0, 2**63, size=len(COLUMNS)).astype(np.uint64),
                     [(float(s + c), rng.standard_normal(16)) for c in range(len(COLUMNS))])
            w.record_step(loss=2.0 - 0.1 * s, grad_norm=1.0 + s, lr=1e-3, batch=batch, trace=trace, **state)
            if s % 2 == 0:
                w.append_eval(s, 3.0 - s, rng.standard_normal((2, 3, 7)).astype(np.float32), float(s == 0))
        w.dump_tensors(0, tensors(rng))
    return {str(k): v for k, v in hashes.items()}


def contents(path: Path) -> Dict[str, bytes]:
    """Every dataset's values and every attribute, by path (created_utc aside: a clock)."""
    out: Dict[str, bytes] = {}

    def visit(name: str, obj) -> None:
        if isinstance(obj, h5py.Dataset):
            out[f"/{name}"] = obj.dtype.str.encode() + repr(obj.shape).encode() + obj[()].tobytes()
        for key, value in obj.attrs.items():
            if key != "created_utc":
                out[f"/{name}@{key}"] = np.asarray(value).tobytes()

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return out


def test_the_library_is_what_writes_where_it_is_found(writer_library: str, monkeypatch, tmp_path: Path):
    monkeypatch.setenv(ENV, "auto")
    library = receipt_library()
    assert library is not None and Path(library.path).resolve() == Path(writer_library).resolve()
    with ReceiptWriter(tmp_path / "r.h5", manifest(steps=1), NAMES, stack=STACK) as w:
        assert w._native is not None


def test_the_library_writes_what_the_h5py_writer_wrote_bit_for_bit(writer_library: str, monkeypatch,
                                                                     tmp_path: Path):
    monkeypatch.setenv(ENV, writer_library)
    native_hashes = write_everything(tmp_path / "native.h5")
    monkeypatch.setenv(ENV, "h5py")
    h5py_hashes = write_everything(tmp_path / "h5py.h5")
    assert native_hashes == h5py_hashes and len(native_hashes) == 2
    native, ours = contents(tmp_path / "native.h5"), contents(tmp_path / "h5py.h5")
    assert sorted(native) == sorted(ours)
    assert [name for name in native if native[name] != ours[name]] == []
    with ReceiptReader(tmp_path / "native.h5") as r:  # and what the test itself wrote is there
        assert r.complete and r.steps_recorded == 4 and r.dumped_steps() == [0]
        assert [c.step for c in r.stored_checkpoints()] == [0, 2]
        assert r.trace_columns() == COLUMNS


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
    assert library is not None
    assert isinstance(library.lib, ctypes.CDLL) and not isinstance(library.lib, ctypes.PyDLL)
