#!/usr/bin/env bash
# torch 2.9 (.venv/) against cpu-ref (docs/nightly.md, "External lanes"; how the default
# matrix's torch 2.9 lanes are judged is cli.default_nightly's): the 2.9 lane reproduces
# cpu-ref's losses on tiny and llama-tiny, and a matrix whose interpreter is missing is
# refused in one line naming the key.
source "$(dirname "$0")/lib.sh"
SRC=$(cd "$HERE/../.." && pwd)
unset CI
[ -x "$SRC/.venv/bin/python" ] || { echo "FAIL: no .venv/ (scripts/python-env.sh makes it)" >&2; exit 1; }

# torch 2.9 reproduces cpu-ref on tiny and on llama-tiny (each canary's pack trained by the
# 2.9 lane): step 0's loss within 1e-5 relative, every loss within 2e-6 relative, and
# compare passes under torch-cpu.
for canary in tiny llama-tiny; do
  "$HARNESS" export --canary "$canary" --out "$WORK/$canary-pack.h5" >/dev/null || fail "cannot export $canary's pack"
  "$HARNESS" run --canary "$canary" --out "$WORK/$canary-cpu-ref.h5" >/dev/null || fail "cannot run $canary's cpu-ref"
  env PYTHONPATH="$SRC/python" HARNESS_BIN="$HARNESS" "$SRC/.venv/bin/python" -m canary_harness.lane \
    --pack "$WORK/$canary-pack.h5" --versioned --out "$WORK/$canary-torch2.h5" >/dev/null 2>&1 || fail "$canary's 2.9 lane failed"
done
"$PY" - "$WORK/tiny-torch2.h5" <<'PY' || fail "the 2.9 lane's receipt is not torch 2.9's"
import sys, h5py
attrs = h5py.File(sys.argv[1], "r")["manifest"].attrs
libraries = attrs["libraries"].decode() if isinstance(attrs["libraries"], bytes) else attrs["libraries"]
lane = attrs["lane"].decode() if isinstance(attrs["lane"], bytes) else attrs["lane"]
assert "torch 2.9" in libraries and lane == "tiny/torch@2.9", (libraries, lane)
PY
for pair in "$WORK/tiny-torch2.h5 $WORK/tiny-cpu-ref.h5" "$WORK/llama-tiny-torch2.h5 $WORK/llama-tiny-cpu-ref.h5"; do
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
expect_exit 2 "lanes\[[0-9]+\] \(torch2-bf16\)\.python: '.*/no-such-python' does not exist" -- \
  "$HARNESS" nightly --matrix "$WORK/m.toml" --out "$WORK/refused"
[ ! -e "$WORK/refused" ] || fail "a refused matrix left an output directory"
finish
