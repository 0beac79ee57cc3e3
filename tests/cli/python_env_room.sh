#!/usr/bin/env bash
# scripts/python-env.sh refuses, in one line and with nothing changed, to make .venv/ on a
# disk without room for it (docs/python-env.md, "Room first"): a copy of the script in a
# scratch root, with `df` answering 1 GB free, must exit 2 before it makes anything there.
source "$(dirname "$0")/lib.sh"
repo=$(cd "$HERE/../.." && pwd)
root=$WORK/root
mkdir -p "$root/scripts" "$root/python" "$WORK/bin" "$WORK/wheels"
cp "$repo/scripts/python-env.sh" "$root/scripts/"
cp "$repo/python/requirements-venv.txt" "$root/python/"
# df -P -k as coreutils prints it, 1 GB (1048576 KiB) available on every path asked about.
cat >"$WORK/bin/df" <<'DF'
#!/bin/sh
echo "Filesystem 1024-blocks Used Available Capacity Mounted on"
echo "/dev/small 2097152 1048576 1048576 50% /"
DF
chmod +x "$WORK/bin/df"
expect_exit 2 "^python-env: making .venv/ needs about 12 GB free at $root, and 1 GB is: free space there" -- \
  env PATH="$WORK/bin:$PATH" CANARY_HARNESS_WHEELS="$WORK/wheels" timeout 60 bash "$root/scripts/python-env.sh"
[ ! -e "$root/.venv" ] || fail "the refusal made $root/.venv"
[ -z "$(ls -A "$WORK/wheels")" ] || fail "the refusal wrote into the wheel cache"
# With torch's wheel cached, only .venv/'s 8 GB is asked for.
touch "$WORK/wheels/torch-2.9.0-cp311-cp311-manylinux_2_28_x86_64.whl"
expect_exit 2 "^python-env: making .venv/ needs about 8 GB free at $root, and 1 GB is" -- \
  env PATH="$WORK/bin:$PATH" CANARY_HARNESS_WHEELS="$WORK/wheels" timeout 60 bash "$root/scripts/python-env.sh"
[ ! -e "$root/.venv" ] || fail "the refusal made $root/.venv"
finish
