#!/usr/bin/env bash
# docs/oracle.md run as written, on tiny: the clean steps of cpu-ref and accel bf16 within
# their bounds, the nudged op named and nothing else, the same on the own-model example's
# aten ops, a PyTorch lane of tiny within (op by op and at its module outputs) and replayed
# from its pack, bf16 over fp32's bounds, bisect's verdict and repro.py's numbers (a harness
# engine's op and a Python canary's aten op, run again by torch), and each
# ATen capability's exp, log, tanh, erf, GELU and SiLU within what the oracle's bounds take. Release builds only (tests/CMakeLists.txt): cli.precision
# runs the same code on micro under the sanitizers.
source "$(dirname "$0")/lib.sh"
run_page oracle.md
[ "$(grep -c '^within      every judged result within its bound' "$WORK/page.out")" = 5 ] ||
  fail "the page's clean steps are not within: $(cat "$WORK/page.out")"
grep -q '^over        blocks.2.mlp.fc linear_forward out: 678 x its fp32 bound at element 0 (error 1.05e+06 ulps of fp32' "$WORK/page.out" ||
  fail "the page's nudged op is not named: $(cat "$WORK/page.out")"
grep -q '^over        blocks.0.attn.qkv linear_forward out: .* x its fp32 bound' "$WORK/page.out" ||
  fail "the page's bf16 linear is not over fp32's bound: $(cat "$WORK/page.out")"
grep -q '^over        h.0.mlp.c_fc aten.addmm.default out (model.py:[0-9]*): .* x its fp32 bound at element 0 (error 6.55e+04 ulps of fp32' "$WORK/page.out" ||
  fail "the page's nudged aten op of a Python canary is not named: $(cat "$WORK/page.out")"
grep -q '^precision   tiny/torch (.*lane.h5), step 1$' "$WORK/page.out" || fail "the page's PyTorch lane: $(cat "$WORK/page.out")"
grep -q '^verified    steps 0-1 bitwise equal to the receipt$' "$WORK/page.out" || fail "the page's lane replay: $(cat "$WORK/page.out")"
grep -q '^judged      44 op results against float64; 0 over their bounds$' "$WORK/page.out" ||
  fail "the page's lane at its module outputs is not judged whole (tiny's 44 modules): $(cat "$WORK/page.out")"
grep -q '^over        blocks.1.attn attention_forward att: .* x its fp32 bound' "$WORK/page.out" ||
  fail "the page's fast-math exp is not named: $(cat "$WORK/page.out")"
[ "$(grep -c '^judged      .* op results against float64; 1 over their bounds$' "$WORK/page.out")" = 3 ] ||
  fail "the page's nudged runs name more than their one op: $(cat "$WORK/page.out")"
[ "$(grep -c '^exit 1$' "$WORK/page.out")" = 5 ] || fail "the page's over verdicts did not exit 1: $(cat "$WORK/page.out")"
grep -q "^oracle      B exceeds its bound by .*x: B's op is wrong$" "$WORK/page.out" || fail "the page's bisect: $(cat "$WORK/page.out")"
grep -Eq '"error_ulps_at_oracle_element": 1048[0-9]{3}\.' "$WORK/page.out" || fail "the page's repro.py: $(cat "$WORK/page.out")"
grep -Eq '"error_ulps_at_oracle_element": 6553[0-9]\.' "$WORK/page.out" &&
  grep -q '"equals_recorded": false' "$WORK/page.out" && grep -q '"equals_recorded": true' "$WORK/page.out" ||
  fail "the page's repro.py of a Python canary's aten op: $(cat "$WORK/page.out")"

# bench/libm_accuracy.py under each ATen capability: within what the oracle's bounds take,
# read from engines/numerics/function_bounds.h (kStackExpUlps, kStackLogUlps in ulps;
# kStackGeluTanhError, kStackGeluErfError, kStackSiluError in u = 2^-24).
"$PY" - "$WORK/page.out" "$HERE/../../engines/numerics/function_bounds.h" <<'PY' ||
import re, sys
constants = dict(re.findall(r"constexpr double kStack(\w+) = ([0-9.]+)", open(sys.argv[2]).read()))
names = {"exp": "ExpUlps", "softmax exp": "ExpUlps", "log": "LogUlps", "tanh": "GeluTanhError",
         "gelu tanh": "GeluTanhError", "erf": "GeluErfError", "gelu erf": "GeluErfError", "silu": "SiluError"}
taken = {key: float(constants[name]) for key, name in names.items()}
rows = [line for line in open(sys.argv[1]) if line.startswith("eager (")]
figures = [dict((name, float(value)) for name, value in re.findall(r"(\w[\w ]*): ([0-9.]+) (?:ulps|u)\b", row))
           for row in rows]
sys.exit(0 if rows and all(set(f) == set(taken) and all(f[k] <= taken[k] for k in taken) for f in figures) else 1)
PY
  fail "a stack's function is past what the oracle takes: $(grep '^eager' "$WORK/page.out")"

finish
