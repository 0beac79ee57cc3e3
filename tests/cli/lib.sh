# Shared helpers for the CLI tests: each test script sources this, gets $HARNESS and a
# fresh $WORK directory, and fails (exit 1) on the first broken expectation.
set -u
HARNESS=${1:?usage: $0 path/to/harness}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PY=/usr/bin/python3   # Debian's python, where python3-h5py lives
# CI sets CI (golden approve refuses to write there): a test runs as CI runs it unless its
# caller says otherwise, so a test that forgets `unset CI` fails here, not first in CI.
export CI=${CI-true}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
failures=0

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# expect_exit CODE PATTERN -- command...: exit status CODE, stderr one line matching PATTERN.
expect_exit() {
  local code=$1 pattern=$2; shift 3
  "$@" >"$WORK/stdout" 2>"$WORK/stderr"
  local got=$?
  [ "$got" -eq "$code" ] || { fail "exit $got (want $code): $*; stderr: $(cat "$WORK/stderr")"; return; }
  if [ -n "$pattern" ]; then
    grep -qE -- "$pattern" "$WORK/stderr" || fail "stderr of '$*' lacks /$pattern/: $(cat "$WORK/stderr")"
    [ "$(grep -c . "$WORK/stderr")" -eq 1 ] || fail "stderr of '$*' is not one line: $(cat "$WORK/stderr")"
  fi
}

# set_windows IN SECTION METRIC WINDOWS OUT: the budgets file IN with [SECTION]'s METRIC line
# made `METRIC = WINDOWS` (e.g. '[ { steps = "0-", atol = 1e-9 } ]') into OUT, whatever the
# calibrated numbers were: tests that need a tighter or broken entry do not depend on them.
set_windows() {
  "$PY" - "$@" <<'PY'
import re, sys
source, section, metric, windows, out = sys.argv[1:6]
text = open(source).read()
start = text.index("\n[%s]\n" % section) + 1
end = text.find("\n[", start)
end = len(text) if end < 0 else end
body, count = re.subn(r"(?m)^%s = \[.*\]$" % re.escape(metric), "%s = %s" % (metric, windows), text[start:end], count=1)
assert count == 1, "no %s in [%s]" % (metric, section)
open(out, "w").write(text[:start] + body + text[end:])
PY
}

# page_script PAGE HARNESS SCRIPT: every ```sh block of a docs page, in order, as one
# script (set -euo pipefail first) with /tmp/ made $WORK/ and build/bin/harness made
# HARNESS: how the doc tests run a page as written. /tmp/ is replaced first: the harness
# path put in after it may itself lie under /tmp/ (a clone there).
page_script() {
  local page=$1 harness=$2 script=$3 blocks
  blocks=$(awk '/^```sh$/ {on=1; next} /^```$/ {on=0} on' "$page")
  [ -n "$blocks" ] || { echo "FAIL: no sh block in $page" >&2; exit 1; }
  { echo 'set -euo pipefail'; printf '%s\n' "$blocks" | sed -e "s#/tmp/#$WORK/#g" -e "s#build/bin/harness#$harness#g"; } >"$script"
}

# run_page PAGE: docs/PAGE's sh blocks run from the repository root as page_script makes
# them, with `python3` Debian's (where python3-torch lives); their output in $WORK/page.out.
# A command that fails fails the test.
run_page() {
  local repo harness script=$WORK/page.sh
  repo=$(cd "$HERE/../.." && pwd)
  harness=$(cd "$(dirname "$HARNESS")" && pwd)/$(basename "$HARNESS")  # the page runs from the repository root
  page_script "$repo/docs/$1" "$harness" "$script"
  mkdir -p "$WORK/bin" && ln -sf "$PY" "$WORK/bin/python3"
  (cd "$repo" && PATH="$WORK/bin:$PATH" PYTHONDONTWRITEBYTECODE=1 bash "$script") >"$WORK/page.out" 2>&1 ||
    fail "a command of docs/$1 failed: $(tail -5 "$WORK/page.out")"
}

finish() {
  if [ "$failures" -gt 0 ]; then echo "$failures failure(s)" >&2; exit 1; fi
  echo "all expectations met"
}
