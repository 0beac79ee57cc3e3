"""Batch invariance on every zoo member (docs/invariance.md, "Your own model"; docs/zoo.md):
`python3 -m canary_harness.invariance MEMBER.py:canary --max-batch 4`, the member's forward
in eval mode (dropout off), batch(0)'s first row alone and at a drawn row of batches of 2..4,
every module's output compared bit for bit. What each member gives on .venv/'s torch 2.9
and transformers, one thread, is recorded below and held exactly, so that a change in
either (or in the check) shows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional, Tuple

import pytest

from conftest import shared

ZOO = Path(__file__).resolve().parent

# member -> (smallest breaking batch size, the first module that differs there): observed.
# Every member is bitwise for 2..4: torch 2.9's CPU kernels compute each row alike at these
# sizes, and no member's forward mixes rows (Mixtral's router is top-k per token, no
# capacity: a token's experts do not depend on the other rows).
OBSERVED: Dict[str, Tuple[Optional[int], Optional[str]]] = {
    "gpt2": (None, None),
    "llama": (None, None),
    "mixtral": (None, None),
    "bert": (None, None),
    "t5": (None, None),
    "accumulation": (None, None),
}


@pytest.mark.parametrize("name", list(OBSERVED))
def test_each_member_gives_its_recorded_verdict(name: str) -> None:
    out = shared.run_module("canary_harness.invariance", f"{ZOO / name}.py:canary", "--max-batch", "4", "--json",
                            check=False)
    assert out.returncode in (0, 1), out.stderr
    report = json.loads(out.stdout)
    assert out.returncode == (0 if report["invariant"] else 1)
    assert report["lane"] == f"zoo-{name}/torch" and report["forward"] == "eval mode, dropout off, no grad"
    assert report["outputs_compared"] > 0  # "bitwise" covers the module outputs, never none
    assert [(c["batch_size"], c["position"]) for c in report["checks"]] == [(2, 1), (3, 2), (4, 3)]
    smallest = report["smallest_breaking_batch"]
    first = report["checks"][smallest - 2]["first_op"] if smallest else None
    assert (smallest, first) == OBSERVED[name], report
    for c in report["checks"]:
        assert c["max_logprob_delta"] is not None, c  # every member returns its logits: log p is read
        if c["bitwise"]:
            assert c["max_logprob_delta"] == 0.0, c
