"""The restart gate (docs/own-model.md, "The restart gate"): does a canary's own
checkpointing restart training where it stopped, bit for bit?

`python3 -m canary_harness resume-check FILE.py:NAME --at K` runs the canary straight
through; runs it again to the end of step K and saves with the canary's save(state_dir);
then, in a new process, builds it afresh (NAME() under its seed), loads with its
load(state_dir) and goes on from step K+1 (`--precision bf16` and `--compile` train both
runs as a bf16 or compiled lane does; the new process compiles afresh, as a restarted job
does). From K+1 the two runs must be bitwise equal:
loss, gradient norm, lr, batch hash and every tensor's hash. Where they are not, the first
thing that differs names the likely omission:

    parameters at the resume   the model's weights (load restores no model)
    moments at the resume      the optimizer's state (Adam's exp_avg, exp_avg_sq)
    batch hash                 the data position (a sampler's or an iterator's state)
    lr                         a learning-rate schedule (its scheduler's state)
    anything else, all of those equal: an RNG state (dropout's or a sampler's draws)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence

import torch

from .canary import CanaryError, LoadedCanary, load_canary
from .runner import CanaryLoop, RunOptions, StepRecord

# What each family's difference at the resume says was left out of the save.
_STATE_OMISSIONS = (("params", "the model's weights: load restores no model (its state_dict)"),
                    ("adam_m", "the moments: the optimizer's state is not saved or not loaded (its state_dict)"),
                    ("adam_v", "the moments: the optimizer's state is not saved or not loaded (its state_dict)"))
_BATCH_OMISSION = "the data position: a sampler's or an iterator's state is not saved"
_LR_OMISSION = "a learning-rate schedule: its scheduler's state is not saved (its state_dict)"
_RNG_OMISSION = ("an RNG state: the batch, lr, weights and moments resume equal, so the draws differ "
                 "(torch.get_rng_state(), dropout's or a sampler's generator)")


@dataclass
class Difference:
    """The first thing the resumed run does otherwise than the uninterrupted one."""

    step: int
    what: str        # params, adam_m, adam_v, grads (a hash family), batch_hash, lr, loss or grad_norm
    tensor: str      # the tensor, for a hash family; "" otherwise
    at_resume: bool  # the state as loaded, before `step`, differs from what step-1 left
    resumed: Any     # the two values, for a number (None for a hash family)
    uninterrupted: Any
    omission: str    # the likely omission, in words


@dataclass
class GateOptions:
    """How both runs train the canary, as the lane it gates does: its CPU threads, bf16
    autocast or fp32, torch.compile or eager (on the CPU; the canary's save and load are its own)."""

    threads: int = 1
    precision: str = "fp32"
    compile: bool = False

    def flags(self) -> List[str]:
        """The same options as the new process's command-line flags."""
        return ["--threads", str(self.threads), "--precision", self.precision] + (["--compile"] if self.compile else [])


@dataclass
class ResumeCheck:
    canary: str
    at: int
    steps: int
    first_difference: Optional[Difference]
    options: GateOptions

    def equal(self) -> bool:
        return self.first_difference is None


def _hashes_json(hashes: Dict[str, Any]) -> Dict[str, List[int]]:
    """Each family's tensor hashes (numpy arrays from the digest) as ints: what JSON carries between the processes."""
    return {family: [int(h) for h in values] for family, values in hashes.items()}


def _record_json(record: StepRecord) -> Dict[str, Any]:
    return {"loss": record.loss, "grad_norm": record.grad_norm, "lr": record.lr, "batch_hash": int(record.batch_hash),
            "hashes": _hashes_json(record.hashes)}


def _loop(loaded: LoadedCanary, options: GateOptions) -> CanaryLoop:
    return CanaryLoop(loaded, RunOptions(out="", threads=options.threads, steps=loaded.canary.steps,
                                         precision=options.precision, compile=options.compile), torch.device("cpu"))


def _load(spec: str, seed: Optional[int], threads: int) -> LoadedCanary:
    torch.set_num_threads(threads)  # before NAME(): its init runs on these threads too
    loaded = load_canary(spec, seed=seed)
    if loaded.canary.save is None:
        raise CanaryError(f"{spec}: the canary gives no save and load; return Canary(..., save=save, load=load), "
                          "the checkpointing its training code does (docs/own-model.md)")
    return loaded


def _run(loaded: LoadedCanary, options: GateOptions, steps: Sequence[int]) -> List[Dict[str, Any]]:
    loop = _loop(loaded, options)
    try:
        return [_record_json(loop.run_step(i)) for i in steps]
    finally:
        loop.close()


def resumed_run(spec: str, seed: Optional[int], options: GateOptions, at: int, steps: int,
                state_dir: str) -> Dict[str, Any]:
    """The new process's part: the canary built afresh, loaded from `state_dir` with its own
    load, its state digested as loaded, then steps at+1 .. steps-1 (compiled afresh, where
    the gate compiles: as a restarted job compiles)."""
    loaded = _load(spec, seed, options.threads)
    loaded.canary.load(state_dir)
    loop = _loop(loaded, options)
    try:
        at_resume = _hashes_json(loop.capture.state_now()["hashes"])
        records = [_record_json(loop.run_step(i)) for i in range(at + 1, steps)]
    finally:
        loop.close()
    return {"at_resume": at_resume, "records": records}


def _differing_tensor(names: List[str], got: List[Any], want: List[Any]) -> Optional[str]:
    for name, a, b in zip(names, got, want):
        if a != b:
            return name
    return None


def first_difference(names: List[str], straight: List[Dict[str, Any]], resumed: Dict[str, Any],
                     at: int) -> Optional[Difference]:
    """Where the resumed run first parts from the uninterrupted one, with the likely omission
    (module docstring): the state as loaded first, then each step from at+1 on."""
    for family, omission in _STATE_OMISSIONS:
        tensor = _differing_tensor(names, resumed["at_resume"][family], straight[at]["hashes"][family])
        if tensor is not None:
            return Difference(at + 1, family, tensor, True, None, None, omission)
    for step, (got, want) in enumerate(zip(resumed["records"], straight[at + 1:]), start=at + 1):
        for what, omission in (("batch_hash", _BATCH_OMISSION), ("lr", _LR_OMISSION)):
            if got[what] != want[what]:
                return Difference(step, what, "", False, got[what], want[what], omission)
        for what in ("loss", "grad_norm"):
            if got[what] != want[what]:
                return Difference(step, what, "", False, got[what], want[what], _RNG_OMISSION)
        for family in ("grads", "params", "adam_m", "adam_v"):
            tensor = _differing_tensor(names, got["hashes"][family], want["hashes"][family])
            if tensor is not None:
                return Difference(step, family, tensor, False, None, None, _RNG_OMISSION)
    return None


def resume_check(spec: str, at: int, steps: Optional[int] = None, options: Optional[GateOptions] = None,
                 seed: Optional[int] = None) -> ResumeCheck:
    """The gate (module docstring). `steps`: the run's length (default the canary's); `at` in
    0 .. steps-2. Raises CanaryError for a canary without save and load, or a step out of range."""
    options = options or GateOptions()
    loaded = _load(spec, seed, options.threads)
    if steps is not None and steps > loaded.canary.steps:
        raise CanaryError(f"--steps: {steps} is past the canary's {loaded.canary.steps} steps")
    total = loaded.canary.steps if steps is None else steps
    if not 0 <= at <= total - 2:
        raise CanaryError(f"--at: step {at} is not in 0..{total - 2} (a step the run goes on after)")
    straight = _run(loaded, options, range(total))
    with tempfile.TemporaryDirectory(prefix="resume-check-") as work:
        state_dir = os.path.join(work, "state")
        os.makedirs(state_dir)
        stopped = _load(spec, seed, options.threads)
        if _run(stopped, options, range(at + 1)) != straight[:at + 1]:  # no gate can hold a run that does not repeat
            raise CanaryError(f"{spec}: two runs of steps 0-{at} in one process differ: the run itself does not "
                              "repeat (state kept between loads, or nondeterminism), so no restart can be held to it")
        stopped.canary.save(state_dir)
        resumed = _resume_in_new_process(spec, seed, options, at, total, state_dir, os.path.join(work, "resumed.json"))
    return ResumeCheck(loaded.canary.name, at, total, first_difference(loaded.tensor_names, straight, resumed, at),
                       options)


def _resume_in_new_process(spec: str, seed: Optional[int], options: GateOptions, at: int, steps: int, state_dir: str,
                           out: str) -> Dict[str, Any]:
    argv = [sys.executable, "-m", "canary_harness", "resume-check", spec, "--at", str(at), "--steps", str(steps),
            *options.flags(), "--resume-from", state_dir, "--json-out", out]
    if seed is not None:
        argv += ["--seed", str(seed)]
    child = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # its prints are the canary's
    if child.returncode != 0 or not os.path.exists(out):
        last = (child.stderr.strip().splitlines() or [f"exit {child.returncode}"])[-1]
        raise CanaryError(f"{spec}: the resumed run failed in its new process: {last}")
    with open(out) as f:
        return json.load(f)


def to_json(check: ResumeCheck) -> Dict[str, Any]:
    return {"version": 1, "verdict": "equal" if check.equal() else "differs", "canary": check.canary,
            "at": check.at, "steps": check.steps, "precision": check.options.precision,
            "compile": check.options.compile, "first_difference": asdict(check.first_difference) if check.first_difference else None}


def to_text(check: ResumeCheck) -> str:
    how = f" ({check.options.precision}{', compiled' if check.options.compile else ''})"
    out = (f"{'resume':<12}{check.canary}{how}: stopped after step {check.at}, saved with its save, loaded with its "
           f"load in a new process\n")
    if check.equal():
        return out + f"{'equal':<12}steps {check.at + 1}-{check.steps - 1} bitwise equal to the uninterrupted run\n"
    d = check.first_difference
    assert d is not None
    if d.at_resume:
        out += f"{'differs':<12}at the resume: {d.what} {d.tensor} as loaded is not what step {d.step - 1} left\n"
    elif d.tensor:
        out += f"{'differs':<12}step {d.step}: {d.what} {d.tensor}\n"
    else:
        out += f"{'differs':<12}step {d.step}: {d.what} {d.resumed} resumed, {d.uninterrupted} uninterrupted\n"
    return out + f"{'omission':<12}{d.omission}\n"
