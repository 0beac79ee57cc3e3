#!/usr/bin/env python3
"""Emulation against reality for the mesh (docs/xla.md, "tpu-mesh beside XLA's SPMD"): per
shard plan, tpu-mesh's drift from cpu-ref beside the drift of XLA's real SPMD partitioner
(canary_harness.jax on virtual CPU devices) from the same program on one device, on the
same pack, and each against the `mesh-*` entry both declare. Also each lane's compile
counters over the step sequence.

    .venv/bin/python bench/mesh_vs_xla.py [--steps 100] [--out DIR]

Runs (all from one `harness export` of tiny; tpu-mesh at 1 thread):
    cpu-ref                         harness run --canary tiny
    tpu-mesh MESH PLAN PRECISION    harness run --engine tpu-mesh --mesh MESH --shard-plan PLAN --precision P
    jax 1x1 dp [bf16]               python -m canary_harness.jax (the partitioner's baseline)
    jax MESH PLAN [bf16]            python -m canary_harness.jax --mesh MESH --shard-plan PLAN

Deviations are `harness compare --json`'s max_deviation per metric (loss, grad_norm,
params_sketch), read from comparisons against a copy of the budgets file, so a failing
comparison still reports its numbers; `verdict` is the comparison under the shipped entry
of the mesh feature alone (tpu-mesh against cpu-ref, JAX's mesh against JAX's one device).
A benchmark, not a test: it prints a Markdown table and writes JSON (--out/mesh-vs-xla.json).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, os.pardir))
HARNESS = os.environ.get("HARNESS_BIN", os.path.join(ROOT, "build", "bin", "harness"))
CASES = [("2x1", "dp", "fp32"), ("2x2", "tp", "fp32"), ("2x2", "zero3", "fp32"), ("2x2", "zero3", "bf16")]
METRICS = ("loss", "grad_norm", "params_sketch")


def sh(argv):
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python"), "HARNESS_BIN": HARNESS}
    env.pop("XLA_FLAGS", None)
    return subprocess.run(argv, check=False, capture_output=True, text=True, env=env)


def must(argv):
    result = sh(argv)
    if result.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()[-400:]}")
    return result


def deviations(a, b, features_budgets):
    """max_deviation per metric of `harness compare a b`, and whether it passed."""
    result = sh([HARNESS, "compare", a, b, "--json", "--budgets", features_budgets])
    verdict = json.loads(result.stdout)
    found = {m["metric"]: m["max_deviation"] for m in verdict["metrics"] if m["metric"] in METRICS}
    return found, verdict["verdict"]


def counters(path):
    import h5py

    with h5py.File(path, "r") as f:
        return [int(x) for x in f["compile/UncachedCompile"][()]] if "compile" in f else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--out")
    args = ap.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="mesh-vs-xla-")
    os.makedirs(out, exist_ok=True)
    path = lambda name: os.path.join(out, name + ".h5")  # noqa: E731
    budgets = os.path.join(ROOT, "canaries", "budgets.toml")
    pack = path("pack")
    must([HARNESS, "export", "--canary", "tiny", "--steps", str(args.steps), "--out", pack, "--force"])
    must([HARNESS, "run", "--canary", "tiny", "--steps", str(args.steps), "--threads", "1", "--out", path("cpu-ref"),
          "--force"])
    jax = [sys.executable, "-m", "canary_harness.jax", "--pack", pack, "--force"]
    for precision in ("fp32", "bf16"):
        must(jax + ["--precision", precision, "--out", path(f"jax-1x1-dp-{precision}")])
    rows = []
    for mesh, plan, precision in CASES:
        mesh_name = f"tpu-mesh-{mesh}-{plan}-{precision}"
        must([HARNESS, "run", "--canary", "tiny", "--engine", "tpu-mesh", "--mesh", mesh, "--shard-plan", plan,
              "--threads", "1", "--steps", str(args.steps), "--out", path(mesh_name), "--force"] +
             ["--precision", precision])
        jax_name = f"jax-{mesh}-{plan}-{precision}"
        must(jax + ["--mesh", mesh, "--shard-plan", plan, "--precision", precision, "--out", path(jax_name)])
        emulated, emulated_verdict = deviations(path(mesh_name), path("cpu-ref"), budgets)
        real, real_verdict = deviations(path(jax_name), path(f"jax-1x1-dp-{precision}"), budgets)
        rows.append({"mesh": mesh, "plan": plan, "precision": precision, "feature": f"mesh-{precision}",
                     "tpu_mesh": emulated, "tpu_mesh_verdict": emulated_verdict, "tpu_mesh_compiles": counters(path(mesh_name)),
                     "xla": real, "xla_verdict": real_verdict, "xla_compiles": counters(path(jax_name))})
    print("| plan | feature | tpu-mesh vs cpu-ref: loss / grad_norm / params sketch | XLA SPMD vs one device: loss / "
          "grad_norm / params sketch | under the entry: tpu-mesh, XLA |")
    print("|---|---|---|---|---|")
    for r in rows:
        fmt = lambda d: " / ".join(f"{d[m]:.2g}" for m in METRICS)  # noqa: E731
        print(f"| {r['mesh']} {r['plan']} {r['precision']} | `{r['feature']}` | {fmt(r['tpu_mesh'])} | {fmt(r['xla'])} | "
              f"{r['tpu_mesh_verdict']}, {r['xla_verdict']} |")
    for r in rows:
        compiles = lambda c: "none recorded" if c is None else f"{sum(c)} ({c.index(1) if 1 in c else '-'} first)"  # noqa: E731
        print(f"compiles {r['mesh']} {r['plan']} {r['precision']}: tpu-mesh {sum(r['tpu_mesh_compiles'] or [])} "
              f"at steps {[i for i, c in enumerate(r['tpu_mesh_compiles'] or []) if c]}, XLA {sum(r['xla_compiles'] or [])} "
              f"at steps {[i for i, c in enumerate(r['xla_compiles'] or []) if c]}")
    with open(os.path.join(out, "mesh-vs-xla.json"), "w") as f:
        json.dump({"steps": args.steps, "rows": rows}, f, indent=2)
    print(f"receipts and JSON in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
