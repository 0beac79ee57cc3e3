#!/usr/bin/env bash
# docs/own-model.md, run as written: every ```sh block of the page in order, from the
# repository root, with `build/bin/harness` as this build's harness, `python3` as
# Debian's (where python3-torch lives) and /tmp/ as a fresh directory. A command that is
# meant to fail says so on the page (`|| echo "exit $?"`); any other failure fails this test.
source "$(dirname "$0")/lib.sh"
root=$(cd "$HERE/../.." && pwd)
page=$root/docs/own-model.md
mkdir -p "$WORK/bin" && ln -s /usr/bin/python3 "$WORK/bin/python3"
blocks=$(awk '/^```sh$/ {on=1; next} /^```$/ {on=0} on' "$page")
[ -n "$blocks" ] || { echo "FAIL: no sh block in $page" >&2; exit 1; }
script=$WORK/page.sh
{ echo 'set -euo pipefail'; printf '%s\n' "$blocks" | sed -e "s#build/bin/harness#$HARNESS#g" -e "s#/tmp/#$WORK/#g"; } >"$script"
(cd "$root" && PATH="$WORK/bin:$PATH" bash "$script") >"$WORK/page.out" 2>&1 || fail "a command of $page failed: $(tail -5 "$WORK/page.out")"
# What the page says the commands show.
grep -q "budget      reference (bitwise" "$WORK/page.out" || fail "two runs of the example did not compare bitwise"
grep -q "^budget_features torch-bf16" "$WORK/page.out" || fail "the bf16 run does not declare torch-bf16"
grep -q "^exit 1" "$WORK/page.out" || fail "the fault run did not fail its comparison"
grep -qE "first failing step 20|from step 20|step 20" "$WORK/page.out" || fail "the fault's comparison does not name step 20: $(grep -i step "$WORK/page.out" | tail -5)"
finish
