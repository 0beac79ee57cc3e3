#!/usr/bin/env bash
# Each lane's least headroom on each emulated host (docs/budgets.md, "Headroom on every
# host"): `harness nightly` run under every host's environment (from `harness hosts`), each
# into DIR/HOST/, then one markdown table, lane by host, into DIR/headroom.md and stdout.
# A cell is the lane's least headroom (docs/nightly.md, "Fragile lanes"), FAIL when the lane
# failed, "fragile" under 20%. A lane's golden recorded without the host's knobs is then
# another platform, as a real new runner's would be, so its cross-platform entry judges it.
#
# Usage: scripts/host-headroom.sh [--matrix M] [--goldens G] [--budgets B] [--lanes L,...] [--hosts V,...]
#          --out DIR   (defaults: canaries/nightly.toml, goldens/, canaries/budgets.toml, every lane,
#          every preset). Exit 0 when every lane
# passes on every host, 1 when one does not, 2 on bad input.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
harness=${HARNESS:-$root/build/bin/harness}
matrix=$root/canaries/nightly.toml goldens=$root/goldens budgets=$root/canaries/budgets.toml lanes="" hosts="" out=""
usage() { echo "host-headroom.sh: $1 (usage: see the head of scripts/host-headroom.sh)" >&2; exit 2; }
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || usage "$1 needs a value"
  case $1 in
    --matrix) matrix=$2 ;; --goldens) goldens=$2 ;; --budgets) budgets=$2 ;; --lanes) lanes=$2 ;; --hosts) hosts=$2 ;; --out) out=$2 ;;
    *) usage "unknown flag $1" ;;
  esac
  shift 2
done
[ -x "$harness" ] || usage "$harness is not built; run scripts/build.sh first"
[ -n "$out" ] || usage "--out: name the directory for the nightlies' reports"
host_lines=$("$harness" hosts ${hosts:+"$hosts"}) || exit 2
mkdir -p "$out"
status=0
while IFS=$'\t' read -r -u 3 host assignments _; do  # fd 3: the nightly's lanes read stdin
  [ -f "$out/$host/summary.json" ] && continue  # kept from an earlier run of this DIR
  rm -rf "${out:?}/$host"
  # shellcheck disable=SC2086
  env $assignments "$harness" nightly --matrix "$matrix" --goldens "$goldens" --budgets "$budgets" ${lanes:+--lanes "$lanes"} --out "$out/$host" \
    >"$out/$host.log" 2>&1 || { code=$?; [ "$code" -le 1 ] || { echo "host-headroom.sh: nightly on $host exited $code ($out/$host.log)" >&2; exit "$code"; }; }
done 3<<<"$host_lines"

python3 - "$out" "$host_lines" <<'PY' | tee "$out/headroom.md"
import json, sys
out, lines = sys.argv[1], sys.argv[2].splitlines()
hosts = [line.split("\t")[0] for line in lines]
summaries = {h: json.load(open(f"{out}/{h}/summary.json")) for h in hosts}
lanes = [lane["id"] for lane in summaries[hosts[0]]["lanes"]]
def cell(lane):
    if lane["status"] != "pass":
        return "**FAIL**"
    h = lane.get("headroom")
    if not h or h.get("headroom_pct") is None:
        return "bitwise"
    mark = " fragile" if lane.get("fragile") else ""
    return "%.0f%% (%s %s)%s" % (h["headroom_pct"], h["check"], h["metric"], mark)
print("| lane | " + " | ".join("`%s`" % h for h in hosts) + " |")
print("|---|" + "---|" * len(hosts))
failed = False
for lane_id in lanes:
    row = []
    for h in hosts:
        lane = next(l for l in summaries[h]["lanes"] if l["id"] == lane_id)
        row.append(cell(lane))
        failed |= row[-1] == "**FAIL**"
    print("| `%s` | %s |" % (lane_id, " | ".join(row)))
sys.exit(1 if failed else 0)
PY
