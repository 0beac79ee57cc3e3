"""The PyTorch canary lane: `python3 -m canary_harness.lane --pack PACK.h5 --out R.h5`.

Trains the canary of a pack (`harness export`) from the pack's own initial parameters and
batches with the package's PyTorch model of the canary's architecture (the canary JSON's
`architecture` key: gpt2, canary_harness.models.gpt2, where the key is absent; llama,
canary_harness.models.llama), the canary's exact
schedule, clipping and AdamW in the XLA-safe pattern (canary_harness.optim), on CPU, CUDA
or an XLA device, in fp32 or under bf16 autocast. The pack's canary runs through the
runner that runs a team's Python canaries (canary_harness.runner: one loop, one digest
path), into a receipt that the C++ harness judges like its own:

    engine          torch
    lane            <canary>/torch (fp32) or <canary>/torch+bf16
    budget_features torch-<device> for fp32 (torch-cpu on CPU), torch-bf16 for bf16 on CPU,
                    torch-<device>+torch-bf16 for bf16 elsewhere

`--trace ops` adds op traces (/trace) from module hooks (canary_harness.trace), in the C++
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
from typing import Any, List, NoReturn, Optional, Tuple, Union

from .faults import FaultSpec, nudge_first_result, parse_fault
from .regressions import RegressionSpec, is_regression, parse_regression
from .usage import UsageError, count_flag, all_digits  # noqa: F401 (UsageError: the CLI modules import it here)
from .architectures import Architecture, architecture_of, model_of
from .budget_features import format_features
from .lane_stacks import budget_features as stack_budget_features, lane_name as stack_lane_name, stack_options

PROG = "canary_harness.lane"
# torch CPU threads: 1..MAX_THREADS, the harness's bound (run::kMaxThreads); a torch lane
# pins a count (its CPU kernels' bits depend on it), so there is no "0 = all cores".
MAX_THREADS = 1024
# What a run records beside its metrics: the harness's levels (run::TraceLevel); a replay
# takes "aten" instead of "ops" (canary_harness.replay).
TRACE_LEVELS = ("none", "ops")


def trace_problem(level: str, levels: Tuple[str, ...] = TRACE_LEVELS, where: str = "--trace") -> Optional[str]:
    """None when `level` is one of `levels`, else the harness's one-line refusal of it."""
    return None if level in levels else f"{where}: '{level}' is not a trace level; use {' or '.join(levels)}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own errors: one line too
        print(f"{PROG}: error: {message} (see `python3 -m {PROG} --help`)", file=sys.stderr)
        sys.exit(2)


def add_layout_arguments(ap: Any) -> None:
    """--layout and --nproc, as `canary_harness run` and `canary_harness.lane` take them."""
    ap.add_argument("--layout", help="ddp or fsdp: train on --nproc processes over gloo (DistributedDataParallel, or "
                                     "FSDP2's fully_shard on torch 2.6 on), rank 0 writing the receipt: lane "
                                     "+ddp (+fsdp), budget feature torch-ddp (torch-fsdp) (docs/own-model.md)")
    ap.add_argument("--nproc", help="processes (ranks) of --layout, 2..16 (default 2); each step's batch is split "
                                    "among them by rows")


def add_device_arguments(ap: Any) -> None:
    """--device and --compile-cache, as `canary_harness run` and `canary_harness.lane` take them."""
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N or xla (torch_xla: a TPU where "
                                                    "there is one, XLA's CPU client otherwise; docs/xla.md)")
    ap.add_argument("--compile-cache", help="DIR: XLA's persistent compile cache (--device xla): a later run of the "
                                            "same graphs loads them from DIR instead of compiling")


def check_device_name(name: str) -> None:
    if not (name in ("cpu", "cuda", "xla") or (name.startswith("cuda:") and all_digits(name[5:]))):
        raise UsageError(f"--device: unknown device '{name}'; use cpu, cuda, cuda:N or xla")


def device_of(name: str, compile_cache: Optional[str] = None, deterministic: bool = False) -> Any:
    """The torch device --device names, UsageError where it cannot be had here (no CUDA,
    no torch_xla); on XLA with XLA's persistent compile cache in --compile-cache."""
    import torch

    check_device_name(name)
    if compile_cache is not None and name != "xla":
        raise UsageError(f"--compile-cache: only --device xla has a persistent compile cache (--device {name})")
    if name == "xla":
        from .xla import XlaUnavailable, xla_device

        try:
            return xla_device(compile_cache)
        except XlaUnavailable as e:
            raise UsageError(f"--device xla: {e}") from None
        except OSError as e:
            raise UsageError(f"--compile-cache: cannot use '{compile_cache}' ({e.strerror or e})") from None
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError(f"--device {name}: no CUDA device (torch.cuda.is_available() is False)")
        if deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    device = torch.device(name)
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(f"--device {name}: there are {torch.cuda.device_count()} CUDA devices")
    return device


def add_versioned_argument(ap: Any) -> None:
    """--versioned, as `canary_harness run` and `canary_harness.lane` take it (torch_release)."""
    ap.add_argument("--versioned", action="store_true",
                    help="name the lane after torch's release too, NAME/torch@MAJOR.MINOR (a nightly lane that runs "
                         "another interpreter's torch beside Debian's, with a golden of its own)")


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


def check_out(path: str, force: bool) -> None:
    if not path:
        raise UsageError("--out: empty path; give the receipt's file path (.h5)")
    if os.path.isdir(path):
        raise UsageError(f"--out: '{path}' is a directory; give a file path")
    if os.path.lexists(path) and not force:
        raise UsageError(f"--out: '{path}' exists; pass --force to overwrite it or choose another path")
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise UsageError(f"--out: directory '{directory}' does not exist; create it first")
    if not os.access(directory, os.W_OK):
        raise UsageError(f"--out: directory '{directory}' is not writable; choose another path")


def parse_lane_fault(text: str, op_names: List[str], parameters: List[str], steps: int) -> Any:
    """--inject-fault of a pack's lane (this one, the JAX lane): a nudge of an op's output
    (step=K,op=NAME[,ulps=N]: a FaultSpec) or a regression of `harness power` (kind=...: a
    RegressionSpec on one of `parameters`, the canary's tensor names); UsageError, one line,
    for anything else."""
    if is_regression(text):
        return parse_regression(text, list(parameters), steps)
    return parse_fault(text, op_names, steps)


def budget_features(device_type: str, precision: str, compiled: bool = False, layout: Optional[str] = None) -> str:
    """What separates the lane from cpu-ref (its stack's description, lane_stacks.py): the
    device's torch, bf16, torch.compile and the distributed layout."""
    options = stack_options("", device=device_type, precision=precision, compiled=compiled, layout=layout)
    return format_features(stack_budget_features("torch-pack", options))


def run(args: argparse.Namespace) -> int:
    from .pack import PackError  # numpy/h5py only: a bad pack is named before torch loads

    if args.precision not in ("fp32", "bf16"):
        raise UsageError(f"--precision: unknown precision '{args.precision}'; use fp32 or bf16")
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
    from .distributed import fsdp_available, launch, layout_processes, rank_from_env

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
    from .distributed import join, leave

    join(rank)
    try:
        return _run_lane(args, pack, steps, threads, rank)
    finally:
        leave()


def _run_lane(args: argparse.Namespace, pack: Any, steps: int, threads: int, rank: Any) -> int:
    """The lane in this process: the whole run, or one rank of a distributed one."""
    import torch

    device_name = args.device
    model_module = architecture_module(pack)
    try:
        cfg = model_module.config_class.from_json(pack.canary_json)
    except ValueError as e:
        raise UsageError(f"{pack.path}: {e}") from None
    fault = parse_lane_fault(args.inject_fault, model_module.forward_op_names(cfg), pack.tensor_names, steps) \
        if args.inject_fault is not None else None

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

    from .optim import CanaryAdamW
    from .runner import RunOptions, run_canary

    model = model_module.model_class(cfg, pack.init, device=device)
    loaded = pack_canary(pack, model_module, cfg, model, CanaryAdamW(model.named_parameters(), cfg), steps)
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
    from .receipt import ReceiptReader
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

    from .runner import lane_features, torch_release

    run_options = {"pack": os.path.basename(pack.path), "device": args.device, "precision": args.precision,
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


def pack_canary(pack: Any, architecture: "Architecture", cfg: Any, model: Any, optimizer: Any, steps: int):
    """The pack's canary as the runner runs it (canary_harness.runner): its batches are the
    pack's int32 tokens (the C++ engines' data contract), its step the lane's (lane_step)."""
    import numpy as np
    import torch

    from .canary import Canary, LoadedCanary

    def batch(i: int) -> Any:
        return torch.from_numpy(np.ascontiguousarray(pack.batch(i)))

    def step(model: Any, optimizer: Any, tokens: Any, i: int) -> Tuple[Any, Any]:
        return lane_step(model, optimizer, tokens, i, architecture, cfg)

    held_out = pack.held_out
    evaluation = {}
    if held_out is not None:  # docs/logit-kl.md: the logits the loss reads (the model's LOGITS_OP)
        tokens = torch.from_numpy(np.ascontiguousarray(held_out.tokens))
        evaluation = dict(eval_batch=tokens, eval_every=held_out.every, eval_rows=held_out.rows,
                          eval_logits=held_out_logits, eval_targets=tokens[:, 1:])
    canary = Canary(name=pack.name, model=model, optimizer=optimizer, batch=batch, step=step, steps=steps,
                    seed=pack.seed, **evaluation)
    names = list(pack.tensor_names)
    return LoadedCanary(canary, f"{pack.path} (pack)", os.path.abspath(pack.path), "", pack.seed, names,
                        {n: tuple(pack.init[n].shape) for n in names}, token_batches=True)


def held_out_logits(model: Any, tokens: Any) -> Any:
    """The (B, T, V) logits of the model's forward on `tokens`: its LOGITS_OP's output."""
    core = getattr(model, "module", model)  # --layout ddp wraps it
    seen = []

    def keep(op: str, out: Any) -> Any:
        if op == core.LOGITS_OP:
            seen.append(out)
        return out

    model(tokens, keep)
    return seen[-1]


def lane_step(model: Any, optimizer: Any, tokens: Any, step: int, architecture: "Architecture", cfg: Any,
              autocast: Any = None) -> Tuple[Any, Any]:
    """Step `step` of the lane on tokens already on the device: the schedule's lr set, then
    train_step (autocast around the forward when given). Returns the loss and the norm
    before clipping as device tensors."""
    optimizer.set_lr(architecture.lr_at(step, cfg))
    return train_step(model, optimizer, tokens, autocast)


class CanaryStep:
    """The lane's training step: `step(i)` trains on the pack's batch i exactly as the lane
    does, and returns (loss, norm, lr, tokens): the loss and the norm before clipping as
    device tensors (nothing read to the host), the step's fp32 lr, the batch's int32 tokens.

    Made from a pack (canary_harness.pack.CanaryPack) and its config on `device`, with the
    lane's bf16 autocast (`autocast`: a torch.autocast, or None for fp32) and fault (a
    FaultSpec or None: a forward hook on the op's module, registered here, before any hook a
    Recorder's op tracer adds). `model` is the pack's architecture's module (GPT2 or Llama,
    picked by the canary JSON's `architecture` key) and `optimizer` the lane's CanaryAdamW.

    The step is XLA-safe: `python3 -m canary_harness.audit` finds it clean (the audit case
    python/tests/audit_cases/canary_lane.py: `CanaryStep.from_pack(path)`).
    """

    def __init__(self, pack, cfg, device="cpu", autocast=None, fault: Optional[FaultSpec] = None):
        import torch

        from .optim import CanaryAdamW

        self.pack, self.cfg, self.autocast, self.fault = pack, cfg, autocast, fault
        self.architecture = architecture_module(pack)
        self.device = torch.device(device) if isinstance(device, str) else device
        self.model = self.architecture.model_class(cfg, pack.init, device=self.device)
        self.optimizer = CanaryAdamW(self.model.named_parameters(), cfg)
        self.active = torch.zeros((), dtype=torch.bool, device=self.device)  # the fault's step, filled in place
        if fault is not None:
            # The op's module is the op (its path is the op's name); registered before the op
            # tracer's hooks, so a trace sees the nudged output, what the next op reads.
            active, ulps = self.active, fault.ulps
            self.model.get_submodule(fault.op).register_forward_hook(
                lambda module, args, out: nudge_first_result(out, active, ulps))

    @classmethod
    def from_pack(cls, path: str, device: str = "cpu", precision: str = "fp32",
                  inject_fault: Optional[str] = None) -> "CanaryStep":
        """The lane's step for a pack file, as `--pack PATH --device D --precision P
        [--inject-fault SPEC]` runs it (bad values are UsageErrors, one line)."""
        import torch

        from .pack import PackError

        if precision not in ("fp32", "bf16"):
            raise UsageError(f"precision: unknown precision '{precision}'; use fp32 or bf16")
        try:
            pack = load_pack(path)
        except PackError as e:
            raise UsageError(str(e)) from None
        model_module = architecture_module(pack)
        try:
            cfg = model_module.config_class.from_json(pack.canary_json)
        except ValueError as e:
            raise UsageError(f"{pack.path}: {e}") from None
        fault = parse_fault(inject_fault, model_module.forward_op_names(cfg), pack.steps) \
            if inject_fault is not None else None
        autocast = torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16) \
            if precision == "bf16" else None
        return cls(pack, cfg, device, autocast, fault)

    def __call__(self, step: int):
        import numpy as np
        import torch

        tokens = self.pack.batch(step)
        if self.fault is not None:
            self.active.copy_(torch.tensor(step == self.fault.step))  # data, not a constant of the graph
        inputs = torch.from_numpy(np.ascontiguousarray(tokens)).to(self.device)
        loss, norm = lane_step(self.model, self.optimizer, inputs, step, self.architecture, self.cfg, self.autocast)
        return loss, norm, self.optimizer.param_groups[0]["lr"], tokens


def train_step(model, optimizer, inputs, autocast=None, hook=None):
    """One step of the canary on the device, with no host read: forward (under autocast
    when given), backward, the global norm, the clip, the AdamW update. optimizer.set_lr()
    comes first. Returns the loss and the norm before clipping as device tensors."""
    import torch

    from .optim import clip_grads_, global_grad_norm

    core = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model  # --layout ddp
    params = list(model.parameters())
    for p in params:
        p.grad = None
    if autocast is not None:
        with autocast:
            loss = model(inputs, hook)
    else:
        loss = model(inputs, hook)
    loss.backward()
    grads = [p.grad for p in params]
    norm = global_grad_norm(grads)
    clip_grads_(grads, norm, core.cfg.max_grad_norm)
    optimizer.step()
    return loss, norm


# ---- architectures: the canary JSON's `architecture` key picks the model -----------------------

def architecture_module(pack_or_canary: Any) -> Architecture:
    """The model of a pack's (or a canary JSON's) architecture; another architecture is a UsageError."""
    canary = getattr(pack_or_canary, "canary", pack_or_canary)
    try:
        return model_of(architecture_of(canary))
    except ValueError as e:
        raise UsageError(str(e)) from None


def load_pack(path: str, canary: Optional[str] = None):
    """A pack of any architecture the lane runs, read and checked in full by
    canary_harness.pack.read_pack (a PackError, one line starting with the path, where it
    is damaged or does not fit)."""
    from .pack import read_pack

    return read_pack(path, canary=canary)


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
