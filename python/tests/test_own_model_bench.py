"""bench/own_model_overhead.py on any canary: one with a held-out evaluation (eval_batch)
runs past its steps (the bench starts the schedule again), and the bench's temporary
directory is gone afterwards, whether it finished or failed."""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any, List

import pytest

# The bench lives in the repository, not in the package (scripts/python-venv-check.sh names it).
BENCH = Path(os.environ.get("CANARY_HARNESS_BENCH", str(Path(__file__).resolve().parents[2] / "bench")))
SMALL = Path(__file__).parent / "own_canaries" / "small.py"


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("own_model_overhead", BENCH / "own_model_overhead.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PREFIX = "own-model-overhead-"


@pytest.fixture
def made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> List[Path]:
    """The temporary directories made while the test runs (tempfile.mkdtemp, which
    TemporaryDirectory calls too), under a root of the test's own."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    paths: List[Path] = []
    mkdtemp = tempfile.mkdtemp

    def spy(*args: Any, **kwargs: Any) -> str:
        path = mkdtemp(*args, **kwargs)
        paths.append(Path(path))
        return path
    monkeypatch.setattr(tempfile, "mkdtemp", spy)
    return paths


def left_behind(made: List[Path]) -> List[Path]:
    """The bench's own directories among `made` (importing torch.distributed makes one of
    torch's, removed at exit), asserting the bench made one, and those that still exist."""
    own = [p for p in made if p.name.startswith(PREFIX)]
    assert len(own) == 1, made
    return [p for p in own if p.exists()]


def test_a_canary_with_eval_batch_runs_past_its_steps_and_leaves_nothing(tmp_path: Path, made: List[Path],
                                                                          writer_library: str) -> None:
    # small.py:with_eval: 6 steps, evaluated every 2. 10 steps in blocks of 2 wrap the
    # schedule (steps 6-9 run steps 0-3 again): its evaluation steps come round twice.
    out = tmp_path / "overhead.json"
    assert bench().main(["--canary", f"{SMALL}:with_eval", "--rounds", "10", "--warmup", "0", "--block", "2",
                         "--writers", f"auto,{writer_library}", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["bare_ms"] > 0 and sorted(result["writers"]) == sorted(["auto", writer_library])
    assert all(w["recorded_ms"] > 0 for w in result["writers"].values())
    assert left_behind(made) == []


def test_a_bench_that_fails_leaves_no_temporary_directory(made: List[Path]) -> None:
    with pytest.raises(FloatingPointError, match="loss went NaN"):  # the canary's step 3 raises
        bench().main(["--canary", f"{SMALL}:step_fails_at_3", "--rounds", "8", "--warmup", "0", "--block", "2"])
    assert left_behind(made) == []
