"""Replay a Python canary's receipt from its checkpoint and verify it bit for bit
(`python3 -m canary_harness replay R.h5 --from K`; `harness replay` and `harness bisect`
hand a Python canary's receipt to it; docs/own-model.md, "Bisect to the op").

The recipe is the receipt's own: run_options names the canary (FILE.py:NAME, absolute),
device, precision, threads, seed and fault. The canary is loaded again (its tensors must
be the receipt's), resumed from the checkpoint at or before K (the receipt holds them:
canary_harness.runs.canary_state), and steps K' .. M are run and compared with the record: the
batch hash, loss and gradient norm bit for bit, and the four hash families. Nothing is
trusted blindly: a checkpoint whose bytes do not hash to the recorded content hash, or
whose parameters and moments do not hash to the receipt's record of the step before it,
is refused. With `trace="aten"` the steps from K on run under canary_harness.tracing.aten_trace,
and the result carries their traces (what bisect compares).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..tracing.aten_trace import AtenTracer
from ..tracing.module_capture import ModuleCapture
from ..tracing.op_capture import OpCapture, OpKey, StepCapture
from ..cli.lane_args import device_of, parse_lane_fault
from ..pack import PackError
from .canary import CanaryError, LoadedCanary, canonical_json, load_canary, stateful_objects
from .canary_state import restore_state
from .devices import to_device
from .pack_step import build_pack_canary, load_pack
from .precision import autocast_units, switches
from ..receipts.receipt import ReceiptReader
from .runner import CanaryLoop, RunOptions, StepRecord, parse_canary_fault, run_canary
from ..receipts.schema import HASH_FAMILIES
from ..receipts.stack import git_commit_of

# The families a checkpoint holds (what it is verified against): gradients are not state.
CHECKPOINT_FAMILIES = ("params", "adam_m", "adam_v")


@dataclass
class Mismatch:
    step: int
    what: str        # lr, batch_hash, loss, grad_norm or a hash family
    tensor: str = ""
    values: Tuple[Any, ...] = ()  # a scalar's (replayed, recorded)


@dataclass
class ReplayResult:
    receipt: str
    lane: str
    from_step: int
    to_step: int
    resumed_from: int = 0
    checkpoint: str = ""           # "" when resumed from the initial state
    steps_run: int = 0
    seconds: float = 0.0
    first_mismatch: Optional[Mismatch] = None
    mismatched_steps: List[int] = field(default_factory=list)
    record_altered: bool = False
    diagnosis: str = ""            # one line on why the first mismatch happened, where the data says
    notes: List[str] = field(default_factory=list)
    restored: List[str] = field(default_factory=list)  # the declared objects the checkpoint's state was loaded into
    schedules_restored: bool = False  # the canary declares schedulers, and the checkpoint held every one
    traces: List[Dict[str, Any]] = field(default_factory=list)  # per traced step (trace_json)
    precision: str = "fp32"        # the run's declared precision (its recipe's)
    captured: Optional[StepCapture] = None  # the last step's ops, with capture_ops (the op oracle's)
    capture_level: Optional[str] = None     # aten or modules, with capture_ops

    def reproduced(self) -> bool:
        return self.first_mismatch is None

    def verdict(self) -> str:
        return "reproduced" if self.reproduced() else ("record_altered" if self.record_altered else "diverged")


def is_python_canary_receipt(manifest: Dict[str, Any]) -> bool:
    """True for a receipt that `python3 -m canary_harness run` wrote (its canary JSON's kind)."""
    try:
        return json.loads(manifest.get("canary", "{}")).get("kind") == "python"
    except (ValueError, AttributeError):
        return False


def is_pack_lane_receipt(manifest: Dict[str, Any]) -> bool:
    """True for a receipt the PyTorch lane (`python3 -m canary_harness.lane`) wrote from a
    canary pack: engine torch, the pack it read named in the manifest."""
    return manifest.get("engine") == "torch" and bool(manifest.get("pack"))


def _recipe(reader: ReceiptReader, pack: Optional[str] = None) -> Dict[str, Any]:
    """The receipt's run_options: a Python canary's (FILE.py:NAME and its seed), or a PyTorch
    lane's of a canary pack, which is replayed from `pack` (the pack is not in the receipt)."""
    manifest = reader.manifest
    lane = is_pack_lane_receipt(manifest)
    if lane and pack is None:
        raise CanaryError(f"{reader.path}: a PyTorch lane's receipt of the canary pack {manifest['pack']}: give that "
                          "pack with --pack PATH (the nightly's canary-pack.h5, or `harness export`'s)")
    if not lane and pack is not None:
        raise CanaryError(f"--pack: {reader.path} is not a PyTorch lane's receipt of a canary pack; replay it "
                          "without --pack")
    if not lane and not is_python_canary_receipt(manifest):
        raise CanaryError(f"{reader.path}: not a Python canary's receipt nor a PyTorch lane's (replay it with "
                          "`harness replay`)")
    try:
        recipe = json.loads(manifest["run_options"])
    except (KeyError, TypeError, ValueError):
        recipe = None
    needed = ("device", "precision", "threads", "steps") if lane else ("canary", "seed", "threads", "steps")
    if not isinstance(recipe, dict) or not all(key in recipe for key in needed):
        raise CanaryError(f"{reader.path}: its manifest has no run_options recipe of a "
                          f"{'PyTorch lane' if lane else 'Python canary'} run; it cannot be replayed")
    if "layout" in recipe:  # its ranks kept no checkpoint, and a replay runs one process
        raise CanaryError(f"{reader.path}: a run of --layout {recipe['layout']} on {recipe.get('nproc')} processes; "
                          "replay and rerun run one process: run it again with `python3 -m canary_harness run "
                          f"... --layout {recipe['layout']}`, or replay the one-process run")
    return recipe


def _load_pack_lane(reader: ReceiptReader, recipe: Dict[str, Any], pack_path: str,
                    device: torch.device) -> Tuple[LoadedCanary, Any]:
    """The lane's canary built again from `pack_path`, which must be the pack the run read
    (its canary, seed and data seed), on `device` as the lane built it (its optimizer's
    state there too: one built on the CPU and moved leaves it behind, and on XLA every
    update then crosses devices), and the recipe's fault as the lane parses it."""
    try:
        pack = load_pack(pack_path)
    except PackError as e:
        raise CanaryError(str(e)) from None
    manifest = reader.manifest
    recorded = canonical_json(json.loads(manifest["canary"]))
    for what, now, then in (("canary", canonical_json(json.loads(pack.canary_json)), recorded),
                            ("seed", pack.seed, int(manifest.get("seed", -1))),
                            ("data seed", pack.data_seed, int(manifest.get("data_seed", -1)))):
        if now != then:
            raise CanaryError(f"--pack: {pack_path} is not the pack {reader.path} was run from (its {what} differs); "
                              f"give the pack the lane read ({manifest['pack']})")
    torch.set_num_threads(int(recipe["threads"]))
    if recipe.get("deterministic"):
        torch.use_deterministic_algorithms(True)
    steps = int(recipe["steps"])
    loaded, architecture, cfg = build_pack_canary(pack, steps, device)
    fault = None
    if recipe.get("inject_fault"):
        fault = parse_lane_fault(recipe["inject_fault"], architecture.forward_op_names(cfg), pack.tensor_names, steps)
    return loaded, fault


def _device_of(recipe: Dict[str, Any]) -> torch.device:
    """The device the recipe ran on, as the run's --device had it (a UsageError where it
    cannot be had here: no CUDA, no torch_xla)."""
    return device_of(recipe.get("device", "cpu"), deterministic=bool(recipe.get("deterministic")))


def _load(reader: ReceiptReader, recipe: Dict[str, Any], pack: Optional[str] = None) -> Tuple[LoadedCanary, Any]:
    """The canary the receipt's recipe ran, built again, and the recipe's fault."""
    if pack is not None:
        return _load_pack_lane(reader, recipe, pack, _device_of(recipe))
    torch.set_num_threads(int(recipe["threads"]))  # before NAME(), as the run: the init runs on these threads too
    loaded = load_canary(recipe["canary"], seed=int(recipe["seed"]))
    recorded = canonical_json(json.loads(reader.manifest["canary"]))
    now = loaded.identity()  # canonical_json too: both sides as JSON gives them back
    for key in ("name", "tensor_table_sha256", "config"):
        if recorded.get(key) != now.get(key):
            raise CanaryError(f"{recipe['canary']} no longer builds the canary of {reader.path} (its {key} differs): "
                              "the code changed since the run; replay it from the receipt's commit "
                              f"({reader.manifest.get('git_commit', 'unknown')})")
    fault = None
    if recipe.get("inject_fault"):
        fault = parse_canary_fault(recipe["inject_fault"], loaded.canary.model, int(recipe["steps"]))
    return loaded, fault


def _options(recipe: Dict[str, Any], fault: Any) -> RunOptions:
    """The recipe's run options, its op trace where the step is one graph: under torch_xla
    and torch.compile the tensors a trace keeps are outputs of the step's graph, which is
    then fused otherwise (an XLA lane recorded with --trace ops reproduces only traced).
    Run eagerly, the trace's hooks change no number, and a replay without them keeps the
    step's aten ops the model's own (what `--trace aten` and the op oracle see)."""
    one_graph = recipe.get("device") == "xla" or bool(recipe.get("compile", False))
    return RunOptions(out="", device=recipe.get("device", "cpu"), precision=recipe.get("precision", "fp32"),
                      steps=int(recipe["steps"]), threads=int(recipe["threads"]), fault=fault,
                      trace=recipe.get("trace", "none") if one_graph else "none",
                      perturb_init=recipe.get("perturb_init"), compile=bool(recipe.get("compile", False)),
                      versioned=bool(recipe.get("versioned", False)),
                      autocast_off=list(recipe.get("autocast_off", [])))


class _Record:
    """The receipt's per-step record, read once."""

    def __init__(self, reader: ReceiptReader) -> None:
        self.scalars = {name: reader.steps(name) for name in ("lr", "loss", "grad_norm", "batch_hash")}
        self.hashes = {fam: reader.hashes(fam) for fam in HASH_FAMILIES}

    def row(self, step: int) -> Dict[str, Any]:
        return {"lr": self.scalars["lr"][step], "loss": self.scalars["loss"][step],
                "grad_norm": self.scalars["grad_norm"][step],
                "batch_hash": int(self.scalars["batch_hash"][step]),
                "hashes": {fam: rows[step] for fam, rows in self.hashes.items()}}


def _first_difference(record: StepRecord, recorded: Dict[str, Any], names: List[str]) -> Optional[Mismatch]:
    """The first thing the replayed step records differently: the lr first (a schedule
    resumed wrongly changes everything after it, and is then the cause: _diagnose), then
    in the order bisect reads them."""
    if not _same_bits(record.lr, recorded["lr"]):
        return Mismatch(-1, "lr", values=(record.lr, recorded["lr"]))
    if record.batch_hash != recorded["batch_hash"]:
        return Mismatch(-1, "batch_hash")
    for what in ("loss", "grad_norm"):
        if not _same_bits(getattr(record, what), recorded[what]):
            return Mismatch(-1, what, values=(getattr(record, what), recorded[what]))
    for fam in HASH_FAMILIES:
        differs = np.nonzero(np.asarray(record.hashes[fam], dtype=np.uint64) != recorded["hashes"][fam])[0]
        if differs.size:
            return Mismatch(-1, fam, names[int(differs[0])])
    return None


def _same_bits(a: float, b: float) -> bool:
    return np.float64(a).tobytes() == np.float64(b).tobytes()


def _diagnose(result: ReplayResult) -> str:
    """The one line that says why a replay from a checkpoint first differs in the lr: the
    step's lr came from state the checkpoint did not hold. (The optimizer's state_dict holds
    the lr of the checkpoint's step, so that step agrees, and the steps after it run with
    the lr a restarted schedule sets.) "" when the replay started from the initial state,
    where nothing was restored and an lr that differs is the code's, and when the record
    was altered."""
    m = result.first_mismatch
    if m is None or m.what != "lr" or not result.checkpoint or result.record_altered:
        return ""
    held = ", ".join(["the model", "the optimizer", *result.restored, "the RNG states"])
    replayed, recorded = (float(v) for v in m.values)  # repr: every digit that tells them apart
    if result.schedules_restored:  # the schedule resumed where the run was: what computes the lr changed
        return (f"step {m.step} replays lr {replayed!r} where the receipt records {recorded!r}, though the checkpoint "
                f"of step {result.resumed_from} restored the declared schedulers (it holds {held}): the schedule's "
                "code or settings changed since the run")
    return (f"step {m.step} replays lr {replayed!r} where the receipt records {recorded!r}: a learning-rate "
            f"schedule's state is missing from the checkpoint of step {result.resumed_from} (it holds {held}); "
            "declare it on the Canary, schedulers=[scheduler] for the schedulers the step steps and "
            "state={'name': obj} for any other object with state_dict() and load_state_dict(), and record the run "
            "again")


def _resume(reader: ReceiptReader, record: _Record, loaded: LoadedCanary, loop: CanaryLoop, from_step: int,
            result: ReplayResult) -> int:
    """Loads the last checkpoint at or before from_step and verifies it; returns its step
    (0, untouched, when there is none: the initial state is the one the loader built)."""
    stored = [c for c in reader.stored_checkpoints() if c.step <= from_step]
    if not stored:
        return 0
    checkpoint = stored[-1]
    result.restored = restore_state(loaded, reader.checkpoint_state(checkpoint), checkpoint.step, loop.device)
    unheld = [label for label in stateful_objects(loaded.canary) if label not in result.restored]
    result.schedules_restored = bool(loaded.canary.schedulers) and not unheld
    if unheld:
        result.notes.append(f"the checkpoint of step {checkpoint.step} holds no state of {', '.join(unheld)} (it was "
                            "recorded before the canary declared it): resumed as the canary builds it")
    names = loaded.tensor_names
    hashes = loop.capture.state_now()["hashes"]  # the loaded state's, against the record of the step before
    for fam in CHECKPOINT_FAMILIES:
        recorded = record.hashes[fam][checkpoint.step - 1]
        differs = np.nonzero(np.asarray(hashes[fam], dtype=np.uint64) != recorded)[0]
        if differs.size:
            raise CanaryError(f"{reader.path}: the checkpoint of step {checkpoint.step} does not hold the receipt's "
                              f"{fam} {names[int(differs[0])]} of step {checkpoint.step - 1}: the checkpoint or the "
                              "receipt was altered, not trusted")
    result.checkpoint = f"step {checkpoint.step} in the receipt ({checkpoint.content_hash[:23]}...)"
    return checkpoint.step


def replay(path: str, from_step: int, to_step: Optional[int] = None, trace: str = "none",
           capture_ops: bool = False, pack: Optional[str] = None, capture_level: Optional[str] = None,
           keep: Optional[OpKey] = None) -> ReplayResult:
    """Replays the receipt at `path` from the checkpoint at or before from_step up to to_step
    (default: its last recorded step) and compares every replayed step (module docstring).
    capture_ops: the last step's ops captured for the op oracle (result.captured), at
    capture_level `aten` (tracing/op_capture.py) or `modules` (tracing/module_capture.py;
    the default on XLA and under --compile, whose aten ops run in compiled graphs), the aten
    call `keep` kept whole (result.captured.kept; `harness repro`'s). pack: the canary pack a
    PyTorch lane's receipt was run from."""
    with ReceiptReader(path) as reader:
        recipe = _recipe(reader, pack)
        recorded_steps = reader.steps_recorded
        last = recorded_steps - 1 if to_step is None else to_step
        if not 0 <= from_step <= last < recorded_steps:
            raise CanaryError(f"--from {from_step} --to {last}: {path} records steps 0-{recorded_steps - 1}; give "
                              "0 <= from <= to within them")
        loaded, fault = _load(reader, recipe, pack)
        options = _options(recipe, fault)
        if options.compile and trace == "aten":
            raise CanaryError(f"--trace aten: {_compiled(path)}; record both runs with --trace ops, and bisect names "
                              "the step and the module")
        level = _capture_level(path, options, capture_level) if capture_ops else None
        device = _device_of(recipe)
        result = ReplayResult(path, reader.manifest["lane"], from_step, last, precision=options.precision,
                              capture_level=level)
        now = git_commit_of(loaded.path) if pack is None else None  # a lane's code is the package's, not the pack's
        if now is not None and reader.manifest.get("git_commit") not in (None, now):
            result.notes.append(f"the canary's code was at commit {reader.manifest.get('git_commit')} when the run "
                                f"was recorded and is at {now} now")
        loop = CanaryLoop(loaded, options, device)
        tracer = AtenTracer(loaded.canary.model, loaded.canary.optimizer) if trace == "aten" else None
        capture = (None if level is None else OpCapture(loaded.canary.model, loaded.canary.optimizer, keep)
                   if level == "aten" else ModuleCapture(loaded.canary.model, autocast=options.precision != "fp32"))
        try:
            _replay_steps(reader, loaded, loop, tracer, result, capture)
        finally:
            loop.close()
            for observer in (tracer, capture):
                if observer is not None:
                    observer.close()
        # A real divergence never heals bit for bit: agreement again at the end means the record was altered.
        result.record_altered = bool(result.mismatched_steps) and result.mismatched_steps[-1] != last
        result.diagnosis = _diagnose(result)
        return result


def _capture_level(path: str, options: RunOptions, asked: Optional[str]) -> str:
    """The capture level of the op oracle (replay's docstring): module outputs where the step
    runs as compiled graphs (torch_xla, torch.compile), whose aten ops no dispatch mode sees
    one by one (a CanaryError for aten there), else aten ops."""
    if asked not in (None, "aten", "modules"):
        raise CanaryError(f"--level {asked}: give aten or modules")
    level = asked or ("modules" if options.device == "xla" or options.compile else "aten")
    if level == "aten" and options.device == "xla":
        raise CanaryError(f"--level aten: {path} ran on XLA, whose aten ops run as one compiled graph when the step "
                          "ends, not one by one; capture at module outputs (--level modules)")
    if level == "aten" and options.compile:
        raise CanaryError(f"--level aten: {_compiled(path)}; capture at module outputs (--level modules)")
    return level


def _compiled(path: str) -> str:
    """Why a compiled run's aten ops cannot be traced or captured one by one."""
    return (f"{path} is a compiled run (--compile): its steps run Inductor's fused kernels, whose aten ops no "
            "dispatch mode sees")


def _replay_steps(reader: ReceiptReader, loaded: LoadedCanary, loop: CanaryLoop, tracer: Any,
                  result: ReplayResult, capture: Optional[Union[OpCapture, ModuleCapture]] = None) -> None:
    """Resumes (_resume) and runs steps resumed_from .. to_step, each compared with the
    record; the steps from from_step on traced when `tracer` is given, the last one's ops
    captured when `capture` is."""
    record = _Record(reader)
    result.resumed_from = _resume(reader, record, loaded, loop, result.from_step, result)
    start = time.perf_counter()
    for i in range(result.resumed_from, result.to_step + 1):
        traced = tracer is not None and i >= result.from_step
        captured = capture is not None and i == result.to_step
        replayed = loop.run_step(i, tracer.step() if traced else capture.step() if captured else None)
        result.steps_run += 1
        if traced:
            result.traces.append(_trace_json(i, tracer.finish_step()))
        if captured:
            result.captured = capture.finish()
        mismatch = _first_difference(replayed, record.row(i), loaded.tensor_names)
        if mismatch is not None:
            mismatch.step = i
            result.mismatched_steps.append(i)
            result.first_mismatch = result.first_mismatch or mismatch
    result.seconds = time.perf_counter() - start


def rerun(path: str, out: str, perturb_init: Optional[int] = None, overwrite: bool = False,
          autocast_off: Sequence[str] = ()) -> Any:
    """The receipt's own recipe run again from step 0 into a new receipt at `out` (no
    checkpoints), its initial weights moved one ulp under seed `perturb_init` when given
    (what `harness calibrate --perturb N` runs N times for a Python canary's receipt), with
    the modules `autocast_off` out of autocast besides the recipe's own (what `harness
    triage` runs). A run on XLA or compiled is run with its op trace, as replay's (_options):
    the rerun then computes as the run did, and its receipt holds a /trace too."""
    with ReceiptReader(path) as reader:
        recipe = _recipe(reader)
        loaded, fault = _load(reader, recipe)
    options = _options(recipe, fault)
    options.out, options.overwrite, options.perturb_init = out, overwrite, perturb_init
    options.autocast_off = list(dict.fromkeys([*options.autocast_off, *autocast_off]))
    return run_canary(loaded, options, _device_of(recipe))


def precision_switches(path: str) -> List[Dict[str, Any]]:
    """What `harness triage` may switch in the receipt's recipe (precision.switches): the
    modules autocast runs in bf16 (observed in step 0) less those the recipe keeps out;
    none for an fp32 run."""
    with ReceiptReader(path) as reader:
        recipe = _recipe(reader)
        loaded, fault = _load(reader, recipe)
    options = _options(recipe, fault)
    if options.precision != "bf16":
        return []
    device = _device_of(recipe)
    torch.set_num_threads(options.threads)
    batch = to_device(loaded.canary.batch(0), device)
    loaded.canary.model.to(device)
    return switches(autocast_units(loaded.canary, batch, device, options.autocast_off))


def _trace_json(step: int, traced: Any) -> Dict[str, Any]:
    return {"step": step, "level": "aten",
            "columns": [{"op_index": c.op_index, "op": c.op, "layer": c.layer, "phase": c.phase, "tensor": c.tensor,
                         "kind": c.kind, "site": site} for c, site in zip(traced.columns, traced.sites)],
            # Sketches as their float64 bit patterns: exact, and JSON has no inf or NaN (a
            # masked attention score is -inf).
            "hash": [int(h) for h in traced.hashes],
            "l2_bits": np.asarray(traced.l2, dtype=np.float64).view(np.uint64).tolist(),
            "projection_bits": np.asarray(traced.projection, dtype=np.float64).view(np.uint64).tolist()}


def to_json(result: ReplayResult) -> Dict[str, Any]:
    """`replay --json` (the keys of `harness replay --json`, version 1, and `traces`)."""
    mismatch = None
    if result.first_mismatch is not None:
        m = result.first_mismatch
        mismatch = {"step": m.step, "what": m.what, "tensor": m.tensor}
    return {"version": 1, "verdict": result.verdict(), "receipt": result.receipt, "lane": result.lane,
            "resumed_from": result.resumed_from, "checkpoint": result.checkpoint or None, "from": result.from_step,
            "to": result.to_step, "steps_run": result.steps_run, "seconds": result.seconds,
            "first_mismatch": mismatch, "mismatched_steps": result.mismatched_steps, "notes": result.notes,
            "diagnosis": result.diagnosis or None, "traces": result.traces}


def to_text(result: ReplayResult) -> str:
    """The story `harness replay` tells, line by line."""
    lines = [f"{'replay':<12}{result.lane} ({result.receipt})"]
    lines.append(f"{'resumed':<12}" + (f"checkpoint of {result.checkpoint}: content and tensor hashes verified"
                                       if result.checkpoint else
                                       f"the initial state (no checkpoint at or before step {result.from_step})"))
    lines.append(f"{'replayed':<12}steps {result.resumed_from}-{result.to_step} in {result.seconds:.2f} s "
                 f"({result.steps_run} steps)")
    lines += [f"{'note':<12}{note}" for note in result.notes]
    for traced in result.traces:
        lines.append(f"{'traced':<12}step {traced['step']}: {len(traced['columns'])} aten op outputs")
    if result.reproduced():
        lines.append(f"{'verified':<12}steps {result.resumed_from}-{result.to_step} bitwise equal to the receipt")
        return "\n".join(lines) + "\n"
    m = result.first_mismatch
    lines.append(f"{'mismatch':<12}step {m.step} differs from the receipt first in {m.what}"
                 + (f" {m.tensor}" if m.tensor else ""))
    if result.diagnosis:
        lines.append(f"{'diagnosis':<12}{result.diagnosis}")
    if result.record_altered:
        steps = ", ".join(str(s) for s in result.mismatched_steps)
        lines.append(f"{'diagnosis':<12}the replay agrees again at step {result.to_step}: the receipt's record of "
                     f"step{'s' if len(result.mismatched_steps) > 1 else ''} {steps} was altered; the receipt is not "
                     "trusted")
    return "\n".join(lines) + "\n"
