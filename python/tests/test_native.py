"""The harness's digest library through ctypes (canary_harness.receipts.native) against the pure-Python
digest: the same hashes and the same sketch bits for every size around the block and lane
boundaries and for awkward values, and the selection rules of CANARY_HARNESS_DIGEST.

The library is the one the build made next to the harness binary (HARNESS_BIN/../lib): a
build without it fails here rather than skipping, as the conformance tests do."""

from __future__ import annotations

import ctypes.util
import os
from pathlib import Path

import numpy as np
import pytest

from canary_harness import stream_id
from canary_harness.receipts import native
from canary_harness.receipts.digest import SketchLayout, tensor_hash
from canary_harness.receipts.digest_plan import DigestPlan
from canary_harness.receipts.native import NativeDigest, NativeDigestError

from test_digest import awkward_array, bits


@pytest.fixture()
def use_library(digest_library: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(native.ENV, digest_library)
    return digest_library


def special_array(rng: np.random.Generator, n: int) -> np.ndarray:
    """awkward_array plus the values that stress a sum: subnormals, the float32 maximum,
    infinities and a NaN."""
    x = awkward_array(rng, n)
    specials = np.array([1e-45, -1e-40, 3.4028235e38, -3.4028235e38, np.inf, -np.inf, np.nan], dtype=np.float32)
    if n:
        picks = rng.integers(0, n, size=min(n, 3))
        x[picks] = rng.choice(specials, size=picks.size)
    return x


def test_plan_digests_bit_for_bit_as_python(use_library: str):
    rng = np.random.default_rng(11)
    sizes = list(range(0, 70)) + [127, 128, 129, 1000, 4097, 65536, 100003]
    arrays = [special_array(rng, n) if i % 2 else awkward_array(rng, n) for i, n in enumerate(sizes)]
    salts = [stream_id(f"blocks.{i}.w") for i in range(len(sizes))]
    sketched = [i % 4 != 3 for i in range(len(sizes))]  # some hashed only, as Adam's moments
    python = DigestPlan(sizes, salts, sketched, native=False)
    library = DigestPlan(sizes, salts, sketched, native=True)
    assert (python.implementation, library.implementation) == ("python", use_library)
    expected_hashes, expected = python.run(arrays)
    assert expected_hashes == [tensor_hash(x) for x in arrays]
    for threads in (1, 2, 0):
        hashes, sketches = library.run(arrays, threads=threads)
        assert hashes == expected_hashes, threads
        for n, got, want in zip(sizes, sketches, expected):
            if want is None:
                assert got is None
                continue
            assert bits(got.l2) == bits(want.l2), (n, threads)
            assert np.array_equal(bits(got.projection), bits(want.projection)), (n, threads)
    addresses = [x.ctypes.data for x in arrays]
    assert library.rows_at(addresses).hashes.tolist() == expected_hashes


def test_plan_refuses_what_it_was_not_built_for(use_library: str):
    plan = DigestPlan([4, 8], [1, 2], [True, False], native=True)
    with pytest.raises(ValueError, match="1 tensors where 2 are expected"):
        plan.run([np.zeros(4, np.float32)])
    with pytest.raises(ValueError, match="9 elements where 8 are expected"):
        plan.run([np.zeros(4, np.float32), np.zeros(9, np.float32)])
    with pytest.raises(ValueError, match="float32"):
        plan.run([np.zeros(4, np.float64), np.zeros(8, np.float32)])
    with pytest.raises(ValueError, match="float32"):
        plan.run([np.zeros(8, np.float32)[::2], np.zeros(8, np.float32)])  # not contiguous


def test_python_setting_never_loads_the_library(monkeypatch: pytest.MonkeyPatch, digest_library: str):
    monkeypatch.setenv(native.ENV, "python")
    monkeypatch.setenv("HARNESS_BIN", str(Path(digest_library).parent.parent / "bin" / "harness"))
    assert native.native_digest() is None
    assert DigestPlan([4], [1], [True]).implementation == "python"
    with pytest.raises(NativeDigestError, match="no digest library found"):
        DigestPlan([4], [1], [True], native=True)


def test_auto_finds_the_library_next_to_the_harness(monkeypatch: pytest.MonkeyPatch, harness_bin: Path,
                                                     digest_library: str):
    monkeypatch.setenv(native.ENV, "auto")
    monkeypatch.setenv("HARNESS_BIN", str(harness_bin))
    monkeypatch.setattr(native, "_loaded", {})
    found = native.native_digest()
    assert found is not None and os.path.samefile(found.path, digest_library)


def test_a_named_library_that_cannot_be_used_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    missing = tmp_path / "nowhere.so"
    monkeypatch.setenv(native.ENV, str(missing))
    with pytest.raises(NativeDigestError, match=f"{native.ENV}={missing}: no such file"):
        native.native_digest()
    not_a_library = tmp_path / "junk.so"
    not_a_library.write_bytes(b"\x7fELF but not really")
    with pytest.raises(NativeDigestError, match="cannot load the digest library"):
        NativeDigest(str(not_a_library))
    with pytest.raises(NativeDigestError, match="not a canary-harness digest library"):
        NativeDigest(ctypes.util.find_library("m"))  # libm: loads, but has none of the functions


def test_a_library_that_digests_differently_is_refused(use_library: str, monkeypatch: pytest.MonkeyPatch):
    # A library of another release or build: simulated by a Python side whose sketch is off
    # by one bit; the probe at load must refuse it rather than write receipts that disagree.
    real = SketchLayout.sketch

    def off_by_one_bit(self, arrays):
        sketches = real(self, arrays)
        first = sketches[0]
        return [first._replace(l2=np.nextafter(first.l2, np.inf)), *sketches[1:]]

    monkeypatch.setattr(SketchLayout, "sketch", off_by_one_bit)
    with pytest.raises(NativeDigestError, match="digests a 1-element probe tensor differently"):
        NativeDigest(use_library)


def test_the_numpy_digest_says_so_once_when_no_library_is_found(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(native, "library_candidates", lambda *_: [])  # none anywhere
    monkeypatch.setattr(native, "_loaded", {})
    monkeypatch.setenv(native.ENV, "auto")
    plans = [DigestPlan([4], [1], [True]) for _ in range(3)]
    assert {plan.implementation for plan in plans} == {"python"}
    said = capsys.readouterr().err
    assert said.count("canary_harness: digesting in Python (numpy): no libcanary_harness_digest.so.1") == 1, said
    monkeypatch.setenv(native.ENV, "python")  # chosen, not fallen back to: nothing to say
    assert DigestPlan([4], [1], [True]).implementation == "python"
    assert "digesting in Python" not in capsys.readouterr().err


def test_libraries_are_looked_for_beside_the_named_harness_then_in_the_package_then_on_path(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import canary_harness

    name = "libcanary_harness_example.so.1"

    def prefix_with_harness(where: Path) -> Path:
        (where / "bin").mkdir(parents=True)
        (where / "bin" / "harness").write_text("#!/bin/sh\n")
        (where / "bin" / "harness").chmod(0o755)
        (where / "lib").mkdir()
        (where / "lib" / name).write_bytes(b"")
        return where

    named, on_path = prefix_with_harness(tmp_path / "named"), prefix_with_harness(tmp_path / "path")
    package = tmp_path / "package"
    package.mkdir()
    (package / name).write_bytes(b"")
    monkeypatch.setattr(canary_harness, "__path__", [str(tmp_path / "sources"), str(package)])
    monkeypatch.setenv("PATH", f"{on_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv("HARNESS_BIN", str(named / "bin" / "harness"))
    assert native.library_candidates(name, "canary_harness_example") == [
        str(named / "lib" / name), str(package / name), str(on_path / "lib" / name)]
    monkeypatch.delenv("HARNESS_BIN")  # an installed package: its own first
    assert native.library_candidates(name, "canary_harness_example") == [str(package / name), str(on_path / "lib" / name)]
