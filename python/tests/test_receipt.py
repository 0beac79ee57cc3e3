"""ReceiptWriter -> ReceiptReader, the file format the writer leaves, and the reader's errors."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from canary_harness import (HASH_FAMILIES, SCHEMA_MINOR, SCHEMA_VERSION, SKETCH_FAMILIES, SKETCH_WIDTH, ReceiptError,
                            ReceiptReader, ReceiptWriter, batch_hash, sketch, tensor_hash)
from canary_harness.receipts.stack import StackInfo
from conftest import flipped_byte_failures

PYTHON_DIR = Path(__file__).resolve().parents[1]
SHAPES = {"wte": (11, 7), "wpe": (5, 7), "blocks.0.ln1.weight": (7,), "lnf.bias": (7,)}
NAMES = list(SHAPES)
BATCH = (2, 6)
STACK = StackInfo(toolchain="test", libraries="test", host="test", cpu="test", kernels="none")


def manifest(steps: int = 3, **extra) -> dict:
    return {"lane": "unit/torch", "engine": "torch", "budget_features": "torch-cpu", "seed": 7,
            "canary": {"preset": "unit", "vocab_size": 11}, "steps_planned": steps, **extra}


def tensors(rng: np.random.Generator) -> dict:
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}


def write_steps(writer: ReceiptWriter, steps: int, seed: int = 0) -> list:
    """Records `steps` steps of random state; returns what each step recorded."""
    rng = np.random.default_rng(seed)
    recorded = []
    for s in range(steps):
        state = {fam: tensors(rng) for fam in HASH_FAMILIES}
        batch = rng.integers(0, 11, BATCH)
        writer.record_step(loss=1.0 + s, grad_norm=0.5 * s, lr=1e-3, batch=batch, **state)
        recorded.append((state, batch))
    return recorded


def walk(f: h5py.File):
    """Every (name, object) of the file, root included."""
    objects = [("/", f)]
    f.visititems(lambda name, obj: objects.append((name, obj)))
    return objects


# ---- round trip -------------------------------------------------------------------------------

def test_round_trip(tmp_path: Path):
    path = tmp_path / "r.h5"
    with ReceiptWriter(path, manifest(noise_seed=5, ratio=0.25, note="é"), NAMES, batch_shape=BATCH,
                       stack=STACK) as writer:
        writer.dump_tensors(0, tensors(np.random.default_rng(9)))
        recorded = write_steps(writer, 3)

    with ReceiptReader(path) as r:
        assert (r.schema_version, r.schema_minor) == (SCHEMA_VERSION, SCHEMA_MINOR)
        assert r.complete and r.steps_recorded == 3 and r.steps_planned == 3
        assert r.tensor_names == NAMES
        m = r.manifest
        assert m["lane"] == "unit/torch" and m["budget_features"] == "torch-cpu" and m["features"] == ""
        assert m["canary"] == '{"preset":"unit","vocab_size":11}'
        assert (m["noise_seed"], m["ratio"], m["note"], m["seed"]) == (5, 0.25, "é", 7)
        assert m["toolchain"] == "test" and m["kernels"] == "none"
        assert list(r.steps("loss")) == [1.0, 2.0, 3.0] and list(r.steps("lr")) == [1e-3] * 3
        assert r.steps("batch_hash").dtype == np.uint64
        for s, (state, batch) in enumerate(recorded):
            assert int(r.steps("batch_hash")[s]) == batch_hash(batch)
            assert np.array_equal(r.batches()[s], batch)
            for fam in HASH_FAMILIES:
                assert [int(h) for h in r.hashes(fam)[s]] == [tensor_hash(state[fam][n]) for n in NAMES]
            for fam in SKETCH_FAMILIES:
                l2, projection = r.sketches(fam)
                for k, n in enumerate(NAMES):
                    expected = sketch(state[fam][n], n)
                    assert l2[s, k] == expected.l2 and np.array_equal(projection[s, k], expected.projection)
        assert r.dumped_steps() == [0]
        dumped = r.tensors(0)
        assert dumped["wte"].shape == (11, 7) and dumped["wte"].dtype == np.float32
        assert np.array_equal(dumped["wpe"], tensors(np.random.default_rng(9))["wpe"])


def test_append_step_takes_precomputed_digests(tmp_path: Path):
    path = tmp_path / "r.h5"
    hashes = {fam: [2**64 - 1 - k for k in range(len(NAMES))] for fam in HASH_FAMILIES}
    sketches = {fam: [(float(k), np.full(SKETCH_WIDTH, -0.5)) for k in range(len(NAMES))] for fam in SKETCH_FAMILIES}
    with ReceiptWriter(path, manifest(steps=1), NAMES, stack=STACK) as writer:
        writer.append_step(loss=2.5, grad_norm=1.0, lr=0.1, batch_hash=2**63 + 1, hashes=hashes, sketches=sketches)
        with pytest.raises(ReceiptError, match="all 1 planned steps are recorded"):
            writer.append_step(loss=2.5, grad_norm=1.0, lr=0.1, batch_hash=0, hashes=hashes, sketches=sketches)
    with ReceiptReader(path) as r:
        assert int(r.steps("batch_hash")[0]) == 2**63 + 1
        assert int(r.hashes("adam_v")[0, 0]) == 2**64 - 1
        assert r.sketches("grads")[1].shape == (1, len(NAMES), SKETCH_WIDTH)


def test_discard_removes_a_receipt_without_steps_and_refuses_one_with_steps(tmp_path: Path):
    empty, started = tmp_path / "empty.h5", tmp_path / "started.h5"
    ReceiptWriter(empty, manifest(), NAMES, stack=STACK).discard()
    assert not empty.exists()
    with ReceiptWriter(started, manifest(), NAMES, stack=STACK) as writer:
        write_steps(writer, 1)
        with pytest.raises(ReceiptError, match="1 steps are recorded; a receipt with steps is closed, never discarded"):
            writer.discard()
    with ReceiptReader(started) as r:
        assert r.steps_recorded == 1 and not r.complete


# ---- the file format --------------------------------------------------------------------------

def test_file_format_is_hdf5_1_10_fixed_strings_and_checksummed_chunks(tmp_path: Path):
    path = tmp_path / "r.h5"
    with ReceiptWriter(path, manifest(empty=""), NAMES, batch_shape=BATCH, stack=STACK) as writer:
        writer.dump_tensors(0, tensors(np.random.default_rng(1)))
        write_steps(writer, 3)

    with h5py.File(path, "r") as f:
        assert f.id.get_create_plist().get_version()[0] == 3  # superblock 3: the 1.10 format
        strings = datasets = 0
        for name, obj in walk(f):
            assert h5py.h5o.get_info(obj.id).hdr.version == 2  # checksummed object headers
            for attr_name in obj.attrs:
                attr = obj.attrs.get_id(attr_name)
                dtype = attr.dtype
                if h5py.check_string_dtype(dtype) is not None:
                    strings += 1
                    info = h5py.check_string_dtype(dtype)
                    assert info.length is not None and info.encoding == "utf-8", (name, attr_name)
                    assert not attr.get_type().is_variable_str()
                    assert attr.shape == ()
                elif dtype.kind in "iu":
                    assert dtype == np.dtype("<i8"), (name, attr_name, dtype)
                else:
                    assert dtype == np.dtype("<f8"), (name, attr_name, dtype)
            if isinstance(obj, h5py.Dataset):
                datasets += 1
                plist = obj.id.get_create_plist()
                assert plist.get_layout() == h5py.h5d.CHUNKED and obj.chunks is not None, name
                assert obj.fletcher32, name
                filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
                assert filters[-1] == h5py.h5z.FILTER_FLETCHER32, name  # last: covers the bytes as stored
                info = h5py.check_string_dtype(obj.dtype)
                if info is not None:
                    strings += 1
                    assert info.length is not None and info.encoding == "utf-8", name
        # The walk saw the whole receipt: 13 manifest strings, /sketches method, /hashes/names; 4 steps,
        # names, 4 hashes, 4 sketches, tokens, 4 dumped tensors.
        assert (strings, datasets) == (15, 18)

        manifest_attrs = f["manifest"].attrs
        assert h5py.check_string_dtype(manifest_attrs.get_id("empty").dtype).length == 1  # no 0-byte strings
        assert h5py.check_string_dtype(manifest_attrs.get_id("lane").dtype).length == len(b"unit/torch")
        assert f["hashes/names"].dtype.itemsize == max(len(n) for n in NAMES)
        for name in ("steps/loss", "steps/batch_hash", "hashes/params", "sketches/grads_projection", "batches/tokens"):
            assert f[name].maxshape[0] is None and f[name].shape[0] == 3
        assert f["steps/loss"].dtype == np.dtype("<f8") and f["steps/batch_hash"].dtype == np.dtype("<u8")
        assert f["hashes/grads"].shape == (3, len(NAMES)) and f["hashes/grads"].dtype == np.dtype("<u8")
        assert f["sketches/params_projection"].shape == (3, len(NAMES), SKETCH_WIDTH)
        assert f["batches/tokens"].dtype == np.dtype("<i4")
        sk = f["sketches"].attrs
        assert (sk["method"].decode(), int(sk["width"]), int(sk["block"])) == ("count-sketch over blocks", 16, 32)
        expected = {"schema_version", "schema_minor", "lane", "engine", "features", "budget_features", "canary", "seed",
                    "steps_planned", "threads", "complete", "created_utc", "git_commit", "toolchain", "libraries",
                    "host", "cpu"}
        assert expected <= set(manifest_attrs)
        assert int(manifest_attrs["schema_version"]) == SCHEMA_VERSION and int(manifest_attrs["schema_minor"]) == SCHEMA_MINOR


READ_ROWS = """
import sys
from canary_harness import ReceiptReader
with ReceiptReader(sys.argv[1]) as r:
    print(r.steps_recorded, int(r.complete), r.hashes("params").shape[0], r.sketches("grads")[1].shape[0])
"""


def read_rows_elsewhere(path: Path) -> str:
    """The receipt as another process sees it (a second handle in this process would share
    HDF5's cache and prove nothing about what reached the file)."""
    result = subprocess.run([sys.executable, "-c", READ_ROWS, str(path)], capture_output=True, text=True,
                            cwd=PYTHON_DIR, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_every_step_is_flushed_and_visible_to_another_reader(tmp_path: Path):
    path = tmp_path / "r.h5"
    with ReceiptWriter(path, manifest(steps=3), NAMES, stack=STACK) as writer:
        rng = np.random.default_rng(0)
        for s in range(3):
            writer.dump_tensors(s, tensors(rng))  # a structural change between steps
            state = {fam: tensors(rng) for fam in HASH_FAMILIES}
            writer.record_step(loss=1.0, grad_norm=1.0, lr=1.0, batch=np.zeros(BATCH, np.int32), **state)
            assert read_rows_elsewhere(path) == f"{s + 1} 0 {s + 1} {s + 1}"
    assert read_rows_elsewhere(path) == "3 1 3 3"


KILLED_WRITER = """
import os, signal, sys
import numpy as np
sys.path.insert(0, {tests!r})
from test_receipt import BATCH, NAMES, STACK, manifest, write_steps
from canary_harness import ReceiptWriter
writer = ReceiptWriter(sys.argv[1], manifest(steps=10), NAMES, stack=STACK)
write_steps(writer, 2)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_writer_leaves_a_readable_prefix(tmp_path: Path):
    path = tmp_path / "killed.h5"
    code = KILLED_WRITER.format(tests=str(Path(__file__).parent))
    result = subprocess.run([sys.executable, "-c", code, str(path)], cwd=PYTHON_DIR, capture_output=True, timeout=60)
    assert result.returncode == -signal.SIGKILL, result.stderr
    with ReceiptReader(path) as r:
        assert not r.complete and r.steps_recorded == 2 and r.steps_planned == 10
        assert r.hashes("adam_m").shape == (2, len(NAMES))


# ---- writer contract ------------------------------------------------------------------------

def test_refuses_to_overwrite_unless_asked(tmp_path: Path):
    path = tmp_path / "r.h5"
    path.write_bytes(b"precious")
    with pytest.raises(ReceiptError, match=f"^{path}: exists"):
        ReceiptWriter(path, manifest(), NAMES, stack=STACK)
    assert path.read_bytes() == b"precious"
    with ReceiptWriter(path, manifest(steps=0), NAMES, overwrite=True, stack=STACK):
        pass
    assert ReceiptReader(path).complete


def test_budget_features_are_declared_never_defaulted(tmp_path: Path):
    m = manifest()
    del m["budget_features"]
    with pytest.raises(ValueError, match="budget_features"):
        ReceiptWriter(tmp_path / "r.h5", m, NAMES, stack=STACK)
    assert not (tmp_path / "r.h5").exists()  # nothing written on bad input
    with pytest.raises(ValueError, match="writer owns"):
        ReceiptWriter(tmp_path / "r.h5", manifest(complete=1), NAMES, stack=STACK)
    with pytest.raises(ValueError, match="JSON object"):
        ReceiptWriter(tmp_path / "r.h5", {**manifest(), "canary": "[1]"}, NAMES, stack=STACK)


def test_an_interrupted_run_stays_incomplete(tmp_path: Path):
    path = tmp_path / "r.h5"
    with pytest.raises(RuntimeError):
        with ReceiptWriter(path, manifest(steps=3), NAMES, stack=STACK) as writer:
            write_steps(writer, 1)
            with pytest.raises(ReceiptError, match="1 of 3 planned steps"):
                writer.finish()
            raise RuntimeError("training crashed")
    with ReceiptReader(path) as r:
        assert not r.complete and r.steps_recorded == 1


def test_a_bad_step_writes_no_row(tmp_path: Path):
    path = tmp_path / "r.h5"
    with ReceiptWriter(path, manifest(steps=1), NAMES, stack=STACK) as writer:
        hashes = {fam: [0] * len(NAMES) for fam in HASH_FAMILIES}
        sketches = {fam: [(0.0, np.zeros(SKETCH_WIDTH))] * len(NAMES) for fam in SKETCH_FAMILIES}
        with pytest.raises(ValueError, match="adam_v"):
            writer.append_step(loss=1, grad_norm=1, lr=1, batch_hash=0, hashes={**hashes, "adam_v": [0]},
                               sketches=sketches)
        with pytest.raises(ValueError, match="16 numbers"):
            writer.append_step(loss=1, grad_norm=1, lr=1, batch_hash=0, hashes=hashes,
                               sketches={**sketches, "grads": [(0.0, np.zeros(3))] * len(NAMES)})
        with pytest.raises(ValueError, match="grads: no tensor for wte"):
            state = {fam: tensors(np.random.default_rng(0)) for fam in HASH_FAMILIES}
            del state["grads"]["wte"]
            writer.record_step(loss=1, grad_norm=1, lr=1, batch=np.zeros(BATCH), **state)
        assert writer.steps_recorded == 0
        writer.append_step(loss=1, grad_norm=1, lr=1, batch_hash=0, hashes=hashes, sketches=sketches)
    assert ReceiptReader(path).complete
    with h5py.File(path, "r") as f:  # the good step's row alone: the bad calls left none behind
        assert all(f[p].shape[0] == 1 for p in ("steps/loss", "hashes/params", "hashes/adam_v", "sketches/grads_l2",
                                                "sketches/grads_projection"))


# ---- reader errors ------------------------------------------------------------------------------

def legacy_receipt(path: Path, schema_version: int = 1) -> None:
    """A receipt as the C++ writer wrote it before schema minor 1: variable-length strings,
    no schema_minor, contiguous datasets."""
    vlen = h5py.string_dtype("utf-8")
    with h5py.File(path, "w") as f:
        m = f.create_group("manifest")
        m.attrs.create("schema_version", np.int64(schema_version))
        for key, value in (("lane", "micro/cpu-ref"), ("engine", "cpu-ref"), ("features", "")):
            m.attrs.create(key, value, dtype=vlen)
        m.attrs.create("complete", np.int64(1))
        m.attrs.create("steps_planned", np.int64(2))
        f.create_dataset("steps/loss", data=np.array([2.0, 1.5]))
        f.create_dataset("steps/batch_hash", data=np.array([1, 2], dtype=np.uint64))
        f.create_dataset("hashes/names", data=np.array(["wte", "wpe"], dtype=object), dtype=vlen)
        f.create_dataset("hashes/params", data=np.array([[1, 2], [3, 4]], dtype=np.uint64))


def test_reads_legacy_receipts(tmp_path: Path):
    path = tmp_path / "old.h5"
    legacy_receipt(path)
    with ReceiptReader(path) as r:
        assert (r.schema_version, r.schema_minor) == (1, 0)
        assert r.manifest["lane"] == "micro/cpu-ref" and r.manifest["features"] == ""
        assert r.tensor_names == ["wte", "wpe"] and r.complete and r.steps_recorded == 2
        assert r.hashes("params").tolist() == [[1, 2], [3, 4]]


def test_accepts_any_minor_of_its_major(tmp_path: Path):
    path = tmp_path / "r.h5"
    with ReceiptWriter(path, manifest(steps=0), NAMES, stack=STACK):
        pass
    with h5py.File(path, "r+") as f:
        f["manifest"].attrs.create("schema_minor", np.int64(99))
        f.create_group("from_the_future")  # a minor adds groups a reader ignores
    with ReceiptReader(path) as r:
        assert r.schema_minor == 99 and r.complete


@pytest.mark.parametrize("major, advice", [(2, "upgrade canary_harness"), (0, "re-record the receipt")])
def test_another_major_is_refused_with_advice(tmp_path: Path, major: int, advice: str):
    path = tmp_path / "major.h5"
    legacy_receipt(path, schema_version=major)
    with pytest.raises(ReceiptError) as e:
        ReceiptReader(path)
    assert str(e.value).startswith(f"{path}: schema_version {major}")
    assert advice in str(e.value)


def damaged_files(tmp_path: Path):
    good = tmp_path / "good.h5"
    with ReceiptWriter(good, manifest(steps=2), NAMES, stack=STACK) as writer:
        write_steps(writer, 2)
    text = tmp_path / "notes.txt"
    text.write_text("not a receipt\n")
    truncated = tmp_path / "truncated.h5"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 3])
    no_manifest = tmp_path / "nomanifest.h5"
    with h5py.File(no_manifest, "w") as f:
        f.create_group("steps")
    no_version = tmp_path / "noversion.h5"
    with h5py.File(no_version, "w") as f:
        f.create_group("manifest")
    text_version = tmp_path / "textversion.h5"
    legacy_receipt(text_version)
    with h5py.File(text_version, "r+") as f:
        f["manifest"].attrs["schema_version"] = "1"
    no_loss = tmp_path / "noloss.h5"
    legacy_receipt(no_loss)
    with h5py.File(no_loss, "r+") as f:
        del f["steps/loss"]
    return [
        (tmp_path / "absent.h5", "no such file"),
        (tmp_path, "is a directory"),
        (text, "not an HDF5 file"),
        (truncated, "cannot be opened"),
        (no_manifest, "no /manifest group"),
        (no_version, "no schema_version"),
        (text_version, "schema_version is not an integer"),
        (no_loss, "missing dataset /steps/loss"),
    ]


def test_every_damaged_file_is_a_receipt_error_naming_it(tmp_path: Path):
    for path, what in damaged_files(tmp_path):
        with pytest.raises(ReceiptError) as e:
            ReceiptReader(path)
        assert str(e.value).startswith(f"{path}: "), str(e.value)
        assert what in str(e.value), str(e.value)


def test_a_flipped_data_byte_is_a_checksum_error(tmp_path: Path):
    path = tmp_path / "r.h5"
    with ReceiptWriter(path, manifest(steps=2), NAMES, stack=STACK) as writer:
        write_steps(writer, 2)
    with h5py.File(path, "r") as f:
        offset = f["hashes/params"].id.get_chunk_info(0).byte_offset
    data = bytearray(path.read_bytes())
    data[offset + 3] ^= 0x10
    path.write_bytes(bytes(data))
    with ReceiptReader(path) as r:
        assert r.steps_recorded == 2  # the rest of the file still reads
        with pytest.raises(ReceiptError, match=rf"^{path}: cannot read /hashes/params \(the Fletcher32 checksum failed: "):
            r.hashes("params")
        with pytest.raises(ReceiptError, match="missing dataset /hashes/nothing"):
            r.hashes("nothing")
        with pytest.raises(ReceiptError, match="no tensor dump of step 4"):
            r.tensors(4)


KILLED_PLAIN_WRITER = """
import os, signal, sys
import h5py
f = h5py.File(sys.argv[1], "w", libver=("v110", "v110"))
f.create_group("manifest").attrs["schema_version"] = 1
f.flush()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_file_left_open_for_write_outside_swmr_is_named(tmp_path: Path):
    # What a writer killed outside SWMR mode leaves in the 1.10 format: a superblock that
    # still says "open for write", which no reader accepts; the error says how to clear it.
    path = tmp_path / "killed-plain.h5"
    subprocess.run([sys.executable, "-c", KILLED_PLAIN_WRITER, str(path)], capture_output=True, timeout=60)
    with pytest.raises(ReceiptError, match=rf"^{path}: marked open for write .*h5clear -s"):
        ReceiptReader(path)


def read_everything(path: Path) -> None:
    """Every accessor of ReceiptReader, as a tool that reads the whole receipt calls them."""
    with ReceiptReader(path) as r:
        assert isinstance(r.complete, bool)
        r.steps_recorded, r.tensor_names
        for name in ("loss", "grad_norm", "lr", "batch_hash"):
            r.steps(name)
        for family in HASH_FAMILIES:
            r.hashes(family)
        for family in SKETCH_FAMILIES:
            r.sketches(family)
        for step in r.dumped_steps():
            r.tensors(step)
        r.trace_columns(), r.batches()


def test_damaged_contents_are_receipt_errors_naming_the_field(tmp_path: Path):
    good = tmp_path / "good.h5"
    with ReceiptWriter(good, manifest(steps=2), NAMES, stack=STACK) as writer:
        write_steps(writer, 2)
    read_everything(good)

    def changed(name: str, change) -> Path:
        path = tmp_path / f"{name}.h5"
        path.write_bytes(good.read_bytes())
        with h5py.File(path, "r+") as f:
            change(f)
        return path

    def forged_extent(f):  # chunked, nothing written: reading it would allocate 8 TB
        del f["steps/loss"]
        f.create_dataset("steps/loss", shape=(1 << 40,), maxshape=(None,), chunks=(16,), dtype="<f8")

    def not_utf8(f):
        value = b"\xff\xfeXeon"
        f["manifest"].attrs.create("cpu", value, dtype=h5py.string_dtype("utf-8", len(value)))

    def name_not_utf8(f):
        names = f["hashes/names"][()]
        names[1] = b"\xff" + names[1][1:]
        f["hashes/names"][...] = names

    def numbers_for_names(f):
        count = len(f["hashes/names"])
        del f["hashes/names"]
        f.create_dataset("hashes/names", data=np.arange(count, dtype=np.int64))

    def flat_hashes(f):
        values = f["hashes/params"][()].reshape(-1)
        del f["hashes/params"]
        f.create_dataset("hashes/params", data=values)

    with pytest.raises(ReceiptError, match=r"/steps/loss declares shape \(1099511627776,\) of float64 .* the file "
                                           r"stores 0 bytes of it; the receipt is damaged"):
        ReceiptReader(changed("extent", forged_extent)).steps("loss")
    with pytest.raises(ReceiptError, match=r"/manifest attribute cpu is not UTF-8 text"):
        ReceiptReader(changed("utf8", not_utf8))
    for name, change, pattern in [("names", name_not_utf8, r"/hashes/names\[1\] is not UTF-8 text"),
                                  ("numbers", numbers_for_names, r"/hashes/names holds int64 values, not strings"),
                                  ("flat", flat_hashes, r"/hashes/params has shape \(\d+,\), where a 2-D dataset")]:
        with pytest.raises(ReceiptError) as e:
            read_everything(changed(name, change))
        message = str(e.value)
        assert message.startswith(f"{tmp_path / name}.h5: ") and "\n" not in message, message
        assert re.search(pattern, message), message


def test_any_flipped_byte_reads_or_is_a_receipt_error(tmp_path: Path):
    """A property over the file's bytes: a receipt with one byte flipped, anywhere, either
    reads whole or fails with a ReceiptError naming the file; never another exception, a
    crash or a hang."""
    good = tmp_path / "good.h5"
    with ReceiptWriter(good, manifest(steps=2), NAMES, stack=STACK) as writer:
        write_steps(writer, 2)
    failures = flipped_byte_failures(good.read_bytes(), tmp_path / "flipped.h5", read_everything, ReceiptError,
                                     samples=400, stride=3)
    assert not failures, failures[:5]


# ---- bad values: one ReceiptError naming the field, and no row -------------------------------------

def _good_step(**changes) -> dict:
    step = dict(loss=1.0, grad_norm=1.0, lr=0.1, batch_hash=5,
                hashes={fam: [1] * len(NAMES) for fam in HASH_FAMILIES},
                sketches={fam: [(1.0, np.zeros(SKETCH_WIDTH))] * len(NAMES) for fam in SKETCH_FAMILIES})
    step.update(changes)
    return step


@pytest.mark.parametrize("changes, field", [
    (dict(grad_norm="x"), r"grad_norm is 'x', not a number"),
    (dict(lr=None), r"lr is None, not a number"),
    (dict(loss="x", compile={"HostSync": 0.0}), r"loss is 'x', not a number"),
    (dict(batch_hash=2**64), r"batch_hash is 18446744073709551616, not an integer in 0..2\*\*64-1"),
    (dict(batch_hash=-1), r"batch_hash is -1, not an integer"),
    (dict(batch_hash=1.5), r"batch_hash is 1.5, not an integer"),
    (dict(batch_hash="12"), r"batch_hash is '12', not an integer"),
    (dict(hashes={fam: [-1] + [1] * (len(NAMES) - 1) for fam in HASH_FAMILIES}), r"hashes\['params'\]\[0\] is -1"),
    (dict(hashes={fam: [1.5] * len(NAMES) for fam in HASH_FAMILIES}), r"hashes\['params'\]\[0\] is 1.5"),
    (dict(hashes={fam: np.full(len(NAMES), 1.0) for fam in HASH_FAMILIES}), r"hashes\['params'\] holds float64"),
    (dict(hashes={fam: np.full(len(NAMES), -1) for fam in HASH_FAMILIES}), r"hashes\['params'\] holds a negative"),
    (dict(sketches={fam: [("x", np.zeros(SKETCH_WIDTH))] * len(NAMES) for fam in SKETCH_FAMILIES}),
     r"sketches\['params'\]\[0\] l2 is 'x'"),
    (dict(trace=5), r"trace is 5, not \(columns, hashes, sketches\)"),
    (dict(compile=5), r"compile is 5, not a mapping"),
])
def test_a_bad_value_is_named_before_any_row_is_written(tmp_path: Path, harness_bin: Path, changes: dict,
                                                         field: str):
    """Every value is checked before the first dataset is touched: a bad one (here after a
    good compile= row, the first written) leaves every dataset as it was, and the receipt
    completed afterwards is valid."""
    from conftest import run_harness
    path = tmp_path / "r.h5"
    good = {"compile": {"HostSync": 0.0}} if "compile" in changes else {}
    with ReceiptWriter(path, manifest(steps=1), NAMES, stack=STACK) as writer:
        with pytest.raises(ReceiptError, match=rf"^{re.escape(str(path))}: append_step 0: {field}"):
            writer.append_step(**_good_step(**changes))
        assert writer.steps_recorded == 0
        writer.append_step(**_good_step(**good))
    run_harness(harness_bin, "validate", str(path))
    with ReceiptReader(path) as r:
        assert r.complete and r.steps("batch_hash").tolist() == [5] and r.hashes("params")[0].tolist() == [1] * 4
        assert all(r.read(n).shape[0] == 1 for n in ("steps/loss", "steps/grad_norm", "steps/lr", "hashes/params",
                                                      "sketches/params_l2"))


@pytest.mark.parametrize("call, message", [
    (lambda d: ReceiptWriter(d, manifest(), NAMES, stack=STACK), r"^{d}: is a directory; give a file path"),
    (lambda d: ReceiptWriter(d / "x.h5", {k: v for k, v in manifest().items() if k != "engine"}, NAMES, stack=STACK),
     r"^{d}/x.h5: manifest lacks engine"),
    (lambda d: ReceiptWriter(d / "x.h5", manifest(canary="{"), NAMES, stack=STACK), r"manifest canary is not JSON"),
    (lambda d: ReceiptWriter(d / "x.h5", manifest(canary=[1]), NAMES, stack=STACK), r"manifest canary is a list"),
    (lambda d: ReceiptWriter(d / "x.h5", manifest(), ["a", 1], stack=STACK), r"tensor_names must be"),
    (lambda d: ReceiptWriter(5, manifest(), NAMES, stack=STACK), r"^5: not a receipt path"),
    (lambda d: ReceiptWriter("", manifest(), NAMES, stack=STACK), r"^'': not a receipt path"),
    (lambda d: ReceiptWriter(d / "x.h5", {**manifest(), "seed": 2**63}, NAMES, stack=STACK), r"manifest seed is"),
    (lambda d: ReceiptWriter(d / "x.h5", {**manifest(), "seed": -5}, NAMES, stack=STACK), r"manifest seed is -5"),
    (lambda d: ReceiptWriter(d / "x.h5", manifest(steps=2**63), NAMES, stack=STACK), r"manifest steps_planned is"),
    (lambda d: ReceiptWriter(d / "x.h5", manifest(x=2**64), NAMES, stack=STACK), r"manifest x is .* outside int64"),
    (lambda d: ReceiptWriter(d / "x.h5", {**manifest(), 5: 1}, NAMES, stack=STACK), r"manifest key 5 is not"),
    (lambda d: ReceiptWriter(d / "x.h5", manifest(x="a\x00b"), NAMES, stack=STACK), r"manifest x holds a NUL"),
    (lambda d: ReceiptWriter(d / "x.h5", manifest(), NAMES, batch_shape=(2, -1), stack=STACK), r"batch_shape is"),
    (lambda d: ReceiptWriter(d / "x.h5", manifest(), NAMES, batch_shape=(2, 3, 4), stack=STACK), r"batch_shape is"),
    (lambda d: ReceiptWriter(d / "dangling.h5", manifest(), NAMES, overwrite=True, stack=STACK),
     r"dangling.h5: is a symlink to a missing file .*remove the link"),
    (lambda d: ReceiptWriter(d / "none" / "x.h5", manifest(), NAMES, stack=STACK), r"directory .*none does not exist"),
])
def test_bad_writer_arguments_are_one_receipt_error_and_no_file(tmp_path: Path, call, message: str):
    d = tmp_path / "d"
    d.mkdir()
    (d / "dangling.h5").symlink_to(tmp_path / "nowhere.h5")
    with pytest.raises(ReceiptError, match=message.replace("{d}", re.escape(str(d)))):
        call(d)
    assert sorted(p.name for p in d.iterdir()) == ["dangling.h5"]


@pytest.mark.parametrize("dataset, value, read", [
    ("hashes/params", np.zeros((3, 4)), lambda r: r.hashes("params")),
    ("steps/batch_hash", np.zeros(3), lambda r: r.steps("batch_hash")),
    ("steps/loss", np.zeros(3, dtype=np.int64), lambda r: r.steps("loss")),
    ("sketches/params_l2", np.zeros((3, 4), dtype=np.float32), lambda r: r.sketches("params")),
])
def test_a_dataset_of_the_wrong_dtype_is_named(tmp_path: Path, dataset: str, value: np.ndarray, read):
    path = tmp_path / "r.h5"
    with ReceiptWriter(path, manifest(steps=3), NAMES, stack=STACK) as writer:
        write_steps(writer, 3)
    with h5py.File(path, "r+") as f:
        del f[dataset]
        f.create_dataset(dataset, data=value)
    with ReceiptReader(path) as r, pytest.raises(ReceiptError, match=rf"/{dataset} holds .* where .* belongs"):
        read(r)


WRITER_PAST_A_FILE_SIZE_LIMIT = """
import os, resource, sys
sys.path[:0] = sys.argv[2:]
from test_receipt import NAMES, STACK, manifest, write_steps
from canary_harness import ReceiptError, ReceiptWriter
resource.setrlimit(resource.RLIMIT_FSIZE, (40000, 40000))  # SIGXFSZ: Python ignores it, so a write fails with EFBIG
writer = ReceiptWriter(sys.argv[1], manifest(steps=200), NAMES, stack=STACK)
try:
    write_steps(writer, 200)
except ReceiptError as e:
    print(e)
writer.close()
print("left" if os.path.lexists(sys.argv[1]) else "removed")
"""


def test_a_write_that_fails_part_way_removes_the_file_and_ends_cleanly(tmp_path: Path):
    """Past a file size limit (as on a full disk) a step's flush fails part-way: the file is
    no receipt a reader can trust, so it is removed with one line naming why, and the
    process ends normally (HDF5 1.10.8 crashed at exit closing such a file)."""
    path = tmp_path / "r.h5"
    run = subprocess.run([sys.executable, "-c", WRITER_PAST_A_FILE_SIZE_LIMIT, str(path), str(Path(__file__).parent),
                          str(PYTHON_DIR)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert len(lines) == 2 and lines[1] == "removed", run.stdout
    assert re.fullmatch(rf"{re.escape(str(path))}: (HDF5 cannot flush the receipt|cannot append step \d+) \(File too "
                        r"large\); the damaged file is removed: free space \(or raise the file size limit\) and run "
                        r"again", lines[0]), lines[0]
    assert not path.exists()


def test_a_loss_tensor_as_the_step_left_it_is_a_number(tmp_path: Path):
    """record_step takes the loss straight from the step: a 0-d tensor with grad, or bf16."""
    import torch

    weight = torch.ones(3, requires_grad=True)
    losses = [(weight * 2).sum(), (weight * 2).sum().detach().to(torch.bfloat16)]
    with ReceiptWriter(tmp_path / "r.h5", manifest(steps=2), NAMES, stack=STACK) as writer:
        rng = np.random.default_rng(0)
        for loss in losses:
            state = {fam: tensors(rng) for fam in HASH_FAMILIES}
            writer.record_step(loss=loss, grad_norm=torch.tensor(0.5), lr=1e-3, batch=rng.integers(0, 11, BATCH),
                               **state)
    with ReceiptReader(tmp_path / "r.h5") as r:
        assert r.steps("loss").tolist() == [6.0, 6.0] and r.steps("grad_norm").tolist() == [0.5, 0.5]


@pytest.mark.parametrize("key", ["lane", "engine"])
def test_an_empty_lane_or_engine_is_refused_as_validate_refuses_it(tmp_path: Path, key: str):
    with pytest.raises(ReceiptError, match=rf"manifest {key} is '': a non-empty str"):
        ReceiptWriter(tmp_path / "r.h5", manifest(**{key: ""}), NAMES, stack=STACK)
    assert not (tmp_path / "r.h5").exists()


@pytest.mark.parametrize("declared", ["noise++bf16", "+bf16", "bf16+", "bf16+noise+bf16", "bf16+torch cpu"])
def test_a_malformed_budget_features_is_refused_in_validates_words(tmp_path: Path, harness_bin: Path, declared: str):
    """The package parses budget_features as the harness does (canary_harness.receipts.budget_features
    and receipt::BudgetFeatures): the writer refuses a declaration before any file exists,
    with the words `harness validate` uses for a file that holds it."""
    from canary_harness.receipts.budget_features import format_features, parse_features
    from conftest import run_harness
    with pytest.raises(ValueError) as parsed:
        parse_features(declared)
    with pytest.raises(ReceiptError, match=rf"manifest budget_features: {re.escape(str(parsed.value))}; nothing"):
        ReceiptWriter(tmp_path / "r.h5", manifest(budget_features=declared), NAMES, stack=STACK)
    assert not (tmp_path / "r.h5").exists()
    path = tmp_path / "held.h5"
    with ReceiptWriter(path, manifest(steps=1), NAMES, batch_shape=BATCH, stack=STACK) as writer:
        write_steps(writer, 1)
    with h5py.File(path, "r+") as f:  # as the writer stores a string: fixed-length UTF-8
        encoded = declared.encode("utf-8")
        dtype = h5py.string_dtype("utf-8", len(encoded))
        f["manifest"].attrs.create("budget_features", np.array(encoded, dtype=dtype), dtype=dtype)
    validated = run_harness(harness_bin, "validate", str(path), check=False)
    assert validated.returncode != 0
    assert f"/manifest/budget_features: {parsed.value}" in validated.stdout + validated.stderr
    names = [n for n in declared.split("+") if n and " " not in n]
    assert parse_features(format_features(dict.fromkeys(names))) == list(dict.fromkeys(names))

