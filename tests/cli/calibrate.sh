#!/usr/bin/env bash
# harness calibrate: the proposal fits every repeat with its margin and no more (halving
# it fails a repeat), only the calibrated feature's section changes, the budgets file is
# never written, bad input exits 2 with one line.
source "$(dirname "$0")/lib.sh"
MATRIX="$HERE/data/micro_nightly.toml"
BUDGETS="$WORK/budgets.toml"
cp "$HERE/../../canaries/budgets.toml" "$BUDGETS"
before=$(sha256sum "$BUDGETS")

expect_exit 0 "" -- "$HARNESS" calibrate --lane bf16 --repeats 3 --matrix "$MATRIX" --budgets "$BUDGETS"
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
assert new["bf16"]["repeats"] == 3 and new["bf16"]["rationale"] == old["bf16"]["rationale"]
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
for seed in 1000 1001 1002; do
  "$HARNESS" run --canary micro --steps 12 --seed 7 --engine accel --features bf16 --noise-seed $seed \
    --out "$WORK/r$seed.h5" >/dev/null 2>&1 || fail "repeat $seed"
  expect_exit 0 "" -- "$HARNESS" compare "$WORK/r$seed.h5" "$WORK/ref.h5" --budgets "$WORK/budgets.candidate.toml"
  "$HARNESS" compare "$WORK/r$seed.h5" "$WORK/ref.h5" --budgets "$WORK/halved.toml" >/dev/null 2>&1 || failing=$((failing + 1))
done
[ "$failing" -ge 1 ] || fail "half the proposal still fits every repeat: the proposal is not tight"

expect_exit 2 "--lane: 'nope' is not a lane" -- "$HARNESS" calibrate --lane nope --matrix "$MATRIX" --budgets "$BUDGETS"
expect_exit 2 "is the reference lane itself" -- "$HARNESS" calibrate --lane ref --matrix "$MATRIX" --budgets "$BUDGETS"
expect_exit 2 "--feature: mesh-fp32 is not a feature" -- "$HARNESS" calibrate --lane bf16 --feature mesh-fp32 --matrix "$MATRIX" --budgets "$BUDGETS"
expect_exit 2 "--repeats: must be between" -- "$HARNESS" calibrate --lane bf16 --repeats 0 --matrix "$MATRIX" --budgets "$BUDGETS"
expect_exit 2 "--out: cannot write into /nonexistent/dir" -- "$HARNESS" calibrate --lane bf16 --repeats 1 --matrix "$MATRIX" --budgets "$BUDGETS" --out /nonexistent/dir/c.toml
expect_exit 2 "--out: .* is the budgets file" -- "$HARNESS" calibrate --lane bf16 --repeats 1 --matrix "$MATRIX" --budgets "$BUDGETS" --out "$BUDGETS"
expect_exit 2 "--out: .* must end in .toml" -- "$HARNESS" calibrate --lane bf16 --repeats 1 --matrix "$MATRIX" --budgets "$BUDGETS" --out "$WORK/c.md"
[ "$before" = "$(sha256sum "$BUDGETS")" ] || fail "a refused calibration wrote the budgets file"
finish
