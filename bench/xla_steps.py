#!/usr/bin/env python3
"""XLA beside the harness's engines, in one run (docs/xla.md, "Cost"): the tiny canary's
step on cpu-ref, on tpu-mesh (the emulated compile-stable mesh, 2x2 tp), on the PyTorch
lane on the CPU, on the PyTorch lane on torch_xla (XLA's CPU client) and in JAX (one
device, and 2x2 tp through XLA's SPMD partitioner; cold and from its cache), each lane run
for SHORT and for LONG steps in alternation, ROUNDS times. The steady step is
(work(LONG) - work(SHORT)) / (LONG - SHORT), work being the process's wall time less the
compile seconds its receipt records (/compile/CompileTime, where the engine records one:
tpu-mesh, torch_xla): process start, imports and compiles cancel out. Step 0's compile is
reported on its own. torch_xla is also run twice on one
--compile-cache: its second process cannot load the executables on the CPU client
(docs/xla.md, "The persistent compile cache"), which the receipt's counters show.

Usage:
    .venv/bin/python bench/xla_steps.py [--rounds 3] [--short 4] [--long 24] [--json FILE]

A benchmark, not a test: the numbers depend on the machine and its load (printed).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, os.pardir))
HARNESS = os.environ.get("HARNESS_BIN", os.path.join(ROOT, "build", "bin", "harness"))


def lanes(pack: str, cache: str):
    """name -> the argv of one lane's run; timed() adds --steps and --out."""
    lane = [sys.executable, "-m", "canary_harness.lane", "--pack", pack, "--force"]
    jax = [sys.executable, "-m", "canary_harness.jax", "--pack", pack, "--force"]
    return {
        "cpu-ref": [HARNESS, "run", "--canary", "tiny", "--threads", "1", "--force"],
        "tpu-mesh 2x2 tp": [HARNESS, "run", "--canary", "tiny", "--engine", "tpu-mesh", "--mesh", "2x2",
                            "--shard-plan", "tp", "--threads", "1", "--force"],
        "torch lane, CPU": lane + ["--threads", "1"],
        "torch lane, torch_xla": lane + ["--device", "xla"],
        "torch_xla, --compile-cache": lane + ["--device", "xla", "--compile-cache", cache],
        "JAX 1x1 dp": jax,
        "JAX 2x2 tp": jax + ["--mesh", "2x2", "--shard-plan", "tp"],
        "JAX 2x2 tp, --compile-cache": jax + ["--mesh", "2x2", "--shard-plan", "tp", "--compile-cache", cache + "-jax"],
    }


def timed(argv, steps: int, out: str) -> float:
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python"), "HARNESS_BIN": HARNESS, "PJRT_DEVICE": "CPU"}
    env.pop("XLA_FLAGS", None)
    start = time.perf_counter()
    subprocess.run(argv + ["--steps", str(steps), "--out", out], check=True, capture_output=True, env=env)
    return time.perf_counter() - start


def compile_counters(path: str):
    with h5py.File(path, "r") as f:
        if "compile" not in f:
            return None
        group = f["compile"]
        return {k: [float(v) for v in group[k][()]] for k in group}


def compile_seconds(path: str) -> float:
    counters = compile_counters(path)
    return sum(counters.get("CompileTime", [])) if counters else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--short", type=int, default=4)
    ap.add_argument("--long", type=int, default=24)
    ap.add_argument("--json")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as d:
        pack = os.path.join(d, "pack.h5")
        subprocess.run([HARNESS, "export", "--canary", "tiny", "--steps", str(args.long), "--out", pack],
                       check=True, capture_output=True)
        cache = os.path.join(d, "cache")
        for name, argv in lanes(pack, cache).items():
            steady, compile0, counters = [], [], None
            for r in range(args.rounds):
                out = os.path.join(d, "r.h5")
                short = timed(argv, args.short, out) - compile_seconds(out)
                long_ = timed(argv, args.long, out) - compile_seconds(out)
                steady.append((long_ - short) / (args.long - args.short))
                counters = compile_counters(out)
                if counters and "CompileTime" in counters:
                    compile0.append(counters["CompileTime"][0])
            results[name] = {
                "step_ms": 1000 * statistics.median(steady),
                "step_ms_range": [1000 * min(steady), 1000 * max(steady)],
                "compile0_s": statistics.median(compile0) if compile0 else None,
                "uncached_compiles": counters.get("UncachedCompile") if counters else None,
                "persistent": {k: sum(counters[k]) for k in counters if k.startswith("PersistentCache")}
                if counters else None,
            }
            print(f"{name:28} step {results[name]['step_ms']:8.1f} ms "
                  f"({results[name]['step_ms_range'][0]:.1f}..{results[name]['step_ms_range'][1]:.1f}), "
                  f"compile at step 0: {results[name]['compile0_s'] if compile0 else '-'} s", flush=True)
    machine = {"cpu": platform.processor() or platform.machine(), "cores": len(os.sched_getaffinity(0)),
               "load": os.getloadavg()}
    print(f"machine     {machine}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "args": vars(args), "lanes": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
