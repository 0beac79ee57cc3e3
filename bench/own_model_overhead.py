#!/usr/bin/env python3
"""What recording costs a Python canary's step (docs/own-model.md, "Cost"): the example's
small GPT (examples/own-model/canary.py) trained twice side by side in this process, from
the same seed, in blocks of --block steps that take turns so that both see the same
machine load: a block bare (the team's own loop: batch(i), then step(model, optimizer,
batch, i)), a block through the harness's runner (canary_harness.runs.runner.ReceiptRun, as
`run` records: the batch hashed and checked, the digests taken at the end of
optimizer.step(), each row handed to the background writer that appends it to a
receipt), timed until its last row is written, so that no recording work runs during a
bare block. After the warm-up, each round's recorded block is set against the same
round's bare block: the median and quartiles of those per-round overheads are the paired
figure; the ratio of the medians is printed beside it.

Usage:
    /usr/bin/python3 bench/own_model_overhead.py [--canary FILE.py:NAME | --pack PACK.h5] [--rounds 200]
        [--warmup 16] [--block 8] [--threads 1] [--writers auto[,LIBRARY]] [--json FILE]

--pack measures the built-in canary's PyTorch lane (canary_harness.lane) the same way:
the lane's canary runs through the same runner.

The recorded copy digests through the digest library next to `harness` (HARNESS_BIN, else
build/bin/harness) where it is found; CANARY_HARNESS_DIGEST=python measures the numpy
digest. --writers names the receipt writers to record with (CANARY_HARNESS_WRITER's
settings: "auto", the writer library the package finds; a path, that library: two builds
compared), each a recorded copy of its own taking turns with the bare one in the same rounds. Rounds past the canary's steps start its schedule again (step i mod steps). A
canary's held-out evaluation (eval_batch) is left out of the recorded copy: it runs
between steps, not in one, and the bare loop runs none. The receipt is written in a
temporary directory, removed however the bench ends. This is a benchmark, not a test: the
numbers depend on the machine and its load (printed).
"""

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, os.pardir))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("HARNESS_BIN", os.path.join(ROOT, "build", "bin", "harness"))


def pack_lane_canary(path: str):
    """The PyTorch lane's canary of a pack, as `python3 -m canary_harness.lane` runs it (fp32, CPU)."""
    from canary_harness.runs.pack_step import architecture_module, load_pack, pack_canary
    from canary_harness.runs.optim import CanaryAdamW

    pack = load_pack(path)
    architecture = architecture_module(pack)
    cfg = architecture.config_class.from_json(pack.canary_json)
    model = architecture.model_class(cfg, pack.init)
    return pack_canary(pack, architecture, cfg, model, CanaryAdamW(model.named_parameters(), cfg), pack.steps)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--canary", default=os.path.join(ROOT, "examples", "own-model", "canary.py") + ":canary")
    ap.add_argument("--pack", help="a canary pack (harness export): measure the built-in canary's PyTorch lane instead")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--block", type=int, default=8, help="steps of one kind in a row (a round: a block of each)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--writers", default="auto",
                    help="receipt writers to record with, comma-separated (CANARY_HARNESS_WRITER settings: "
                         "auto, or a library's path)")
    ap.add_argument("--json", help="write the numbers here too")
    return ap.parse_args(argv)


def without_held_out(loaded: Any) -> Any:
    """`loaded` with no held-out evaluation. The bench times a step's recording: an
    evaluation runs between steps, not in one, and the bare loop runs none. Kept, it would
    also run again each time the bench's schedule wraps (step i mod steps) and declare the
    receipt's /eval a second time."""
    return dataclasses.replace(loaded, canary=dataclasses.replace(
        loaded.canary, eval_batch=None, eval_every=0, eval_logits=None, eval_targets=None))


def measure(args: argparse.Namespace, bare: Any, recorded: Dict[str, Any], work: str) -> Dict[str, List[float]]:
    """Seconds per step of each block after the warm-up, {"bare": [...], WRITER: [...]}:
    `bare` trained by its own loop, each of `recorded` through the runner into a receipt in
    `work` written by its writer (a CANARY_HARNESS_WRITER setting)."""
    import torch

    from canary_harness.receipts.receipt_native import ENV
    from canary_harness.runs.runner import ReceiptRun, RunOptions

    steps = bare.canary.steps
    blocks = (args.warmup + args.rounds + args.block - 1) // args.block
    runs = {}
    setting = os.environ.get(ENV)
    try:
        for i, (writer, loaded) in enumerate(recorded.items()):
            os.environ[ENV] = writer  # read when the run's receipt is created
            options = RunOptions(out=os.path.join(work, f"writer-{i}.h5"), threads=args.threads,
                                 steps=blocks * args.block)
            runs[writer] = ReceiptRun(without_held_out(loaded), options, torch.device("cpu"), options.steps)
    finally:  # the caller's setting back (the bench may run inside a test process)
        if setting is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = setting

    def bare_block(first: int) -> float:
        start = time.perf_counter()
        c = bare.canary
        for i in range(first, first + args.block):
            c.step(c.model, c.optimizer, c.batch(i % steps), i % steps)
        return (time.perf_counter() - start) / args.block

    def recorded_block(run: Any, first: int) -> float:
        start = time.perf_counter()
        for i in range(first, first + args.block):
            run.step(i % steps)  # the runner's step: run, digest, its row handed to the background writer
        run.rows.wait()  # the last row written too: no background work of a block overlaps a bare block
        return (time.perf_counter() - start) / args.block

    blocks_of = [("bare", bare_block)] + [(w, lambda first, run=run: recorded_block(run, first)) for w, run in runs.items()]
    times: Dict[str, List[float]] = {name: [] for name, _ in blocks_of}
    try:
        for b in range(blocks):
            shift = b % len(blocks_of)  # the order rotates: no side always follows another
            for name, block in blocks_of[shift:] + blocks_of[:shift]:
                seconds = block(b * args.block)
                if b * args.block >= args.warmup:
                    times[name].append(seconds)
        for run in runs.values():
            run.finish()
    except BaseException as error:
        for run in runs.values():
            run.abandon(error)  # the receipt closed: its directory can go
        raise
    finally:
        for run in runs.values():
            run.loop.close()
    return times


def summary(args: argparse.Namespace, times: Dict[str, List[float]], implementation: str) -> Dict[str, Any]:
    import torch

    bare = statistics.median(times["bare"])
    writers = {}
    for writer, seconds in times.items():
        if writer == "bare":
            continue
        paired = sorted(r / b - 1 for r, b in zip(seconds, times["bare"]))
        writers[writer] = {
            "recorded_ms": 1e3 * statistics.median(seconds),
            "ratio_of_medians_pct": 100 * (statistics.median(seconds) / bare - 1),
            "paired_median_pct": 100 * statistics.median(paired),
            "paired_quartiles_pct": [100 * paired[len(paired) // 4], 100 * paired[(3 * len(paired)) // 4]],
        }
    return {
        "canary": args.canary, "rounds": args.rounds, "threads": args.threads, "digest": implementation,
        "bare_ms": 1e3 * bare, "writers": writers,
        "torch": torch.__version__, "cpu": platform.processor() or platform.machine(), "load": os.getloadavg(),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)

    import torch

    from canary_harness.runs.canary import load_canary
    from canary_harness.receipts.digest_plan import DigestPlan

    torch.set_num_threads(args.threads)
    load = (lambda: pack_lane_canary(args.pack)) if args.pack else (lambda: load_canary(args.canary))
    writers = [w.strip() for w in args.writers.split(",") if w.strip()]
    bare, recorded = load(), {writer: load() for writer in writers}
    if args.pack:
        args.canary = f"{args.pack} (the PyTorch lane)"
    implementation = DigestPlan([1], [1], [True]).implementation
    with tempfile.TemporaryDirectory(prefix="own-model-overhead-") as work:  # removed however the bench ends
        times = measure(args, bare, recorded, work)
    result = summary(args, times, implementation)
    print(f"canary      {args.canary} ({args.threads} thread(s), {args.rounds} rounds, digest {implementation})")
    print(f"bare        {result['bare_ms']:.2f} ms/step (median)")
    for writer, w in result["writers"].items():
        print(f"recorded    {w['recorded_ms']:.2f} ms/step (median), writer {writer}: overhead "
              f"{w['paired_median_pct']:+.1f}% paired median (quartiles {w['paired_quartiles_pct'][0]:+.1f}% .. "
              f"{w['paired_quartiles_pct'][1]:+.1f}%), {w['ratio_of_medians_pct']:+.1f}% ratio of medians")
    print(f"machine     torch {torch.__version__}, load {result['load'][0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
