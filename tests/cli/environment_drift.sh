#!/usr/bin/env bash
# Environment drift end to end (docs/nightly.md, "Environment drift"): goldens recorded on
# another stack (an older fmt) with other bits (a fault at step 5), so that every lane
# fails its golden on a moved stack; the nightly names the library first, in its output,
# summary.json, summary.md and report, with the one refresh that would adopt the new stack.
source "$(dirname "$0")/lib.sh"
BUDGETS="$HERE/../../canaries/budgets.toml"
G="$WORK/goldens"
mkdir -p "$G"
unset CI
cat >"$WORK/matrix.toml" <<'TOML'
schema_version = 1
canary = "micro"
steps = 12
seed = 7
reference = "ref"

[[lanes]]
id = "ref"
engine = "cpu-ref"

[[lanes]]
id = "tp"
engine = "tpu-mesh"
mesh = "2x2"
shard-plan = "tp"
TOML

# The goldens: each lane as the matrix runs it, but with a fault, and an older fmt on record.
fault=(--inject-fault step=5,op=blocks.1.mlp.fc --steps 12 --seed 7 --canary micro)
"$HARNESS" run --engine cpu-ref "${fault[@]}" --out "$WORK/ref.h5" >/dev/null 2>&1 || fail "golden run of ref"
"$HARNESS" run --engine tpu-mesh --mesh 2x2 --shard-plan tp "${fault[@]}" --out "$WORK/tp.h5" >/dev/null 2>&1 ||
  fail "golden run of tp"
"$PY" - "$WORK/ref.h5" "$WORK/tp.h5" <<'PY' || fail "could not put an older fmt on the goldens' record"
import re, sys
import h5py
for path in sys.argv[1:]:
    with h5py.File(path, "r+") as f:
        libraries = f["manifest"].attrs["libraries"].decode()
        older = re.sub(r"fmt [0-9.]+", "fmt 8.0.0", libraries)
        assert older != libraries, libraries
        f["manifest"].attrs.modify("libraries", older.encode())
PY
expect_exit 0 "" -- "$HARNESS" golden refresh --goldens "$G" --receipt "$WORK/ref.h5" --receipt "$WORK/tp.h5" \
  --reason "goldens of another stack"
expect_exit 0 "" -- "$HARNESS" golden approve --goldens "$G" --approved-by test --allow-dirty

OUT="$WORK/nightly"
expect_exit 1 "" -- "$HARNESS" nightly --matrix "$WORK/matrix.toml" --budgets "$BUDGETS" --goldens "$G" --out "$OUT"
grep -qE "environment drift: 2 lanes fail their goldens on a moved stack; libraries.fmt \(8.0.0 -> [0-9.]+\) moved in 2 of 2 failing lanes and 0 of 0 passing" "$WORK/stdout" ||
  fail "the nightly's output does not name the moved library: $(cat "$WORK/stdout")"
"$PY" - "$OUT" <<'PY' || fail "summary.json's environment_drift is not the library first"
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
drift = json.loads((out / "summary.json").read_text())["environment_drift"]
top = drift["entries"][0]
assert top["entry"] == "libraries.fmt" and top["failing"] == 2 and top["passing"] == 0 and top["explains"], top
assert sorted(drift["failing_lanes"]) == ["ref", "tp"], drift
assert drift["refresh"][0].startswith("harness golden refresh --matrix "), drift["refresh"]
assert "environment drift: libraries.fmt 8.0.0 -> " in drift["refresh"][0], drift["refresh"]
assert "| `libraries.fmt` | 8.0.0 -> " in (out / "summary.md").read_text()
assert "<h2>Environment drift</h2>" in (out / "report.html").read_text()
PY
# The proposed refresh runs as written: one candidate set of the whole matrix, to review.
refresh=$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['environment_drift']['refresh'][0])" "$OUT/summary.json")
eval "\"$HARNESS\" ${refresh#harness }" >"$WORK/refresh.log" 2>&1 ||
  fail "the proposed refresh did not run: $refresh: $(cat "$WORK/refresh.log")"
[ "$(find "$G" -name '*.candidate.h5' | wc -l)" -eq 2 ] || fail "the refresh did not write one candidate per lane"
grep -q "environment drift: libraries.fmt" "$G/candidates.json" || fail "the candidates do not carry the drift as their reason"
finish
