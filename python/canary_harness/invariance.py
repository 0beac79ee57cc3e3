"""`python3 -m canary_harness.invariance --pack PACK.h5`: batch invariance of the PyTorch lane
(docs/invariance.md), as `harness invariance` checks the harness's engines.

One sequence (batch 0's first row of the pack) runs forward alone, then at a row drawn by
Philox from --position-seed (the C++ draw: the same rows for the same seed) of batches of
2..N whose other rows are the pack's next rows. Every op's output rows for the sequence
(its forward hooks, by the C++ op names; the ops whose output's leading dimension is the
batch) are compared bit for bit with the sequence alone, in op order: the first that
differs names the op that breaks invariance. Each token's log-probability of its target is
the log-softmax of the logits in float64.

Exit status: 0 bitwise for every batch size, 1 a size breaks it, 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, NoReturn, Optional

import numpy as np

from .lane import MAX_THREADS, UsageError, add_device_arguments, architecture_module, check_device_name, device_of, \
    load_pack
from .philox import philox_at, stream_id

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


def _tensor_rows(tree: Any, where: str) -> List[Any]:
    """A batch tree split into one tree per row: every tensor leaf along its leading dimension
    (all leaves must share it); anything else is a ValueError naming where it is."""
    import torch

    if isinstance(tree, torch.Tensor):
        if tree.dim() == 0:
            raise ValueError(f"{where} is a 0-D tensor: a batch's tensors lead with the batch dimension")
        return [tree[i:i + 1] for i in range(int(tree.shape[0]))]
    if isinstance(tree, (tuple, list)):
        parts = [_tensor_rows(item, f"{where}[{i}]") for i, item in enumerate(tree)]
    elif isinstance(tree, dict):
        parts = [_tensor_rows(tree[k], f"{where}[{k!r}]") for k in tree]
    else:
        raise ValueError(f"{where} is a {type(tree).__name__}: only tensors split into rows")
    if not parts or len({len(p) for p in parts}) != 1:
        raise ValueError(f"{where}: its tensors do not share one batch dimension")
    rebuild = (lambda xs: dict(zip(tree.keys(), xs))) if isinstance(tree, dict) else type(tree)
    return [rebuild([p[r] for p in parts]) for r in range(len(parts[0]))]


def _stack_rows(rows: List[Any]) -> Any:
    """The batch tree of these rows (each leaf concatenated along its leading dimension)."""
    import torch

    first = rows[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(rows)
    if isinstance(first, dict):
        return {k: _stack_rows([r[k] for r in rows]) for k in first}
    return type(first)(_stack_rows([r[i] for r in rows]) for i in range(len(first)))


def check_canary_invariance(canary: Any, max_batch: int, position_seed: int = 0,
                            precision: str = "fp32") -> Dict[str, Any]:
    """A Python canary's batch invariance: its step run on copies of its model and optimizer
    (the canary is never trained), the leaf modules' forward outputs compared row by row in
    call order. The sequence is batch(0)'s first row, the others the rows after it."""
    import copy

    import torch

    rows: List[Any] = []
    for i in range(canary.steps):
        rows += _tensor_rows(canary.batch(i), f"batch({i})")
        if len(rows) >= max_batch:
            break
    if len(rows) < max_batch:
        raise ValueError(f"--max-batch: the canary's batches hold {len(rows)} rows, fewer than {max_batch}")

    def run(batch: int, position: int) -> List[Any]:
        placed = [rows[0] if r == position else None for r in range(batch)]
        rest = iter(rows[1:])
        tree = _stack_rows([row if row is not None else next(rest) for row in placed])
        model, optimizer = copy.deepcopy((canary.model, canary.optimizer))
        calls: List[Any] = []

        def keep(name: str):
            def hook(module: Any, args: Any, out: Any) -> None:
                if isinstance(out, torch.Tensor) and out.dim() > 0 and out.shape[0] == batch:
                    calls.append((name, out[position].detach().float().cpu().clone()))
            return hook

        handles = [m.register_forward_hook(keep(n)) for n, m in model.named_modules()
                   if n and not any(True for _ in m.children())]
        try:
            if precision == "bf16":
                with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                    canary.step(model, optimizer, tree, 0)
            else:
                canary.step(model, optimizer, tree, 0)
        finally:
            for h in handles:
                h.remove()
        counted: Dict[Any, Any] = {}  # (module, its k-th call) -> the rows: a module may run twice
        for name, values in calls:
            counted[(name, sum(1 for key in counted if key[0] == name))] = values
        return counted

    alone = run(1, 0)
    if not alone:
        raise ValueError("no module's output leads with the batch dimension: nothing to compare row by row")
    checks = []
    for batch in range(2, max_batch + 1):
        position = position_of(position_seed, batch)
        out = run(batch, position)
        # The calls whose output leads with the batch in both runs, in the order they ran alone.
        shared = [key for key in alone if key in out]
        first = next((key[0] for key in shared if not torch.equal(alone[key], out[key])), None)
        last_key = shared[-1] if shared else None
        delta = 0.0
        if last_key is not None:
            last_alone, last = alone[last_key], out[last_key]
            moved = torch.log_softmax(last.double(), -1) - torch.log_softmax(last_alone.double(), -1)
            delta = float(moved.abs().max())
        checks.append({"batch_size": batch, "position": position, "bitwise": first is None,
                       "max_logprob_delta": delta, "first_op": first})
    broken = [c["batch_size"] for c in checks if not c["bitwise"]]
    return {"sequence_tokens": None, "invariant": not broken,
            "smallest_breaking_batch": broken[0] if broken else None, "checks": checks}


def to_text(report: Dict[str, Any]) -> str:
    what = "one row" if report["sequence_tokens"] is None else f"one sequence of {report['sequence_tokens']} tokens"
    lines = [f"invariance  {report['lane']}: {what} alone, then at a drawn row of batches of "
             f"2..{report['checks'][-1]['batch_size']}"]
    for c in report["checks"]:
        head = f"batch {c['batch_size']:>2} row {c['position']:>2}  "
        lines.append(head + ("bitwise" if c["bitwise"] else
                             f"differs: max |d log p| {c['max_logprob_delta']:.3g}; first at op {c['first_op']}"))
    smallest = report["smallest_breaking_batch"]
    if smallest is None:
        lines.append("verdict     batch-invariant: bitwise for every batch size")
    else:
        first = report["checks"][smallest - 2]["first_op"]
        lines.append(f"verdict     not batch-invariant: smallest breaking batch size {smallest}, first at op {first}")
    return "\n".join(lines) + "\n"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"{PROG}: error: {message} (see `python3 -m {PROG} --help`)", file=sys.stderr)
        sys.exit(2)


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    ap = _Parser(prog=f"python3 -m {PROG}", description="Batch invariance of the PyTorch lane (docs/invariance.md).")
    ap.add_argument("--pack", required=True, help="the canary pack (`harness export --canary NAME --out PACK.h5`)")
    add_device_arguments(ap)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"), help="fp32 (default) or bf16 autocast")
    ap.add_argument("--max-batch", type=int, default=8, help="largest batch size (2..64, default 8)")
    ap.add_argument("--position-seed", type=int, default=0, help="draws the sequence's row in each batch")
    ap.add_argument("--threads", type=int, default=1, help=f"torch threads (1..{MAX_THREADS}, default 1)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    return ap.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    import torch

    if not 2 <= args.max_batch <= 64:
        raise UsageError(f"--max-batch: {args.max_batch} is not in 2..64")
    if not 1 <= args.threads <= MAX_THREADS:
        raise UsageError(f"--threads: {args.threads} is not in 1..{MAX_THREADS}")
    if not 0 <= args.position_seed < 2 ** 64:
        raise UsageError(f"--position-seed: {args.position_seed} is not in 0..2^64-1")
    check_device_name(args.device)
    pack = load_pack(args.pack)
    architecture = architecture_module(pack)
    cfg = architecture.config_class.from_json(pack.canary_json)
    rows = [row for step in range(pack.steps) for row in pack.batch(step)][:args.max_batch]
    if len(rows) < args.max_batch:
        raise UsageError(f"--max-batch: {args.pack} holds {len(rows)} sequences, fewer than {args.max_batch}")
    torch.set_num_threads(args.threads)
    device = device_of(args.device)
    model = architecture.model_class(cfg, pack.init, device=device)
    report = check_batch_invariance(model, rows[0], rows[1:], args.max_batch, args.position_seed, args.precision)
    features = "" if args.precision == "fp32" else "+bf16"
    report = {"lane": f"{pack.name}/torch{features}", **report}
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else to_text(report), end="\n" if args.json else "")
    return 0 if report["invariant"] else 1


def main(argv: Optional[List[str]] = None) -> int:
    try:
        return run(parse_args(argv))
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:  # a damaged pack: one line naming it
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
