#!/usr/bin/env bash
# A nightly of a Python canary that only another interpreter can load (docs/nightly.md,
# "The interpreter"): its file imports a module that Debian's python3 lacks, as a
# transformers canary does. The matrix-level `python = PATH` reads (describes) it and runs
# every lane under that interpreter; a lane's `python` overrides it and, on the reference
# lane, reaches the read too. The report's reproduce command works as printed. Without an
# interpreter that can load it, and for bad values, one line naming the file and key, exit 2.
source "$(dirname "$0")/lib.sh"
unset CI
SMALL=$(cd "$HERE/../../python/tests/own_canaries" && pwd)/small.py
mkdir -p "$WORK/m" "$WORK/g" "$WORK/site" "$WORK/bin" "$WORK/again"
cp "$SMALL" "$WORK/m/small.py"
# The module only the other interpreter imports (transformers, for a team).
echo 'LR = 1e-2' >"$WORK/site/zoomod.py"
cat >"$WORK/m/zoo.py" <<'PY'
import torch
import zoomod  # only ../bin/zoo-python can import it
from small import make


def canary():
    return make(name="zoo", steps=4, optimizer=lambda model: torch.optim.AdamW(model.parameters(), lr=zoomod.LR))
PY
# The other interpreter: a wrapper that sets up its environment and execs Debian's python3
# (as a pyenv shim or a conda activation does; the run records /usr/bin/python3 as its
# sys.executable, not the wrapper).
cat >"$WORK/bin/zoo-python" <<SH
#!/bin/sh
PYTHONPATH="$WORK/site\${PYTHONPATH:+:\$PYTHONPATH}" exec /usr/bin/python3 "\$@"
SH
# One that cannot import this checkout's package (-I: PYTHONPATH ignored).
printf '#!/bin/sh\nexec /usr/bin/python3 -I "$@"\n' >"$WORK/bin/isolated-python"
chmod +x "$WORK/bin/zoo-python" "$WORK/bin/isolated-python"

MATRIX="$WORK/m/nightly.toml"
cat >"$MATRIX" <<'TOML'
schema_version = 1
canary = "zoo.py:canary"
python = "../bin/zoo-python"   # relative to this file
reference = "fp32"
[[lanes]]
id = "fp32"
engine = "torch"
TOML
expect_exit 0 "" -- "$HARNESS" golden refresh --matrix "$MATRIX" --goldens "$WORK/g" --reason "zoo: first goldens"
expect_exit 0 "" -- "$HARNESS" golden approve --goldens "$WORK/g" --approved-by "A. Reviewer" --allow-dirty
# Under the matrix's interpreter the lane is versioned, named after the torch it imports.
golden=$(ls "$WORK/g/zoo/" 2>/dev/null | grep -E '^torch@[0-9]+\.[0-9]+\.h5$')
[ -n "$golden" ] || fail "no golden at zoo/torch@MAJOR.MINOR.h5: $(ls -R "$WORK/g")"

# A regression in the module the interpreter brings (its learning rate moved): the lane
# fails its golden, and the report says how to run it again.
echo 'LR = 1.1e-2' >"$WORK/site/zoomod.py"
expect_exit 1 "" -- "$HARNESS" nightly --matrix "$MATRIX" --goldens "$WORK/g" --out "$WORK/fail"
"$PY" - "$WORK/fail/summary.json" "$WORK/bin/zoo-python" <<'PY' || fail "the nightly's lane"
import json, sys
s = json.load(open(sys.argv[1]))
lane = s["lanes"][0]
assert (lane["id"], lane["status"]) == ("fp32", "fail") and lane["lane"].startswith("zoo/torch@"), lane
assert lane["python"] == sys.argv[2], lane["python"]
PY
again=$("$PY" - "$WORK/fail/report.html" <<'PY'
import html, re, sys
commands = [html.unescape(c) for c in re.findall(r'<pre class="command">(.*?)</pre>', open(sys.argv[1]).read(), re.S)]
print(commands[0])
PY
)
case "$again" in *"/bin/zoo-python -m canary_harness run "*"zoo.py:canary"*"--out fp32.h5") ;;
  *) fail "the report's rerun command: $again" ;; esac
# As printed, from another directory, in a shell without this checkout's PYTHONPATH.
(cd "$WORK/again" && env -u PYTHONPATH bash -c "$again" >"$WORK/again.out" 2>&1) ||
  fail "the report's rerun command failed: $again: $(tail -3 "$WORK/again.out")"
expect_exit 0 "" -- "$HARNESS" compare "$WORK/again/fp32.h5" "$WORK/fail/receipts/fp32.h5"
grep -q "budget      reference (bitwise" "$WORK/stdout" || fail "the rerun is not bitwise the nightly's receipt: $(cat "$WORK/stdout")"

# The reference lane's own python reaches the read (no matrix-level key).
cat >"$WORK/m/lane.toml" <<'TOML'
schema_version = 1
canary = "zoo.py:canary"
reference = "fp32"
[[lanes]]
id = "fp32"
engine = "torch"
python = "../bin/zoo-python"
TOML
expect_exit 0 "" -- "$HARNESS" golden status --matrix "$WORK/m/lane.toml" --goldens "$WORK/g"

# A lane whose receipt lacks what its stack records: traced (trace = "ops"), a Python canary's
# lane writes /trace; this interpreter runs the lane, then drops /trace from its receipt. The
# nightly names the group and the description: the lane's run error (exit 2), no receipt kept.
cat >"$WORK/bin/untraced-python" <<SH
#!/bin/sh
"$WORK/bin/zoo-python" "\$@" || exit \$?
out= previous=
for arg; do [ "\$previous" != --out ] || out=\$arg; previous=\$arg; done  # the receipt, where one is written
[ -z "\$out" ] || /usr/bin/python3 -c 'import h5py, sys; f = h5py.File(sys.argv[1], "a"); del f["trace"]; f.close()' "\$out"
SH
chmod +x "$WORK/bin/untraced-python"
sed -e 's|^python = .*|python = "../bin/untraced-python"|' -e 's|^reference = "fp32"|reference = "fp32"\ntrace = "ops"|' \
  "$MATRIX" >"$WORK/m/untraced.toml"
expect_exit 2 "" -- "$HARNESS" nightly --matrix "$WORK/m/untraced.toml" --goldens "$WORK/g" --out "$WORK/untraced"
"$PY" - "$WORK/untraced/summary.json" <<'PY' || fail "a traced lane's receipt without /trace was not its run error"
import json, sys
lane = json.load(open(sys.argv[1]))["lanes"][0]
assert lane["status"] == "error", lane["status"]
assert "wrote a receipt without /trace, which its lane stack records" in json.dumps(lane), lane
PY
[ ! -e "$WORK/untraced/receipts/fp32.h5" ] || fail "the receipt without /trace was kept"

# Bad matrices: one line naming the file and the key, exit 2.
bad() {
  local pattern=$1 body=$2
  printf 'schema_version = 1\ncanary = "zoo.py:canary"\nreference = "fp32"\n%s\n[[lanes]]\nid = "fp32"\nengine = "torch"\n%s\n' \
    "$body" "${3:-}" >"$WORK/m/bad.toml"
  expect_exit 2 "bad.toml: $pattern" -- "$HARNESS" golden status --matrix "$WORK/m/bad.toml" --goldens "$WORK/g"
}
# Debian's python3 cannot load it: said, with the way out.
bad "canary: /usr/bin/python3 cannot load it \(.*No module named 'zoomod'\); name the interpreter that can with python = " ""
# Only what the interpreter lacks earns that way out, told from describe's result and exit
# status, never from the message's words: a NAME() whose ValueError quotes an import error's
# text is the canary's own error, said as it is.
cat >"$WORK/m/quoting.py" <<'PY'
def canary():
    raise ValueError("No module named 'zoomod' is what the last run said")
PY
printf 'schema_version = 1\ncanary = "quoting.py:canary"\nreference = "fp32"\n[[lanes]]\nid = "fp32"\nengine = "torch"\n' \
  >"$WORK/m/quoting.toml"
expect_exit 2 "quoting.toml: canary: .*quoting.py:canary: calling it raised ValueError: No module named 'zoomod' is what the last run said$" \
  -- "$HARNESS" golden status --matrix "$WORK/m/quoting.toml" --goldens "$WORK/g"
! grep -q "name the interpreter" "$WORK/stderr" || fail "a ValueError is told to name another interpreter: $(cat "$WORK/stderr")"
bad "python: '.*/m/nowhere/python' does not exist" 'python = "nowhere/python"'
bad "python: '.*/m/?' is a directory" 'python = "."'
echo 'not an interpreter' >"$WORK/bin/plain-file"
bad "python: .*/bin/plain-file .*could not be started: Permission denied" 'python = "../bin/plain-file"'
bad "python: .*/bin/isolated-python cannot load .*zoo.py:canary: .*No module named canary_harness" \
  'python = "../bin/isolated-python"'
# A lane's python overrides the matrix's: that interpreter must load the canary too.
bad "lanes\[1\] \(debian\).python: /usr/bin/python3 cannot load .*zoo.py:canary: .*No module named 'zoomod'" \
  'python = "../bin/zoo-python"' '[[lanes]]
id = "debian"
engine = "torch"
precision = "bf16"
python = "/usr/bin/python3"'
finish
