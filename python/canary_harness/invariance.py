"""`python3 -m canary_harness.invariance --pack PACK.h5`: batch invariance of the PyTorch lane
(docs/invariance.md), as `harness invariance` checks the harness's engines.

One sequence (batch 0's first row of the pack) runs forward alone, then at a row drawn by
Philox from --position-seed (the C++ draw: the same rows for the same seed) of batches of
2..N whose other rows are the pack's next rows. Every op's output rows for the sequence
(its forward hooks, by the C++ op names; the ops whose output's leading dimension is the
batch) are compared bit for bit with the sequence alone, in op order: the first that
differs names the op that breaks invariance. Each token's log-probability of its target is
the log-softmax of the logits in float64.

`python3 -m canary_harness.invariance FILE.py:NAME` checks a team's own Python canary the
same way (check_canary_invariance): the rows are batch(0)'s, then batch(1)'s, ... (every
tensor of the batch tree split along its shared leading size), the model's forward runs in
eval mode (dropout off) under no_grad, and every module's output (its named_modules name;
a tuple or ModelOutput by its tensors) is compared in the order the modules returned.

Exit status: 0 bitwise for every batch size, 1 a size breaks it, 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any, Callable, Dict, List, NoReturn, Optional, Tuple

import numpy as np

from .runs.canary import call_model, load_canary
from .cli.lane_args import MAX_THREADS, add_device_arguments, check_device_name, device_of
from .cli.lane_stacks import lane_name, stack_options
from .runs.pack_step import architecture_module, load_pack
from .cli.usage import UsageError
from .receipts.philox import philox_at, stream_id

PROG = "canary_harness.invariance"
POSITION_STREAM = stream_id("invariance/position")  # harness/run/invariance.cpp draws from the same stream


def position_of(position_seed: int, batch: int) -> int:
    """The sequence's row in a batch of `batch`: the C++ draw, word 0 of Philox modulo the size."""
    return int(philox_at(position_seed, POSITION_STREAM, batch)[0]) % batch


def batch_rows(sequence: np.ndarray, others: List[np.ndarray], batch: int, position: int) -> np.ndarray:
    """(batch, T+1): the sequence at `position`, the other rows in order around it."""
    rest = iter(others)
    return np.stack([sequence if r == position else next(rest) for r in range(batch)])


def _sequence_outputs(model: Any, tokens: Any, position: int, precision: str) -> Dict[str, Any]:
    """{op: the sequence's rows of its output} for every op whose output leads with the batch."""
    import torch

    batch = int(tokens.shape[0])
    rows: Dict[str, Any] = {}

    def keep(op: str, out: Any) -> Any:
        if isinstance(out, torch.Tensor) and out.dim() > 0 and out.shape[0] == batch:
            rows[op] = out[position].detach().float().cpu().clone()
        return out

    with torch.no_grad():
        if precision == "bf16":
            with torch.autocast(device_type=tokens.device.type, dtype=torch.bfloat16):
                model(tokens, hook=keep)
        else:
            model(tokens, hook=keep)
    return rows


def _target_logprobs(logits: Any, sequence: np.ndarray) -> np.ndarray:
    import torch

    lp = torch.log_softmax(logits.double(), dim=-1)
    targets = torch.as_tensor(sequence[1:].astype(np.int64))
    return lp.gather(-1, targets[:, None])[:, 0].numpy()


def check_batch_invariance(model: Any, sequence: np.ndarray, others: List[np.ndarray], max_batch: int,
                           position_seed: int = 0, precision: str = "fp32") -> Dict[str, Any]:
    """The report `harness invariance --json` gives, for a canary module (forward(tokens, hook))."""
    import torch

    if len(others) < max_batch - 1:
        raise ValueError(f"a batch of {max_batch} needs {max_batch - 1} other sequences; {len(others)} given")
    device = next(model.parameters()).device
    run = lambda rows, p: _sequence_outputs(model, torch.as_tensor(rows, device=device), p, precision)  # noqa: E731
    alone = run(sequence[None, :], 0)
    logits_op = model.LOGITS_OP
    checks = []
    for batch in range(2, max_batch + 1):
        position = position_of(position_seed, batch)
        out = run(batch_rows(sequence, others, batch, position), position)
        # The ops whose output leads with the batch in both runs (a broadcast (1, T, C) output
        # leads with 1 alone too, and is no row of the sequence's).
        ops = [op for op in model.op_names() if op in alone and op in out]
        first = next((op for op in ops if not torch.equal(out[op], alone[op])), None)
        delta = np.abs(_target_logprobs(out[logits_op], sequence) - _target_logprobs(alone[logits_op], sequence))
        checks.append({"batch_size": batch, "position": position, "bitwise": first is None,
                       "max_logprob_delta": float(delta.max()), "first_op": first})
    broken = [c["batch_size"] for c in checks if not c["bitwise"]]
    return {"sequence_tokens": int(sequence.shape[0]) - 1, "invariant": not broken,
            "smallest_breaking_batch": broken[0] if broken else None, "checks": checks}


Key = Tuple[str, int, str]  # (module's named_modules name, its k-th call, the output leaf's path)
MODEL = "(model)"  # how the root module (named "" by named_modules) is reported


def _leaves(tree: Any, path: str = "") -> List[Tuple[str, Any]]:
    """(path, value) of every leaf of a tree of dicts (ModelOutput included), tuples and lists."""
    if isinstance(tree, dict):
        return [leaf for k, v in tree.items() for leaf in _leaves(v, f"{path}[{k!r}]")]
    if isinstance(tree, (tuple, list)):
        return [leaf for i, v in enumerate(tree) for leaf in _leaves(v, f"{path}[{i}]")]
    return [(path, tree)]


def _rebuild(tree: Any, leaf: Callable[[Any], Any]) -> Any:
    """The tree with `leaf` applied to each leaf, containers kept (a namedtuple included)."""
    if isinstance(tree, dict):
        return {k: _rebuild(v, leaf) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        items = [_rebuild(v, leaf) for v in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    return leaf(tree)


def _tensor_rows(tree: Any, where: str) -> List[Any]:
    """A batch tree split into one tree per row. The rows are what the data says: every
    tensor leaf leads with the same size B (no name is read); a leaf that is no tensor, a
    0-D tensor or a leaf of another leading size is a ValueError naming them."""
    import torch

    sizes: Dict[str, int] = {}
    for path, leaf in _leaves(tree):
        if not isinstance(leaf, torch.Tensor):
            raise ValueError(f"{where}{path} is a {type(leaf).__name__}: a batch is a tree of tensors split into rows")
        if leaf.dim() == 0:
            raise ValueError(f"{where}{path} is a 0-D tensor: every tensor of a batch leads with its rows")
        sizes[path or "(the tensor)"] = int(leaf.shape[0])
    if len(set(sizes.values())) != 1:
        told = ", ".join(f"{path} {size}" for path, size in sizes.items())
        raise ValueError(f"{where}: its tensors disagree on the leading (batch) size ({told}); every tensor of a "
                         "batch leads with its rows")
    return [_rebuild(tree, lambda t, r=r: t[r:r + 1]) for r in range(next(iter(sizes.values())))]


def _stack_rows(rows: List[Any]) -> Any:
    """The batch tree of these rows (each leaf concatenated along its leading dimension)."""
    import torch

    first = rows[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(rows)
    if isinstance(first, dict):
        return {k: _stack_rows([r[k] for r in rows]) for k in first}
    items = [_stack_rows([r[i] for r in rows]) for i in range(len(first))]
    return type(first)(*items) if hasattr(first, "_fields") else type(first)(items)


def _canary_rows(canary: Any, max_batch: int) -> List[Any]:
    """batch(0)'s rows, then batch(1)'s, ... until there are max_batch of them."""
    rows: List[Any] = []
    for i in range(canary.steps):
        rows += _tensor_rows(canary.batch(i), f"batch({i})")
        if len(rows) >= max_batch:
            return rows[:max_batch]
    raise ValueError(f"--max-batch: the canary's batches hold {len(rows)} rows, fewer than {max_batch}")


def _logits_of(out: Any) -> Any:
    """The model output's logits: its `logits` field, or the output itself when it is a
    tensor; None otherwise (a model that returns only its loss has none to read)."""
    if isinstance(out, dict):
        return out.get("logits")
    return out if hasattr(out, "dim") else getattr(out, "logits", None)


def _forward_rows(model: Any, tree: Any, batch: int, position: int,
                  precision: str) -> Tuple[Dict[Key, Any], Optional[Any]]:
    """One forward of the model on `tree` (call_model, no grad): {(module, call, leaf): the
    sequence's row} for every tensor a module output whose leading size is the batch, in
    the order the modules returned; and the sequence's row of the logits, if any."""
    import torch

    rows: Dict[Key, Any] = {}
    calls: Counter = Counter()

    def keep(name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any, out: Any) -> None:
            call = calls[name]
            calls[name] += 1
            for path, leaf in _leaves(out):
                if isinstance(leaf, torch.Tensor) and leaf.dim() > 0 and leaf.shape[0] == batch:
                    rows[(name or MODEL, call, path)] = leaf[position].detach().cpu().clone()
        return hook

    handles = [m.register_forward_hook(keep(n)) for n, m in model.named_modules()]
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = call_model(model, tree)
    finally:
        for h in handles:
            h.remove()
    logits = _logits_of(out)
    usable = isinstance(logits, torch.Tensor) and logits.dim() > 1 and logits.shape[0] == batch
    return rows, logits[position].detach().cpu() if usable else None


def _logprob_delta(alone: Any, out: Any) -> Optional[float]:
    """max |d log p| over every class of the sequence's logits; None without logits."""
    import torch

    if alone is None or out is None or alone.shape != out.shape:
        return None
    return float((torch.log_softmax(out.double(), -1) - torch.log_softmax(alone.double(), -1)).abs().max())


def check_canary_invariance(canary: Any, max_batch: int, position_seed: int = 0,
                            precision: str = "fp32") -> Dict[str, Any]:
    """A Python canary's batch invariance: its model's forward (eval mode: dropout off;
    invariance is a property of the forward, not of dropout's draws), batch(0)'s first row
    alone and at a drawn row of batches of 2..max_batch, every module's output rows
    compared bit for bit in the order the modules returned. The model's train/eval flags
    are restored and its weights untouched."""
    import torch

    rows = _canary_rows(canary, max_batch)
    model = canary.model
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        def run(batch: int, position: int) -> Tuple[Dict[Key, Any], Optional[Any]]:
            others = iter(rows[1:])
            placed = [rows[0] if r == position else next(others) for r in range(batch)]
            return _forward_rows(model, _stack_rows(placed), batch, position, precision)

        alone, alone_logits = run(1, 0)
        if not alone:
            raise ValueError("no module's output leads with the batch dimension: nothing to compare row by row")
        checks = []
        for batch in range(2, max_batch + 1):
            position = position_of(position_seed, batch)
            out, logits = run(batch, position)
            # The outputs that lead with the batch in both runs (a broadcast (1, ...) output
            # leads with 1 alone too, and is no row of the sequence's), in the order alone.
            first = next((key for key in alone if key in out and not torch.equal(alone[key], out[key])), None)
            checks.append({"batch_size": batch, "position": position, "bitwise": first is None,
                           "max_logprob_delta": _logprob_delta(alone_logits, logits),
                           "first_op": first and first[0], "first_output": first and first[2]})
    finally:
        for m, training in modes.items():
            m.train(training)
    broken = [c["batch_size"] for c in checks if not c["bitwise"]]
    # outputs_compared: what "bitwise" covers (the module outputs that lead with the batch alone).
    return {"sequence_tokens": None, "forward": "eval mode, dropout off, no grad", "outputs_compared": len(alone),
            "invariant": not broken, "smallest_breaking_batch": broken[0] if broken else None, "checks": checks}


def _first_at(c: Dict[str, Any]) -> str:
    leaf = c.get("first_output")
    return f"first at op {c['first_op']}" + (f" (output {leaf})" if leaf else "")


def to_text(report: Dict[str, Any]) -> str:
    what = "one row" if report["sequence_tokens"] is None else f"one sequence of {report['sequence_tokens']} tokens"
    forward = f" (forward in {report['forward']}; {report['outputs_compared']} module outputs)" \
        if "forward" in report else ""
    lines = [f"invariance  {report['lane']}: {what} alone, then at a drawn row of batches of "
             f"2..{report['checks'][-1]['batch_size']}{forward}"]
    for c in report["checks"]:
        head = f"batch {c['batch_size']:>2} row {c['position']:>2}  "
        delta = c["max_logprob_delta"]
        moved = "" if delta is None else f"max |d log p| {delta:.3g}; "
        lines.append(head + ("bitwise" if c["bitwise"] else f"differs: {moved}{_first_at(c)}"))
    smallest = report["smallest_breaking_batch"]
    if smallest is None:
        lines.append("verdict     batch-invariant: bitwise for every batch size")
    else:
        first = _first_at(report["checks"][smallest - 2])
        lines.append(f"verdict     not batch-invariant: smallest breaking batch size {smallest}, {first}")
    return "\n".join(lines) + "\n"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"{PROG}: error: {message} (see `python3 -m {PROG} --help`)", file=sys.stderr)
        sys.exit(2)


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    ap = _Parser(prog=f"python3 -m {PROG}", description="Batch invariance of the PyTorch lane or of a Python "
                                                         "canary's forward (docs/invariance.md).")
    ap.add_argument("canary", nargs="?", help="FILE.py:NAME: a function in FILE.py returning canary_harness.Canary")
    ap.add_argument("--pack", help="the canary pack (`harness export --canary NAME --out PACK.h5`)")
    add_device_arguments(ap)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"), help="fp32 (default) or bf16 autocast")
    ap.add_argument("--max-batch", type=int, default=8, help="largest batch size (2..64, default 8)")
    ap.add_argument("--position-seed", type=int, default=0, help="draws the sequence's row in each batch")
    ap.add_argument("--threads", type=int, default=1, help=f"torch threads (1..{MAX_THREADS}, default 1)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    return ap.parse_args(argv)


def _check_counts(args: argparse.Namespace) -> None:
    if not 2 <= args.max_batch <= 64:
        raise UsageError(f"--max-batch: {args.max_batch} is not in 2..64")
    if not 1 <= args.threads <= MAX_THREADS:
        raise UsageError(f"--threads: {args.threads} is not in 1..{MAX_THREADS}")
    if not 0 <= args.position_seed < 2 ** 64:
        raise UsageError(f"--position-seed: {args.position_seed} is not in 0..2^64-1")
    if (args.pack is None) == (args.canary is None):
        raise UsageError("name one of --pack PACK.h5 or FILE.py:NAME")


def _pack_report(args: argparse.Namespace) -> Dict[str, Any]:
    import torch

    check_device_name(args.device)
    pack = load_pack(args.pack)
    architecture = architecture_module(pack)
    cfg = architecture.config_class.from_json(pack.canary_json)
    rows = [row for step in range(pack.steps) for row in pack.batch(step)][:args.max_batch]
    if len(rows) < args.max_batch:
        raise UsageError(f"--max-batch: {args.pack} holds {len(rows)} sequences, fewer than {args.max_batch}")
    torch.set_num_threads(args.threads)  # a CPU reduction's order, so the bits, depend on it
    device = device_of(args.device)
    model = architecture.model_class(cfg, pack.init, device=device)
    report = check_batch_invariance(model, rows[0], rows[1:], args.max_batch, args.position_seed, args.precision)
    return {"lane": lane_name("torch-pack", stack_options(pack.name, device="cpu", precision=args.precision)), **report}


def _canary_report(args: argparse.Namespace) -> Dict[str, Any]:
    import contextlib

    import torch

    if args.device != "cpu":
        raise UsageError(f"--device: a Python canary is checked on the CPU; '{args.device}' is for --pack")
    torch.set_num_threads(args.threads)  # a CPU reduction's order, so the bits, depend on it
    with contextlib.redirect_stdout(sys.stderr):  # a model that prints while it is built keeps stdout clean
        loaded = load_canary(args.canary)
    try:
        report = check_canary_invariance(loaded.canary, args.max_batch, args.position_seed, args.precision)
    except ValueError as e:
        raise UsageError(f"{args.canary}: {e}") from None
    return {"lane": lane_name("torch-canary", stack_options(loaded.canary.name, device="cpu", precision=args.precision)),
            **report}


def run(args: argparse.Namespace) -> int:
    _check_counts(args)
    report = _pack_report(args) if args.pack is not None else _canary_report(args)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else to_text(report), end="\n" if args.json else "")
    return 0 if report["invariant"] else 1


def main(argv: Optional[List[str]] = None) -> int:
    try:
        return run(parse_args(argv))
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:  # a damaged pack, a canary that cannot load: one line naming it
        print(f"{PROG}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # torch missing or failing: one line, never the "not invariant" exit 1
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"{PROG}: error: {type(e).__name__}: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
