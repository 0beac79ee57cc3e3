#!/usr/bin/env bash
# harness calibrate: the proposal fits every repeat with its margin and no more (halving
# it fails a repeat), only the calibrated feature's section changes (a canary's own
# [micro.X] when the file has one), the budgets file is never written, bad input exits 2
# with one line, and fewer than 8 samples need --provisional, which check then reports.
source "$(dirname "$0")/lib.sh"
MATRIX="$HERE/data/micro_nightly.toml"
BUDGETS="$WORK/budgets.toml"
cp "$HERE/../../canaries/budgets.toml" "$BUDGETS"
before=$(sha256sum "$BUDGETS")

expect_exit 0 "" -- "$HARNESS" calibrate --lane bf16 --repeats 3 --provisional --matrix "$MATRIX" --budgets "$BUDGETS"
grep -q "^provisional \[bf16\] from 3 samples (fewer than 8)" "$WORK/stdout" || fail "calibrate does not say the entry is provisional"
grep -q "within the proposal: 3/3" "$WORK/stdout" || fail "not every repeat fits the proposal: $(cat "$WORK/stdout")"
[ "$before" = "$(sha256sum "$BUDGETS")" ] || fail "calibrate wrote the budgets file"
[ -s "$WORK/budgets.candidate.toml" ] && [ -s "$WORK/budgets.candidate.md" ] || fail "no candidate or report beside the budgets"

"$PY" - "$BUDGETS" "$WORK/budgets.candidate.toml" "$WORK/halved.toml" <<'PY' || fail "the candidate is not a bf16-only proposal"
import sys, tomllib
old, new = (tomllib.load(open(p, "rb")) for p in sys.argv[1:3])
assert set(old) == set(new)
for key in old:
    if key != "bf16":
        assert old[key] == new[key], key
assert new["bf16"]["samples"] == 3 and "repeats" not in new["bf16"] and new["bf16"]["rationale"] == old["bf16"]["rationale"]
assert new["bf16"]["calibrated"] and set(new["bf16"]["observed"]) == {"loss", "grad_norm", "params_sketch"}
assert [w["steps"] for w in new["bf16"]["loss"]] == [w["steps"] for w in old["bf16"]["loss"]]
# halve the proposal of every metric: below the largest need, so some repeat must fail
text = open(sys.argv[2]).read()
for metric in ("loss", "grad_norm", "params_sketch"):
    for w in new["bf16"][metric]:
        for k in ("atol", "rtol", "ulp"):
            if k in w:
                w[k] /= 2
head = text.index("[bf16]")
end = text.index("\n[", head)
def window(w):
    return "{ " + ", ".join('steps = "%s"' % w["steps"] if k == "steps" else "%s = %r" % (k, w[k]) for k in w) + " }"
section = text[head:end].splitlines()
section = [l if not l.split(" ")[0] in ("loss", "grad_norm", "params_sketch")
           else "%s = [ %s ]" % (l.split(" ")[0], ", ".join(window(w) for w in new["bf16"][l.split(" ")[0]])) for l in section]
open(sys.argv[3], "w").write(text[:head] + "\n".join(section) + text[end:])
PY
"$HARNESS" run --canary micro --steps 12 --seed 7 --out "$WORK/ref.h5" >/dev/null 2>&1 || fail "reference run"
failing=0
"$HARNESS" run --canary micro --steps 12 --seed 7 --engine tpu-mesh --mesh 2x2 --shard-plan tp \
  --out "$WORK/tp-for-receipts.h5" >/dev/null 2>&1 || fail "tp run (receipts)"
for seed in 1000 1001 1002; do
  "$HARNESS" run --canary micro --steps 12 --seed 7 --engine accel --features bf16 --noise-seed $seed \
    --out "$WORK/r$seed.h5" >/dev/null 2>&1 || fail "repeat $seed"
  expect_exit 0 "" -- "$HARNESS" compare "$WORK/r$seed.h5" "$WORK/ref.h5" --budgets "$WORK/budgets.candidate.toml"
  "$HARNESS" compare "$WORK/r$seed.h5" "$WORK/ref.h5" --budgets "$WORK/halved.toml" >/dev/null 2>&1 || failing=$((failing + 1))
done
[ "$failing" -ge 1 ] || fail "half the proposal still fits every repeat: the proposal is not tight"

# From receipts made elsewhere: the same three runs, given as receipts, propose exactly what
# running them did (the repeats above replayed noise seeds 1000..1002, as calibrate's runs do).
expect_exit 0 "" -- "$HARNESS" calibrate --receipts "$WORK/r1000.h5" "$WORK/r1001.h5" "$WORK/r1002.h5" \
  --reference "$WORK/ref.h5" --budgets "$BUDGETS" --out "$WORK/from_receipts.candidate.toml" --provisional
grep -q "^3 receipts of micro/accel+bf16 against micro/cpu-ref" "$WORK/from_receipts.candidate.md" ||
  fail "the report does not say it calibrated from receipts: $(head -4 "$WORK/from_receipts.candidate.md")"
"$PY" - "$WORK/budgets.candidate.toml" "$WORK/from_receipts.candidate.toml" <<'PY' || fail "receipts and runs propose differently"
import sys, tomllib
runs, receipts = (tomllib.load(open(p, "rb")) for p in sys.argv[1:3])
# the same numbers; each says how it was made
assert runs["bf16"].pop("method").startswith("repeats: 3 runs (noise seeds 1000..1002)")
assert receipts["bf16"].pop("method").startswith("receipts: 3 made elsewhere")
assert runs == receipts, (runs["bf16"], receipts["bf16"])
PY
# Pairs (--reference per receipt): each receipt against the run made beside it, here the
# bf16 lane and cpu-ref from the same perturbed initial weights. The proposal rests on each
# pair's own deviation: `observed` is the largest of the three pairs' compare.
for s in 1 2 3; do
  "$HARNESS" run --canary micro --steps 12 --seed 7 --perturb-init $s --out "$WORK/pair-ref$s.h5" >/dev/null 2>&1 ||
    fail "paired reference $s"
  "$HARNESS" run --canary micro --steps 12 --seed 7 --perturb-init $s --engine accel --features bf16 --noise-seed 1000 \
    --out "$WORK/pair$s.h5" >/dev/null 2>&1 || fail "paired receipt $s"
  "$HARNESS" compare "$WORK/pair$s.h5" "$WORK/pair-ref$s.h5" --budgets "$BUDGETS" --json > "$WORK/pair$s.json" 2>/dev/null
done
expect_exit 0 "" -- "$HARNESS" calibrate --receipts "$WORK/pair1.h5" "$WORK/pair2.h5" "$WORK/pair3.h5" \
  --reference "$WORK/pair-ref1.h5" "$WORK/pair-ref2.h5" "$WORK/pair-ref3.h5" --budgets "$BUDGETS" \
  --out "$WORK/pairs.candidate.toml" --provisional
grep -q "^3 receipts of micro/accel+bf16 against micro/cpu-ref (3 pairs, each receipt against the reference made beside it)" \
  "$WORK/pairs.candidate.md" || fail "the report does not say it calibrated from pairs: $(head -4 "$WORK/pairs.candidate.md")"
grep -q "pair2.h5 (against .*pair-ref2.h5): now pass" "$WORK/pairs.candidate.md" || fail "repeat 2 is not judged against its pair"
"$PY" - "$WORK/pairs.candidate.toml" "$WORK"/pair?.json <<'PY' || fail "the pairs' proposal is not made from each pair's deviation"
import json, math, sys, tomllib
entry = tomllib.load(open(sys.argv[1], "rb"))["bf16"]
assert entry["method"].startswith("pairs: 3 receipts, each against the reference run made beside it"), entry["method"]
observed = entry["observed"]
for metric in ("loss", "grad_norm"):
    largest = max(max(next(m["step_deviation"] for m in json.load(open(p))["metrics"] if m["metric"] == metric))
                  for p in sys.argv[2:])
    assert math.isclose(observed[metric], largest, rel_tol=5e-3), (metric, observed[metric], largest)
PY
expect_exit 2 "--reference: give one reference, or one per receipt in their order \\(3 receipts, 2 references\\)" -- \
  "$HARNESS" calibrate --receipts "$WORK/pair1.h5" "$WORK/pair2.h5" "$WORK/pair3.h5" \
  --reference "$WORK/pair-ref1.h5" "$WORK/pair-ref2.h5" --budgets "$BUDGETS" --out "$WORK/x.toml" --provisional
expect_exit 2 "--reference: .*pair3.h5 is of lane micro/accel\+bf16" -- \
  "$HARNESS" calibrate --receipts "$WORK/pair1.h5" "$WORK/pair2.h5" \
  --reference "$WORK/pair-ref1.h5" "$WORK/pair3.h5" --budgets "$BUDGETS" --out "$WORK/x.toml" --provisional

# A window no step of the repeats reaches (12-step receipts, a window from step 40) keeps its
# values: nothing was measured there (a floor-sized proposal would fail every longer run).
cp "$BUDGETS" "$WORK/later.toml"
printf '\n[micro.bf16]\nform = "tolerance"\nrationale = "micro, two windows"\ncalibrated = "2000-01-01"\nrepeats = 1\nloss = [ { steps = "0-39", atol = 1e-3 }, { steps = "40-", atol = 7e-3 } ]\ngrad_norm = [ { steps = "0-39", rtol = 1e-2 }, { steps = "40-", rtol = 3e-2 } ]\nparams_sketch = [ { steps = "0-", atol = 0.4, rtol = 0.035 } ]\n' \
  >> "$WORK/later.toml"
expect_exit 0 "" -- "$HARNESS" calibrate --receipts "$WORK/r1000.h5" "$WORK/r1001.h5" "$WORK/r1002.h5" \
  --reference "$WORK/ref.h5" --budgets "$WORK/later.toml" --out "$WORK/later.candidate.toml" --provisional
[ "$(grep -c "no step of the repeats is in it, kept as it is" "$WORK/later.candidate.md")" = 2 ] ||
  fail "the report does not name the two windows without samples: $(cat "$WORK/later.candidate.md")"
"$PY" - "$WORK/later.toml" "$WORK/later.candidate.toml" <<'PY' || fail "a window without samples was changed"
import sys, tomllib
old, new = (tomllib.load(open(p, "rb"))["micro"]["bf16"] for p in sys.argv[1:3])
assert new["loss"][1] == old["loss"][1] and new["grad_norm"][1] == old["grad_norm"][1], (old, new)
assert new["loss"][0] != old["loss"][0] and new["loss"][0]["atol"] > 1e-9, new["loss"]
PY
# --widen never proposes less than the current entry: a [bf16] ten times the proposal stays as it is
"$PY" - "$WORK/budgets.candidate.toml" "$WORK/wide.toml" <<'PY' || fail "cannot write a wide [bf16]"
import re, sys
text = open(sys.argv[1]).read()
head = text.index("[bf16]")
end = text.index("\n[", head)
wide = re.sub(r"(atol|rtol|ulp) = ([0-9.e+-]+)", lambda m: "%s = %.3g" % (m.group(1), 10 * float(m.group(2))), text[head:end])
open(sys.argv[2], "w").write(text[:head] + wide + text[end:])
PY
expect_exit 0 "" -- "$HARNESS" calibrate --receipts "$WORK/r1000.h5" --reference "$WORK/ref.h5" --budgets "$WORK/wide.toml" \
  --widen --provisional --out "$WORK/widened.candidate.toml"
grep -q "no term below the current entry's (--widen)" "$WORK/widened.candidate.md" || fail "the report does not say --widen"
"$PY" - "$WORK/wide.toml" "$WORK/widened.candidate.toml" <<'PY' || fail "--widen proposed less than the current entry"
import sys, tomllib
wide, widened = (tomllib.load(open(p, "rb"))["bf16"] for p in sys.argv[1:3])
for metric in ("loss", "grad_norm", "params_sketch"):
    assert widened[metric] == wide[metric], (metric, wide[metric], widened[metric])
assert all(widened["observed"][m] >= wide["observed"][m] for m in wide["observed"])
PY
expect_exit 2 "--receipts: name the receipt they are judged against with --reference" -- \
  "$HARNESS" calibrate --receipts "$WORK/r1000.h5" --budgets "$BUDGETS" --out "$WORK/x.toml"
expect_exit 2 "--lane or --receipts" -- "$HARNESS" calibrate --budgets "$BUDGETS" --out "$WORK/x.toml"
expect_exit 2 "excludes" -- "$HARNESS" calibrate --lane bf16 --receipts "$WORK/r1000.h5" --reference "$WORK/ref.h5" \
  --matrix "$MATRIX" --budgets "$BUDGETS" --out "$WORK/x.toml"
expect_exit 2 "--receipts: .*tp-for-receipts.h5 is of lane micro/tpu-mesh@2x2\+tp" -- "$HARNESS" calibrate --receipts "$WORK/r1000.h5" \
  "$WORK/tp-for-receipts.h5" --reference "$WORK/ref.h5" --budgets "$BUDGETS" --out "$WORK/x.toml" --provisional
head -c 3000 "$WORK/r1001.h5" > "$WORK/truncated.h5"
expect_exit 2 "truncated.h5" -- "$HARNESS" calibrate --receipts "$WORK/truncated.h5" --reference "$WORK/ref.h5" \
  --budgets "$BUDGETS" --out "$WORK/x.toml" --provisional
[ ! -e "$WORK/x.toml" ] || fail "a refused calibration wrote a candidate"

# a per-canary entry is the one calibrated for its canary: [micro.mesh-fp32] changes, [mesh-fp32] stays
cp "$BUDGETS" "$WORK/per_canary.toml"
printf '\n[micro.mesh-fp32]\nform = "tolerance"\nrationale = "micro only"\ncalibrated = "2000-01-01"\nrepeats = 1\nloss = [ { steps = "0-", atol = 1e-6 } ]\ngrad_norm = [ { steps = "0-", rtol = 1e-5 } ]\nparams_sketch = [ { steps = "0-", atol = 5e-4, rtol = 2e-5 } ]\n' \
  >> "$WORK/per_canary.toml"
expect_exit 0 "" -- "$HARNESS" calibrate --lane tp --repeats 1 --provisional --matrix "$MATRIX" --budgets "$WORK/per_canary.toml" \
  --out "$WORK/per_canary.candidate.toml"
grep -q "^# Calibration of \[micro.mesh-fp32\]" "$WORK/per_canary.candidate.md" || fail "the report does not name [micro.mesh-fp32]"
"$PY" - "$WORK/per_canary.toml" "$WORK/per_canary.candidate.toml" <<'PY' || fail "the candidate does not replace [micro.mesh-fp32] alone"
import sys, tomllib
old, new = (tomllib.load(open(p, "rb")) for p in sys.argv[1:3])
assert set(old) == set(new) and old["mesh-fp32"] == new["mesh-fp32"]
for key in old:
    if key != "micro":
        assert old[key] == new[key], key
entry = new["micro"]["mesh-fp32"]
assert entry["rationale"] == "micro only" and entry["calibrated"] != "2000-01-01", entry
assert [w["steps"] for w in entry["loss"]] == ["0-"]
PY

# a declared feature with no entry ("no budget for feature ... calibrate one"): calibrate adds one
"$PY" - "$BUDGETS" "$WORK/no_mesh.toml" <<'PY' || fail "cannot drop [mesh-fp32]"
import sys
text = open(sys.argv[1]).read()
head = text.index("\n[mesh-fp32]\n") + 1
end = text.index("\n[", head) + 1
open(sys.argv[2], "w").write(text[:head] + text[end:])
PY
expect_exit 0 "" -- "$HARNESS" calibrate --lane tp --repeats 1 --provisional --matrix "$MATRIX" --budgets "$WORK/no_mesh.toml" \
  --out "$WORK/new_entry.candidate.toml"
grep -q "^# Calibration of \[mesh-fp32\] (a new entry" "$WORK/new_entry.candidate.md" || fail "the report does not say the entry is new"
grep -q "within the current budgets: 0/1; within the proposal: 1/1" "$WORK/new_entry.candidate.md" \
  || fail "a new entry's repeats: $(cat "$WORK/new_entry.candidate.md")"
"$PY" - "$WORK/no_mesh.toml" "$WORK/new_entry.candidate.toml" <<'PY' || fail "the candidate does not add [mesh-fp32] alone"
import sys, tomllib
old, new = (tomllib.load(open(p, "rb")) for p in sys.argv[1:3])
assert set(new) - set(old) == {"mesh-fp32"} and all(old[k] == new[k] for k in old)
entry = new["mesh-fp32"]
assert entry["form"] == "tolerance" and entry["rationale"].startswith("NEW: proposed by harness calibrate"), entry
assert entry["samples"] == 1 and [w["steps"] for w in entry["loss"]] == ["0-"] and entry["loss"][0]["atol"] > 0, entry
PY
"$HARNESS" run --canary micro --steps 12 --seed 7 --engine tpu-mesh --mesh 2x2 --shard-plan tp --out "$WORK/tp.h5" \
  >/dev/null 2>&1 || fail "tp run"
expect_exit 2 "no budget for feature 'mesh-fp32' in .*no_mesh.toml: calibrate one" -- \
  "$HARNESS" compare "$WORK/tp.h5" "$WORK/ref.h5" --budgets "$WORK/no_mesh.toml"
expect_exit 0 "" -- "$HARNESS" compare "$WORK/tp.h5" "$WORK/ref.h5" --budgets "$WORK/new_entry.candidate.toml"

# Windows from the decisions' part: moe-tiny's accel-noise golden (the nightly's noise seed)
# moves one routing choice at step 40. With [moe-tiny.noise] zeroed, the steps before the
# part fit its first windows (the noise of sums alone) and the steps after it the windows
# from the part, on top of those.
GOLDENS="$HERE/../../goldens/moe-tiny"
"$PY" - "$BUDGETS" "$WORK/zeroed.toml" <<'PY' || fail "cannot zero [moe-tiny.noise]"
import re, sys
text = open(sys.argv[1]).read()
head = text.index("[moe-tiny.noise]")
end = text.index("\n[", head)
section = re.sub(r"atol = [0-9.e+-]+", "atol = 0", text[head:end])
assert section.count('from = "decisions-part"') == 6, section  # loss, grad_norm, params_sketch and the logit metrics
open(sys.argv[2], "w").write(text[:head] + section + text[end:])
PY
expect_exit 0 "" -- "$HARNESS" calibrate --receipts "$GOLDENS/accel.h5" --reference "$GOLDENS/cpu-ref.h5" \
  --feature noise --provisional --budgets "$WORK/zeroed.toml" --out "$WORK/part.candidate.toml"
"$PY" - "$WORK/part.candidate.toml" <<'PY' || fail "the part's windows were not calibrated apart"
import sys, tomllib
entry = tomllib.load(open(sys.argv[1], "rb"))["moe-tiny"]["noise"]
for metric in ("loss", "grad_norm", "params_sketch", "logit_kl", "logprob_delta"):
    base, part = entry[metric]
    assert "from" not in base and part["from"] == "decisions-part", entry[metric]
    assert part["atol"] > 100 * base["atol"] > 0, (metric, base, part)
assert entry["loss"][0]["atol"] < 1e-5 and entry["loss"][1]["atol"] > 1e-3, entry["loss"]
PY
expect_exit 0 "" -- "$HARNESS" compare "$GOLDENS/accel.h5" "$GOLDENS/cpu-ref.h5" --budgets "$WORK/part.candidate.toml"

# One-sided drift over the repeats: bf16 raises micro's loss on every noise seed (a real,
# one-signed effect of rounding), a warning by default, a failure where the entry says so.
expect_exit 0 "" -- "$HARNESS" calibrate --lane bf16 --repeats 8 --matrix "$MATRIX" --budgets "$BUDGETS" \
  --out "$WORK/bias.toml"
grep -qE '^- loss steps 10-: 8 of 8 repeats above the reference, 0 below, .*: biased$' "$WORK/stdout" ||
  fail "bf16's one-signed loss is not reported biased: $(cat "$WORK/stdout")"
grep -q '^bias        one-sided drift over the repeats, a warning' "$WORK/stdout" || fail "no bias warning line"
"$PY" - "$BUDGETS" "$WORK/bias-fail.toml" <<'PY'
import sys
text = open(sys.argv[1]).read()
head = text.index("[bf16]\n")
text = text[:head] + "[bf16]\nbias = \"fail\"\n" + text[head + len("[bf16]\n"):]
open(sys.argv[2], "w").write(text)
PY
expect_exit 1 "" -- "$HARNESS" calibrate --lane bf16 --repeats 8 --matrix "$MATRIX" --budgets "$WORK/bias-fail.toml" \
  --out "$WORK/bias-fail.candidate.toml"
grep -q 'bias = "fail"' "$WORK/bias-fail.candidate.toml" || fail "the candidate dropped the entry's bias = \"fail\""
grep -q '^bias        one-sided drift over the repeats: the entry says bias = "fail"' "$WORK/stdout" ||
  fail "no bias failure line: $(cat "$WORK/stdout")"

# Held-out samples (docs/budgets.md, "False alarms"): the proposal is made from the others
# alone (the same windows as from those runs without any held out), the candidate records
# how many were held out and how many fell outside, and check states the bound.
expect_exit 0 "" -- "$HARNESS" calibrate --lane bf16 --repeats 12 --held-out 4 --matrix "$MATRIX" --budgets "$BUDGETS" \
  --out "$WORK/held.toml"
grep -q '^false alarm 0 of 4 held-out samples outside the proposal: false-alarm rate below 52.7% at 95% confidence' \
  "$WORK/stdout" || fail "no false-alarm line: $(cat "$WORK/stdout")"
[ "$(grep -c '(held out): now' "$WORK/held.md")" -eq 4 ] || fail "the report does not mark the 4 held-out repeats"
# A held-out receipt that a real fault moved (one op 1e8 ulps off at step 6) is counted outside.
for seed in 1003 1004 1005 1006 1007 1008 1009 1010; do
  "$HARNESS" run --canary micro --steps 12 --seed 7 --engine accel --features bf16 --noise-seed $seed \
    --out "$WORK/r$seed.h5" >/dev/null 2>&1 || fail "repeat $seed"
done
"$HARNESS" run --canary micro --steps 12 --seed 7 --engine accel --features bf16 --noise-seed 1011 \
  --inject-fault step=6,op=blocks.0.ln1,ulps=100000000 --out "$WORK/faulted.h5" >/dev/null 2>&1 || fail "faulted run"
expect_exit 1 "" -- "$HARNESS" calibrate --receipts "$WORK"/r100[0-9].h5 "$WORK/r1010.h5" "$WORK/faulted.h5" \
  --reference "$WORK/ref.h5" --held-out 4 --budgets "$BUDGETS" --out "$WORK/held-receipts.toml"
grep -q '^false alarm 1 of 4 held-out samples outside the proposal: false-alarm rate below 75.1% at 95%' "$WORK/stdout" ||
  fail "the faulted held-out receipt is not counted outside: $(grep -i 'false alarm\|held out' "$WORK/stdout")"
"$PY" - "$WORK/bias.toml" "$WORK/held.toml" "$WORK/held-receipts.toml" "$WORK/held-none.toml" <<'PY' || fail "the held-out entries"
import re, sys, tomllib
eight, held, receipts = (tomllib.load(open(p, "rb"))["bf16"] for p in sys.argv[1:4])
for metric in ("loss", "grad_norm", "params_sketch"):
    assert held[metric] == eight[metric], (metric, held[metric], eight[metric])  # the 4 held out proposed nothing
assert held["samples"] == 8 and held["held_out"] == 4 and held["held_out_outside"] == 0, held
assert receipts["samples"] == 8 and receipts["held_out"] == 4 and receipts["held_out_outside"] == 1, receipts
# held-none: [noise] without its held-out samples (the shipped entry has 16, none outside)
text = open(sys.argv[2]).read()
head = text.index("\n[noise]\n") + 1
end = text.index("\n[", head)
assert "held_out = 16\n" in text[head:end]
body = re.sub(r"(?m)^held_out(_outside)? = .*\n", "", text[head:end])
open(sys.argv[4], "w").write(text[:head] + body + text[end:])
PY
for budgets in held-none.toml held.toml; do
  expect_exit 0 "" -- "$HARNESS" compare "$WORK/r1000.h5" "$WORK/ref.h5" --budgets "$WORK/$budgets" --json
  cp "$WORK/stdout" "$WORK/$budgets.json"
done
expect_exit 0 "" -- "$HARNESS" compare "$WORK/r1000.h5" "$WORK/ref.h5" --budgets "$WORK/held.toml"
grep -qE '^budget      bf16 \+ noise \(.*\) \(false alarms below 69.8% at 95%\)$' "$WORK/stdout" ||
  fail "check does not state the bound: $(grep '^budget' "$WORK/stdout")"
"$PY" - "$WORK/held-none.toml.json" "$WORK/held.toml.json" <<'PY' || fail "the JSON verdict's false-alarm bound"
import json, sys
one, both = (json.load(open(p))["budget"]["false_alarm"] for p in sys.argv[1:])
assert one["bound"] is None and set(one["entries"]) == {"bf16"}, one  # [noise] has no held-out samples there
assert abs(both["bound"] - (1 - 0.05 ** (1 / 4)) - (1 - 0.05 ** (1 / 16))) < 1e-12 and both["confidence"] == 0.95, both
PY
# Refused before anything runs: nothing left to propose from, too few besides the held out,
# and an envelope (nothing proposed to hold samples out of).
expect_exit 2 "^harness: error: --held-out 12: --repeats 12 gives 12 samples; hold out fewer" -- \
  "$HARNESS" calibrate --lane bf16 --repeats 12 --held-out 12 --matrix "$MATRIX" --budgets "$BUDGETS" --out "$WORK/few.toml"
expect_exit 2 "^harness: error: --repeats 10: an entry needs at least 8 samples of the lane's deviation besides the 4 held out" -- \
  "$HARNESS" calibrate --lane bf16 --repeats 10 --held-out 4 --matrix "$MATRIX" --budgets "$BUDGETS" --out "$WORK/few.toml"
expect_exit 2 "^harness: error: --held-out: an envelope proposes no entry" -- \
  "$HARNESS" calibrate --lane ref --perturb 8 --held-out 2 --matrix "$MATRIX" --budgets "$BUDGETS" --out "$WORK/few.toml"
[ ! -e "$WORK/few.toml" ] || fail "a refused held-out calibration wrote a candidate"

# --power: the lane's detection power under the proposal (harness power, docs/budgets.md);
# micro's 12 steps of bf16 miss a 1e-4 scale of the layer even under the proposal: exit 1.
expect_exit 1 "" -- "$HARNESS" calibrate --lane bf16 --repeats 8 --power --matrix "$MATRIX" --budgets "$BUDGETS" \
  --out "$WORK/power.toml"
grep -q "^power       TOO LOOSE under the proposal" "$WORK/stdout" || fail "no power line: $(cat "$WORK/stdout")"
grep -q "^## Detection power under the proposal" "$WORK/power.md" || fail "the report has no power section"
[ "$(grep -c '^ladder      ' "$WORK/power.md")" -eq 4 ] || fail "the report lacks a ladder: $(cat "$WORK/power.md")"
"$PY" - "$WORK/power.toml" "$WORK/power.md" <<'PY' || fail "the entry does not record the power the report gives"
import re, sys, tomllib
power = tomllib.load(open(sys.argv[1], "rb"))["bf16"]["power"]
assert power["lane"] == "micro/accel+bf16" and power["too_loose"] is True and power["step"] == 3, power
report = open(sys.argv[2]).read()
for kind in ("weight-scale", "weight-ulps", "lr-scale", "eps-scale"):
    line = re.search(r"^ladder      %s: (.*)$" % kind, report, re.M).group(1)
    value = power[kind.replace("-", "_")]
    assert (line.startswith("none caught") if isinstance(value, str) else ("= %g caught" % value) in line), (kind, value, line)
PY
expect_exit 2 "^harness: error: --power: needs --lane" -- "$HARNESS" calibrate --receipts "$WORK"/r100[0-7].h5 \
  --reference "$WORK/ref.h5" --power --budgets "$BUDGETS" --out "$WORK/few.toml"

# Samples (docs/budgets.md): fewer than 8 without --provisional is refused before anything
# runs, one line naming the flag, no candidate; with it, check says which entry is provisional.
for given in "--lane bf16 --repeats 3:--repeats 3" \
             "--receipts $WORK/r1000.h5 --reference $WORK/ref.h5:--receipts \(1 receipt\)" \
             "--receipts $WORK/r1000.h5 $WORK/r1001.h5 $WORK/r1002.h5 --reference $WORK/ref.h5:--receipts \(3 receipts\)" \
             "--perturb 3 --lane bf16:--perturb 3" \
             "--perturb 7 --receipts $WORK/r1000.h5 --reference $WORK/ref.h5:--perturb 7"; do
  # shellcheck disable=SC2086
  expect_exit 2 "^harness: error: ${given#*:}: an entry needs at least 8 samples of the lane's deviation \(docs/budgets.md, \"Samples\"\); give 8 or more, or --provisional to write an entry marked provisional$" -- \
    "$HARNESS" calibrate ${given%%:*} --matrix "$MATRIX" --budgets "$BUDGETS" --out "$WORK/few.toml"
  [ "$(wc -l < "$WORK/stderr")" -eq 1 ] && [ ! -s "$WORK/stdout" ] || fail "a refusal is not one line on stderr: $(cat "$WORK/stderr")"
  [ ! -e "$WORK/few.toml" ] && [ ! -e "$WORK/few.md" ] || fail "a refused calibration ($given) wrote a candidate"
done
# One receipt with --provisional: written, and marked so in the entry and by check.
expect_exit 0 "" -- "$HARNESS" calibrate --receipts "$WORK/r1000.h5" --reference "$WORK/ref.h5" --budgets "$BUDGETS" \
  --out "$WORK/one.toml" --provisional
grep -q "^provisional \[bf16\] from 1 sample (fewer than 8)" "$WORK/stdout" ||
  fail "calibrate from one receipt does not say the entry is provisional: $(cat "$WORK/stdout")"
grep -qE '^(samples|repeats) = 1$' "$WORK/one.toml" || fail "the entry from one receipt does not record 1 sample"
expect_exit 0 "" -- "$HARNESS" compare "$WORK/r1000.h5" "$WORK/ref.h5" --budgets "$WORK/one.toml"
grep -qE '^budget .*\(provisional: (.*, )?\[bf16\] from 1 sample[,)]' "$WORK/stdout" ||
  fail "check does not say [bf16] is provisional from 1 sample: $(cat "$WORK/stdout")"
# [noise], which the bf16 lane composes too, from 8 samples; [bf16] from the 3 above (few) or 8
"$PY" - "$WORK/budgets.candidate.toml" "$WORK/few.toml" "$WORK/eight.toml" <<'PY' || fail "cannot write entries from 8 samples"
import re, sys
def with_samples(text, section, n):
    head = text.index("\n[%s]\n" % section) + 1
    end = text.index("\n[", head)
    body, count = re.subn(r"(?m)^(repeats|samples) = \d+$", "samples = %d" % n, text[head:end], count=1)
    assert count == 1, section
    return text[:head] + body + text[end:]
text = with_samples(open(sys.argv[1]).read(), "noise", 8)
open(sys.argv[2], "w").write(text)
open(sys.argv[3], "w").write(with_samples(text, "bf16", 8))
PY
for budgets in few.toml eight.toml; do
  expect_exit 0 "" -- "$HARNESS" compare "$WORK/r1000.h5" "$WORK/ref.h5" --budgets "$WORK/$budgets"
  cp "$WORK/stdout" "$WORK/$budgets.out"
  expect_exit 0 "" -- "$HARNESS" compare "$WORK/r1000.h5" "$WORK/ref.h5" --budgets "$WORK/$budgets" --json
  cp "$WORK/stdout" "$WORK/$budgets.json"
done
grep -qE '^budget      bf16 \+ noise \(.*\) \(provisional: \[bf16\] from 3 samples\)$' "$WORK/few.toml.out" ||
  fail "check does not say [bf16] is provisional: $(cat "$WORK/few.toml.out")"
! grep -q "provisional" "$WORK/eight.toml.out" || fail "an entry from 8 samples reads as provisional"
"$PY" - "$WORK/few.toml.json" "$WORK/eight.toml.json" <<'PY' || fail "the JSON verdict's provisional entries"
import json, sys
few, eight = (json.load(open(p))["budget"] for p in sys.argv[1:])
assert few["provisional"] == ["bf16"] and few["samples"] == {"bf16": 3, "noise": 8}, few
assert eight["provisional"] == [] and eight["samples"] == {"bf16": 8, "noise": 8}, eight
PY

expect_exit 2 "--lane: 'nope' is not a lane" -- "$HARNESS" calibrate --lane nope --matrix "$MATRIX" --budgets "$BUDGETS"
expect_exit 2 "is the reference lane itself" -- "$HARNESS" calibrate --lane ref --matrix "$MATRIX" --budgets "$BUDGETS"
expect_exit 2 "--feature: mesh-fp32 is not a feature" -- "$HARNESS" calibrate --lane bf16 --feature mesh-fp32 --matrix "$MATRIX" --budgets "$BUDGETS"
expect_exit 2 "--repeats: must be between" -- "$HARNESS" calibrate --lane bf16 --repeats 0 --matrix "$MATRIX" --budgets "$BUDGETS"
expect_exit 2 "--out: cannot write into /nonexistent/dir" -- "$HARNESS" calibrate --lane bf16 --repeats 1 --matrix "$MATRIX" --budgets "$BUDGETS" --out /nonexistent/dir/c.toml
expect_exit 2 "--out: .* is the budgets file" -- "$HARNESS" calibrate --lane bf16 --repeats 1 --matrix "$MATRIX" --budgets "$BUDGETS" --out "$BUDGETS"
expect_exit 2 "--out: .* must end in .toml" -- "$HARNESS" calibrate --lane bf16 --repeats 1 --matrix "$MATRIX" --budgets "$BUDGETS" --out "$WORK/c.md"
[ "$before" = "$(sha256sum "$BUDGETS")" ] || fail "a refused calibration wrote the budgets file"
finish
