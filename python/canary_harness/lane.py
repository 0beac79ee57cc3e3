"""The PyTorch canary lane: `python3 -m canary_harness.lane --pack PACK.h5 --out R.h5`.

Trains the canary of a pack (`harness export`) from the pack's own initial parameters and
batches with the package's PyTorch model of the canary's architecture (the canary JSON's
`architecture` key: gpt2, canary_harness.models.gpt2, where the key is absent; llama,
canary_harness.models.llama), the canary's exact
schedule, clipping and AdamW in the XLA-safe pattern (canary_harness.runs.optim), on CPU, CUDA
or an XLA device, in fp32 or under bf16 autocast. The pack's canary runs through the
runner that runs a team's Python canaries (canary_harness.runs.runner: one loop, one digest
path), into a receipt that the C++ harness judges like its own:

    engine          torch
    lane            <canary>/torch (fp32) or <canary>/torch+bf16
    budget_features torch-<device> for fp32 (torch-cpu on CPU), torch-bf16 for bf16 on CPU,
                    torch-<device>+torch-bf16 for bf16 elsewhere

`--trace ops` adds op traces (/trace) from module hooks (canary_harness.tracing.trace), in the C++
engines' layout and op names, so that `harness bisect` names the first divergent op.
`--audit` records each step's op graph fingerprint and compile counters in /compile
(canary_harness.audit), so that `harness check`/`compare` judge its compile stability; the
step itself is CanaryStep, which `python3 -m canary_harness.audit` finds clean.

Exit status: 0 the run finished; 2 bad usage or bad input, one line on stderr (a missing or
damaged pack, a pack of another canary than --canary names, a bad flag, an unavailable
device), with no file created; a failure during the run is exit 2 too and leaves the
receipt with complete = 0 and its finished steps.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, List, NoReturn, Optional, Union

from .receipts.budget_features import format_features
from .runs.faults import FaultSpec
from .cli.lane_args import (MAX_THREADS, add_device_arguments, add_layout_arguments, add_versioned_argument,
                        check_device_name, check_out, check_precision, device_of, parse_lane_fault, trace_problem)
from .cli.lane_stacks import budget_features as stack_budget_features, lane_name as stack_lane_name, stack_options
from .pack import PackError
from .runs.pack_step import build_pack_canary, load_pack
from .receipts.receipt import ReceiptReader
from .runs.regressions import RegressionSpec
from .cli.usage import UsageError, count_flag

PROG = "canary_harness.lane"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own errors: one line too
        print(f"{PROG}: error: {message} (see `python3 -m {PROG} --help`)", file=sys.stderr)
        sys.exit(2)


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    ap = _Parser(prog=f"python3 -m {PROG}",
                 description="Train a canary pack's canary in PyTorch and write a receipt (engine torch).")
    ap.add_argument("--pack", required=True, help="canary pack written by `harness export`")
    ap.add_argument("--out", required=True, help="receipt path (.h5); its directory must exist")
    add_device_arguments(ap)
    ap.add_argument("--precision", default="fp32", help="fp32 (default) or bf16 (autocast)")
    ap.add_argument("--steps", help="steps to run, 1..the pack's (default: all of them): a prefix of the pack's run")
    ap.add_argument("--canary", help="refuse a pack of any canary but this one (e.g. tiny)")
    ap.add_argument("--inject-fault", help="step=K,op=NAME[,ulps=N]: move element 0 of op NAME's output up by N ulps "
                                           "at step K (docs/canary.md); or a regression of `harness power`, "
                                           "kind=weight-scale|weight-ulps|lr-scale|eps-scale,... (docs/budgets.md)")
    ap.add_argument("--threads", help=f"torch CPU threads, 1..{MAX_THREADS} (default 1: the bits of torch's CPU kernels "
                                      "depend on the thread count, so a pinned count replays on any machine)")
    ap.add_argument("--deterministic", action="store_true",
                    help="torch.use_deterministic_algorithms(True) (and CUBLAS_WORKSPACE_CONFIG on CUDA)")
    ap.add_argument("--trace", default="none",
                    help="none (default) or ops: op traces in /trace (every op's forward output, the gradients its "
                         "backward writes, the optimizer's norm and updated parameters, hashed and sketched), as "
                         "`harness run --trace ops` writes them, so that `harness bisect` names the first divergent op "
                         "(docs/bisect.md)")
    ap.add_argument("--audit", action="store_true",
                    help="record each step's op graph fingerprint and compile counters in /compile "
                         "(canary_harness.audit: UncachedCompile, CachedCompile, HostSync, Fingerprint), so that "
                         "`harness check`/`compare` judge the run's compile stability as a tpu-mesh run's")
    ap.add_argument("--compile", action="store_true",
                    help="run the model under torch.compile (Inductor; torch 2.x): lane <canary>/torch+compile, "
                         "budget feature torch-compile beside the lane's own (docs/python.md)")
    add_layout_arguments(ap)
    add_versioned_argument(ap)
    ap.add_argument("--force", action="store_true", help="overwrite an existing receipt")
    return ap.parse_args(argv)


def budget_features(device_type: str, precision: str, compiled: bool = False, layout: Optional[str] = None) -> str:
    """What separates the lane from cpu-ref (its stack's description, lane_stacks.py): the
    device's torch, bf16, torch.compile and the distributed layout."""
    options = stack_options("", device=device_type, precision=precision, compiled=compiled, layout=layout)
    return format_features(stack_budget_features("torch-pack", options))


def run(args: argparse.Namespace) -> int:
    check_precision(args.precision)
    problem = trace_problem(args.trace)
    if problem:
        raise UsageError(problem)
    device_name = args.device
    check_device_name(device_name)
    threads = count_flag("threads", args.threads, 1, MAX_THREADS) if args.threads is not None else 1
    try:
        pack = load_pack(args.pack, canary=args.canary)
    except PackError as e:
        raise UsageError(str(e)) from None
    steps = count_flag("steps", args.steps, 1, pack.steps) if args.steps is not None else pack.steps
    if steps is None or steps < 1:
        raise UsageError(f"--steps: '{args.steps}' is not a number in 1..{pack.steps} (the pack's batches)")
    from .runs.distributed import fsdp_available, launch, layout_processes, rank_from_env

    nproc = layout_processes(args.layout, args.nproc, {"--device": device_name != "cpu", "--trace": args.trace != "none",
                                                       "--compile": args.compile, "--audit": args.audit})
    rank = rank_from_env(args.layout) if args.layout else None
    if rank is None or rank.rank == 0:  # the launcher checked for rank 0; the other ranks write nothing
        check_out(args.out, args.force)
        if os.path.exists(args.out) and os.path.samefile(args.out, pack.path):
            raise UsageError(f"--out: '{args.out}' is the pack itself; choose another path")

    import torch

    if args.layout == "fsdp" and not fsdp_available():
        raise UsageError(f"--layout fsdp: torch {torch.__version__} has no FSDP2 (fully_shard: torch 2.6 on); run the "
                         "lane with .venv/bin/python (docs/python-env.md)")
    if args.layout and rank is None:
        return launch(args.argv, nproc, args.out, args.layout, module="canary_harness.lane")
    if rank is None:
        return _run_lane(args, pack, steps, threads, None)
    from .runs.distributed import join, leave

    join(rank)
    try:
        return _run_lane(args, pack, steps, threads, rank)
    finally:
        leave()


def _run_lane(args: argparse.Namespace, pack: Any, steps: int, threads: int, rank: Any) -> int:
    """The lane in this process: the whole run, or one rank of a distributed one."""
    import torch

    device_name = args.device
    device = device_of(device_name, args.compile_cache, args.deterministic)
    if args.precision == "bf16":  # the runner puts it around each step; refused here as a usage error
        try:
            torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        except (RuntimeError, ValueError) as e:
            raise UsageError(f"--precision bf16: no bf16 autocast on device {device.type} ({e})") from None
    if args.compile and not hasattr(torch, "compile"):
        raise UsageError(f"--compile: torch {torch.__version__} has no torch.compile (torch 2.x has; "
                         "docs/python-env.md: run the lane with .venv/bin/python)")
    if threads is not None:
        torch.set_num_threads(threads)
    if args.deterministic:
        torch.use_deterministic_algorithms(True)

    from .runs.runner import RunOptions, run_canary

    loaded, model_module, cfg = build_pack_canary(pack, steps, device)
    fault = parse_lane_fault(args.inject_fault, model_module.forward_op_names(cfg), pack.tensor_names, steps) \
        if args.inject_fault is not None else None
    options = RunOptions(out=args.out, device=device_name, precision=args.precision, steps=steps, threads=threads,
                         fault=fault, overwrite=args.force, trace=args.trace, audit=args.audit, compile=args.compile,
                         rank=rank)
    manifest = lane_manifest(args, pack, steps, threads, fault, _device_label(torch, device),
                             rank.world if rank is not None else 1)
    writes = rank is None or rank.rank == 0

    def progress(step: int, total: int) -> None:
        if writes and ((step + 1) % 25 == 0 or step + 1 == total):
            print(f"step {step + 1}/{total}", file=sys.stderr)

    summary = run_canary(loaded, options, device, progress, manifest)
    if not writes:
        return 0
    with ReceiptReader(args.out) as r:
        print(f"lane        {r.manifest['lane']}")
        print(f"device      {manifest['device']} ({args.precision}), {threads} thread{'s' if threads != 1 else ''}")
        print(f"steps       {steps}")
        print(f"loss        {summary.losses[0]:.6f} (step 0) -> {summary.losses[-1]:.6f} (step {steps - 1})")
        print(f"speed       {steps / summary.seconds:.2f} steps/s, {1000 * summary.seconds / steps:.1f} ms/step "
              "(recording included)")
        columns = r.trace_columns()
        if columns is not None:
            print(f"trace       ops: {len(columns)} outputs of {columns[-1].op_index + 1} ops per step")
        if summary.audit is not None:
            print(f"audit       {summary.audit}")
        print(f"receipt     {args.out}")
    return 0


def lane_manifest(args: argparse.Namespace, pack: Any, steps: int, threads: int,
                  fault: Optional[Union[FaultSpec, RegressionSpec]],
                  device_label: str, nproc: int = 1) -> dict:
    """The lane's receipt manifest (the module docstring): the pack's canary, seed and data
    seed, the lane's features and budget, and the recipe `harness replay` runs again."""
    import torch

    from .runs.runner import lane_features, torch_release

    # python: the interpreter, whose torch a replay of the receipt (`harness precision --pack`) must run again
    run_options = {"pack": os.path.basename(pack.path), "python": sys.executable, "device": args.device,
                   "precision": args.precision,
                   "steps": steps, "inject_fault": str(fault) if fault else None,
                   "deterministic": bool(args.deterministic), "threads": threads, "trace": args.trace,
                   **({"audit": True} if args.audit else {}), **({"compile": True} if args.compile else {}),
                   **({"layout": args.layout, "nproc": nproc} if args.layout else {}),
                   **({"versioned": True} if args.versioned else {})}
    device_type = args.device.partition(":")[0]
    features = "+".join(lane_features(torch.device(device_type), args.precision, args.compile, args.layout))
    budget = budget_features(device_type, args.precision, args.compile, args.layout)
    described = stack_options(pack.name, release=torch_release() if args.versioned else None, device=device_type,
                              precision=args.precision, compiled=args.compile, layout=args.layout)
    manifest = {
        "lane": stack_lane_name("torch-pack", described),
        "engine": "torch", "features": features,
        "budget_features": budget,
        "canary": pack.canary_json, "seed": pack.seed, "steps_planned": steps, "threads": threads,
        "data_seed": pack.data_seed, "pack": os.path.basename(pack.path), "trace": args.trace,
        "device": device_label, "precision": args.precision,
        "autocast": "bfloat16" if args.precision == "bf16" else "none",
        "fault_injection": str(fault) if fault else "none", "deterministic": int(bool(args.deterministic)),
        "pack_git_commit": pack.git_commit, "run_options": json.dumps(run_options, sort_keys=True),
    }
    if args.audit:  # only when on: the manifests of ordinary runs stay as they were
        manifest["audit"] = 1
    if args.compile:
        manifest["compile"] = "inductor"
    if args.layout:
        manifest["layout"], manifest["nproc"] = args.layout, nproc
    return manifest


def _device_label(torch, device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # what a distributed run's ranks are started with
    try:
        return run(args)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted: {args.out} keeps its finished steps (complete = 0)", file=sys.stderr)
        return 130
    except Exception as e:  # a failure during the run: one line, the receipt stays complete = 0
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"{PROG}: error: {type(e).__name__}: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
