#!/usr/bin/env bash
# The default matrix's torch lanes against the repository's goldens (docs/nightly.md,
# "External lanes"): tiny on Debian's torch 1.13 and on .venv/'s torch 2.9 (fp32, bf16,
# compiled) in one job. Every lane passes; the 2.9 lanes are named after their release, equal their own
# goldens bit for bit and pass against cpu-ref under their declared budgets (torch-cpu,
# torch-bf16, torch-cpu+torch-compile); 2.9 reproduces cpu-ref's losses on tiny and
# llama-tiny; a matrix whose interpreter is missing is refused in one line naming the key.
source "$(dirname "$0")/lib.sh"
SRC=$(cd "$HERE/../.." && pwd)
unset CI
[ -x "$SRC/.venv/bin/python" ] || { echo "FAIL: no .venv/ (scripts/python-env.sh makes it)" >&2; exit 1; }

expect_exit 0 "" -- "$HARNESS" nightly --lanes torch-fp32,torch-bf16,torch2-fp32,torch2-bf16,torch2-compile --threads 1 \
  --out "$WORK/run"
"$PY" - "$WORK/run" <<'PY' || fail "the torch 2.9 lanes are not judged as the matrix says"
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
assert s["verdict"] == "pass", s["verdict"]
lanes = {l["id"]: l for l in s["lanes"]}
wanted = {"torch-fp32": ("tiny/torch", ["torch-cpu"]), "torch-bf16": ("tiny/torch+bf16", ["torch-bf16"]),
          "torch2-fp32": ("tiny/torch@2.9", ["torch-cpu"]), "torch2-bf16": ("tiny/torch@2.9+bf16", ["torch-bf16"]),
          "torch2-compile": ("tiny/torch@2.9+compile", ["torch-compile", "torch-cpu"])}
for id, (lane, features) in wanted.items():
    assert lanes[id]["lane"] == lane, (id, lanes[id]["lane"])
    checks = {c["check"]: c for c in lanes[id]["checks"]}
    assert checks["golden"]["status"] == "pass", (id, checks["golden"])
    if id.startswith("torch2"):  # recorded here, on this platform
        assert checks["golden"]["verdict"]["budget"]["bitwise"] is True, (id, checks["golden"])
    ref = checks["reference"]
    assert ref["status"] == "pass" and sorted(ref["verdict"]["budget"]["features"]) == features, (id, ref)
PY
"$PY" - "$WORK/run/receipts/torch2-fp32.h5" <<'PY' || fail "the 2.9 lane's receipt is not torch 2.9's"
import sys, h5py
attrs = h5py.File(sys.argv[1], "r")["manifest"].attrs
libraries = attrs["libraries"].decode() if isinstance(attrs["libraries"], bytes) else attrs["libraries"]
assert "torch 2.9" in libraries, libraries
PY

# torch 2.9 reproduces cpu-ref on tiny (the job's receipts) and on llama-tiny (its pack,
# trained by the 2.9 lane here): step 0's loss within 1e-5 relative, every loss within
# 2e-6 relative, and compare passes under torch-cpu.
"$HARNESS" export --canary llama-tiny --out "$WORK/llama-pack.h5" >/dev/null || fail "cannot export llama-tiny's pack"
"$HARNESS" run --canary llama-tiny --out "$WORK/llama-cpu-ref.h5" >/dev/null || fail "cannot run llama-tiny's cpu-ref"
env PYTHONPATH="$SRC/python" HARNESS_BIN="$HARNESS" "$SRC/.venv/bin/python" -m canary_harness.lane \
  --pack "$WORK/llama-pack.h5" --versioned --out "$WORK/llama-torch2.h5" >/dev/null 2>&1 || fail "llama-tiny's 2.9 lane failed"
for pair in "$WORK/run/receipts/torch2-fp32.h5 $WORK/run/receipts/cpu-ref.h5" "$WORK/llama-torch2.h5 $WORK/llama-cpu-ref.h5"; do
  set -- $pair
  "$PY" - "$1" "$2" <<'PY' || fail "$1 does not reproduce cpu-ref's losses"
import sys, h5py, numpy as np
lane, ref = (h5py.File(p, "r")["steps/loss"][()] for p in sys.argv[1:3])
relative = np.abs(lane - ref) / np.abs(ref)
assert relative[0] <= 1e-5 and relative.max() <= 2e-6, (relative[0], relative.max())
PY
  expect_exit 0 "" -- "$HARNESS" compare "$1" "$2"
  grep -qE "^budget +([a-z-]+\.)?torch-cpu " "$WORK/stdout" || fail "compare of $1 is not under torch-cpu: $(head -3 "$WORK/stdout")"
done

sed 's#python = "../.venv/bin/python"#python = "no-such-python"#' "$SRC/canaries/nightly.toml" >"$WORK/m.toml"
expect_exit 2 "lanes\[9\] \(torch2-fp32\)\.python: '.*/no-such-python' does not exist" -- \
  "$HARNESS" nightly --matrix "$WORK/m.toml" --out "$WORK/refused"
[ ! -e "$WORK/refused" ] || fail "a refused matrix left an output directory"
finish
