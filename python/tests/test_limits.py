"""The package's copies of the harness's ranges are the harness's: each bound is read back
from the error the C++ gives one past it (canaries/canary_file.cpp for a canary's sizes,
harness/run/canary_run.h for --threads), so a range changed on one side alone fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from canary_harness.cli.lane_args import MAX_THREADS
from canary_harness.models.config import SIZE_RANGES

from conftest import run_harness

# SIZE_RANGES' fields as canary-file keys ([table] key); experts_per_token is bounded by
# model.experts in the C++, by 1024 here, so it has no fixed bound to compare.
CANARY_KEYS = {
    "vocab_size": ("model", "vocab"),
    "context_length": ("model", "context"),
    "channels": ("model", "channels"),
    "layers": ("model", "layers"),
    "heads": ("model", "heads"),
    "kv_heads": ("model", "kv_heads"),
    "mlp_hidden": ("model", "mlp_hidden"),
    "experts": ("model", "experts"),
    "batch_size": ("train", "batch"),
    "steps": ("train", "steps"),
}


# A canary file with every key above (the tests run away from the source tree: docs/python.md).
CANARY = """schema_version = 1
name = "limits"
architecture = "moe"
[model]
vocab = 256
context = 16
channels = 32
layers = 2
heads = 4
kv_heads = 2
mlp_hidden = 48
experts = 4
experts_per_token = 2
[train]
batch = 2
steps = 3
seed = 1
"""


def test_every_size_range_is_compared():
    assert set(SIZE_RANGES) - set(CANARY_KEYS) == {"experts_per_token"}


@pytest.mark.parametrize("field", sorted(CANARY_KEYS))
def test_a_canary_size_range_is_the_canary_files(field: str, harness_bin: Path, tmp_path: Path):
    low, high = SIZE_RANGES[field]
    table, key = CANARY_KEYS[field]
    text, count = re.subn(rf"^{key} = .*$", f"{key} = {high + 1}", CANARY, count=1, flags=re.M)
    assert count == 1, key
    canary = tmp_path / "canary.toml"
    canary.write_text(text)
    result = run_harness(harness_bin, "run", "--canary", str(canary), "--out", str(tmp_path / "r.h5"), check=False)
    assert result.returncode == 2, result.stderr
    said = re.search(rf"{table}\.{key}: {high + 1} is outside (\d+)\.\.(\d+)", result.stderr)
    assert said and (int(said[1]), int(said[2])) == (low, high), result.stderr


def test_the_thread_range_is_the_harness_runs(harness_bin: Path, tmp_path: Path):
    result = run_harness(harness_bin, "run", "--threads", str(MAX_THREADS + 1), "--out", str(tmp_path / "r.h5"),
                         check=False)
    assert result.returncode == 2, result.stderr
    said = re.search(rf"--threads: Value {MAX_THREADS + 1} not in range 0 to (\d+)", result.stderr)
    assert said and int(said[1]) == MAX_THREADS, result.stderr
