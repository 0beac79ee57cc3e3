#!/usr/bin/env bash
# docs/own-model.md, run as written: every ```sh block of the page in order, with
# `build/bin/harness` as this build's harness, `python3` as Debian's (where python3-torch
# lives) and /tmp/ as a fresh directory. The page runs in a scratch root holding a copy of
# examples/own-model/ and the package (outside any git work tree, so the receipts' commit
# is "unknown", never "-dirty"), with CI unset (the page refreshes and approves a golden).
# A command that is meant to fail says so on the page (`|| echo "exit $?"`); any other
# failure fails this test.
source "$(dirname "$0")/lib.sh"
repo=$(cd "$HERE/../.." && pwd)
harness=$(cd "$(dirname "$HARNESS")" && pwd)/$(basename "$HARNESS")  # the page runs elsewhere
page=$repo/docs/own-model.md
scratch=$WORK/root
mkdir -p "$WORK/bin" "$scratch/examples" && ln -s /usr/bin/python3 "$WORK/bin/python3"
cp -r "$repo/examples/own-model" "$repo/examples/restart-gate" "$scratch/examples/" && ln -s "$repo/python" "$scratch/python"
script=$WORK/page.sh
page_script "$page" "$harness" "$script"
(cd "$scratch" && env -u CI PATH="$WORK/bin:$PATH" PYTHONDONTWRITEBYTECODE=1 bash "$script") >"$WORK/page.out" 2>&1 ||
  fail "a command of $page failed: $(tail -5 "$WORK/page.out")"
# What the page says the commands show.
grep -q "budget      reference (bitwise" "$WORK/page.out" || fail "two runs of the example did not compare bitwise"
grep -q "^budget_features torch-bf16" "$WORK/page.out" || fail "the bf16 run does not declare torch-bf16"
[ "$(grep -c '^exit 1' "$WORK/page.out")" -eq 5 ] || fail "the fault run did not fail its comparison and its check, bisect did not find the regression, or the restart gate passed an omission"
grep -q "^equal       steps 3-7 bitwise equal to the uninterrupted run$" "$WORK/page.out" || fail "the restart gate's full save did not resume bitwise"
grep -q "^omission    a learning-rate schedule" "$WORK/page.out" || fail "the restart gate did not name the schedule"
grep -q "^omission    an RNG state" "$WORK/page.out" || fail "the restart gate did not name the RNG state"
grep -q "first failing step 20" "$WORK/page.out" || fail "the fault's comparison does not name step 20"
grep -qE "^ok +own-gpt/torch +own-gpt/torch" "$WORK/page.out" || fail "golden status does not list the approved lane"
grep -q '"source":"receipt"' "$WORK/goldens/provenance.jsonl" || fail "the log does not record the golden's source"
grep -q "^verdict     PASS" "$WORK/page.out" || fail "a clean run does not check PASS against its golden"
grep -q "^nightly     pass (2 lanes)" "$WORK/page.out" || fail "the own-model nightly does not pass"
[ ! -e "$WORK/own-nightly/canary-pack.h5" ] || fail "the own-model nightly exported a canary pack"
grep -q "within the proposal: 9/9" "$WORK/page.out" || fail "the perturbation-calibrated bf16 budget does not cover its 9 runs"
grep -q '^method = "perturbation: the unperturbed run and 8 runs' "$WORK/page.out" || fail "the candidate names no method"
grep -qE '^false alarm [0-9]+ of 8 held-out samples outside the proposal: false-alarm rate below' "$WORK/page.out" ||
  fail "the held-out calibration states no false-alarm bound: $(grep -n 'false alarm' "$WORK/page.out")"
# own vs own-again, bf16 and bf16 on two threads under the candidate, the clean check
# ... and the ddp run under the budget calibrated for it
[ "$(grep -c '^verdict     PASS' "$WORK/page.out")" -eq 5 ] || fail "bf16 (one or two threads) or ddp fails its calibrated budget"
grep -qF "[own-gpt.torch-ddp] missing" "$WORK/page.out" || fail "compare did not refuse the ddp run without its budget"
grep -q "^exit 2" "$WORK/page.out" || fail "compare without a torch-ddp budget did not exit 2"
grep -q "^verified    steps 20-39 bitwise equal to the receipt" "$WORK/page.out" || fail "the replay from step 25 did not verify"
grep -q "^first op    h.1.mlp forward, layer 1 .*aten.mul.Tensor" "$WORK/page.out" || fail "bisect does not name h.1.mlp's aten.mul"
grep -q "^at          model.py:" "$WORK/page.out" || fail "bisect does not name the line of the regression"
finish
