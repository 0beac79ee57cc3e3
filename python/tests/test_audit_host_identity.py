"""The audit's host-resident tensors (canary_harness.audit.StepCapture) are told apart by
identity: never by a tensor's == (a tensor of booleans, whose truth raises where it has
more than one element) or its hash, so no collision of hashes or addresses can make the
audit raise."""

from __future__ import annotations

import gc
from pathlib import Path

import torch

from canary_harness.audit import StepCapture, audit_step, load_step

CASES = Path(__file__).resolve().parent / "audit_cases"


class Colliding(torch.Tensor):
    """A tensor whose hash is every other's: a set finds it by == alone."""

    def __hash__(self) -> int:
        return 7


def test_host_tensors_whose_hashes_collide_are_told_apart() -> None:
    marked, other = torch.zeros(3).as_subclass(Colliding), torch.ones(3).as_subclass(Colliding)
    assert hash(marked) == hash(other)
    capture = StepCapture()
    capture.mark_host([marked])
    assert capture.on_host([marked])
    assert not capture.on_host([other]) and not capture.on_host([marked, other])


def test_a_host_tensor_of_many_elements_is_found() -> None:
    window = torch.arange(8.0)
    capture = StepCapture()
    capture.mark_host([window])
    assert capture.on_host([window]) and capture.on_host([window, window])
    assert not capture.on_host([]) and not capture.on_host([window[:4].clone()])


def test_a_dead_host_tensor_is_forgotten_and_its_id_reused_is_not_host() -> None:
    capture = StepCapture()
    dead = torch.zeros(4)
    capture.mark_host([dead])
    address = id(dead)
    del dead
    gc.collect()
    assert len(capture._host) == 0  # its entry went with it: held across steps, nothing accumulates
    # CPython hands a freed object's memory to the next of its size: a new tensor often has its id.
    reused = [t for t in (torch.zeros(4) for _ in range(64)) if id(t) == address]
    assert not any(capture.on_host([t]) for t in reused)


def test_a_step_that_stacks_windows_of_host_tensors_is_audited() -> None:
    # Its host tensors (the stream, the window starts) each have more than one element; a
    # set that compared them with == raised "Boolean value of Tensor ... is ambiguous".
    report = audit_step(load_step(f"{CASES / 'host_windows_step.py'}:make_step"), 4, target="host_windows_step.py")
    assert [(f.kind, f.op) for f in report.findings] == []
