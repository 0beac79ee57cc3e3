"""`python3 -m canary_harness run FILE.py:NAME --out R.h5`: run a team's own model as a canary.

FILE.py:NAME is a function in your file returning canary_harness.Canary (docs/own-model.md).
`replay R.h5 --from K` verifies a receipt from its checkpoint (docs/bisect.md); `rerun R.h5
--out X [--perturb-init SEED]` runs its recipe again into a new receipt, the initial weights
moved one ulp under SEED (what `harness calibrate --perturb N` runs; docs/budgets.md),
and with `--autocast-off M,...` modules out of bf16 autocast (what `harness triage` runs);
`units R.h5` prints the modules triage may switch (docs/triage.md). `replay`, `units` and
`describe` take `--json-out PATH`: the result as JSON in that file (written whole), stdout
left to whatever the canary prints; what the harness reads (docs/bisect.md). A `describe`
whose canary imports a module this interpreter lacks writes {"error": {"kind":
"missing_module", "module": ..., "message": ...}} there before it exits 2.
The harness seeds, places the model and batches on --device, runs each step (under bf16
autocast for --precision bf16), and records the receipt that `harness check`, `compare`
and `golden` judge like any lane's. `--layout ddp|fsdp --nproc N` trains on N processes
over gloo into one receipt (canary_harness.runs.distributed).

Exit status: 0 the run finished; 2 bad usage or bad input, one line on stderr and no file
(a canary that cannot be loaded or breaks its contract: a batch that differs between two
calls, a loss that is not a scalar); a failure inside the team's step is exit 2 too and
leaves the receipt with its finished steps and complete = 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, List, NoReturn, Optional

from .runs.canary import CanaryError, CanaryImportError, load_canary
from .invariance import run as run_invariance
from .cli.lane_args import (MAX_THREADS, add_device_arguments, add_layout_arguments, add_versioned_argument, check_out,
                        check_precision, device_of, trace_problem)
from .receipts.receipt import ReceiptError
from .runs.regressions import linear_weights
from .cli.usage import UsageError, count_flag

PROG = "canary_harness"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own errors: one line, exit 2
        print(f"{PROG}: error: {message} (see `python3 -m {PROG} run --help`)", file=sys.stderr)
        sys.exit(2)


def add_json_out_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json-out", metavar="PATH",
                        help="write the result as JSON to PATH (whole: a temporary file renamed) instead of "
                             "printing it; stdout is left to what the canary prints. What the harness reads")


def write_json_atomically(path: str, value: object) -> None:
    """`value` as JSON at `path`, whole or not at all: a temporary file beside it, renamed."""
    import os
    import tempfile

    directory = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=".json-out-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(value, f, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def print_result(args: argparse.Namespace, as_json: object, as_text: str) -> None:
    """A command's result: into --json-out's file (what the harness reads: stdout stays the
    canary's own), as JSON on stdout with --json, else as text when neither is asked."""
    if args.json_out is not None:
        write_json_atomically(args.json_out, as_json)
    if args.json:
        print(json.dumps(as_json))
    elif args.json_out is None:
        print(as_text, end="")


def check_json_out(path: Optional[str]) -> None:
    """--json-out's directory exists before the work starts (UsageError otherwise)."""
    import os

    if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise UsageError(f"--json-out: no directory for '{path}'")


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    ap = _Parser(prog=f"python3 -m {PROG}", description="Run a team's own model as a canary (docs/own-model.md).")
    commands = ap.add_subparsers(dest="command", parser_class=_Parser)
    commands.required = True
    run = commands.add_parser("run", help="run FILE.py:NAME and write its receipt")
    run.add_argument("canary", help="FILE.py:NAME: a function in FILE.py returning canary_harness.Canary")
    run.add_argument("--out", required=True, help="receipt path (.h5); its directory must exist")
    add_device_arguments(run)
    run.add_argument("--precision", default="fp32", help="fp32 (default) or bf16 (autocast around the forward)")
    run.add_argument("--steps", help="steps to run, 1..the canary's (default: the canary's): a prefix of its run")
    run.add_argument("--threads", help=f"torch CPU threads, 1..{MAX_THREADS} (default 1: torch's CPU kernels' bits depend on "
                                       "the thread count, so a pinned count replays on any machine)")
    run.add_argument("--seed", help="seed torch, random and numpy with this before NAME() (default: the canary's)")
    run.add_argument("--inject-fault", help="step=K,op=PATH[,ulps=N]: move element 0 of module PATH's output up by N "
                                            "ulps (default 1) at step K; op=MODULE:ATEN[#C]: of the C-th call "
                                            "(default 1) of aten op ATEN in MODULE (a functional softmax, a residual add)")
    run.add_argument("--checkpoint-every", help="K: save the whole training state into the receipt at the start "
                                                "of steps K, 2K, ... (what replay and bisect resume from)")
    run.add_argument("--trace", default="none", help="none (default) or ops: every module op's output and gradient, "
                                                     "hashed and sketched into /trace (bisect reads it without a "
                                                     "replay); aten traces come from `replay --trace aten`")
    run.add_argument("--compile", action="store_true",
                     help="run the model under torch.compile (Inductor; torch 2.x): lane <name>/torch+compile, "
                          "budget feature torch-compile (docs/own-model.md)")
    add_versioned_argument(run)
    add_layout_arguments(run)
    run.add_argument("--perturb-init", help="SEED: move every initial weight one ulp, up or down as SEED draws "
                                            "(what `harness calibrate --perturb N` runs; docs/budgets.md)")
    run.add_argument("--autocast-off", help="MODULE,...: with --precision bf16, run these modules (paths of "
                                            "model.named_modules()) in fp32 outside autocast (what `harness triage` "
                                            "switches; docs/triage.md)")
    run.add_argument("--force", action="store_true", help="overwrite an existing receipt")
    replay = commands.add_parser("replay", help="replay a Python canary's receipt from a checkpoint and verify it")
    replay.add_argument("receipt", help="a receipt this command's `run` wrote, or the PyTorch lane's (with --pack)")
    replay.add_argument("--from", dest="from_step", default="0",
                        help="first step to verify: resumes from the checkpoint at or before it (default 0)")
    replay.add_argument("--to", dest="to_step", help="last step to verify (default: the last recorded)")
    replay.add_argument("--trace", default="none", help="none (default) or aten: trace every aten op of the "
                                                        "steps from --from on (docs/bisect.md)")
    replay.add_argument("--json", action="store_true", help="print the result as JSON (with the traces)")
    add_pack_argument(replay)
    add_json_out_argument(replay)
    capture = commands.add_parser("capture-ops", help="replay one step and capture its aten ops (or op modules), recomputed in float64, "
                                                      "for `harness precision` to judge (docs/oracle.md)")
    capture.add_argument("receipt", help="a receipt this command's `run` wrote, or the PyTorch lane's (with --pack)")
    capture.add_argument("--step", required=True, help="K: the step to replay and capture")
    capture.add_argument("--values", required=True, help="FILE.h5: where each captured result's values go")
    capture.add_argument("--level",
                         help="aten: every aten op (the default); modules: the op modules' outputs (the default, and "
                              "the only level, on XLA and under --compile, which run a step's aten ops in compiled "
                              "graphs; docs/oracle.md)")
    capture.add_argument("--json", action="store_true", help="print the description as JSON")
    capture.add_argument("--operands-of", metavar="JSON",
                         help='{"op": MODULE, "phase": P, "tensor": ATEN, "occurrence": N}: keep that aten call whole '
                              "and write it into --operands-dir (what `harness repro` asks; docs/oracle.md)")
    capture.add_argument("--operands-dir", metavar="DIR", help="with --operands-of: the directory to make for the call")
    capture.add_argument("--script", metavar="PATH", help="with --operands-of: write the standalone script that runs "
                                                          "such calls (repro.py) at PATH too")
    add_pack_argument(capture)
    add_json_out_argument(capture)
    rerun = commands.add_parser("rerun", help="run a Python canary's receipt's recipe again into a new receipt")
    rerun.add_argument("receipt", help="a receipt this command's `run` wrote")
    rerun.add_argument("--out", required=True, help="the new receipt's path (.h5)")
    rerun.add_argument("--perturb-init", help="SEED: move every initial weight one ulp (as run --perturb-init)")
    rerun.add_argument("--autocast-off", help="MODULE,...: these modules in fp32 outside autocast, besides the "
                                              "recipe's own (as run --autocast-off)")
    rerun.add_argument("--force", action="store_true", help="overwrite an existing receipt")
    units = commands.add_parser("units", help="print the units `harness triage` may switch in a receipt's recipe "
                                              "(modules autocast runs in bf16) as JSON")
    units.add_argument("receipt", help="a receipt this command's `run` wrote")
    add_json_out_argument(units)
    describe = commands.add_parser("describe", help="print the canary's name, steps and seed as JSON (what a nightly "
                                                    "matrix naming FILE.py:NAME reads)")
    describe.add_argument("canary", help="FILE.py:NAME: a function in FILE.py returning canary_harness.Canary")
    add_json_out_argument(describe)
    invariance = commands.add_parser("invariance", help="batch invariance: batch(0)'s first row alone and at a drawn "
                                                        "row of batches of 2..N, module by module (docs/invariance.md)")
    invariance.add_argument("canary", help="FILE.py:NAME: a function in FILE.py returning canary_harness.Canary")
    invariance.add_argument("--max-batch", default="8", help="largest batch size, 2..64 (default 8)")
    invariance.add_argument("--position-seed", default="0", help="draws the row's place in each batch (default 0)")
    invariance.add_argument("--precision", default="fp32", help="fp32 (default) or bf16 (autocast around the forward)")
    invariance.add_argument("--threads", help=f"torch CPU threads, 1..{MAX_THREADS} (default 1)")
    invariance.add_argument("--json", action="store_true", help="print the report as JSON")
    resume = commands.add_parser("resume-check", help="the restart gate: stop after step --at K, save with the "
                                                      "canary's save, load with its load in a new process, and hold "
                                                      "the rest bitwise to the uninterrupted run (docs/own-model.md)")
    resume.add_argument("canary", help="FILE.py:NAME: a function in FILE.py returning canary_harness.Canary with "
                                       "save and load")
    resume.add_argument("--at", required=True, help="K: the last step before the stop, 0..steps-2")
    resume.add_argument("--steps", help="steps to run, 2..the canary's (default: the canary's)")
    resume.add_argument("--threads", help=f"torch CPU threads, 1..{MAX_THREADS} (default 1)")
    resume.add_argument("--seed", help="seed torch, random and numpy with this before NAME() (default: the canary's)")
    resume.add_argument("--precision", default="fp32", help="fp32 (default) or bf16 (autocast around the forward), "
                                                            "both runs")
    resume.add_argument("--compile", action="store_true", help="torch.compile both runs' model (torch 2.x; the "
                                                               "new process compiles afresh)")
    resume.add_argument("--json", action="store_true", help="print the result as JSON")
    resume.add_argument("--resume-from", help=argparse.SUPPRESS)  # the new process's part: the state dir to load
    add_json_out_argument(resume)
    return ap.parse_args(argv)


def resume_check(args: argparse.Namespace) -> int:
    from .runs.resume_check import GateOptions, resume_check as check, resumed_run, to_json, to_text

    check_precision(args.precision)
    threads = count_flag("threads", args.threads, 1, MAX_THREADS) if args.threads is not None else 1
    options = GateOptions(threads, args.precision, args.compile)
    seed = count_flag("seed", args.seed, 0, 2**63 - 1) if args.seed is not None else None
    at = count_flag("at", args.at, 0, 2**31 - 1)
    steps = count_flag("steps", args.steps, 2, 2**31 - 1) if args.steps is not None else None
    check_json_out(args.json_out)
    if args.resume_from is not None:  # the new process of a check: its records, for the parent to compare
        if args.json_out is None or steps is None:
            raise UsageError("--resume-from: the new process of a resume-check takes --steps and --json-out")
        write_json_atomically(args.json_out, resumed_run(args.canary, seed, options, at, steps, args.resume_from))
        return 0
    result = check(args.canary, at, steps, options, seed)
    print_result(args, to_json(result), to_text(result))
    return 0 if result.equal() else 1


def run(args: argparse.Namespace) -> int:
    check_precision(args.precision)
    if args.trace == "aten":
        raise UsageError("--trace aten: aten traces are taken by a replay (`replay --trace aten`, which `harness "
                         "bisect` runs for you): their ops change between steps (an optimizer's first step), which "
                         "a receipt's /trace cannot hold; use --trace ops")
    problem = trace_problem(args.trace)
    if problem:
        raise UsageError(problem)
    threads = count_flag("threads", args.threads, 1, MAX_THREADS) if args.threads is not None else 1
    seed = count_flag("seed", args.seed, 0, 2**63 - 1)
    perturb = count_flag("perturb-init", args.perturb_init, 0, 2**63 - 1)
    nproc = _layout_processes(args)

    import torch

    from .runs.distributed import fsdp_available, launch, rank_from_env

    if args.layout == "fsdp" and not fsdp_available():
        raise UsageError(f"--layout fsdp: torch {torch.__version__} has no FSDP2 (fully_shard: torch 2.6 on); run it "
                         "with .venv/bin/python (docs/python-env.md)")
    rank = rank_from_env(args.layout) if args.layout else None
    if rank is None or rank.rank == 0:  # the launcher checked for rank 0; the other ranks write nothing
        check_out(args.out, args.force)
    if args.layout and rank is None:
        return launch(args.argv, nproc, args.out, args.layout)
    if rank is not None:
        from .runs.distributed import join, leave

        join(rank)
        try:
            return _run_canary(args, torch, threads, seed, perturb, rank)
        finally:
            leave()
    return _run_canary(args, torch, threads, seed, perturb, None)


def _layout_processes(args: argparse.Namespace) -> int:
    """--layout and --nproc checked, with what a layout cannot be run with: the process count."""
    from .runs.distributed import layout_processes

    return layout_processes(args.layout, args.nproc, {
        "--device": args.device != "cpu", "--checkpoint-every": args.checkpoint_every is not None,
        "--trace": args.trace != "none", "--compile": args.compile})


def _run_canary(args: argparse.Namespace, torch, threads: int, seed: Optional[int], perturb: Optional[int],
                rank) -> int:
    """`run` in this process: the whole run, or one rank of a distributed one."""
    from .runs.runner import RunOptions, parse_canary_fault, print_summary, run_canary

    device = device_of(args.device, args.compile_cache)
    torch.set_num_threads(threads)  # before NAME(): the model's init runs on these threads too
    loaded = load_canary(args.canary, seed=seed)
    steps = loaded.canary.steps
    if args.steps is not None:
        steps = count_flag("steps", args.steps, 1, loaded.canary.steps)
    fault = None
    if args.inject_fault is not None:
        fault = parse_canary_fault(args.inject_fault, loaded.canary.model, steps)
    every = count_flag("checkpoint-every", args.checkpoint_every, 1, steps) if args.checkpoint_every is not None else 0
    options = RunOptions(out=args.out, device=args.device, precision=args.precision, steps=steps, threads=threads,
                         fault=fault, overwrite=args.force, checkpoint_every=every, perturb_init=perturb,
                         trace=args.trace, compile=args.compile, rank=rank, versioned=args.versioned,
                         autocast_off=_modules(args.autocast_off))

    def progress(i: int, total: int) -> None:
        if rank is not None and rank.rank != 0:
            return
        if (i + 1) % 25 == 0 or i + 1 == total:
            print(f"step {i + 1}/{total}", file=sys.stderr)

    summary = run_canary(loaded, options, device, progress)
    if rank is None or rank.rank == 0:
        print_summary(summary, args.out)
    return 0


def add_pack_argument(parser: argparse.ArgumentParser) -> None:
    """--pack: the canary pack a PyTorch lane's receipt (`canary_harness.lane`) was run from."""
    parser.add_argument("--pack", help="PACK.h5: for a PyTorch lane's receipt (python3 -m canary_harness.lane), the "
                                       "canary pack it was run from (the nightly's canary-pack.h5)")


def replay(args: argparse.Namespace) -> int:
    from .runs.replay import replay as replay_receipt
    from .runs.replay import to_json, to_text

    problem = trace_problem(args.trace, ("none", "aten"))
    if problem:
        raise UsageError(problem)
    from_step = count_flag("from", args.from_step, 0, 2**31 - 1)
    to_step = count_flag("to", args.to_step, 0, 2**31 - 1) if args.to_step is not None else None
    check_json_out(args.json_out)
    result = replay_receipt(args.receipt, from_step, to_step, args.trace, pack=args.pack)
    print_result(args, to_json(result), to_text(result))
    return 0 if result.reproduced() else 1


def capture_ops(args: argparse.Namespace) -> int:
    """Replays step --step with its ops captured: the description as JSON (--json-out), the
    values into --values (tracing/op_capture.py). Exit 1 where the step does not replay."""
    import os

    from .runs.replay import replay as replay_receipt
    from .runs.replay import to_json
    from .tracing.op_capture import capture_json, write_values

    step = count_flag("step", args.step, 0, 2**31 - 1)
    check_json_out(args.json_out)
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.values))) or os.path.isdir(args.values):
        raise UsageError(f"--values: '{args.values}' is a directory, or its directory does not exist; name a file")
    keep = _kept_call(args)
    result = replay_receipt(args.receipt, step, step, capture_ops=True, pack=args.pack, capture_level=args.level,
                            keep=keep)
    summary = {**to_json(result), "precision": result.precision, "level": result.capture_level}
    if result.captured is not None and result.reproduced():
        write_values(args.values, result.captured)
        summary.update(capture_json(result.captured))
        if keep is not None:
            _write_kept_call(args, keep, result.captured.kept, result.precision)
    said = (f"{len(summary['results'])} results captured into {args.values}\n" if "results" in summary else
            f"step {step} does not replay as recorded: nothing captured\n")
    print_result(args, summary, said)
    return 0 if result.reproduced() else 1


def _kept_call(args: argparse.Namespace) -> Any:
    """--operands-of as the call to keep (an op_capture.OpKey; None without it);
    --operands-dir must be a path to make."""
    import os

    from .tracing.op_repro import key_of

    if args.operands_of is None:
        if args.operands_dir is not None or args.script is not None:
            raise UsageError("--operands-dir and --script go with --operands-of (the call to write)")
        return None
    try:
        keep = key_of(args.operands_of)
    except ValueError:
        raise UsageError('--operands-of: give {"op": MODULE, "phase": P, "tensor": ATEN, "occurrence": N} '
                         "as bisect's --json names the op") from None
    if args.operands_dir is None or os.path.exists(args.operands_dir) or \
            not os.path.isdir(os.path.dirname(os.path.abspath(args.operands_dir))):
        raise UsageError(f"--operands-dir: '{args.operands_dir}' exists or has no parent directory; name a new "
                         "directory")
    return keep


def _write_kept_call(args: argparse.Namespace, keep: Any, kept: Any, precision: str) -> None:
    """The kept call (an op_capture.KeptCall, None where the step ran no such call) into
    --operands-dir (tracing/op_repro.py), the script at --script."""
    from .tracing.op_repro import NotWritable, write_call, write_script

    if kept is None:
        raise UsageError(f"--operands-of: step {args.step} of {args.receipt} ran no judged {keep.tensor} in "
                         f"{keep.op} ({keep.phase}) at occurrence {keep.occurrence}")
    try:
        write_call(args.operands_dir, kept, {"precision": precision})
    except NotWritable as e:
        raise UsageError(f"{keep.tensor} in {keep.op}: {e}") from None
    if args.script is not None:
        write_script(args.script)


def rerun(args: argparse.Namespace) -> int:
    from .runs.replay import rerun as rerun_receipt
    from .runs.runner import print_summary

    perturb = count_flag("perturb-init", args.perturb_init, 0, 2**63 - 1)
    modules = _modules(args.autocast_off)
    check_out(args.out, args.force)
    print_summary(rerun_receipt(args.receipt, args.out, perturb, args.force, modules), args.out)
    return 0


def _modules(text: Optional[str]) -> List[str]:
    """--autocast-off's module paths (UsageError for a malformed list)."""
    from .runs.precision import parse_modules

    try:
        return parse_modules(text)
    except ValueError as e:
        raise UsageError(str(e)) from None


def units(args: argparse.Namespace) -> int:
    import contextlib

    from .runs.replay import precision_switches

    check_json_out(args.json_out)
    if args.json_out is not None:  # stdout is the canary's own
        write_json_atomically(args.json_out, precision_switches(args.receipt))
        return 0
    with contextlib.redirect_stdout(sys.stderr):  # the canary's own prints; stdout is the JSON
        found = precision_switches(args.receipt)
    print(json.dumps(found))
    return 0


def describe(args: argparse.Namespace) -> int:
    import contextlib

    import torch

    check_json_out(args.json_out)
    try:
        if args.json_out is not None:  # stdout is the canary's own
            loaded = load_canary(args.canary)
        else:
            with contextlib.redirect_stdout(sys.stderr):  # what NAME() prints (a parameter count) is not the JSON
                loaded = load_canary(args.canary)
    except CanaryImportError as e:
        # What the reader decides on (a nightly: "name the interpreter that can"), as data.
        if args.json_out is not None:
            write_json_atomically(args.json_out, {"error": {"kind": "missing_module", "module": e.module,
                                                            "message": str(e)}})
        raise
    # The module paths a fault may name (--inject-fault op=PATH), in registration order; the
    # nightly's negative control faults the first leaf module by default. `torch`: the
    # version this interpreter imports (a lane under it is named after its release).
    modules = [(name, next(module.children(), None) is None) for name, module in loaded.canary.model.named_modules()
               if name]
    # The parameters a regression may move (kind=weight-scale,tensor=P: harness power), and the
    # linear layers' weights among them, in registration order (the first is power's default).
    described = {"name": loaded.canary.name, "steps": loaded.canary.steps, "seed": loaded.seed,
                 "canary": loaded.identity(), "modules": [name for name, _ in modules],
                 "leaf_modules": [name for name, leaf in modules if leaf], "torch": torch.__version__,
                 "parameters": [name for name, _ in loaded.canary.model.named_parameters()],
                 "linear_weights": linear_weights(loaded.canary.model),
                 # its own save and load: a nightly lane may carry the restart gate (resume-at)
                 "checkpoints": loaded.canary.save is not None and loaded.canary.load is not None}
    if args.json_out is not None:
        write_json_atomically(args.json_out, described)
    else:
        print(json.dumps(described, sort_keys=True))
    return 0


def invariance(args: argparse.Namespace) -> int:
    """`python3 -m canary_harness invariance FILE.py:NAME`: canary_harness.invariance's check
    of a Python canary (the flags read here, the work there)."""
    check_precision(args.precision)
    return run_invariance(argparse.Namespace(
        canary=args.canary, pack=None, device="cpu", precision=args.precision, json=args.json,
        max_batch=count_flag("max-batch", args.max_batch, 2, 64),
        position_seed=count_flag("position-seed", args.position_seed, 0, 2**64 - 1),
        threads=count_flag("threads", args.threads, 1, MAX_THREADS) if args.threads is not None else 1))


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # what a distributed run's ranks are started with

    try:
        commands = {"run": run, "replay": replay, "rerun": rerun, "describe": describe, "invariance": invariance,
                    "units": units, "resume-check": resume_check, "capture-ops": capture_ops}
        return commands[args.command](args)
    except (UsageError, CanaryError, ReceiptError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        import os

        if args.command in ("replay", "describe", "invariance", "units", "resume-check", "capture-ops"):
            print(f"{PROG}: interrupted", file=sys.stderr)
            return 130
        kept = f"{args.out} keeps its finished steps (complete = 0)" if os.path.exists(args.out) else "no receipt written"
        print(f"{PROG}: interrupted: {kept}", file=sys.stderr)
        return 130
    except Exception as e:  # the team's step failed: one line, the receipt keeps its finished steps
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        named = args.command in ("run", "describe", "invariance", "resume-check")
        what = args.canary if named else f"{args.command} of {args.receipt}"
        where = "loading the canary" if args.command == "describe" else "the step"
        print(f"{PROG}: error: {what}: {where} raised {type(e).__name__}: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
