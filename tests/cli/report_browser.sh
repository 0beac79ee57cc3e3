#!/usr/bin/env bash
# The nightly HTML report in a real browser (headless Chromium): no console message at
# all (errors, uncaught exceptions), its script ran, every lane has a row, and a
# screenshot is saved for people to look at. A broken page proves the console check bites.
source "$(dirname "$0")/lib.sh"
SHOT=${2:?usage: $0 path/to/harness screenshot.png}
MATRIX="$HERE/data/micro_nightly.toml"
unset CI

# chromium FILE ARGS...: dump the DOM of FILE to $WORK/dom, the browser's log to $WORK/log
chromium_open() {
  local page=$1; shift
  timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$WORK/profile" \
    --enable-logging=stderr --v=0 "$@" "file://$page" >"$WORK/dom" 2>"$WORK/log"
}
console_lines() { grep -E ':CONSOLE[:(]' "$WORK/log"; }

# the detector must see a broken page's errors, or its silence below means nothing
printf '<!DOCTYPE html><html><body><script>console.error("boom"); missing_function();</script></body></html>' > "$WORK/broken.html"
chromium_open "$WORK/broken.html" --dump-dom || fail "chromium did not open a page: $(tail -3 "$WORK/log")"
console_lines | grep -q "Uncaught ReferenceError" || fail "the console check misses an uncaught error: $(cat "$WORK/log")"

"$HARNESS" golden refresh --matrix "$MATRIX" --goldens "$WORK/goldens" --reason test >/dev/null 2>&1 &&
  "$HARNESS" golden approve --goldens "$WORK/goldens" --approved-by test >/dev/null 2>&1 || fail "goldens"
# failing lanes too (a bf16 loss budget of 1e-9), so that the page shows a failure's details
sed 's/loss = \[ { steps = "0-9", atol = 1e-3 }, { steps = "10-", atol = 2.2e-3 } \]/loss = [ { steps = "0-", atol = 1e-9 } ]/' \
  "$HERE/../../canaries/budgets.toml" > "$WORK/tight.toml"
cmp -s "$WORK/tight.toml" "$HERE/../../canaries/budgets.toml" && fail "the bf16 loss budget was not tightened"
"$HARNESS" nightly --matrix "$MATRIX" --goldens "$WORK/goldens" --budgets "$WORK/tight.toml" --out "$WORK/report" >/dev/null 2>&1
[ $? -eq 1 ] || fail "the nightly under a 1e-9 bf16 budget did not exit 1"
page="$WORK/report/report.html"

chromium_open "$page" --dump-dom || fail "chromium could not open the report: $(tail -3 "$WORK/log")"
[ -z "$(console_lines)" ] || fail "the report logs to the console: $(console_lines)"
grep -q '<body data-ready="yes">' "$WORK/dom" || fail "the report's script did not run to its end"
[ "$(grep -o '<tr data-status=' "$WORK/dom" | wc -l)" -eq 5 ] || fail "the verdict table does not have 5 lanes"
grep -q 'data-status="fail"' "$WORK/dom" || fail "the bf16 lanes are not shown failing"
[ "$(grep -o '<svg' "$WORK/dom" | wc -l)" -ge 9 ] || fail "the report lacks the per-lane charts"

mkdir -p "$(dirname "$SHOT")"
chromium_open "$page" --window-size=1280,2000 --screenshot="$SHOT" || fail "no screenshot"
[ "$(head -c 4 "$SHOT" | od -An -c | tr -d ' ')" = "211PNG" ] || fail "$SHOT is not a PNG"
[ -z "$(console_lines)" ] || fail "the report logs to the console while rendering: $(console_lines)"
echo "screenshot: $SHOT"
finish
