#!/usr/bin/env bash
# harness power (docs/budgets.md, "Detection power"): on the bitwise reference lane every
# ladder is caught at its smallest size and at its step (a 1-ulp weight at step 0); on a
# budgeted lane each ladder stops at the first size its check fails, and that size, run by
# hand with `run --inject-fault`, fails `compare` where the size below passes; a check that
# misses a 1e-4 scale of a layer is called too loose (exit 1); --against-golden checks the
# lane against its golden instead; a PyTorch lane takes the same ladders; scripts/power-table.sh tabulates a matrix; bad input exits 2, one line.
source "$(dirname "$0")/lib.sh"
MATRIX="$HERE/data/micro_nightly.toml"
BUDGETS="$HERE/../../canaries/budgets.toml"
power() { "$HARNESS" power --matrix "$MATRIX" --budgets "$BUDGETS" "$@"; }

expect_exit 0 "" -- power --lane ref --json
"$PY" - "$WORK/stdout" <<'PY' || fail "the bitwise lane does not catch every smallest regression at its step"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["bitwise"] and r["too_loose"] is False and r["step"] == 3 and r["tensor"] == "blocks.0.attn.qkv.weight", r
at = {"weight-scale": 3, "weight-ulps": 0, "lr-scale": 3, "eps-scale": 0}
for l in r["ladders"]:
    assert len(l["rungs"]) == 1 and l["smallest_caught"] == l["sizes"][0] and l["step"] == at[l["kind"]], l
    assert l["rungs"][0]["metric"] == "hashes", l
PY
expect_exit 0 "" -- power --lane ref
grep -q "^verdict     catches a 0.0001 scale of blocks.0.attn.qkv.weight within its run$" "$WORK/stdout" ||
  fail "no verdict line: $(cat "$WORK/stdout")"

# tp under [mesh-fp32]: a 12-step run misses a 1e-4 scale of the layer (measured: caught at 1e-3)
expect_exit 1 "" -- power --lane tp --json
cp "$WORK/stdout" "$WORK/tp.json"
"$PY" - "$WORK/tp.json" "$WORK/cases" <<'PY' || fail "tp's ladders are not climbed to their first catch"
import json, sys
r = json.load(open(sys.argv[1]))
assert not r["bitwise"] and r["budget"] == ["mesh-fp32"] and r["too_loose"] is True, r
ladders = {l["kind"]: l for l in r["ladders"]}
assert ladders["weight-scale"]["smallest_caught"] == 1e-3, ladders["weight-scale"]
cases = []
for l in r["ladders"]:
    rungs = l["rungs"]
    assert [x["size"] for x in rungs] == l["sizes"][:len(rungs)], l  # smallest first, none skipped
    assert all(not x["caught"] for x in rungs[:-1]) and (rungs[-1]["caught"] or len(rungs) == len(l["sizes"])), l
    if rungs[-1]["caught"]:
        cases.append("%s %s" % (rungs[-1]["fault"], "1"))
        if len(rungs) > 1:
            cases.append("%s %s" % (rungs[-2]["fault"], "0"))
open(sys.argv[2], "w").write("\n".join(cases) + "\n")
PY
"$HARNESS" run --canary micro --steps 12 --seed 7 --out "$WORK/ref.h5" >/dev/null 2>&1 || fail "reference run"
while read -r fault want; do  # each size the ladder judged, judged again by run and compare
  "$HARNESS" run --canary micro --steps 12 --seed 7 --engine tpu-mesh --mesh 2x2 --shard-plan tp --inject-fault "$fault" \
    --out "$WORK/f.h5" --force >/dev/null 2>&1 || fail "run --inject-fault $fault"
  expect_exit "$want" "" -- "$HARNESS" compare "$WORK/f.h5" "$WORK/ref.h5" --budgets "$BUDGETS"
done <"$WORK/cases"
[ "$(wc -l <"$WORK/cases")" -ge 6 ] || fail "too few ladders caught on tp: $(cat "$WORK/cases")"
expect_exit 1 "" -- power --lane tp
grep -q "^verdict     TOO LOOSE: misses a 0.0001 scale of blocks.0.attn.qkv.weight within its 12 steps$" "$WORK/stdout" ||
  fail "tp is not called too loose: $(cat "$WORK/stdout")"
grep -qE "^ladder      weight-scale: E = 0.001 caught, [a-z_]+ at step 3 " "$WORK/stdout" || fail "no weight-scale line"
# its record, as calibrate --power writes it under an entry, is one the budgets file takes
grep -q '^record      power = { lane = "micro/tpu-mesh@2x2+tp", step = 3, tensor = "blocks.0.attn.qkv.weight", weight_scale = 0.001, ' \
  "$WORK/stdout" || fail "no record line: $(cat "$WORK/stdout")"
"$PY" - "$WORK/tp.json" "$BUDGETS" "$WORK/recorded.toml" <<'PY' || fail "the record does not replace [mesh-fp32]'s"
import json, re, sys
record = json.load(open(sys.argv[1]))["record"]
text, n = re.subn(r"(?m)(^\[mesh-fp32\]\n(?:(?!\[).*\n)*?)power = .*\n", lambda m: m.group(1) + record + "\n",
                  open(sys.argv[2]).read(), count=1)
assert n == 1 and record.startswith("power = { lane = "), record
open(sys.argv[3], "w").write(text)
PY
expect_exit 0 "" -- "$HARNESS" power --matrix "$MATRIX" --budgets "$WORK/recorded.toml" --lane ref --kinds eps-scale

# scripts/power-table.sh (docs/budgets.md's table) on the micro matrix: a row per lane of the
# harness's engines, tp's as measured above
HARNESS="$HARNESS" bash "$HERE/../../scripts/power-table.sh" "$MATRIX" "$BUDGETS" >"$WORK/table.md" 2>"$WORK/table.err" ||
  fail "power-table.sh failed: $(cat "$WORK/table.err")"
[ "$(grep -c '^| `' "$WORK/table.md")" -eq 5 ] || fail "the table has not one row per lane: $(cat "$WORK/table.md")"
grep -qE '^\| `tp` \| \[mesh-fp32\] \| 0.001 \(step 3\) \|' "$WORK/table.md" || fail "tp's row: $(cat "$WORK/table.md")"
grep -qE '^\| `ref` \| bitwise \| 1e-07 \(step 3\) \| 1 \(step 0\) \|' "$WORK/table.md" || fail "ref's row: $(cat "$WORK/table.md")"

# The power of the shipped [bf16] on tiny, held to its measured value (docs/budgets.md, "Detection
# power"): its lane catches the learning rate 1% high from step 25 at step 34, and nothing smaller.
expect_exit 0 "" -- "$HARNESS" power --lane accel-bf16 --kinds lr-scale --budgets "$BUDGETS" --json
"$PY" - "$WORK/stdout" <<'PY' || fail "the power of [bf16] on tiny moved"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["lane"] == "tiny/accel+bf16" and r["budget"] == ["bf16", "noise"] and r["step"] == 25, r
[l] = r["ladders"]
assert l["kind"] == "lr-scale" and l["smallest_caught"] == 0.01 and l["step"] == 34, l
assert r["too_loose"] is None, r  # the weight-scale ladder was not climbed
PY

# --against-golden: the nightly's golden check instead of the reference lane. On the
# golden's own platform it is bitwise, so every ladder is caught at its first rung; a lane
# with no golden, or a golden its log does not know, exits 2 before anything runs.
G="$WORK/goldens"
unset CI  # the goldens are made here, as on a person's machine
"$HARNESS" golden refresh --matrix "$MATRIX" --goldens "$G" --reason test >/dev/null 2>&1 &&
  "$HARNESS" golden approve --goldens "$G" --approved-by test --allow-dirty >/dev/null 2>&1 || fail "goldens"
expect_exit 0 "" -- power --lane tp --against-golden --goldens "$G" --kinds weight-ulps,eps-scale --json
"$PY" - "$WORK/stdout" "$G" <<'PY' || fail "tp against its golden is not bitwise, or misses a first rung"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["against"] == "its golden %s/micro/tpu-mesh@2x2+tp.h5" % sys.argv[2] and r["bitwise"], r
for l in r["ladders"]:
    assert len(l["rungs"]) == 1 and l["smallest_caught"] == l["sizes"][0] and l["step"] == 0, l
assert r["record"].startswith('power = { lane = "micro/tpu-mesh@2x2+tp", against = "golden", step = 3, '), r["record"]
PY
sed 's/^power = { lane = "tiny\/tpu-mesh@2x2+tp", /power = { lane = "tiny\/tpu-mesh@2x2+tp", against = "gold", /' "$BUDGETS" \
  >"$WORK/bad-against.toml"
expect_exit 2 "\\[mesh-fp32\\].power.against: \"golden\" \(measured against the lane's golden\) or absent" -- \
  "$HARNESS" power --matrix "$MATRIX" --lane ref --kinds eps-scale --budgets "$WORK/bad-against.toml"
expect_exit 2 "--against-golden: micro/tpu-mesh@2x2\+tp has no golden" -- power --lane tp --against-golden --goldens "$WORK/none"
printf 'x' >>"$G/micro/tpu-mesh@2x2+tp.h5"
expect_exit 2 "tpu-mesh@2x2\+tp.h5" -- power --lane tp --against-golden --goldens "$G"

# A PyTorch lane (canary_harness.lane on the job's pack) climbs the same ladders through its
# own --inject-fault: each stops at its first catch, and that size, run by hand on the same
# pack, fails compare where the size below passes.
{ cat "$MATRIX"; printf '%s\n' '[[lanes]]' 'id = "torch"' 'engine = "torch"'; } >"$WORK/torch.toml"
status=0
"$HARNESS" power --matrix "$WORK/torch.toml" --budgets "$BUDGETS" --lane torch --json >"$WORK/torch.json" \
  2>"$WORK/torch.err" || status=$?
[ "$status" -le 1 ] || fail "power --lane torch exited $status: $(cat "$WORK/torch.err")"
"$PY" - "$WORK/torch.json" "$WORK/torch-cases" <<'PY' || fail "the torch lane's ladders are not climbed"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["lane"] == "micro/torch" and r["budget"] == ["torch-cpu"] and r["clean_failure"] is None, r
cases = []
for l in r["ladders"]:
    rungs = l["rungs"]
    assert all(not x["caught"] for x in rungs[:-1]) and rungs[-1]["caught"], l  # every kind caught by 2^20 / 1e-2 / 1000
    cases.append("%s 1" % rungs[-1]["fault"])
    if len(rungs) > 1:
        cases.append("%s 0" % rungs[-2]["fault"])
open(sys.argv[2], "w").write("\n".join(cases) + "\n")
PY
"$HARNESS" export --canary micro --steps 12 --seed 7 --out "$WORK/micro-pack.h5" >/dev/null 2>&1 || fail "export"
while read -r fault want; do
  PYTHONPATH="$HERE/../../python" HARNESS_BIN="$HARNESS" "$PY" -m canary_harness.lane --pack "$WORK/micro-pack.h5" --inject-fault "$fault" \
    --out "$WORK/t.h5" --force >/dev/null 2>&1 || fail "canary_harness.lane --inject-fault $fault"
  expect_exit "$want" "" -- "$HARNESS" compare "$WORK/t.h5" "$WORK/ref.h5" --budgets "$BUDGETS"
done <"$WORK/torch-cases"
[ "$(wc -l <"$WORK/torch-cases")" -ge 7 ] || fail "too few torch rungs: $(cat "$WORK/torch-cases")"

# bad input: exit 2, one line, before anything runs
expect_exit 2 "--kinds: 'lr' is not a ladder \(weight-scale, weight-ulps, lr-scale, eps-scale\)" -- power --lane tp --kinds lr
expect_exit 2 "--lane: 'nope' is not a lane" -- power --lane nope
expect_exit 2 "--tensor: blocks.0.nope is not a parameter of micro" -- power --lane tp --tensor blocks.0.nope
expect_exit 2 "--step: 12 is past the matrix's last step \(11\)" -- power --lane tp --step 12
printf '%s\n' 'schema_version = 1' 'canary = "micro"' 'steps = 12' 'seed = 7' 'reference = "ref"' \
  '[[lanes]]' 'id = "ref"' 'engine = "cpu-ref"' '[[lanes]]' 'id = "ext"' \
  'command = ["/bin/true", "{out}"]' 'budget-features = "torch-cpu"' > "$WORK/external.toml"
expect_exit 2 "--lane: ext runs a command" -- "$HARNESS" power --matrix "$WORK/external.toml" --lane ext
finish
