"""The receipt description (canary_harness/receipts/receipt_schema.json, `harness schema`) is what
every writer writes: nothing undescribed, nothing required left out, and the harness's
export and the package's file are one."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

from canary_harness import HASH_FAMILIES, SKETCH_FAMILIES, SKETCH_WIDTH, ReceiptError, ReceiptWriter, batch_hash
from canary_harness.receipts import schema
from canary_harness.receipts.receipt import TraceColumn
from canary_harness.receipts.stack import StackInfo

# The repository's docs; a copy of the tests away from the checkout (the virtual-environment check) is told where.
DOCS = Path(os.environ.get("CANARY_HARNESS_DOCS", Path(__file__).resolve().parents[2] / "docs"))
NAMES = ["wte", "lnf.bias"]
STACK = StackInfo(toolchain="test", libraries="test", host="test", cpu="test", kernels="none")
MANIFEST = {"lane": "unit/torch", "engine": "torch", "budget_features": "torch-cpu", "seed": 7,
            "canary": {"preset": "unit"}, "steps_planned": 2}


def _step(**more) -> dict:
    return dict(loss=1.0, grad_norm=1.0, lr=0.1, batch_hash=batch_hash(np.zeros((1, 3), np.int32)), hashes={fam: [1, 2] for fam in HASH_FAMILIES},
                sketches={fam: [(1.0, np.zeros(SKETCH_WIDTH))] * 2 for fam in SKETCH_FAMILIES}, **more)


def write_everything(path: Path) -> None:
    """A receipt with every optional part the Python writer has: batches, dumps, /trace,
    /compile, checkpoints held in the receipt."""
    columns = [TraceColumn(0, "op", -1, "forward", "op.out", "activation")]
    trace = (columns, [3], [(1.0, np.zeros(SKETCH_WIDTH))])
    with ReceiptWriter(path, MANIFEST, NAMES, batch_shape=(1, 3), stack=STACK) as w:
        w.declare_checkpoints(1)
        w.dump_tensors(0, {"wte": np.ones((2, 2), np.float32), "lnf.bias": np.zeros(2, np.float32)})
        for step in range(2):
            w.append_checkpoint(step, b"state %d" % step)
            w.append_step(**_step(batch_tokens=np.zeros((1, 3), np.int32), trace=trace, compile={"HostSync": 0.0}))


def test_every_dataset_the_python_writer_writes_is_described(tmp_path: Path, harness_bin: Path):
    path = tmp_path / "all.h5"
    write_everything(path)
    with h5py.File(path, "r") as f:
        assert {"batches", "tensors", "trace", "compile", "checkpoints"} <= set(f)
        assert schema.undescribed(f) == [] and schema.missing_required(f) == []
    report = json.loads(subprocess.run([str(harness_bin), "validate", "--json", str(path)], capture_output=True,
                                       text=True).stdout)
    assert report["valid"] and report["unknown"] == [], report


def test_a_described_dataset_that_is_not_written_is_named(tmp_path: Path, harness_bin: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "r.h5"
    write_everything(path)
    added = {"path": "/steps/momentum", "dtype": "float64", "shape": ["steps"], "columns": None,
             "presence": "required", "since_minor": schema.SCHEMA_MINOR, "writer": "every writer", "meaning": "a test's"}
    later = {**added, "path": "/steps/velocity", "since_minor": schema.SCHEMA_MINOR + 1}  # binds later receipts only
    monkeypatch.setitem(schema.DESCRIPTION, "datasets", [*schema.DESCRIPTION["datasets"], added, later])
    with h5py.File(path, "r") as f:
        assert schema.missing_required(f) == ["/steps/momentum"]
    monkeypatch.undo()
    with h5py.File(path, "r+") as f:
        del f["sketches/grads_l2"]
        del f["trace"].attrs["level"]
        assert schema.missing_required(f) == ["/sketches/grads_l2", "/trace/level"]
    out = subprocess.run([str(harness_bin), "validate", str(path)], capture_output=True, text=True)
    assert out.returncode == 2
    assert "/sketches/grads_l2: missing" in out.stderr and "/trace: missing attribute 'level' (a string)" in out.stderr


def test_the_package_reads_what_the_harness_describes(harness_bin: Path):
    exported = subprocess.run([str(harness_bin), "schema"], capture_output=True, text=True, check=True).stdout
    assert json.loads(exported) == schema.DESCRIPTION, (
        "python/canary_harness/receipts/receipt_schema.json is not `harness schema`'s output: regenerate it with "
        "`build/bin/harness schema > python/canary_harness/receipts/receipt_schema.json`")
    described = {d["path"] for d in schema.DESCRIPTION["datasets"]}
    assert {"/steps/loss", "/fp8/*", "/memory/*", "/compile/*"} <= described  # the core and the engines'


def test_every_named_path_is_described_and_written_where_it_is_named(tmp_path: Path):
    for key, path in schema.PATHS.items():
        assert schema.group_entry(path) or schema.dataset_entry(path), f"PATHS[{key!r}] = {path} is not described"
    for family in HASH_FAMILIES:
        assert schema.dataset_entry(schema.hashes_path(family))
    for family in SKETCH_FAMILIES:
        assert all(schema.dataset_entry(p) for p in schema.sketch_paths(family))
    path = tmp_path / "named.h5"
    with ReceiptWriter(path, MANIFEST, NAMES, stack=STACK) as w:
        w.append_step(**_step())
    with h5py.File(path, "r") as f:
        for key in ("loss", "grad_norm", "lr", "batch_hash", "tensor_names"):
            assert isinstance(f[schema.PATHS[key]], h5py.Dataset), key
        assert schema.leaf(schema.PATHS["loss"]) == "loss"


def test_an_engine_setting_of_the_wrong_type_is_refused_before_any_file(tmp_path: Path):
    with pytest.raises(ReceiptError, match=r"manifest noise_seed must be an int \(the receipt schema's type\), not str"):
        ReceiptWriter(tmp_path / "x.h5", {**MANIFEST, "noise_seed": "5"}, NAMES, stack=STACK)
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.parametrize("pattern, path, matches", [
    ("/fp8/*", "/fp8/amax", True), ("/fp8/*", "/fp8", False), ("/fp8/*", "/fp8/a/b", False),
    ("/tensors/*/*", "/tensors/step_000001/wte", True), ("/tensors/*/*", "/tensors/step_000001", False),
])
def test_a_pattern_matches_one_name_per_star(pattern: str, path: str, matches: bool):
    assert schema._matches(pattern, path) == matches


def test_the_reference_page_names_every_described_path():
    page = (DOCS / "receipt-schema.md").read_text(encoding="utf-8")
    unnamed = []
    for entry in [*schema.DESCRIPTION["datasets"], *schema.DESCRIPTION["attributes"]]:
        path = entry["path"]
        if "*" in path:  # the page writes a pattern's names as <placeholders>: /compile/<Name>
            named = re.search(re.escape(path).replace(r"\*", r"(<[^>]+>|\w+)"), page) is not None
        else:
            named = f"`{path.rsplit('/', 1)[1]}`" in page or path in page
        if not named:
            unnamed.append(path)
    assert unnamed == [], f"docs/receipt-schema.md does not name {unnamed}"
