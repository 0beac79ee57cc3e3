#!/usr/bin/env python3
"""What work on another core costs a training step on this machine (docs/own-model.md, "Cost").

The recording's work that does not run on the training thread (a receipt row's HDF5
appends, or a digest handed to a worker) is free only where the other core is truly
independent. This benchmark trains the example's small GPT (examples/own-model/canary.py)
with one torch thread, in blocks of steps that take turns: in an "idle" block nothing
else runs; in a "busy" block each step wakes a separate process (its own GIL: nothing is
shared with the training process but the machine) that spins for --busy-ms, about what
a receipt row costs the writer. The medians of the two kinds of block, and their
difference, say what that much background work costs each step here.

Usage:
    /usr/bin/python3 bench/background_interference.py [--blocks 60] [--block 8] [--busy-ms 0.5] [--json FILE]

A benchmark, not a test: the numbers depend on the machine and its load (printed).
"""

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, os.pardir))
sys.path.insert(0, os.path.join(ROOT, "python"))


def spinner(conn: socket.socket, seconds: float) -> None:
    """The busy process: one spin of `seconds` per byte received, until the socket closes."""
    while conn.recv(1):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    os._exit(0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--canary", default=os.path.join(ROOT, "examples", "own-model", "canary.py") + ":canary")
    ap.add_argument("--blocks", type=int, default=60)
    ap.add_argument("--block", type=int, default=8, help="steps of one kind in a row")
    ap.add_argument("--busy-ms", type=float, default=0.5, help="the other process's work per step")
    ap.add_argument("--json", help="write the numbers here too")
    args = ap.parse_args()

    import torch

    from canary_harness.runs.canary import load_canary

    torch.set_num_threads(1)
    canary = load_canary(args.canary).canary
    ours, theirs = socket.socketpair()
    pid = os.fork()  # before any step: the child never touches torch
    if pid == 0:
        ours.close()
        spinner(theirs, args.busy_ms / 1e3)
    theirs.close()
    times = {"idle": [], "busy": []}
    for b in range(args.blocks):
        kind = "busy" if b % 2 else "idle"
        start = time.perf_counter()
        for j in range(args.block):
            i = (b * args.block + j) % canary.steps
            canary.step(canary.model, canary.optimizer, canary.batch(i), i)
            if kind == "busy":
                ours.send(b"x")
        if b >= 2:  # the first two blocks warm up
            times[kind].append((time.perf_counter() - start) / args.block)
    ours.close()
    os.waitpid(pid, 0)
    median = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    result = {"canary": args.canary, "busy_ms": args.busy_ms, "idle_step_ms": median["idle"],
              "busy_step_ms": median["busy"], "slowdown_ms": median["busy"] - median["idle"],
              "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
              "cores": os.cpu_count(), "load": os.getloadavg()}
    print(f"canary      {args.canary} (1 thread, {args.blocks} blocks of {args.block} steps)")
    print(f"idle        {median['idle']:.2f} ms/step (median of blocks)")
    print(f"busy        {median['busy']:.2f} ms/step, another process spinning {args.busy_ms} ms per step")
    print(f"slowdown    {result['slowdown_ms']:+.2f} ms/step")
    print(f"machine     torch {torch.__version__}, {os.cpu_count()} cores, load {result['load'][0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
