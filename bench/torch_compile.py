#!/usr/bin/env python3
"""torch 2.x eager against torch.compile (Inductor) on a built-in canary's PyTorch lane, with
the harness's cpu-ref beside them, in one run (docs/python.md, "Compiled steps"):

- cpu-ref: `harness run --canary C --threads T`, its own "ms/step (recording included)";
- eager and compiled: the lane's canary (the pack's model, schedule and AdamW) run through
  the harness's runner with recording (canary_harness.runs.runner.ReceiptRun), two copies in
  this process taking turns step by step so that both see the same machine load. The
  compiled copy's first step holds the compilation (forward and backward, Inductor's C++
  kernels built with the system compiler): reported as the compile time, less the
  eager step's median. The steady-state figures are medians over the steps after
  --warmup.

Usage (torch 2.x: the pinned environment, docs/python-env.md):
    .venv/bin/python bench/torch_compile.py [--canary tiny] [--steps 60] [--warmup 5] [--threads 1] [--json FILE]

Inductor caches what it compiled (in /tmp/torchinductor_$USER): a second run of this
benchmark compiles faster; the cold figure needs that directory removed first.
This is a benchmark, not a test: the numbers depend on the machine and its load (printed).
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, os.pardir))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)
os.environ.setdefault("HARNESS_BIN", os.path.join(ROOT, "build", "bin", "harness"))


def cpu_ref_ms(harness: str, canary: str, threads: int, work: str) -> float:
    """cpu-ref's own ms/step on this canary (recording included), as `harness run` prints it."""
    out = subprocess.run([harness, "run", "--canary", canary, "--threads", str(threads), "--out",
                          os.path.join(work, "cpu-ref.h5")], capture_output=True, text=True, check=True).stdout
    return float(re.search(r"([0-9.]+) ms/step", out).group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--canary", default="tiny")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="write the numbers here too")
    args = ap.parse_args()

    import torch

    from canary_harness.runs.runner import ReceiptRun, RunOptions
    from own_model_overhead import pack_lane_canary

    harness = os.environ["HARNESS_BIN"]
    work = tempfile.mkdtemp(prefix="torch-compile-")
    pack = os.path.join(work, "pack.h5")
    subprocess.run([harness, "export", "--canary", args.canary, "--out", pack], capture_output=True, check=True)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    runs = {}
    for name, compiled in (("eager", False), ("compiled", True)):
        loaded = pack_lane_canary(pack)
        steps = min(args.steps, loaded.canary.steps)
        options = RunOptions(out=os.path.join(work, f"{name}.h5"), threads=args.threads, steps=steps, compile=compiled)
        runs[name] = ReceiptRun(loaded, options, device, steps)
    times = {"eager": [], "compiled": []}
    for i in range(steps):
        order = list(runs.items()) if i % 2 == 0 else list(reversed(runs.items()))
        for name, run in order:
            start = time.perf_counter()
            run.step(i)
            times[name].append(time.perf_counter() - start)
    for run in runs.values():
        run.finish()
        run.loop.close()
    eager = statistics.median(times["eager"][args.warmup:])
    compiled = statistics.median(times["compiled"][args.warmup:])
    result = {
        "canary": args.canary, "steps": steps, "threads": args.threads, "torch": torch.__version__,
        "cpu_ref_ms": cpu_ref_ms(harness, args.canary, args.threads, work),
        "eager_ms": 1e3 * eager, "compiled_ms": 1e3 * compiled,
        "compile_s": times["compiled"][0] - eager, "first_compiled_step_s": times["compiled"][0],
        "cpu": platform.processor() or platform.machine(), "load": os.getloadavg(),
    }
    print(f"canary      {args.canary}, {steps} steps, {args.threads} thread(s), torch {torch.__version__}")
    print(f"cpu-ref     {result['cpu_ref_ms']:.1f} ms/step (harness run, recording included)")
    print(f"eager       {result['eager_ms']:.1f} ms/step (median after {args.warmup} steps, recording included)")
    print(f"compiled    {result['compiled_ms']:.1f} ms/step (median after {args.warmup} steps, recording included)")
    print(f"compile     {result['compile_s']:.1f} s (the first compiled step, {result['first_compiled_step_s']:.1f} s, "
          "less an eager step)")
    print(f"machine     {result['cpu']}, load {result['load'][0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
