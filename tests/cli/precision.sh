#!/usr/bin/env bash
# harness precision RECEIPT --step K: every op of a replayed step judged against float64 and
# its precision's rounding bound (docs/oracle.md). A clean step passes (exit 0) on cpu-ref
# and accel bf16; a nudged op is named in one line and in --json, nothing else over (exit
# 1); --against fp32 shows bf16 computing; what cannot be judged is refused (exit 2).
source "$(dirname "$0")/lib.sh"
run() { "$HARNESS" run --canary micro --steps 3 --force "$@" >/dev/null 2>&1 || fail "run $*"; }

run --out "$WORK/ref.h5"
expect_exit 0 "" -- "$HARNESS" precision "$WORK/ref.h5" --step 1
grep -q "^judged      .* op results against float64; 0 over their bounds$" "$WORK/stdout" || fail "clean step: $(cat "$WORK/stdout")"
grep -q "^not judged  .*adamw x" "$WORK/stdout" || fail "the ops without a bound are not listed: $(cat "$WORK/stdout")"

run --out "$WORK/bf16.h5" --engine accel --features bf16 --noise-seed 3
expect_exit 0 "" -- "$HARNESS" precision "$WORK/bf16.h5" --step 2 --json
"$PY" - "$WORK/stdout" <<'PY' || fail "accel bf16's clean step: $(head -c 400 "$WORK/stdout")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["verdict"] == "within" and r["over"] == [] and r["step"] == 2, r["over"]
linears = [j for j in r["judged"] if j["op"] == "linear_forward"]
assert linears and all(j["operands"] == "bf16" and j["stored"] == "bf16" and j["within"] for j in linears), linears
PY

# accel's FP8 units: their linears judged on their operands quantised with the declared
# scales (E4M3 forward, E5M2 output gradients), within; a unit quantised with a scale 2^10
# too large (--fp8-saturate: its operands clip) named, and no other op; under the limited
# accumulator (--fp8-accumulate limited: 14 bits, promoted every 128 products) its linears
# judged within the limited accumulator's bound, nothing listed as not bounded
run --out "$WORK/fp8.h5" --engine accel --features bf16,fp8=all --noise-seed 3
expect_exit 0 "" -- "$HARNESS" precision "$WORK/fp8.h5" --step 1 --json
"$PY" - "$WORK/stdout" <<'PY' || fail "accel fp8: $(head -c 600 "$WORK/stdout")"
import json, sys
r = json.load(open(sys.argv[1]))
assert not r["not_bounded"] and r["verdict"] == "within", r["not_bounded"]
scaled = {(j["site"], j["result"]): j["operands"] for j in r["judged"] if j["operands"].endswith(" scaled")}
assert scaled[("blocks.0.mlp.fc", "out")] == "e4m3,e4m3 scaled", scaled
assert scaled[("blocks.0.mlp.fc", "dinp")] == "e5m2,e4m3,e4m3 scaled", scaled
assert not any(site == "lm_head" for site, _ in scaled), scaled  # lm_head: in no zone
PY
run --out "$WORK/fp8-saturated.h5" --engine accel --features bf16,fp8=all --noise-seed 3 --fp8-saturate attn_proj@0
expect_exit 1 "" -- "$HARNESS" precision "$WORK/fp8-saturated.h5" --step 1 --json
"$PY" - "$WORK/stdout" <<'PY' || fail "accel fp8 saturated: $(head -c 600 "$WORK/stdout")"
import json, sys
r = json.load(open(sys.argv[1]))
assert {(j["site"], j["op"]) for j in r["over"]} == {("blocks.0.attn.proj", "linear_forward"),
                                                     ("blocks.0.attn.proj", "linear_backward")}, r["over"]
PY
run --out "$WORK/fp8-limited.h5" --engine accel --features bf16,fp8=all --fp8-accumulate limited
expect_exit 0 "" -- "$HARNESS" precision "$WORK/fp8-limited.h5" --step 1 --json
"$PY" - "$WORK/stdout" <<'PY' || fail "accel fp8 limited: $(head -c 600 "$WORK/stdout")"
import json, sys
r = json.load(open(sys.argv[1]))
assert not r["not_bounded"] and r["verdict"] == "within", r["not_bounded"]
scaled = [j for j in r["judged"] if j["operands"].endswith(" scaled")]
assert {j["op"] for j in scaled} == {"linear_forward", "linear_backward"} and all(j["within"] for j in scaled), scaled[:2]
PY

# The issue's example: an op made to compute below its declared precision is named, with
# how far over its bound it is; the ops after it, judged on what they were given, are not.
run --out "$WORK/nudged.h5" --inject-fault "step=1,op=blocks.0.attn.proj,ulps=1048576"
expect_exit 1 "" -- "$HARNESS" precision "$WORK/nudged.h5" --step 1
[ "$(grep -c '^over ' "$WORK/stdout")" = 1 ] || fail "not one op over: $(cat "$WORK/stdout")"
grep -q "^over        blocks.0.attn.proj linear_forward out: [0-9.e+]* x its fp32 bound at element 0 (error .* ulps of fp32" "$WORK/stdout" ||
  fail "the nudged op is not named: $(cat "$WORK/stdout")"
expect_exit 0 "" -- "$HARNESS" precision "$WORK/nudged.h5" --step 2  # the fault's step only

expect_exit 1 "" -- "$HARNESS" precision "$WORK/bf16.h5" --step 2 --against fp32 --json
"$PY" - "$WORK/stdout" <<'PY' || fail "bf16 against fp32: $(head -c 400 "$WORK/stdout")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["verdict"] == "over", r["verdict"]
assert all(not j["within"] for j in r["judged"] if j["op"] == "linear_forward"), "a bf16 linear within fp32's bound"
PY

# Who is right, in bisect: at the first divergent op each side's output against the oracle
# on its own operands. The nudged side is wrong; accel's reduction order against cpu-ref's,
# under a budget too tight for it, is rounding; a side that cannot be judged says why.
expect_exit 1 "" -- "$HARNESS" bisect "$WORK/ref.h5" "$WORK/nudged.h5" --json
"$PY" - "$WORK/stdout" <<'PY' || fail "bisect of the nudged run: $(head -c 600 "$WORK/stdout")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["first_divergent_op"]["name"] == "blocks.0.attn.proj", r["first_divergent_op"]
assert r["first_divergent_op"]["level"] == "ops", r["first_divergent_op"]  # a harness engine's module outputs
o = r["oracle"]
assert o["a"]["judged"] and o["a"]["within"] and o["b"]["judged"] and not o["b"]["within"], o
assert o["b"]["error_ulps"] > o["b"]["bound_ulps"] and o["a"]["error_ulps"] <= o["a"]["bound_ulps"], o
assert o["verdict"].startswith("B exceeds its bound by ") and o["verdict"].endswith("x: B's op is wrong"), o["verdict"]
PY
"$PY" - "$(dirname "$0")/../../canaries/budgets.toml" "$WORK/tight.toml" <<'PY'
import re, sys  # the shipped budgets with [noise]'s tolerances a millionth of themselves
out, section = [], None
for line in open(sys.argv[1]).read().splitlines(keepends=True):
    header = re.match(r"^\[([^\]]+)\]", line)
    section = header.group(1) if header else section
    if section == "noise":
        line = re.sub(r"(atol|rtol) = ([0-9.e+-]+)", lambda g: f"{g.group(1)} = {float(g.group(2)) * 1e-6:.3g}", line)
    out.append(line)
open(sys.argv[2], "w").write("".join(out))
PY
run --out "$WORK/noise.h5" --engine accel --noise-seed 5
expect_exit 1 "" -- "$HARNESS" bisect "$WORK/noise.h5" "$WORK/ref.h5" --budgets "$WORK/tight.toml"
grep -q "^oracle      both within their bounds: rounding$" "$WORK/stdout" || fail "accel's order is not rounding: $(cat "$WORK/stdout")"
run --out "$WORK/mesh.h5" --engine tpu-mesh
expect_exit 1 "" -- "$HARNESS" bisect "$WORK/mesh.h5" "$WORK/nudged.h5"
grep -q "^oracle      .*A is not judged (.*engine tpu-mesh compiles its steps" "$WORK/stdout" ||
  fail "the mesh side's reason is not said: $(cat "$WORK/stdout")"

# A standalone repro of the first divergent op: numpy files and a script that, in a fresh
# process with no harness on its path, prints the numbers bisect's oracle printed.
expect_exit 1 "" -- "$HARNESS" bisect "$WORK/ref.h5" "$WORK/nudged.h5" --json
cp "$WORK/stdout" "$WORK/bisect.json"
expect_exit 0 "" -- "$HARNESS" repro "$WORK/ref.h5" "$WORK/nudged.h5" --out "$WORK/repro"
grep -q "^run         python3 $WORK/repro/repro.py$" "$WORK/stdout" || fail "repro's story: $(cat "$WORK/stdout")"
(cd / && "$PY" -I "$WORK/repro/repro.py") >"$WORK/repro.json" || fail "repro.py did not run"
"$PY" - "$WORK/bisect.json" "$WORK/repro.json" <<'PY' || fail "repro.py's numbers are not bisect's: $(cat "$WORK/repro.json")"
import json, math, sys
oracle = json.load(open(sys.argv[1]))["oracle"]
repro = json.load(open(sys.argv[2]))
assert (repro["op"], repro["site"], repro["result"]) == ("linear_forward", "blocks.0.attn.proj", "out"), repro
for side in ("a", "b"):
    got, want = repro["sides"][side]["error_ulps_at_oracle_element"], oracle[side]["error_ulps"]
    assert math.isclose(got, want, rel_tol=1e-9), (side, got, want)
assert repro["sides"]["b"]["from_float64"]["max_ulps"] >= 2**20 > repro["sides"]["a"]["from_float64"]["max_ulps"], repro
assert repro["sides"]["b"]["recomputed_from_float64"]["max_ulps"] < 2**10, "numpy's fp32 op is as far off as the nudge"
PY
expect_exit 2 "--out: .*/repro exists; give --force" -- "$HARNESS" repro "$WORK/ref.h5" "$WORK/nudged.h5" --out "$WORK/repro"
expect_exit 0 "" -- "$HARNESS" repro "$WORK/ref.h5" "$WORK/nudged.h5" --out "$WORK/repro" --force
expect_exit 2 "do not part: nothing to reproduce" -- "$HARNESS" repro "$WORK/ref.h5" "$WORK/ref.h5" --out "$WORK/none"
expect_exit 2 "only an op the oracle judges on both sides can be reproduced" -- \
  "$HARNESS" repro "$WORK/mesh.h5" "$WORK/nudged.h5" --out "$WORK/none"
[ ! -e "$WORK/none" ] && [ ! -e "$WORK/none.repro-partial" ] || fail "a refused repro left files"
expect_exit 0 "" -- "$HARNESS" repro "$WORK/ref.h5" "$WORK/nudged.h5" --out "$WORK/slash/"  # a trailing separator
[ -f "$WORK/slash/repro.py" ] && [ ! -e "$WORK/slash.repro-partial" ] || fail "--out DIR/ did not make DIR"
mkdir "$WORK/mine.repro-partial"
expect_exit 2 "--out: .*mine.repro-partial exists" -- "$HARNESS" repro "$WORK/ref.h5" "$WORK/nudged.h5" --out "$WORK/mine"
[ -d "$WORK/mine.repro-partial" ] || fail "a directory of the user's own was removed"
# accel bf16 against its own seed's replay with the nudge: the script rounds its operands to bf16 as the side declared
run --out "$WORK/bf16-nudged.h5" --engine accel --features bf16 --noise-seed 3 --inject-fault "step=1,op=blocks.1.mlp.fc,ulps=1048576"
expect_exit 0 "" -- "$HARNESS" repro "$WORK/bf16.h5" "$WORK/bf16-nudged.h5" --out "$WORK/repro-bf16"
(cd / && "$PY" -I "$WORK/repro-bf16/repro.py") >"$WORK/repro-bf16.json" || fail "repro.py (bf16) did not run"
"$PY" - "$WORK/repro-bf16/op.json" "$WORK/repro-bf16.json" <<'PY' || fail "bf16 repro: $(cat "$WORK/repro-bf16.json")"
import json, math, sys
op, repro = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert op["sides"]["a"]["operands"] == "bf16" and op["sides"]["a"]["stored"] == "bf16", op["sides"]
for side in ("a", "b"):
    assert math.isclose(repro["sides"][side]["error_ulps_at_oracle_element"], op["sides"][side]["oracle_error_ulps"],
                        rel_tol=1e-9), side
PY

# a layer norm's (its mean and rstd are in the files too; its eps in op.json)
run --out "$WORK/ln.h5" --inject-fault "step=1,op=blocks.0.ln2,ulps=1048576"
expect_exit 0 "" -- "$HARNESS" repro "$WORK/ref.h5" "$WORK/ln.h5" --out "$WORK/repro-ln"
(cd / && "$PY" -I "$WORK/repro-ln/repro.py") >"$WORK/repro-ln.json" || fail "repro.py (layer norm) did not run"
"$PY" - "$WORK/repro-ln/op.json" "$WORK/repro-ln.json" <<'PY' || fail "layer norm repro: $(cat "$WORK/repro-ln.json")"
import json, math, sys
import numpy as np
op, repro = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert op["op"] == "layernorm_forward" and op["attributes"] == [float(np.float32(1e-5))], op  # the model's fp32 eps
assert not op["sides"]["b"]["within"] and op["sides"]["a"]["within"], op["sides"]
for side in ("a", "b"):
    assert math.isclose(repro["sides"][side]["error_ulps_at_oracle_element"], op["sides"][side]["oracle_error_ulps"],
                        rel_tol=1e-9), side
PY

# Refused, one line, exit 2: no such step, an engine that compiles its steps, a bad flag, no file
expect_exit 2 "--step: step 5 is not recorded in" -- "$HARNESS" precision "$WORK/ref.h5" --step 5
expect_exit 2 "mesh.h5: engine tpu-mesh compiles its steps" -- "$HARNESS" precision "$WORK/mesh.h5" --step 1
expect_exit 2 "--against: 'e4m3' is not a precision \\(fp32, bf16\\)" -- "$HARNESS" precision "$WORK/ref.h5" --step 1 --against e4m3
expect_exit 2 "nowhere.h5" -- "$HARNESS" precision "$WORK/nowhere.h5" --step 1

finish
