#!/usr/bin/env bash
# docs/python-env.md, run as written: every ```sh block of the page in order, in the
# repository root, with `build/bin/harness` as this build's harness and /tmp/ as a fresh
# directory. Registered only where .venv/ exists (tests/CMakeLists.txt): the page's
# `--check` must then find it up to date, and the run must be torch 2.9's.
source "$(dirname "$0")/lib.sh"
repo=$(cd "$HERE/../.." && pwd)
harness=$(cd "$(dirname "$HARNESS")" && pwd)/$(basename "$HARNESS")
page=$repo/docs/python-env.md
script=$WORK/page.sh
page_script "$page" "$harness" "$script"
(cd "$repo" && PYTHONDONTWRITEBYTECODE=1 bash "$script") >"$WORK/page.out" 2>&1 ||
  fail "a command of $page failed: $(tail -5 "$WORK/page.out")"
grep -q "^python-env: .venv/ is up to date (torch 2.9.0" "$WORK/page.out" || fail "python-env.sh did not reuse .venv/"
"$repo/.venv/bin/python" - "$WORK/own-2x.h5" <<'PY' || fail "the receipt is not torch 2.9's"
import sys, h5py
attrs = h5py.File(sys.argv[1], "r")["manifest"].attrs
libraries = attrs["libraries"].decode() if isinstance(attrs["libraries"], bytes) else attrs["libraries"]
assert "torch 2.9.0" in libraries, libraries
assert attrs["complete"] == 1
PY
grep -q "^lane        own-gpt/torch+fsdp" "$WORK/page.out" || fail "the fsdp run did not record its lane"
grep -q "^verdict     PASS" "$WORK/page.out" || fail "the fsdp run does not pass its calibrated budget"
finish
