#!/usr/bin/env python3
"""Run-to-run determinism of the PyTorch canary lane on one device, per configuration.

For each configuration (precision fp32 or bf16, torch.use_deterministic_algorithms off or
on) the lane (`python3 -m canary_harness.lane`) runs the same pack REPEATS times, each in
its own process, and this script reports, per configuration:
- whether the repeats are bitwise equal (every loss, grad norm, and every parameter,
  gradient and Adam-moment hash of every step), and if not, the first step where two
  repeats part and the largest relative loss and grad-norm spread between repeats;
- the loss at step 0 and at the last step, and the median ms/step (recording included,
  from the lane's own timing line).
The receipts stay in OUT_DIR, named CONFIG-rI.h5 (e.g. cuda-bf16-det-r0.h5), so that they
can be judged afterwards with `harness compare`, `harness bisect` or `harness calibrate
--receipts` on any machine (docs/python.md, "The lane on a GPU").

Usage:
    python3 bench/torch_lane_repeats.py --pack PACK.h5 --out-dir DIR [--device cuda]
        [--repeats 3] [--steps N] [--precisions fp32,bf16] [--deterministic off,on]
        [--json FILE]

This is a benchmark, not a test: it needs the device it names (the tests never do), and
its timings depend on the machine.
"""

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(HERE, os.pardir, "python")
sys.path.insert(0, PYTHON_DIR)

import numpy as np  # noqa: E402

from canary_harness.receipts.receipt import ReceiptReader  # noqa: E402

HASH_FAMILIES = ("params", "grads", "adam_m", "adam_v")


def run_lane(pack, out, device, precision, deterministic, steps):
    """One lane run in its own process; returns its ms/step (the lane's `speed` line)."""
    cmd = [sys.executable, "-m", "canary_harness.lane", "--pack", pack, "--device", device,
           "--precision", precision, "--out", out, "--force"]
    if deterministic:
        cmd.append("--deterministic")
    if steps:
        cmd += ["--steps", str(steps)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [PYTHON_DIR, os.environ.get("PYTHONPATH")])))
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"torch_lane_repeats: the lane exited {done.returncode} for {out}:\n{done.stderr.strip()}")
    speed = re.search(r"([0-9.]+) ms/step", done.stdout)
    return float(speed.group(1)) if speed else 1000 * (time.perf_counter() - started)


def series(path):
    """Every number a repeat records per step: losses, norms and the four hash families."""
    with ReceiptReader(path) as r:
        return {"loss": r.steps("loss"), "grad_norm": r.steps("grad_norm"),
                **{f: r.hashes(f) for f in HASH_FAMILIES}}


def first_difference(a, b):
    """The first step where two repeats' records differ in any value, or None."""
    steps = len(a["loss"])
    for s in range(steps):
        if any(not np.array_equal(a[k][s], b[k][s]) for k in a):
            return s
    return None


def relative_spread(values):
    """The largest |x - x_0| / |x_0| over repeats and steps, repeat 0 as the reference."""
    base = values[0]
    scale = np.maximum(np.abs(base), np.finfo(np.float64).tiny)
    return float(max(np.max(np.abs(v - base) / scale) for v in values[1:])) if len(values) > 1 else 0.0


def summarize(name, paths, times):
    records = [series(p) for p in paths]
    firsts = [first_difference(records[0], r) for r in records[1:]]
    parted = [s for s in firsts if s is not None]
    return {"config": name, "repeats": len(paths), "receipts": [os.path.basename(p) for p in paths],
            "bitwise_equal": not parted, "first_divergent_step": min(parted) if parted else None,
            "loss_spread": relative_spread([r["loss"] for r in records]),
            "grad_norm_spread": relative_spread([r["grad_norm"] for r in records]),
            "loss_first": float(records[0]["loss"][0]), "loss_last": float(records[0]["loss"][-1]),
            "ms_per_step": float(np.median(times))}


def markdown(results, device_label):
    lines = [f"device: {device_label}", "",
             "| configuration | repeats | bitwise equal | first divergent step | loss spread | grad-norm spread "
             "| loss step 0 -> last | ms/step |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        first = "-" if r["first_divergent_step"] is None else str(r["first_divergent_step"])
        lines.append(f"| {r['config']} | {r['repeats']} | {'yes' if r['bitwise_equal'] else 'no'} | {first} "
                     f"| {r['loss_spread']:.3g} | {r['grad_norm_spread']:.3g} "
                     f"| {r['loss_first']:.6f} -> {r['loss_last']:.6f} | {r['ms_per_step']:.1f} |")
    return "\n".join(lines)


def device_label(device):
    import torch
    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(torch.device(device))}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    return f"{device}, torch {torch.__version__}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pack", required=True, help="the canary's pack (harness export)")
    ap.add_argument("--out-dir", required=True, help="where the receipts go (created if missing)")
    ap.add_argument("--device", default="cuda", help="the lane's --device (default cuda)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per configuration (default 3)")
    ap.add_argument("--steps", type=int, help="steps per run (default: the pack's)")
    ap.add_argument("--precisions", default="fp32,bf16", help="comma-separated lane precisions")
    ap.add_argument("--deterministic", default="off,on", help="comma-separated: off, on")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
    args = ap.parse_args()
    if args.repeats < 2:
        sys.exit("torch_lane_repeats: --repeats must be at least 2 (run-to-run agreement needs two runs)")
    modes = args.deterministic.split(",")
    if any(m not in ("off", "on") for m in modes):
        sys.exit(f"torch_lane_repeats: --deterministic takes off and on, not '{args.deterministic}'")
    os.makedirs(args.out_dir, exist_ok=True)
    tag = args.device.replace(":", "")
    results = []
    for precision, mode in itertools.product(args.precisions.split(","), modes):
        name = f"{tag}-{precision}-{'det' if mode == 'on' else 'nondet'}"
        paths = [os.path.join(args.out_dir, f"{name}-r{i}.h5") for i in range(args.repeats)]
        times = [run_lane(args.pack, p, args.device, precision, mode == "on", args.steps) for p in paths]
        results.append(summarize(name, paths, times))
        print(f"{name}: done", file=sys.stderr)
    label = device_label(args.device)
    print(markdown(results, label))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": label, "pack": os.path.basename(args.pack), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
