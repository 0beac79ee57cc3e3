#!/usr/bin/env bash
# docs/triage.md run as written: tiny's saturated FP8 unit and the regressed example's broken
# bf16 layer are the units named. Release builds only (tests/CMakeLists.txt): nine tiny runs
# under the sanitizers take minutes and add nothing that cli.triage and Triage.* (micro)
# do not run there.
source "$(dirname "$0")/lib.sh"
run_page triage.md
grep -q '^culprits    fp8 at mlp_fc@1 (1 of 16 units): in bf16, the lane passes$' "$WORK/page.out" ||
  fail "the page's saturated unit is not the one named: $(cat "$WORK/page.out")"
[ "$(grep -c '^verdict     FOUND$' "$WORK/page.out")" -eq 2 ] || fail "the page's triages did not both find their unit"
grep -q '^culprits    bf16 at h.1.mlp.c_fc (1 of 13 units): in fp32, the lane passes$' "$WORK/page.out" ||
  fail "the regressed example's broken layer is not the one named: $(cat "$WORK/page.out")"

finish
