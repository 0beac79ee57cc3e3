#!/usr/bin/env bash
# Mutation test of whole receipts through the CLI: one-byte flips anywhere in a valid
# receipt, read by inspect, validate and check (the mutant as run, and as golden).
# Every exit is 0, 1 or 2, never a signal; a 2 names the mutant; and a mutant that
# validates is bitwise the receipt it came from, content for content (no silent
# wrong value: the checksummed format of docs/receipt-schema.md).
#   MUTANTS (default 300) and MUTATION_SEED (default 20261123) set the sample.
source "$(dirname "$0")/lib.sh"
mutants=${MUTANTS:-300}
seed=${MUTATION_SEED:-20261123}

good="$WORK/good.h5"
"$HARNESS" run --canary micro --steps 5 --trace ops --out "$good" >/dev/null 2>&1 || { fail "run"; finish; }
"$HARNESS" validate --json "$good" >"$WORK/good.json" || fail "the unmutated receipt does not validate"

# mutate SRC DST INDEX: DST is SRC with one byte at a seeded offset XORed with a non-zero mask.
mutate() {
  $PY - "$1" "$2" "$3" "$seed" <<'EOF'
import random, sys
src, dst, index, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
data = bytearray(open(src, "rb").read())
rng = random.Random(seed * 1000003 + index)
data[rng.randrange(len(data))] ^= rng.randrange(1, 256)
open(dst, "wb").write(bytes(data))
EOF
}

# judge WHAT CODE ALLOWED [OUTPUT]: an exit status the CLI contract allows; a 2 names the
# file in OUTPUT (stderr, or the --json document on stdout).
judge() {
  local what=$1 code=$2 allowed=$3 output=${4:-$WORK/stderr}
  if [ "$code" -ge 128 ]; then fail "$what: killed by signal $((code - 128))"; return; fi
  case " $allowed " in *" $code "*) ;; *) fail "$what: exit $code, allowed: $allowed"; return ;; esac
  if [ "$code" -eq 2 ]; then
    grep -q "mutant.h5" "$output" || fail "$what: exit 2 without naming the file: $(head -c 300 "$output")"
  fi
}

counts_validated=0; counts_refused=0
for ((i = 0; i < mutants; i++)); do
  m="$WORK/mutant.h5"
  mutate "$good" "$m" "$i"
  "$HARNESS" inspect --json "$m" >/dev/null 2>"$WORK/stderr"; judge "mutant $i inspect" $? "0 2"
  "$HARNESS" validate --json "$m" >"$WORK/validate.json" 2>"$WORK/stderr"; code=$?
  judge "mutant $i validate" $code "0 2" "$WORK/validate.json"
  if [ "$code" -eq 0 ]; then
    counts_validated=$((counts_validated + 1))
    # Valid means unchanged: the same steps, tensors and content as the original
    # (a flip that lands in unused space changes nothing anyone reads).
    $PY - "$good" "$m" <<'EOF' || fail "mutant $i validates but reads differently from the original"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
def content(f):
    out = {}
    def visit(name, obj):
        for k, v in obj.attrs.items(): out["@" + name + "/" + k] = np.asarray(v).tobytes()
        if isinstance(obj, h5py.Dataset): out[name] = obj[()].tobytes()
    f.visititems(visit)
    for k, v in f.attrs.items(): out["@/" + k] = np.asarray(v).tobytes()
    return out
sys.exit(0 if content(a) == content(b) else 1)
EOF
  else
    counts_refused=$((counts_refused + 1))
  fi
  "$HARNESS" check --golden "$good" "$m" >/dev/null 2>"$WORK/stderr"; judge "mutant $i check (as run)" $? "0 2"
  "$HARNESS" check --golden "$m" "$good" >/dev/null 2>"$WORK/stderr"; judge "mutant $i check (as golden)" $? "0 2"
done
echo "$mutants mutants: $counts_validated read back unchanged, $counts_refused refused with exit 2"
[ "$counts_refused" -gt 0 ] || fail "no mutant was refused: the mutations did not reach the receipt"
finish
