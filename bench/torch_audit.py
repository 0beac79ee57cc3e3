#!/usr/bin/env python3
"""What the compile-stability audit costs on the tiny PyTorch lane's step (issue 15).

The PyTorch canary lane's own step (canary_harness.runs.pack_step.CanaryStep: the GPT2 model,
CanaryAdamW, the lane's train_step, the pack's init and batches) on CPU, in two fresh
copies per repetition:
- bare: steps 0..N-1 (default 4) run as they are;
- audited: canary_harness.audit.audit_step over the same N steps: the steps under the
  TorchDispatchMode and TorchFunctionMode that record every op, then the fingerprints and
  the analysis (what `python3 -m canary_harness.audit` does once the file is imported).
Each repetition times both (which goes first alternates, so both see the same machine
load); the medians over the repetitions and their ratio are printed. Model construction is
not timed.

Usage:
    /usr/bin/python3 bench/torch_audit.py [--pack PACK.h5] [--steps 4] [--repeats 5]
        [--threads 1] [--json FILE]

Without --pack, one is written by `build/bin/harness export --canary tiny` (HARNESS_BIN)
into a temporary directory. This is a benchmark, not a test: numbers depend on the
machine and its load (the report prints the load average).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, os.pardir)
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402

from canary_harness.audit import audit_step  # noqa: E402
from canary_harness.runs.pack_step import CanaryStep  # noqa: E402
from canary_harness.models import gpt2  # noqa: E402
from canary_harness.pack import read_pack  # noqa: E402
from tiny_pack import export_tiny_pack  # noqa: E402


def time_bare(pack, cfg, steps):
    step = CanaryStep(pack, cfg)
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(steps):
        step(i)
    return (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3


def time_audit(pack, cfg, steps):
    step = CanaryStep(pack, cfg)
    c0, t0 = time.process_time(), time.perf_counter()
    report = audit_step(step, steps, target="tiny lane")
    return (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3, report


def main(argv=None):
    ap = argparse.ArgumentParser(description="The audit's cost on the tiny PyTorch lane's step.")
    ap.add_argument("--pack", help="tiny pack (`harness export --canary tiny`); default: exported to a temp dir")
    ap.add_argument("--steps", type=int, default=4, help="steps audited, and run bare (default 4)")
    ap.add_argument("--repeats", type=int, default=5, help="repetitions of each (median reported)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, the lane's)")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
    args = ap.parse_args(argv)
    if args.steps < 2 or args.repeats < 1:
        ap.error("--steps must be >= 2 and --repeats >= 1")
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        pack = read_pack(args.pack or export_tiny_pack(tmp), canary="tiny")
        if args.steps > pack.steps:
            ap.error(f"--steps: the pack holds {pack.steps} batches")
        cfg = gpt2.CanaryConfig.from_json(pack.canary_json)
        time_bare(pack, cfg, 1)  # torch's one-time costs (first kernels, allocator) before anything is timed
        bare, audited, bare_cpu, audited_cpu = [], [], [], []
        report = None
        for r in range(args.repeats):
            for which in ((0, 1) if r % 2 == 0 else (1, 0)):
                if which == 0:
                    wall, cpu = time_bare(pack, cfg, args.steps)
                    bare.append(wall)
                    bare_cpu.append(cpu)
                else:
                    wall, cpu, report = time_audit(pack, cfg, args.steps)
                    audited.append(wall)
                    audited_cpu.append(cpu)

    bare_med, audit_med = statistics.median(bare), statistics.median(audited)
    bare_cpu_med, audit_cpu_med = statistics.median(bare_cpu), statistics.median(audited_cpu)
    ops = [g.op_count for g in report.steps]
    results = {
        "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "load_average": os.getloadavg(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "steps": args.steps, "repeats": args.repeats, "ops_per_step": ops, "clean": report.clean,
        "bare_ms": bare_med, "audit_ms": audit_med, "ratio": audit_med / bare_med,
        "bare_cpu_ms": bare_cpu_med, "audit_cpu_ms": audit_cpu_med, "cpu_ratio": audit_cpu_med / bare_cpu_med,
        "bare_ms_all": bare, "audit_ms_all": audited,
    }
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); {os.cpu_count()} CPUs, load average "
          f"{results['load_average'][0]:.2f}; tiny lane step, {args.steps} steps, {args.repeats} repetitions "
          f"(median); {ops[-1]} ops a step, audit {'clean' if report.clean else 'NOT clean'}")
    print(f"  {args.steps} bare steps          {bare_med:8.1f} ms wall  {bare_cpu_med:8.1f} ms CPU")
    print(f"  audit of {args.steps} steps       {audit_med:8.1f} ms wall  {audit_cpu_med:8.1f} ms CPU")
    print(f"  ratio                  {results['ratio']:8.2f}x wall {results['cpu_ratio']:8.2f}x CPU")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
