#!/usr/bin/env bash
# The detection power of every lane of a matrix that takes the ladders, as the
# markdown table of docs/budgets.md ("Detection power"): `harness power --json` per lane,
# then one row each. Usage: scripts/power-table.sh [MATRIX] [BUDGETS]  (defaults: the
# shipped canaries/nightly.toml and canaries/budgets.toml; build/bin/harness, or $HARNESS).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
harness=${HARNESS:-$root/build/bin/harness}
matrix=${1:-$root/canaries/nightly.toml}
budgets=${2:-$root/canaries/budgets.toml}
[ -x "$harness" ] || { echo "power-table.sh: $harness is not built; run scripts/build.sh first" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The lanes that take the ladders: the harness's engines (cpu-ref, accel, tpu-mesh) and the
# package's PyTorch and JAX lanes (not a command lane of the team's own), in matrix order.
python3 - "$matrix" >"$work/lanes" <<'PY'
import sys, tomllib
for lane in tomllib.load(open(sys.argv[1], "rb"))["lanes"]:
    if lane.get("engine") in ("cpu-ref", "accel", "tpu-mesh", "torch", "jax") and "command" not in lane:
        print(lane["id"])
PY
while read -r lane; do
  start=$(date +%s)
  status=0
  "$harness" power --lane "$lane" --matrix "$matrix" --budgets "$budgets" --json >"$work/$lane.json" || status=$?
  [ "$status" -le 1 ] || { echo "power-table.sh: harness power --lane $lane exited $status" >&2; exit "$status"; }
  echo "$(( $(date +%s) - start ))" >"$work/$lane.seconds"
done <"$work/lanes"
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def cell(ladder):
    if ladder["smallest_caught"] is None:
        return "none up to %.7g" % ladder["sizes"][-1]
    return "%.7g (step %d)" % (ladder["smallest_caught"], ladder["step"])
print("| lane | judged by | weight-scale E | weight-ulps N | lr-scale E | eps-scale F | verdict | seconds |")
print("|---|---|---|---|---|---|---|---|")
for lane in open("%s/lanes" % work).read().split():
    r = json.load(open("%s/%s.json" % (work, lane)))
    seconds = open("%s/%s.seconds" % (work, lane)).read().strip()
    budget = "bitwise" if r["bitwise"] else " + ".join("[%s]" % b for b in r["budget"])
    if r["clean_failure"]:
        print("| `%s` | %s | clean lane fails: %s | | | | | %s |" % (lane, budget, r["clean_failure"], seconds))
        continue
    ladders = {l["kind"]: l for l in r["ladders"]}
    verdict = "**too loose**" if r["too_loose"] else "catches 1e-4"
    print("| `%s` | %s | %s | %s | %s | %s | %s | %s |" % (lane, budget, *(cell(ladders[k]) for k in
          ("weight-scale", "weight-ulps", "lr-scale", "eps-scale")), verdict, seconds))
PY
