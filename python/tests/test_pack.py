"""canary_harness.pack: a `harness export` pack read back, and every way a pack can be bad."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from canary_harness import ReceiptError, ReceiptReader, batch_hash
from canary_harness.pack import PackError, read_pack
from conftest import flipped_byte_failures


def test_pack_is_what_a_run_starts_from_and_trains_on(micro_pack: Path, cpp_receipt: Path):
    pack = read_pack(micro_pack, canary="micro")
    with ReceiptReader(cpp_receipt) as receipt:
        assert pack.canary_json == receipt.manifest["canary"]  # byte for byte: the two compare
        assert pack.name == "micro" and pack.steps == 3 and pack.seed == receipt.manifest["seed"] == 1337
        assert pack.data_seed == pack.canary["data_seed"]
        assert pack.tensor_names == receipt.tensor_names
        dump = receipt.tensors(0)
        for name in pack.tensor_names:
            assert pack.init[name].dtype == np.float32
            assert pack.init[name].tobytes() == dump[name].tobytes(), name
        assert np.array_equal(pack.tokens, receipt.batches())
        assert [batch_hash(pack.batch(s)) for s in range(pack.steps)] == [int(h) for h in receipt.steps("batch_hash")]
    assert pack.batch_shape == (2, 17)
    with pytest.raises(IndexError, match="batches 0..2"):
        pack.batch(3)


def test_reading_a_pack_needs_no_torch(micro_pack: Path):
    import subprocess
    code = ("import sys; from canary_harness.pack import read_pack; read_pack(sys.argv[1]); "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    result = subprocess.run([sys.executable, "-c", code, str(micro_pack)], cwd=Path(__file__).resolve().parents[1],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def expect_error(path: Path, pattern: str, **kwargs) -> PackError:
    with pytest.raises(PackError) as info:
        read_pack(path, **kwargs)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert "\n" not in message
    import re
    assert re.search(pattern, message), message
    assert isinstance(info.value, ReceiptError)  # one family of errors for packs and receipts
    return info.value


def test_a_pack_of_another_canary_is_refused(micro_pack: Path):
    expect_error(micro_pack, r"a pack of canary 'micro', not 'tiny'; export one with `harness export --canary tiny`",
                 canary="tiny")


def test_missing_and_foreign_files(tmp_path: Path, cpp_receipt: Path):
    expect_error(tmp_path / "absent.h5", "no such file")
    expect_error(tmp_path, "is a directory")
    text = tmp_path / "text.h5"
    text.write_text("not hdf5")
    expect_error(text, "not an HDF5 file")
    expect_error(cpp_receipt, "is a receipt, not a canary pack")


def test_truncated_pack(micro_pack: Path, tmp_path: Path):
    data = micro_pack.read_bytes()
    for keep in (len(data) // 2, len(data) - 100):
        cut = tmp_path / f"cut{keep}.h5"
        cut.write_bytes(data[:keep])
        expect_error(cut, r"truncated or corrupt|cannot read|damaged")


def copy_with(micro_pack: Path, tmp_path: Path, change) -> Path:
    path = tmp_path / "changed.h5"
    shutil.copy(micro_pack, path)
    with h5py.File(path, "r+") as f:
        change(f)
    return path


def test_missing_dataset(micro_pack: Path, tmp_path: Path):
    def drop(name):
        return lambda f: f.__delitem__(name)
    expect_error(copy_with(micro_pack, tmp_path, drop("init/wte")), r"missing dataset /init/wte: pack is damaged; "
                 r"export it again with `harness export`")
    expect_error(copy_with(micro_pack, tmp_path, drop("batches/tokens")), "missing dataset /batches/tokens")
    expect_error(copy_with(micro_pack, tmp_path, drop("init/names")), "missing dataset /init/names")


def test_contents_that_do_not_fit_the_canary(micro_pack: Path, tmp_path: Path):
    def retype(f):
        values = f["init/wpe"][()]
        del f["init/wpe"]
        f["init"].create_dataset("wpe", data=values.astype(np.float64))
    expect_error(copy_with(micro_pack, tmp_path, retype), r"/init/wpe is float64 \(16, 32\), canary 'micro' has float32")

    def shorten(f):
        tokens = f["batches/tokens"][()]
        del f["batches/tokens"]
        f["batches"].create_dataset("tokens", data=tokens[:2])
    expect_error(copy_with(micro_pack, tmp_path, shorten), r"/batches/tokens is int32 \(2, 2, 17\), canary 'micro' has int32 \(3, 2, 17\)")

    def out_of_vocab(f):
        f["batches/tokens"][0, 0, 0] = 128
    expect_error(copy_with(micro_pack, tmp_path, out_of_vocab), "token ids outside 0..127")

    def newer(f):
        f["manifest"].attrs["pack_version"] = np.int64(2)
    expect_error(copy_with(micro_pack, tmp_path, newer), "pack_version 2 is newer than this canary_harness reads")

    def no_version(f):
        del f["manifest"].attrs["pack_version"]
    expect_error(copy_with(micro_pack, tmp_path, no_version), "no pack_version attribute: not a canary pack")


def test_a_flipped_byte_in_raw_data_is_an_error_not_a_value(micro_pack: Path, tmp_path: Path):
    path = tmp_path / "flipped.h5"
    shutil.copy(micro_pack, path)
    with h5py.File(path, "r") as f:
        offset = f["batches/tokens"].id.get_chunk_info(0).byte_offset
    data = bytearray(path.read_bytes())
    data[offset + 5] ^= 0x01
    path.write_bytes(bytes(data))
    expect_error(path, r"cannot read /batches/tokens \(the Fletcher32 checksum failed: ")


def test_a_canary_json_or_manifest_no_canary_file_allows(micro_pack: Path, tmp_path: Path):
    """Sizes and seeds are checked before anything is sized from them: a table of 10**12
    layers is refused at once, not built."""
    def canary_with(**changes):
        def change(f):
            canary = json.loads(f["manifest"].attrs["canary"])
            canary.update(changes)
            text = json.dumps(canary)
            f["manifest"].attrs.create("canary", text, dtype=h5py.string_dtype("utf-8", len(text.encode())))
        return change

    expect_error(copy_with(micro_pack, tmp_path, canary_with(layers=10**12)),
                 r"/manifest canary JSON key 'layers' must be <= 1024 \(is 1000000000000\)")
    expect_error(copy_with(micro_pack, tmp_path, canary_with(vocab_size=True)),
                 r"canary JSON key 'vocab_size' is True, not an int")
    expect_error(copy_with(micro_pack, tmp_path, canary_with(preset=7)), r"canary JSON key 'preset' is 7, not a string")

    def nested(f):
        text = "[" * 100000 + "]" * 100000
        f["manifest"].attrs.create("canary", text, dtype=h5py.string_dtype("utf-8", len(text)))
    expect_error(copy_with(micro_pack, tmp_path, nested), r"attribute canary is not JSON \(nested too deeply\)")

    def not_utf8(f):
        f["manifest"].attrs.create("canary", b"{\xff}", dtype=h5py.string_dtype("utf-8", 3))
    expect_error(copy_with(micro_pack, tmp_path, not_utf8), r"/manifest attribute canary is not UTF-8 text")

    def huge_seed(f):
        f["manifest"].attrs["seed"] = np.uint64(2**64 - 1)
    expect_error(copy_with(micro_pack, tmp_path, huge_seed),
                 r"/manifest attribute seed is 18446744073709551615, outside 0\.\.9223372036854775807")

    def forged_extent(f):
        del f["batches/tokens"]
        f.create_dataset("batches/tokens", shape=(3, 2, 17), chunks=(1, 2, 17), dtype="<i4")
    expect_error(copy_with(micro_pack, tmp_path, forged_extent),
                 r"/batches/tokens declares shape \(3, 2, 17\) of int32 .* the file stores 0 bytes of it")


def test_any_flipped_byte_reads_or_is_a_pack_error(micro_pack: Path, tmp_path: Path):
    """A property over the file's bytes: a pack with one byte flipped, anywhere, either reads
    (a flip in unused space) or fails with a one-line PackError naming the file; never
    another exception, a crash or a hang."""
    failures = flipped_byte_failures(micro_pack.read_bytes(), tmp_path / "flipped.h5",
                                     lambda path: read_pack(path, canary="micro"), PackError, samples=300, stride=4)
    assert not failures, failures[:5]
