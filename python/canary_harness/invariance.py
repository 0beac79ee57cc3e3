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
    ops = [op for op in model.op_names() if op in alone]
    logits_op = model.LOGITS_OP
    checks = []
    for batch in range(2, max_batch + 1):
        position = position_of(position_seed, batch)
        out = run(batch_rows(sequence, others, batch, position), position)
        first = next((op for op in ops if op not in out or not torch.equal(out[op], alone[op])), None)
        delta = np.abs(_target_logprobs(out[logits_op], sequence) - _target_logprobs(alone[logits_op], sequence))
        checks.append({"batch_size": batch, "position": position, "bitwise": first is None,
                       "max_logprob_delta": float(delta.max()), "first_op": first})
    broken = [c["batch_size"] for c in checks if not c["bitwise"]]
    return {"sequence_tokens": int(sequence.shape[0]) - 1, "invariant": not broken,
            "smallest_breaking_batch": broken[0] if broken else None, "checks": checks}


def to_text(report: Dict[str, Any]) -> str:
    lines = [f"invariance  {report['lane']}: one sequence of {report['sequence_tokens']} tokens alone, then at a "
             f"drawn row of batches of 2..{report['checks'][-1]['batch_size']}"]
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


if __name__ == "__main__":
    sys.exit(main())
