#!/usr/bin/env bash
# What recording costs each zoo member (tests/zoo/, docs/zoo.md): bench/own_model_overhead.py
# on every member in one run, each member's bare step beside its recorded step (paired
# blocks, the same machine load), then one table. Needs .venv/ (scripts/python-env.sh) and a
# built harness (its digest library: build/lib).
#   bench/zoo.sh [ROUNDS]      default 48 rounds of 4 steps each kind, after 8 warm-up rounds
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=${1:-48}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# USE_TORCH_XLA=0: transformers would import torch_xla, which no CPU run uses.
export USE_TORCH_XLA=0 HARNESS_BIN=${HARNESS_BIN:-$root/build/bin/harness} PYTHONPATH=$root/python
for member in gpt2 llama mixtral bert t5 accumulation; do
  "$root/.venv/bin/python" "$root/bench/own_model_overhead.py" --canary "$root/tests/zoo/$member.py:canary" \
    --rounds "$rounds" --warmup 8 --block 4 --json "$out/$member.json" >/dev/null 2>"$out/$member.err" ||
    { echo "zoo bench: $member failed: $(tail -n 3 "$out/$member.err")" >&2; exit 1; }
done
"$root/.venv/bin/python" - "$out" <<'PY'
import json, os, sys
print(f"{'member':<14}{'bare ms/step':>14}{'recorded':>10}{'overhead (paired median, quartiles)':>40}")
for member in ("gpt2", "llama", "mixtral", "bert", "t5", "accumulation"):
    r = json.load(open(os.path.join(sys.argv[1], member + ".json")))
    w = r["writers"]["auto"]
    q = w["paired_quartiles_pct"]
    print(f"{member:<14}{r['bare_ms']:>14.2f}{w['recorded_ms']:>10.2f}"
          f"{w['paired_median_pct']:>+19.1f}% ({q[0]:+.1f}% .. {q[1]:+.1f}%)")
print(f"torch {r['torch']}, digest {os.path.basename(r['digest'])}, load {r['load'][0]:.2f}")
PY
