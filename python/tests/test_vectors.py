"""The receipt digests' test vectors (docs/receipt-test-vectors.json), recomputed bit for bit.

docs/receipt-schema.md ("Digests") specifies every digest a receipt holds; the vector file
pins them down with inputs and expected outputs, written as hex bit patterns so nothing is
lost in decimal. This test recomputes every expected value with canary_harness (the
digest module and the Philox generator, the code the Recorder and the writer use) and
compares with ==; tests/unit/receipt_test.cpp (ReceiptVectors) does the same with the C++
functions, so both implementations are held to the one file, and a third can be.

Inputs are part of the file (explicit float32 bit patterns, or a generator rule with its
parameters); the expected fields are outputs. After a deliberate change of an algorithm,
`python3 tests/test_vectors.py --write` recomputes the outputs of the file's inputs in
place: review the diff (every changed value is a receipt change and invalidates goldens).

One exception to "bit for bit": a float64 output whose expected value is a NaN matches any
NaN. The sign and payload of a NaN that arithmetic produces depend on the hardware (x86
quiets a signalling NaN when it widens it and keeps the first operand's payload; other
ISAs may return a default NaN), and the schema does not pin them. Hashes cover the input
bytes, NaN payloads included, and are always compared exactly.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import sys
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest
import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # canary_harness, when run as a script

from canary_harness.receipts import digest  # noqa: E402
from canary_harness.receipts.philox import philox4x32_10, philox_at, philox_words, stream_id  # noqa: E402
from canary_harness.receipts.schema import SKETCH_BLOCK, SKETCH_WIDTH  # noqa: E402

# The repository's file; a copy of the tests away from the checkout (the virtual-environment
# check) is told where it is.
VECTORS = Path(os.environ.get("CANARY_HARNESS_VECTORS",
                              Path(__file__).resolve().parents[2] / "docs" / "receipt-test-vectors.json"))
FIRST_DRAWS = 2  # blocks whose Philox draw, bucket and sign each tensor vector lists

# Some inputs are deliberately infinite or NaN: numpy's "invalid value" warnings are expected.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


# ---- encodings of the file ---------------------------------------------------------------------

def u64_hex(value: int) -> str:
    return f"0x{value:016x}"


def u32_hex(value: int) -> str:
    return f"0x{value:08x}"


def f64_hex(value: float) -> str:
    return u64_hex(struct.unpack("<Q", struct.pack("<d", value))[0])


def f64_of_hex(text: str) -> float:
    return struct.unpack("<d", struct.pack("<Q", int(text, 16)))[0]


def f32_values(spec: Dict[str, Any]) -> np.ndarray:
    """A tensor vector's input: explicit float32 bit patterns, or a generator rule."""
    if "values_f32" in spec:
        bits = np.array([int(v, 16) for v in spec["values_f32"]], dtype=np.uint32)
        return bits.view(np.float32)  # a view: NaN payloads and signalling NaNs stay as written
    rule = spec["generate"]
    assert rule["rule"] == "affine_mod", rule
    i = np.arange(rule["count"], dtype=np.int64)
    numerator = (i * rule["mul"]) % rule["modulus"] - rule["offset"]
    return (numerator.astype(np.float64) / float(rule["divisor"])).astype(np.float32)


def batch_tokens(spec: Dict[str, Any]) -> np.ndarray:
    return np.array(spec["tokens"], dtype=np.int32).reshape(spec["shape"])


def content_bytes(spec: Dict[str, Any]) -> bytes:
    if "bytes_hex" in spec:
        return bytes.fromhex(spec["bytes_hex"])
    rule = spec["generate"]
    assert rule["rule"] == "byte_affine", rule
    return bytes((i * rule["mul"] + rule["add"]) % 256 for i in range(rule["count"]))


# ---- the outputs, computed by canary_harness ---------------------------------------------------

def philox_outputs(spec: Dict[str, Any]) -> Dict[str, Any]:
    if "counter" in spec:
        counter = tuple(int(c, 16) for c in spec["counter"])
        key = tuple(int(k, 16) for k in spec["key"])
        return {"output": [u32_hex(w) for w in philox4x32_10(counter, key)]}
    seed, stream, index = (int(spec[f], 16) for f in ("seed", "stream", "index"))
    return {"output": [u32_hex(w) for w in philox_at(seed, stream, index)]}


def tensor_outputs(spec: Dict[str, Any]) -> Dict[str, Any]:
    values = f32_values(spec)
    salt = stream_id(spec["name"])
    sketch = digest.sketch(values, spec["name"])
    draws = []
    blocks = -(-values.size // SKETCH_BLOCK)
    for j in range(min(blocks, FIRST_DRAWS)):
        draw = philox_at(salt, 0, j)[0]
        draws.append({"block": j, "draw": u32_hex(draw), "bucket": draw % SKETCH_WIDTH, "negative": bool(draw >> 31)})
    return {
        "numel": int(values.size),
        "hash": u64_hex(digest.tensor_hash(values)),
        "salt": u64_hex(salt),
        "first_draws": draws,
        "l2": f64_hex(sketch.l2),
        "projection": [f64_hex(p) for p in sketch.projection],
    }


def batch_outputs(spec: Dict[str, Any]) -> Dict[str, Any]:
    return {"hash": u64_hex(digest.batch_hash(batch_tokens(spec)))}


def content_outputs(spec: Dict[str, Any]) -> Dict[str, Any]:
    # The C++ harness streams the file through XXH3-128 (harness/run/file_io.cpp); the digest
    # is printed in canonical (big-endian) order, which is what xxh3_128_hexdigest prints.
    return {"content_hash": "xxh128:" + xxhash.xxh3_128_hexdigest(content_bytes(spec))}


SECTIONS = {"philox": philox_outputs, "stream_id": lambda s: {"fnv1a64": u64_hex(stream_id(s["name"]))},
            "tensors": tensor_outputs, "batch_hash": batch_outputs, "content_hash": content_outputs}


def load() -> Dict[str, Any]:
    return json.loads(VECTORS.read_text(encoding="utf-8"))


# ---- the checks ---------------------------------------------------------------------------------

def same_f64(expected_hex: str, actual: float) -> bool:
    """Bit-for-bit equality, except that an expected NaN matches any NaN (module docstring)."""
    expected = f64_of_hex(expected_hex)
    if math.isnan(expected):
        return math.isnan(actual)
    return f64_hex(actual) == expected_hex.lower()


def test_the_file_holds_the_vectors_the_doc_promises():
    """The file cannot be emptied or lose a section without this failing (no vacuous pass)."""
    data = load()
    assert data["sketch"] == {"width": SKETCH_WIDTH, "block": SKETCH_BLOCK}
    for section, minimum in (("philox", 5), ("stream_id", 4), ("tensors", 10), ("batch_hash", 2),
                             ("content_hash", 3)):
        assert len(data[section]) >= minimum, section
    ids = {v["id"] for v in data["tensors"]}
    assert {"empty", "one", "negative-zero", "specials", "nan-payloads", "rule-1000", "rule-300000"} <= ids


@pytest.mark.parametrize("index", range(len(load()["philox"])))
def test_philox(index: int):
    spec = load()["philox"][index]
    assert philox_outputs(spec)["output"] == spec["output"], spec.get("id")
    if "seed" in spec:  # the vectorised generator the sketch uses, too
        seed, stream, i = (int(spec[f], 16) for f in ("seed", "stream", "index"))
        words = philox_words(seed, stream, np.array([i], dtype=np.uint64))[:, 0]
        assert [u32_hex(int(w)) for w in words] == spec["output"]


@pytest.mark.parametrize("index", range(len(load()["stream_id"])))
def test_stream_id(index: int):
    spec = load()["stream_id"][index]
    assert u64_hex(stream_id(spec["name"])) == spec["fnv1a64"], spec["name"]


def check_tensor(spec: Dict[str, Any], hash_value: int, sketch: digest.Sketch) -> None:
    values = f32_values(spec)
    assert values.size == spec["numel"]
    assert u64_hex(hash_value) == spec["hash"], "hash"
    assert u64_hex(stream_id(spec["name"])) == spec["salt"], "salt"
    codes = digest.block_codes(values.size, stream_id(spec["name"]))
    for d in spec["first_draws"]:
        draw = philox_at(stream_id(spec["name"]), 0, d["block"])[0]
        assert u32_hex(draw) == d["draw"], d
        assert (int(codes[d["block"]]) & 0x7F, int(codes[d["block"]]) >> 7 == 1) == (d["bucket"], d["negative"]), d
    assert same_f64(spec["l2"], sketch.l2), f"l2: {f64_hex(sketch.l2)} != {spec['l2']}"
    assert len(spec["projection"]) == SKETCH_WIDTH
    for b, (expected, actual) in enumerate(zip(spec["projection"], sketch.projection)):
        assert same_f64(expected, float(actual)), f"projection[{b}]: {f64_hex(float(actual))} != {expected}"


@pytest.mark.parametrize("index", range(len(load()["tensors"])))
def test_tensor(index: int):
    spec = load()["tensors"][index]
    values = f32_values(spec)
    check_tensor(spec, digest.tensor_hash(values), digest.sketch(values, spec["name"]))


def test_tensors_sketched_together():
    """The Recorder's path: every vector in one SketchLayout (hash_and_sketch), same bits."""
    tensors = load()["tensors"]
    arrays = [digest.as_float32(f32_values(s)) for s in tensors]
    layout = digest.SketchLayout([a.size for a in arrays], [stream_id(s["name"]) for s in tensors])
    hashes, sketches = layout.hash_and_sketch(arrays)
    for spec, h, s in zip(tensors, hashes, sketches):
        check_tensor(spec, h, s)


@pytest.mark.parametrize("index", range(len(load()["batch_hash"])))
def test_batch_hash(index: int):
    spec = load()["batch_hash"][index]
    assert batch_outputs(spec) == {"hash": spec["hash"]}


@pytest.mark.parametrize("index", range(len(load()["content_hash"])))
def test_content_hash(index: int):
    spec = load()["content_hash"][index]
    assert content_outputs(spec) == {"content_hash": spec["content_hash"]}


# ---- regeneration -------------------------------------------------------------------------------

def _dump(data: Dict[str, Any]) -> str:
    """Indented JSON with every list of scalars (and every one-line object) on one line."""
    text = json.dumps(data, indent=2, ensure_ascii=False)
    scalar_list = re.compile(r"\[\s*((?:(?:\"[^\"\n]*\"|-?\d+|true|false),\s*)*(?:\"[^\"\n]*\"|-?\d+|true|false))\s*\]")
    text = scalar_list.sub(lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text)
    flat_object = re.compile(r"\{\n\s*((?:\"[^\"\n]+\": (?:\"[^\"\n]*\"|-?\d+|true|false),\n\s*)*"
                             r"\"[^\"\n]+\": (?:\"[^\"\n]*\"|-?\d+|true|false))\n\s*\}")
    def one_line(m: "re.Match[str]") -> str:
        line = "{" + re.sub(r",\n\s*", ", ", m.group(1)) + "}"
        return line if len(line) <= 110 else m.group(0)
    return flat_object.sub(one_line, text) + "\n"


def write() -> None:
    data = load()
    with np.errstate(invalid="ignore"):
        for section, outputs in SECTIONS.items():
            for spec in data[section]:
                spec.update(outputs(spec))
    VECTORS.write_text(_dump(data), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: test_vectors.py --write   (recomputes the outputs of docs/receipt-test-vectors.json)")
    write()
