#!/usr/bin/env python3
"""PyTorch timing of a canary's training step, from the canary's pack (fp32, CPU).

Times the PyTorch lane's own step (canary_harness.runs.pack_step.CanaryStep: forward, backward,
global-norm clip and AdamW, on the pack's initial parameters and batches) for any
architecture the lane runs, at each torch thread count, so that the harness's step on the
same canary can be set beside it in one run (bench/canary-step.sh does that for llama-tiny and moe-tiny).

Usage:
    /usr/bin/python3 bench/torch_canary_step.py --pack PACK.h5 [--steps 30] [--warmup 5]
        [--threads 1,2] [--json FILE] [--compare-ms X] [--memory]

This is a benchmark, not a test: numbers depend on the machine and its load.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "python"))

import torch  # noqa: E402

from canary_harness.runs.pack_step import CanaryStep  # noqa: E402


def time_steps(pack_path, threads, steps, warmup):
    """Median and fastest ms per training step at `threads` torch threads."""
    torch.set_num_threads(threads)
    step = CanaryStep.from_pack(pack_path)
    batches = step.pack.steps
    for s in range(warmup):
        step(s % batches)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        step((warmup + i) % batches)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times), step


def resident_mib():
    """This process's resident memory now (VmRSS), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def peak_resident_mib():
    """This process's peak resident memory so far (ru_maxrss: KiB on Linux), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv=None):
    ap = argparse.ArgumentParser(description="Time a canary's training step in PyTorch, from its pack.")
    ap.add_argument("--pack", required=True, help="the canary's pack (harness export)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps (median reported)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed warm-up steps")
    ap.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    ap.add_argument("--json", metavar="FILE", help="write results as JSON to FILE")
    ap.add_argument("--compare-ms", type=float, metavar="X", help="harness ms/step to compare with the best torch time")
    ap.add_argument("--memory", action="store_true",
                    help="report the process's peak resident memory, and its resident memory before the model was built")
    args = ap.parse_args(argv)
    try:
        thread_counts = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        ap.error(f"--threads: expected a list like 1,2, got {args.threads!r}")
    if not thread_counts or min(thread_counts) < 1:
        ap.error("--threads: thread counts must be >= 1")
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")

    baseline_mib = resident_mib() if args.memory else None  # torch imported, no model yet
    results = {}
    for t in thread_counts:
        med, lo, step = time_steps(args.pack, t, args.steps, args.warmup)
        if not results:
            c = step.cfg
            tokens_per_step = c.batch_size * c.context_length
            print(f"torch {torch.__version__}, {step.architecture.name} step of pack {os.path.basename(args.pack)} "
                  f"(B={c.batch_size} T={c.context_length}), fp32 CPU, {args.warmup} warm-up + {args.steps} "
                  f"timed steps, median")
            print(f"{'threads':>7}  {'ms/step':>9}  {'min ms':>9}  {'tokens/s':>10}")
        results[t] = med
        print(f"{t:>7}  {med:>9.3f}  {lo:>9.3f}  {tokens_per_step / (med / 1e3):>10.0f}")
    best_threads = min(results, key=results.get)
    best_ms = results[best_threads]
    print(f"best: {best_ms:.3f} ms/step at {best_threads} thread(s)")
    out = {"torch_version": torch.__version__, "threads": {str(t): ms for t, ms in results.items()},
           "best_ms": best_ms, "best_threads": best_threads, "steps": args.steps, "warmup": args.warmup}
    if args.memory:
        out["peak_rss_mib"], out["baseline_rss_mib"] = peak_resident_mib(), baseline_mib
        print(f"memory: peak resident {out['peak_rss_mib']:.0f} MiB, of which {baseline_mib:.0f} MiB before the "
              f"model (the torch runtime)")
    if args.compare_ms is not None:
        out["compare_ms"] = args.compare_ms
        out["ratio_harness_over_torch"] = args.compare_ms / best_ms
        print(f"harness {args.compare_ms:.3f} ms/step / torch best {best_ms:.3f} ms/step = "
              f"{out['ratio_harness_over_torch']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
