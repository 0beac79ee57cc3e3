#!/usr/bin/env bash
# docs/xla.md, run as written: every ```sh block of the page in order, in the repository
# root, with `build/bin/harness` as this build's harness and /tmp/ as a fresh directory.
# Registered only where .venv/ exists (tests/CMakeLists.txt): torch_xla is .venv/'s.
source "$(dirname "$0")/lib.sh"
repo=$(cd "$HERE/../.." && pwd)
harness=$(cd "$(dirname "$HARNESS")" && pwd)/$(basename "$HARNESS")
page=$repo/docs/xla.md
script=$WORK/page.sh
page_script "$page" "$harness" "$script"
(cd "$repo" && PYTHONDONTWRITEBYTECODE=1 bash "$script") >"$WORK/page.out" 2>&1 ||
  fail "a command of $page failed: $(tail -5 "$WORK/page.out")"
# What the page says the commands show.
grep -q "^lane        tiny/torch+xla" "$WORK/page.out" || fail "the lane on XLA is not tiny/torch+xla"
grep -q "^budget      torch-xla" "$WORK/page.out" || fail "compare does not judge the lane under torch-xla"
[ "$(grep -c '^verdict     PASS' "$WORK/page.out")" -eq 3 ] ||
  fail "the lane or JAX's tp does not pass against cpu-ref, or the example's declared warm-up does not pass its check"
grep -q "^lane        tiny/jax@2x2+tp" "$WORK/page.out" || fail "the JAX run on 2x2 is not tiny/jax@2x2+tp"
grep -q "^budget      jax + mesh-fp32 (" "$WORK/page.out" || fail "JAX's tp is not judged under jax + mesh-fp32"
grep -q "^FAIL  compile_stability.uncached_compiles    first failing step 1" "$WORK/page.out" ||
  fail "the example's second compile (torch.optim's lazy state) is not failed at step 1"
[ "$(grep -c '^exit 1$' "$WORK/page.out")" -eq 2 ] || fail "the example's check or the ramp's audit did not exit 1"
grep -q "^  cause     graph 0: node 0: f32\[16,1\]{1,0} xla::device_data() where step 1 had f32\[8,1\]" "$WORK/page.out" ||
  fail "the audit does not name the ramp's recompile cause"
grep -q "^agreement   static audit: recompiles, no host read; torch_xla: recompiles, no host read: they agree" \
  "$WORK/page.out" || fail "the audit's agreement line is not the page's"
finish
