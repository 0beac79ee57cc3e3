#!/usr/bin/env bash
# The fuzzers' seed corpus (fuzz/corpus/, reproducers of past findings included) through
# the CLI commands that read each kind of file, in every build this suite runs in (Release
# and ASan + UBSan): every exit is 0, 1 or 2, never a signal, and a 2 is one line. The
# libFuzzer runs themselves are scripts/fuzz.sh (docs/testing.md, "Fuzzing").
source "$(dirname "$0")/lib.sh"
corpus="$HERE/../../fuzz/corpus"

# allowed WHAT CODE: the CLI contract's exit statuses; anything else (a signal: 128+N,
# an ASan abort) is a finding.
allowed() {
  case "$2" in
    0 | 1) ;;
    2) [ "$(grep -c . "$WORK/stderr")" -le 1 ] || fail "$1: exit 2 with more than one line: $(cat "$WORK/stderr")" ;;
    *) fail "$1: exit $2 (not 0, 1 or 2): $(tail -n 3 "$WORK/stderr")" ;;
  esac
}

ref="$WORK/ref.h5"
"$HARNESS" run --canary micro --steps 2 --out "$ref" >/dev/null 2>&1 || { fail "run"; finish; }

seeds=0
for f in "$corpus"/receipt/*; do
  seeds=$((seeds + 1))
  cp "$f" "$WORK/seed.h5"
  for cmd in "validate" "validate --json" "inspect"; do
    "$HARNESS" $cmd "$WORK/seed.h5" >"$WORK/stdout" 2>"$WORK/stderr"
    allowed "$cmd $(basename "$f")" $?
  done
  "$HARNESS" compare "$WORK/seed.h5" "$ref" >"$WORK/stdout" 2>"$WORK/stderr"
  allowed "compare $(basename "$f")" $?
  "$HARNESS" bisect "$ref" "$WORK/seed.h5" --no-replay >"$WORK/stdout" 2>"$WORK/stderr"
  allowed "bisect $(basename "$f")" $?
done

for f in "$corpus"/budgets/*; do
  seeds=$((seeds + 1))
  "$HARNESS" compare "$ref" "$ref" --budgets "$f" >"$WORK/stdout" 2>"$WORK/stderr"
  allowed "compare --budgets $(basename "$f")" $?
done

mkdir -p "$WORK/goldens"
for f in "$corpus"/matrix/*; do
  seeds=$((seeds + 1))
  "$HARNESS" golden status --matrix "$f" --goldens "$WORK/goldens" >"$WORK/stdout" 2>"$WORK/stderr"
  allowed "golden status --matrix $(basename "$f")" $?
done

# Canary files, each as canary.toml beside the two token files fuzz/fuzz_canary.cpp writes
# (80 uint16 ids below 256, 80 uint32 ids below 8): one step of a run.
mkdir -p "$WORK/canary"
"$PY" -c "
import numpy as np
np.array([(i * 37) % 256 for i in range(80)], '<u2').tofile('$WORK/canary/tokens.u16')
np.array([(i * 3) % 8 for i in range(80)], '<u4').tofile('$WORK/canary/tokens.u32')"
for f in "$corpus"/canary/*; do
  seeds=$((seeds + 1))
  cp "$f" "$WORK/canary/canary.toml"
  "$HARNESS" run --canary "$WORK/canary/canary.toml" --steps 1 --out "$WORK/canary/run.h5" --force \
    >"$WORK/stdout" 2>"$WORK/stderr"
  allowed "run --canary $(basename "$f")" $?
done

[ "$seeds" -ge 10 ] || fail "only $seeds seeds found under $corpus"
finish
