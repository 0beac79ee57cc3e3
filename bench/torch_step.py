#!/usr/bin/env python3
"""PyTorch reference timing of one `tiny` canary training step (fp32, CPU).

Times the same step the harness runs (forward + backward + global-norm clip + AdamW)
for the docs/design.md `tiny` preset (V=256, T=64, C=128, L=4, NH=4, B=8), using the twin's
model code (the package's python/canary_harness/models/gpt2.py, which the twin runs) with random init and random int tokens, at
torch thread counts 1 and 2. It gives a yardstick for the harness's own step time:
pass that with --compare-ms to print harness/torch.

Usage:
    /usr/bin/python3 bench/torch_step.py [--steps 30] [--warmup 5] [--threads 1,2]
        [--json FILE] [--compare-ms X]

This is a benchmark, not a test: numbers depend on the machine and its load.
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir, "python"))

import torch  # noqa: E402

from canary_harness.models import gpt2 as model  # noqa: E402


def time_steps(cfg, threads, steps, warmup, seed=0):
    """Median ms per training step at `threads` torch threads."""
    torch.set_num_threads(threads)
    params = model.random_init(cfg, seed)
    opt = model.AdamW(params, cfg)
    g = torch.Generator().manual_seed(seed + 1)
    # a small pool of random batches (B, T+1), cycled
    pool = [torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.context_length + 1),
                          generator=g) for _ in range(8)]
    for s in range(warmup):
        model.train_step(params, opt, pool[s % len(pool)], s, cfg)
    times = []
    for i in range(steps):
        s = warmup + i
        t0 = time.perf_counter()
        model.train_step(params, opt, pool[s % len(pool)], s, cfg)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Time the tiny canary training step in PyTorch.")
    ap.add_argument("--steps", type=int, default=30, help="timed steps (median reported)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed warm-up steps")
    ap.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    ap.add_argument("--json", metavar="FILE", help="write results as JSON to FILE")
    ap.add_argument("--compare-ms", type=float, metavar="X",
                    help="harness ms/step to compare with the best torch time")
    args = ap.parse_args(argv)
    try:
        thread_counts = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        ap.error(f"--threads: expected a list like 1,2, got {args.threads!r}")
    if not thread_counts or min(thread_counts) < 1:
        ap.error("--threads: thread counts must be >= 1")
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")

    cfg = model.CanaryConfig()  # docs/design.md tiny preset
    tokens_per_step = cfg.batch_size * cfg.context_length
    print(f"torch {torch.__version__}, tiny step (V={cfg.vocab_size} T={cfg.context_length} "
          f"C={cfg.channels} L={cfg.layers} NH={cfg.heads} B={cfg.batch_size}), fp32 CPU, "
          f"{args.warmup} warm-up + {args.steps} timed steps, median")
    print(f"{'threads':>7}  {'ms/step':>9}  {'min ms':>9}  {'tokens/s':>10}")
    results = {}
    for t in thread_counts:
        med, lo = time_steps(cfg, t, args.steps, args.warmup)
        results[t] = med
        print(f"{t:>7}  {med:>9.3f}  {lo:>9.3f}  {tokens_per_step / (med / 1e3):>10.0f}")
    best_threads = min(results, key=results.get)
    best_ms = results[best_threads]
    print(f"best: {best_ms:.3f} ms/step at {best_threads} thread(s) "
          f"({tokens_per_step / (best_ms / 1e3):.0f} tokens/s)")

    ratio = None
    if args.compare_ms is not None:
        ratio = args.compare_ms / best_ms
        print(f"harness {args.compare_ms:.3f} ms/step / torch best {best_ms:.3f} ms/step "
              f"= {ratio:.2f}x")

    if args.json:
        out = {
            "torch_version": torch.__version__,
            "threads": {str(t): ms for t, ms in results.items()},
            "best_ms": best_ms,
            "best_threads": best_threads,
            "steps": args.steps,
            "warmup": args.warmup,
            "tokens_per_step": tokens_per_step,
        }
        if ratio is not None:
            out["compare_ms"] = args.compare_ms
            out["ratio_harness_over_torch"] = ratio
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
