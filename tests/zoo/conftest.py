"""The zoo's fixtures: python/tests/conftest.py's (the harness binary, run_module,
run_harness), loaded under another module name so that both suites keep their own conftest."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "canary_harness_tests_conftest", Path(__file__).resolve().parents[2] / "python" / "tests" / "conftest.py")
assert _spec is not None and _spec.loader is not None
shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shared)

harness_bin = shared.harness_bin  # the session fixture: HARNESS_BIN for every child
