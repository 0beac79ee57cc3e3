#!/usr/bin/env bash
# docs/transformers.md, run as written: every ```sh block of the page in order, in the
# repository root, with `build/bin/harness` as this build's harness and /tmp/ as a fresh
# directory. Registered only where .venv/ exists (tests/CMakeLists.txt): transformers is .venv/'s.
source "$(dirname "$0")/lib.sh"
repo=$(cd "$HERE/../.." && pwd)
harness=$(cd "$(dirname "$HARNESS")" && pwd)/$(basename "$HARNESS")
page=$repo/docs/transformers.md
script=$WORK/page.sh
page_script "$page" "$harness" "$script"
(cd "$repo" && PYTHONDONTWRITEBYTECODE=1 bash "$script") >"$WORK/page.out" 2>&1 ||
  fail "a command of $page failed: $(tail -5 "$WORK/page.out")"
# What the page says the commands show.
grep -q "^budget      reference (bitwise" "$WORK/page.out" || fail "two runs of the member did not compare bitwise"
grep -q "^result      3 findings: 3 varying_constant" "$WORK/page.out" ||
  fail "the audit's findings are not AdamW's three constants"
[ "$(grep -c '^verdict     PASS' "$WORK/page.out")" -ge 2 ] ||
  fail "the Trainer's receipt does not pass against the run's"
grep -q "^diverges    step 6 " "$WORK/page.out" || fail "bisect does not name step 6"
grep -q "^first op    transformer.h.1.mlp forward, layer 1 .*aten.mul.Tensor" "$WORK/page.out" ||
  fail "bisect does not name h.1.mlp's aten.mul"
grep -q "^exit 1$" "$WORK/page.out" || fail "bisect of the regression did not exit 1"
finish
