#!/usr/bin/env python3
"""Emulation against reality: the accel engine's bf16 drift beside PyTorch's bf16 autocast drift.

Reads the receipts bench/emulation-vs-reality.sh writes into one directory:

    cpu-ref.h5                  harness run --canary tiny
    accel-bf16+noise=off.h5     harness run --engine accel --features bf16 --noise off
    accel-bf16+seed=*.h5        the same with seeded noise (--noise-seed S), any number
    torch-fp32.h5, torch-bf16.h5  python3 -m canary_harness.lane --precision fp32 | bf16

and prints, per metric and step window, a Markdown table of

    emulation   accel bf16 (noise off) against cpu-ref
    reality     torch bf16 against torch fp32 (same stack, same kernels: only autocast differs)
    also        torch bf16 against cpu-ref, torch fp32 against cpu-ref (the floor between stacks),
                the seeded accel runs against cpu-ref, and their ratio emulation / reality

with a verdict per row: `over` or `under` when every accel run (noise off and each seed)
lies above or below reality, `within` when reality lies inside the accel runs' range.
It also writes everything (per-step series included) as JSON (--json).

The metrics are the ones `harness compare` judges (harness/check/verdict.cpp,
metric_deviations): per step |loss - ref loss|, |grad_norm - ref grad_norm|, and for the
parameters the Euclidean distance between the two receipts' count sketches
(/sketches/params_projection, 16 buckets) per tensor, summed over the buckets in the
C++'s order (so the numbers are the same doubles); a step counts its worst tensor. The
`harness compare --json` files the script leaves beside the receipts are checked against
this: at each metric's reported worst step (and tensor) the deviation computed here must be
the verdict's `max_deviation` bit for bit.

With --harness, it also asks whether a budget calibrated on the emulation would hold the
real stack: a copy of the budgets file (DIR/budgets.emulation.toml) whose `[torch-bf16]`
windows are accel's `bf16 + noise` (what `harness compare` allows accel bf16 against
cpu-ref), and `harness compare torch-bf16.h5 cpu-ref.h5 --budgets COPY --json`.

Needs h5py and numpy only (Debian's /usr/bin/python3 has both; Python 3.11 for tomllib).
    python3 bench/emulation_vs_reality.py --dir DIR [--json FILE] [--seconds S]
                                          [--harness build/bin/harness [--budgets canaries/budgets.toml]]
Exit 1 when a deviation computed here is not the harness's own at its worst step.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import platform
import re
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

import h5py
import numpy as np

METRICS = ("loss", "grad_norm", "params_sketch")
WINDOW_STARTS = (0, 10, 50)  # windows 0-9, 10-49, 50-(last step)


def _text(value) -> str:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.ndarray) and value.shape == ():
        return _text(value[()])
    return str(value)


class Receipt:
    def __init__(self, path: str):
        self.path = path
        self.name = os.path.basename(path)[:-3]
        with h5py.File(path, "r") as f:
            m = f["manifest"].attrs
            self.manifest = {k: _text(m[k]) for k in m.keys()}
            self.loss = f["steps/loss"][:]
            self.grad_norm = f["steps/grad_norm"][:]
            self.batch_hash = f["steps/batch_hash"][:]
            self.tensors = [_text(n) for n in f["hashes/names"][:]]
            self.sketch = f["sketches/params_projection"][:]  # (N, K, 16) float64
        if self.manifest.get("complete") not in ("1", "True", "true"):
            raise SystemExit(f"{path}: the run is incomplete (complete = {self.manifest.get('complete')}); rerun it")

    @property
    def lane(self) -> str:
        return self.manifest.get("lane", self.name)


def deviations(run: Receipt, ref: Receipt) -> Dict[str, np.ndarray]:
    """Per-step deviations as harness/check/verdict.cpp computes them."""
    if len(run.loss) != len(ref.loss):
        raise SystemExit(f"{run.path} and {ref.path}: {len(run.loss)} vs {len(ref.loss)} steps")
    if not np.array_equal(run.batch_hash, ref.batch_hash):
        raise SystemExit(f"{run.path} and {ref.path}: different batches (batch_hash differs); not one canary run")
    if run.tensors != ref.tensors:
        raise SystemExit(f"{run.path} and {ref.path}: different tensors")
    # sketch_distance(): d2 += (a - b)^2 and r2 += b^2 bucket by bucket, in order, then sqrt
    d2 = np.zeros(run.sketch.shape[:2])
    r2 = np.zeros(run.sketch.shape[:2])
    for i in range(run.sketch.shape[2]):
        a, b = run.sketch[:, :, i], ref.sketch[:, :, i]
        d2 = d2 + (a - b) * (a - b)
        r2 = r2 + b * b
    dist = np.sqrt(d2)  # (N, K)
    return {"loss": np.abs(run.loss - ref.loss), "grad_norm": np.abs(run.grad_norm - ref.grad_norm),
            "params_sketch": dist.max(axis=1), "params_sketch_tensor": dist,
            "params_sketch_reference_norm": np.sqrt(r2)}


def windows(steps: int) -> List[Tuple[int, int]]:
    starts = [s for s in WINDOW_STARTS if s < steps]
    return [(a, (starts[i + 1] - 1) if i + 1 < len(starts) else steps - 1) for i, a in enumerate(starts)]


def fmt(x: Optional[float]) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.2e}" if x != 0 else "0"


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (math.inf if a > 0 else math.nan)


def verdict(accel_values: List[float], reality: float) -> str:
    lo, hi = min(accel_values), max(accel_values)
    if lo > reality:
        return f"over (x{ratio(lo, reality):.2g}-{ratio(hi, reality):.2g})"
    if hi < reality:
        return f"under (x{ratio(lo, reality):.2g}-{ratio(hi, reality):.2g})"
    return f"within (x{ratio(lo, reality):.2g}-{ratio(hi, reality):.2g})"


def cross_check(directory: str, name_a: str, name_b: str, dev: Dict[str, np.ndarray],
                tensors: List[str]) -> Optional[dict]:
    """The harness's own verdict (`harness compare --json`) at its worst steps must show the
    same deviations as computed here."""
    path = os.path.join(directory, f"compare.{name_a}.vs.{name_b}.json")
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return None
    with open(path) as f:
        v = json.load(f)
    checks = []
    for m in v.get("metrics", []):
        if m["metric"] not in METRICS:
            continue
        s = m["worst_step"]
        if m["metric"] == "params_sketch":
            mine = float(dev["params_sketch_tensor"][s, tensors.index(m["worst_tensor"])])
        else:
            mine = float(dev[m["metric"]][s])
        checks.append({"metric": m["metric"], "worst_step": s, "worst_tensor": m.get("worst_tensor", ""),
                       "harness": m["max_deviation"], "here": mine, "equal": mine == m["max_deviation"],
                       "pass": m["pass"], "headroom_pct": m["headroom_pct"]})
    return {"file": os.path.basename(path), "budget": v.get("budget", {}).get("features"),
            "pass": all(c["pass"] for c in checks), "checks": checks}


def emulation_budget_check(harness: str, budgets_path: str, directory: str, canary: str = "tiny") -> dict:
    """Would a budget calibrated on the emulation hold reality? The accel bf16 lane is judged
    against cpu-ref under `bf16 + noise` (docs/budgets.md); a copy of the budgets file whose
    `[torch-bf16]` windows are replaced by that sum judges torch-bf16 against cpu-ref with the
    harness's own verdict (`harness compare --budgets COPY --json`)."""
    import tomllib  # Python 3.11+

    with open(budgets_path, "rb") as f:
        data = tomllib.load(f)

    def entry(name):
        return data.get(canary, {}).get(name) or data[name]

    bf16, noise = entry("bf16"), entry("noise")

    def span(window) -> Tuple[int, float]:
        first, _, last = str(window["steps"]).partition("-")
        return int(first), (math.inf if last == "" else int(last))

    lines = ["[torch-bf16]", 'form = "tolerance"',
             'rationale = "bench/emulation_vs_reality.py: the bf16 + noise budget of the accel emulation, summed"',
             f'calibrated = "{bf16["calibrated"]}"']
    for metric in METRICS:
        windows_out = []
        for w in bf16[metric]:
            lo, hi = span(w)
            cover = [n for n in noise[metric] if span(n)[0] <= lo and hi <= span(n)[1]]
            if len(cover) != 1:  # the shipped file splits both at step 10 (or not at all)
                raise SystemExit(f"{budgets_path}: the bf16 window {w['steps']} of {metric} is not inside one "
                                 "noise window; cannot sum them")
            keys = {k: w.get(k, 0) + cover[0].get(k, 0) for k in ("atol", "rtol", "ulp") if k in w or k in cover[0]}
            windows_out.append(f'{{ steps = "{w["steps"]}", ' + ", ".join(f"{k} = {v!r}" for k, v in keys.items()) + " }")
        lines.append(f"{metric} = [ {', '.join(windows_out)} ]")
    text = open(budgets_path).read()
    # drop [torch-bf16] and [<canary>.torch-bf16], append the replacement
    for header in ("torch-bf16", f"{canary}.torch-bf16"):
        text = re.sub(r"(?ms)^\[" + re.escape(header) + r"\]\n.*?(?=^\[|\Z)", "", text)
    copy = os.path.join(directory, "budgets.emulation.toml")
    with open(copy, "w") as f:
        f.write(text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")
    # against cpu-ref, the composed budget is [torch-bf16] alone (torch-bf16 vs torch-fp32 would add torch-cpu)
    proc = subprocess.run([harness, "compare", os.path.join(directory, "torch-bf16.h5"),
                           os.path.join(directory, "cpu-ref.h5"), "--budgets", copy, "--json"],
                          capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"harness compare --budgets {copy}: exit {proc.returncode}: {proc.stderr.strip()}")
    v = json.loads(proc.stdout)
    return {"budgets": copy, "entry": "\n".join(lines), "against": "cpu-ref", "budget": v["budget"]["features"],
            "pass": proc.returncode == 0,
            "metrics": [{k: m[k] for k in ("metric", "pass", "worst_step", "max_deviation", "allowed", "headroom_pct",
                                           "failing_steps", "first_failing_step", "worst_tensor")}
                        for m in v["metrics"]]}


def tensor_group(name: str) -> str:
    return re.sub(r"^blocks\.\d+\.", "blocks.*.", name)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, help="the directory bench/emulation-vs-reality.sh wrote")
    ap.add_argument("--json", help="write the results here as JSON")
    ap.add_argument("--seconds", type=float, help="wall time of the runs, for the record")
    ap.add_argument("--harness", help="the harness binary: also judge torch-bf16 against cpu-ref under the "
                                      "emulation's own budget (bf16 + noise of --budgets)")
    ap.add_argument("--budgets", help="the budgets file (default: canaries/budgets.toml beside this script)")
    args = ap.parse_args(argv)

    d = args.dir
    need = ["cpu-ref", "accel-bf16+noise=off", "torch-fp32", "torch-bf16"]
    missing = [n for n in need if not os.path.exists(os.path.join(d, n + ".h5"))]
    if missing:
        raise SystemExit(f"{d}: missing receipts {', '.join(n + '.h5' for n in missing)} "
                         "(run bench/emulation-vs-reality.sh)")
    r = {n: Receipt(os.path.join(d, n + ".h5")) for n in need}
    seeded = [Receipt(p) for p in sorted(glob.glob(os.path.join(d, "accel-bf16+seed=*.h5")))]
    steps = len(r["cpu-ref"].loss)
    tensors = r["cpu-ref"].tensors

    comparisons = {  # key: (run, reference, what it is)
        "emulation": ("accel-bf16+noise=off", "cpu-ref", "accel bf16, noise off, vs cpu-ref"),
        "reality": ("torch-bf16", "torch-fp32", "torch bf16 autocast vs torch fp32"),
        "torch_bf16_vs_cpu_ref": ("torch-bf16", "cpu-ref", "torch bf16 autocast vs cpu-ref"),
        "floor": ("torch-fp32", "cpu-ref", "torch fp32 vs cpu-ref (two fp32 stacks)"),
    }
    receipts = dict(r)
    for s in seeded:
        receipts[s.name] = s
        comparisons[s.name] = (s.name, "cpu-ref", f"accel bf16, seeded noise (noise_seed {s.manifest.get('noise_seed')}), "
                                                  "vs cpu-ref")
    dev = {k: deviations(receipts[a], receipts[b]) for k, (a, b, _) in comparisons.items()}
    accel_keys = ["emulation"] + [s.name for s in seeded]
    # seed-to-seed spread of the emulation itself: every pair of accel runs
    accel_runs = [r["accel-bf16+noise=off"]] + seeded
    spread = {m: np.zeros(steps) for m in METRICS}
    for i in range(len(accel_runs)):
        for j in range(i + 1, len(accel_runs)):
            pair = deviations(accel_runs[i], accel_runs[j])
            for m in METRICS:
                spread[m] = np.maximum(spread[m], pair[m])

    wins = windows(steps)
    rows = []
    for m in METRICS:
        for a, b in wins:
            sl = slice(a, b + 1)
            row = {"metric": m, "steps": f"{a}-{b}"}
            for stat, fn in (("max", np.max), ("mean", np.mean)):
                vals = {k: float(fn(dev[k][m][sl])) for k in comparisons}
                accel_vals = [vals[k] for k in accel_keys]
                row[stat] = {
                    "emulation": vals["emulation"],
                    "emulation_seeded": [vals[s.name] for s in seeded],
                    "emulation_seed_spread": float(fn(spread[m][sl])) if len(accel_runs) > 1 else None,
                    "reality": vals["reality"],
                    "torch_bf16_vs_cpu_ref": vals["torch_bf16_vs_cpu_ref"],
                    "floor": vals["floor"],
                    "ratio": ratio(vals["emulation"], vals["reality"]),
                    "ratio_range": [ratio(min(accel_vals), vals["reality"]), ratio(max(accel_vals), vals["reality"])],
                    "ratio_vs_torch_bf16_vs_cpu_ref": ratio(vals["emulation"], vals["torch_bf16_vs_cpu_ref"]),
                    "verdict": verdict(accel_vals, vals["reality"]),
                }
            rows.append(row)

    # step 0: both lanes start from the same parameters, so its loss and grad norm are one
    # forward and backward's rounding alone, before any drift compounds through the updates
    # (its params sketch is after the first update)
    first = []
    for m in METRICS:
        vals = {k: float(dev[k][m][0]) for k in comparisons}
        accel_vals = [vals[k] for k in accel_keys]
        first.append({"metric": m, "emulation": vals["emulation"], "emulation_seeded": [vals[s.name] for s in seeded],
                      "reality": vals["reality"], "torch_bf16_vs_cpu_ref": vals["torch_bf16_vs_cpu_ref"],
                      "floor": vals["floor"], "ratio": ratio(vals["emulation"], vals["reality"]),
                      "verdict": verdict(accel_vals, vals["reality"])})

    # params sketch per tensor kind (layers pooled), last window: where the emulation is off
    a, b = wins[-1]
    sl = slice(a, b + 1)
    groups: Dict[str, List[int]] = {}
    for k, name in enumerate(tensors):
        groups.setdefault(tensor_group(name), []).append(k)
    per_tensor = []
    for g, idx in groups.items():
        vals = {k: float(dev[k]["params_sketch_tensor"][sl][:, idx].max()) for k in comparisons}
        accel_vals = [vals[k] for k in accel_keys]
        refnorm = float(dev["reality"]["params_sketch_reference_norm"][sl][:, idx].max())
        per_tensor.append({"tensors": g, "count": len(idx), "steps": f"{a}-{b}", "emulation": vals["emulation"],
                           "emulation_seeded": [vals[s.name] for s in seeded], "reality": vals["reality"],
                           "torch_bf16_vs_cpu_ref": vals["torch_bf16_vs_cpu_ref"], "floor": vals["floor"],
                           "reference_norm": refnorm, "ratio": ratio(vals["emulation"], vals["reality"]),
                           "verdict": verdict(accel_vals, vals["reality"])})

    checks = {k: cross_check(d, receipts[a].name, receipts[b].name, dev[k], tensors)
              for k, (a, b, _) in comparisons.items()}
    checks = {k: v for k, v in checks.items() if v is not None}
    mismatches = [(k, c) for k, v in checks.items() for c in v["checks"] if not c["equal"]]

    budget_check = None
    if args.harness:
        budgets_path = args.budgets or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "canaries",
                                                    "budgets.toml")
        budget_check = emulation_budget_check(args.harness, budgets_path, d)

    torch_m = r["torch-bf16"].manifest
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
               "torch_receipt_cpu": torch_m.get("cpu"), "torch_libraries": torch_m.get("libraries"),
               "torch_kernels": torch_m.get("kernels"), "harness_cpu": r["cpu-ref"].manifest.get("cpu"),
               "harness_toolchain": r["cpu-ref"].manifest.get("toolchain")}

    timings = {}
    timings_path = os.path.join(d, "timings.tsv")
    if os.path.exists(timings_path):
        with open(timings_path) as f:
            for line in f:
                name, _, secs = line.rstrip("\n").partition("\t")
                if secs:
                    timings[name] = float(secs)

    # ---- Markdown ----
    out = []
    p = out.append
    p("# Emulation against reality: accel bf16 beside PyTorch bf16 autocast\n")
    p(f"canary tiny, {steps} steps, init seed {r['cpu-ref'].manifest.get('seed')}; machine: {machine['cpu']}, "
      f"{machine['cores']} cores" + (f"; runs {args.seconds:.1f} s" if args.seconds else "") + "\n")
    if timings:
        p("wall seconds per run (1 thread): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()) + "\n")
    p("| comparison | run | reference |")
    p("|---|---|---|")
    for k, (a_, b_, what) in comparisons.items():
        p(f"| {k}: {what} | {receipts[a_].lane} | {receipts[b_].lane} |")
    p("")
    p("Per step: |Δloss|, |Δgrad_norm| and the params sketch distance of the worst tensor "
      "(harness/check/verdict.cpp). emulation = accel bf16 noise off vs cpu-ref; reality = torch bf16 vs "
      "torch fp32; ratio = emulation / reality; verdict: every accel run (noise off and "
      f"{len(seeded)} seeded) above (over) or below (under) reality, or reality inside their range (within), "
      "with the range of accel / reality over those runs.\n")
    for stat in ("max", "mean"):
        p(f"### Window {stat} of the per-step deviation\n")
        p("| metric | steps | emulation | accel seeded (min-max) | accel seed spread | reality | torch bf16 vs cpu-ref "
          "| floor: torch fp32 vs cpu-ref | ratio | verdict |")
        p("|---|---|---|---|---|---|---|---|---|---|")
        for row in rows:
            x = row[stat]
            sd = x["emulation_seeded"]
            p(f"| {row['metric']} | {row['steps']} | {fmt(x['emulation'])} | "
              f"{(fmt(min(sd)) + '-' + fmt(max(sd))) if sd else '-'} | {fmt(x['emulation_seed_spread'])} | "
              f"{fmt(x['reality'])} | {fmt(x['torch_bf16_vs_cpu_ref'])} | {fmt(x['floor'])} | "
              f"{x['ratio']:.2f} | {x['verdict']} |")
        p("")
    p("### Step 0 alone (same parameters in every lane: one forward and backward's rounding)\n")
    p("| metric | emulation | accel seeded (min-max) | reality | torch bf16 vs cpu-ref | floor | ratio | verdict |")
    p("|---|---|---|---|---|---|---|---|")
    for t in first:
        sd = t["emulation_seeded"]
        p(f"| {t['metric']} | {fmt(t['emulation'])} | {(fmt(min(sd)) + '-' + fmt(max(sd))) if sd else '-'} | "
          f"{fmt(t['reality'])} | {fmt(t['torch_bf16_vs_cpu_ref'])} | {fmt(t['floor'])} | {t['ratio']:.2f} | "
          f"{t['verdict']} |")
    p("")
    p(f"### Params sketch distance per tensor kind, steps {a}-{b} (max over steps and layers)\n")
    p("| tensors | emulation | accel seeded (min-max) | reality | torch bf16 vs cpu-ref | floor | ratio | verdict |")
    p("|---|---|---|---|---|---|---|---|")
    for t in per_tensor:
        sd = t["emulation_seeded"]
        p(f"| {t['tensors']} | {fmt(t['emulation'])} | {(fmt(min(sd)) + '-' + fmt(max(sd))) if sd else '-'} | "
          f"{fmt(t['reality'])} | {fmt(t['torch_bf16_vs_cpu_ref'])} | {fmt(t['floor'])} | {t['ratio']:.2f} | "
          f"{t['verdict']} |")
    p("")
    under = [f"{row['metric']} {row['steps']}" for row in rows if row["max"]["verdict"].startswith("under")]
    over = [f"{row['metric']} {row['steps']}" for row in rows if row["max"]["verdict"].startswith("over")]
    within = [f"{row['metric']} {row['steps']}" for row in rows if row["max"]["verdict"].startswith("within")]
    p("Window max: emulation under reality in " + (", ".join(under) or "none") + "; over in " +
      (", ".join(over) or "none") + "; reality within the accel runs' range in " + (", ".join(within) or "none") + ".")
    tu = [t["tensors"] for t in per_tensor if t["verdict"].startswith("under")]
    to = [t["tensors"] for t in per_tensor if t["verdict"].startswith("over")]
    p(f"Per tensor kind (steps {a}-{b}): under in " + (", ".join(tu) or "none") + "; over in " +
      (", ".join(to) or "none") + ".")
    if checks:
        n = sum(len(v["checks"]) for v in checks.values())
        p("")
        p(f"Cross-check with `harness compare --json`: {n - len(mismatches)} of {n} worst-step deviations equal bit "
          "for bit; verdicts: " + ", ".join(f"{k} {'PASS' if v['pass'] else 'FAIL'} under "
                                          f"{'+'.join(v['budget'] or []) or 'bitwise'}" for k, v in checks.items()) + ".")
    if budget_check:
        p("")
        p("Reality under the emulation's budget: torch-bf16 against cpu-ref judged by `harness compare` with "
          "`[torch-bf16]` replaced by accel's `bf16 + noise` (" + os.path.basename(budget_check["budgets"]) + "): " +
          ("PASS" if budget_check["pass"] else "FAIL") + "; " +
          "; ".join(f"{m['metric']} worst step {m['worst_step']} {fmt(m['max_deviation'])} of {fmt(m['allowed'])} "
                    f"(headroom {m['headroom_pct']:.0f}%)" if m["headroom_pct"] is not None else
                    f"{m['metric']} {'pass' if m['pass'] else 'fail'}" for m in budget_check["metrics"]) + ".")
    print("\n".join(out))

    if args.json:
        doc = {"canary": "tiny", "steps": steps, "seed": r["cpu-ref"].manifest.get("seed"), "machine": machine,
               "seconds": args.seconds, "run_seconds": timings, "windows": [f"{a_}-{b_}" for a_, b_ in wins],
               "comparisons": {k: {"run": receipts[a_].path, "run_lane": receipts[a_].lane,
                                   "reference": receipts[b_].path, "reference_lane": receipts[b_].lane,
                                   "what": what, "noise_mode": receipts[a_].manifest.get("noise_mode"),
                                   "noise_seed": receipts[a_].manifest.get("noise_seed"),
                                   "per_step": {m: dev[k][m].tolist() for m in METRICS},
                                   "params_sketch_worst_tensor": [tensors[i] for i in
                                                                  dev[k]["params_sketch_tensor"].argmax(axis=1)]}
                               for k, (a_, b_, what) in comparisons.items()},
               "emulation_seed_spread_per_step": {m: spread[m].tolist() for m in METRICS},
               "rows": rows, "step0": first, "per_tensor": per_tensor, "harness_compare": checks,
               "reality_under_emulation_budget": budget_check}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, allow_nan=True)
    if mismatches:
        for k, c in mismatches:
            print(f"emulation_vs_reality: {k} {c['metric']} step {c['worst_step']}: harness {c['harness']!r}, "
                  f"here {c['here']!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
