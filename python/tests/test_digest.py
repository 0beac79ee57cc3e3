"""Digests against independent references: known answers, and a plain loop written from the
C++ source (harness/run/tensor_digest.cpp) that the vectorised sketch must equal bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import xxhash

from canary_harness import SKETCH_WIDTH, as_float32, batch_hash, philox_at, sketch, stream_id, tensor_hash
from canary_harness.receipts import digest
from canary_harness.receipts.digest import SketchLayout, block_codes, sketch_many
from canary_harness.receipts.philox import philox4x32_10, philox_words

SIZES = (1, 5, 31, 32, 33, 1000, 4097)


def reference_sketch(values: np.ndarray, name: str) -> tuple[float, list[float]]:
    """TensorSketcher::operator() transcribed line by line, one element at a time."""
    x = [float(v) for v in np.asarray(values, dtype=np.float32).reshape(-1)]
    salt = stream_id(name)
    squares = [0.0] * 4
    projection = [0.0] * SKETCH_WIDTH
    for block, start in enumerate(range(0, len(x), 32)):
        sums = [0.0] * 4
        for i in range(start, min(start + 32, len(x))):
            sums[i % 4] += x[i]
            squares[i % 4] += x[i] * x[i]
        block_sum = (sums[0] + sums[1]) + (sums[2] + sums[3])
        draw = philox_at(salt, 0, block)[0]
        projection[draw % SKETCH_WIDTH] += -block_sum if draw >> 31 else block_sum
    return math.sqrt((squares[0] + squares[1]) + (squares[2] + squares[3])), projection


def bits(values) -> np.ndarray:
    """float64 bit patterns: equality here is exact, -0.0 and NaN payloads included."""
    return np.asarray(values, dtype=np.float64).reshape(-1).view(np.uint64)


def awkward_array(rng: np.random.Generator, n: int) -> np.ndarray:
    """Values whose sums round differently in every other order: mixed magnitudes and signs,
    exact zeros and negative zeros."""
    x = rng.standard_normal(n) * np.exp2(rng.integers(-30, 30, n))
    x[rng.random(n) < 0.05] = 0.0
    x[rng.random(n) < 0.05] = -0.0
    return x.astype(np.float32)


# ---- Philox and stream ids -------------------------------------------------------------------

def test_philox_matches_random123_known_answers():
    # The vectors engines/numerics' own test (tests/unit/det_math_test.cpp) holds the C++ to.
    assert philox4x32_10((0, 0, 0, 0), (0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    assert philox4x32_10((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2) == (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)
    assert philox4x32_10((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)) == (
        0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)


def test_vectorised_philox_equals_the_scalar_one():
    seed, stream = stream_id("blocks.0.attn.qkv.weight"), (7 << 32) | 3
    indices = np.array([0, 1, 2, 1000, 2**32 - 1, 2**32 + 5, 2**63 + 11], dtype=np.uint64)
    words = philox_words(seed, stream, indices)
    assert words.dtype == np.uint32
    for column, index in enumerate(indices):
        assert tuple(int(w) for w in words[:, column]) == philox_at(seed, stream, int(index))


def test_stream_id_is_fnv1a_64():
    assert stream_id("") == 0xCBF29CE484222325
    assert stream_id("a") == 0xAF63DC4C8601EC8C
    assert stream_id("foobar") == 0x85944171F73967E8


def test_block_codes_hold_a_bucket_and_a_sign():
    codes = block_codes(32 * 500 + 1, stream_id("wte"))
    assert codes.shape == (501,)
    assert int((codes & 0x7F).max()) < SKETCH_WIDTH
    assert 0.3 < float(np.mean(codes >> 7)) < 0.7  # signs are drawn, not constant


# ---- hashes ---------------------------------------------------------------------------------

def test_tensor_hash_is_xxh3_64_of_little_endian_float32():
    assert tensor_hash(np.zeros(0, dtype=np.float32)) == 0x2D06800538D394C2  # XXH3-64 of nothing
    assert tensor_hash(np.array([1.0], dtype=np.float32)) == xxhash.xxh3_64_intdigest(b"\x00\x00\x80\x3f")
    x = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    assert tensor_hash(x) == xxhash.xxh3_64_intdigest(x.tobytes(), seed=0)
    assert tensor_hash(x.astype(">f4")) == tensor_hash(x)  # byte order of the input is irrelevant
    assert tensor_hash(np.asfortranarray(x)) == tensor_hash(x)  # the logical row-major value is hashed
    assert tensor_hash(x.T) == tensor_hash(np.ascontiguousarray(x.T))
    assert tensor_hash(x.astype(np.float64)) == tensor_hash(x)  # exact widening is accepted
    assert tensor_hash(x.tolist()) == tensor_hash(x)


def test_inexact_float32_conversion_is_refused():
    with pytest.raises(ValueError, match="float32 exactly"):
        tensor_hash(np.array([0.1], dtype=np.float64))
    with pytest.raises(ValueError, match="int32 exactly"):
        batch_hash(np.array([2**40]))


def test_batch_hash_is_xxh3_64_of_int32_tokens():
    tokens = np.arange(2 * 17, dtype=np.int64).reshape(2, 17)
    assert batch_hash(tokens) == xxhash.xxh3_64_intdigest(tokens.astype("<i4").tobytes())


@pytest.mark.parametrize("layout", ["int32", "fortran", "strided", "big-endian", "int16", "uint8"])
def test_batch_hash_is_the_row_major_int32_bytes_whatever_the_layout(layout: str):
    # An int32 C-contiguous batch is hashed in place (no copy, no check); every other layout
    # is converted first: the hash is always that of the row-major little-endian int32 values.
    rng = np.random.default_rng(7)
    base = rng.integers(0, 250, size=(8, 65)).astype(np.int32)
    given = {"int32": base, "fortran": np.asfortranarray(base), "strided": np.repeat(base, 2, axis=1)[:, ::2],
             "big-endian": base.astype(">i4"), "int16": base.astype(np.int16), "uint8": base.astype(np.uint8)}[layout]
    assert np.array_equal(given, base)
    assert batch_hash(given) == xxhash.xxh3_64_intdigest(base.astype("<i4").tobytes())


def test_torch_tensors_hash_like_numpy():
    torch = pytest.importorskip("torch")
    x = torch.randn(6, 7)
    assert tensor_hash(x) == tensor_hash(x.numpy())
    assert tensor_hash(x.t()) == tensor_hash(np.ascontiguousarray(x.numpy().T))
    w = torch.randn(5, requires_grad=True)
    assert tensor_hash(w) == tensor_hash(w.detach().numpy())
    b = x.to(torch.bfloat16)  # no numpy bf16: widened to float32, exactly
    assert tensor_hash(b) == tensor_hash(b.float().numpy())
    assert sketch(x, "wte").l2 == sketch(x.numpy(), "wte").l2


# ---- the sketch -----------------------------------------------------------------------------

@pytest.mark.parametrize("n", SIZES)
def test_sketch_equals_the_reference_loop_bit_for_bit(n: int):
    rng = np.random.default_rng(n)
    for name in ("wte", "blocks.0.mlp.fc.weight", "loss"):
        for x in (rng.standard_normal(n).astype(np.float32), awkward_array(rng, n)):
            l2, projection = sketch(x, name)
            ref_l2, ref_projection = reference_sketch(x, name)
            assert bits(l2) == bits(ref_l2)
            assert projection.shape == (SKETCH_WIDTH,)
            assert np.array_equal(bits(projection), bits(ref_projection))


def test_the_reference_loop_is_order_sensitive():
    # Guards the test above: with these inputs a different (pairwise) summation order gives
    # other bits, so agreeing with the reference is evidence of the same order.
    x = awkward_array(np.random.default_rng(7), 4097).astype(np.float64)
    ref_l2, _ = reference_sketch(x, "wte")
    assert math.sqrt(float(np.sum(x * x))) != ref_l2


def test_sketch_of_special_values():
    l2, projection = sketch(np.zeros(0, dtype=np.float32), "empty")
    assert l2 == 0.0 and np.array_equal(bits(projection), bits(np.zeros(SKETCH_WIDTH)))
    l2, projection = sketch(np.full(33, -0.0, dtype=np.float32), "neg")
    assert bits(l2) == bits(0.0) and np.array_equal(bits(projection), bits(np.zeros(SKETCH_WIDTH)))
    x = np.array([1.0, np.inf, 2.0], dtype=np.float32)
    assert sketch(x, "inf").l2 == math.inf


def test_sketch_is_a_signed_bucketing_of_block_sums():
    x = np.ones(64 * 32, dtype=np.float32)  # every block sums to 32
    _, projection = sketch(x, "ones")
    codes = block_codes(x.size, stream_id("ones"))
    expected = np.zeros(SKETCH_WIDTH)
    np.add.at(expected, codes & 0x7F, np.where(codes & 0x80, -32.0, 32.0))  # exact: small integers
    assert np.array_equal(projection, expected)


def test_as_float32_is_contiguous_little_endian():
    out = as_float32(np.arange(6, dtype=">f4").reshape(2, 3).T)
    assert out.dtype == np.dtype("<f4") and out.flags.c_contiguous


# ---- the many-tensor path (SketchLayout, what the Recorder uses) -------------------------------

def property_array(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite float32 values that make every order visible: mixed magnitudes and signs, exact
    zeros and negative zeros, subnormals, and values near the float32 maximum."""
    x = awkward_array(rng, n)
    x[rng.random(n) < 0.04] = -0.0
    pick = rng.random(n)
    tiny = pick < 0.05
    x[tiny] = (rng.standard_normal(int(tiny.sum())) * 1e-40).astype(np.float32)  # subnormal
    if n and rng.random() < 0.3:  # now and then one near float32's maximum (its square is still finite in double)
        x[rng.integers(0, n)] = np.float32(3.0e38) * np.float32(rng.choice([-1, 1]))
    return x


def assert_same_bits(ours, reference) -> None:
    l2, projection = ours
    ref_l2, ref_projection = reference
    assert bits(l2) == bits(ref_l2)
    assert np.array_equal(bits(projection), bits(ref_projection))


def test_every_size_from_1_to_130_equals_the_reference_loop():
    rng = np.random.default_rng(130)
    for n in range(1, 131):
        x = property_array(rng, n)
        assert_same_bits(sketch(x, f"t{n}"), reference_sketch(x, f"t{n}"))


def test_a_layout_of_many_tensors_equals_the_reference_loop_per_tensor():
    # Sizes that share a block count (one group), partial blocks, empty and one-element
    # tensors, one name on two tensors (params and grads share a salt), tensors big enough
    # for several cache chunks; the layout's buffers reused over calls.
    rng = np.random.default_rng(11)
    sizes = [0, 1, 3, 32, 31, 33, 64, 64, 64, 100, 130, 4097, 32 * 2048, 32 * 2048, 5, 0]
    names = [f"n{i % 12}" for i in range(len(sizes))]
    layout = SketchLayout(sizes, [stream_id(n) for n in names])
    for _ in range(2):
        arrays = [property_array(rng, n).reshape((n // 2, 2) if n % 2 == 0 and n else (n,)) for n in sizes]
        got = layout.sketch(arrays)
        for x, name, ours in zip(arrays, names, got):
            ref = reference_sketch(x, name) if x.size <= 4097 else None
            assert_same_bits(ours, ref if ref is not None else sketch_loop_free_reference(x, name))
        assert [s.l2 for s in sketch_many(arrays, names)] == [s.l2 for s in got]


def sketch_loop_free_reference(x: np.ndarray, name: str) -> tuple[float, np.ndarray]:
    """The pre-SketchLayout implementation (np.cumsum chains only), for tensors too big for the
    element loop: an independent second path."""
    v = np.asarray(x, dtype=np.float32).reshape(-1).astype(np.float64)
    blocks = -(-v.size // 32)
    padded = np.zeros(blocks * 32)
    padded[:v.size] = v
    squares = np.cumsum((padded * padded).reshape(-1, 4), axis=0)[-1]
    l2 = float(np.sqrt((squares[0] + squares[1]) + (squares[2] + squares[3])))
    lanes = np.zeros((blocks, 4))
    for r in range(8):
        lanes += padded.reshape(blocks, 8, 4)[:, r, :]
    block_sum = (lanes[:, 0] + lanes[:, 1]) + (lanes[:, 2] + lanes[:, 3])
    codes = block_codes(v.size, stream_id(name))
    signed = np.where(codes & 0x80, -block_sum, block_sum)
    projection = np.zeros(SKETCH_WIDTH)
    for b in range(SKETCH_WIDTH):
        chain = signed[(codes & 0x7F) == b]
        projection[b] = np.cumsum(np.concatenate(([0.0], chain)))[-1]
    return l2, projection


def test_infinities_and_nans_land_where_the_reference_puts_them():
    rng = np.random.default_rng(5)
    for n in (1, 7, 40, 97):
        for special in (np.inf, -np.inf, np.nan):
            x = property_array(rng, n)
            x[rng.integers(0, n)] = special
            l2, projection = sketch(x, "special")
            ref_l2, ref_projection = reference_sketch(x, "special")
            assert np.array_equal(np.isnan(projection), np.isnan(ref_projection))
            assert math.isnan(l2) == math.isnan(ref_l2)
            finite = ~np.isnan(ref_projection)
            assert np.array_equal(bits(projection[finite]), bits(np.asarray(ref_projection)[finite]))
            if not math.isnan(ref_l2):
                assert bits(l2) == bits(ref_l2)


def test_the_column_chains_are_sequential_on_this_numpy(monkeypatch):
    # The fast path (np.add.reduce over axis 0) is the one the tests above exercised ...
    assert digest._probe_reduce_order()
    digest.column_chains(np.zeros((2, 4)))
    assert digest._REDUCE_IS_SEQUENTIAL
    # ... and the np.cumsum fallback gives the same bits where a numpy would fail the probe.
    rng = np.random.default_rng(3)
    arrays = [property_array(rng, n) for n in (5, 64, 1000, 4097)]
    names = ["a", "b", "c", "d"]
    fast = sketch_many(arrays, names)
    monkeypatch.setattr(digest, "_REDUCE_IS_SEQUENTIAL", False)
    slow = sketch_many(arrays, names)
    for f, s in zip(fast, slow):
        assert_same_bits(f, s)
    m = np.ones((300, 8))
    m[0] = 2.0 ** 53
    assert np.array_equal(digest.column_chains(m), np.full(8, 2.0 ** 53))  # the probe's column, by cumsum


def test_the_layout_refuses_what_it_was_not_built_for():
    layout = SketchLayout([4, 8], [1, 2])
    with pytest.raises(ValueError, match="1 tensors where 2 are expected"):
        layout.sketch([np.zeros(4, np.float32)])
    with pytest.raises(ValueError, match="9 elements where 8 are expected"):
        layout.sketch([np.zeros(4, np.float32), np.zeros(9, np.float32)])
    with pytest.raises(ValueError, match="float32"):
        layout.sketch([np.zeros(4, np.float64), np.zeros(8, np.float32)])


def test_hash_and_sketch_equals_tensor_hash_and_sketch():
    rng = np.random.default_rng(2)
    sizes = [0, 7, 64, 64, 1000]
    names = ["a", "b", "c", "d", "e"]
    arrays = [property_array(rng, n) for n in sizes]
    hashes, sketches = SketchLayout(sizes, [stream_id(n) for n in names]).hash_and_sketch(arrays)
    assert hashes == [tensor_hash(x) for x in arrays]
    for x, name, ours in zip(arrays, names, sketches):
        assert_same_bits(ours, reference_sketch(x, name))
