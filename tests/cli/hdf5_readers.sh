#!/usr/bin/env bash
# Receipts open in the standard readers: h5dump, h5ls (hdf5-tools) and h5py.
source "$(dirname "$0")/lib.sh"
receipt="$WORK/micro.h5"
"$HARNESS" run --canary micro --steps 3 --dump-tensors 0 --record-batches --out "$receipt" >/dev/null 2>&1 || fail "run"
h5dump -H "$receipt" > "$WORK/header.txt" || fail "h5dump -H exit $?"
for expected in 'GROUP "manifest"' 'ATTRIBUTE "schema_version"' 'DATASET "loss"' 'DATASET "params"' 'H5T_STD_U64LE'; do
  grep -q "$expected" "$WORK/header.txt" || fail "h5dump -H lacks $expected"
done
h5ls -r "$receipt" | grep -q '^/steps/batch_hash' || fail "h5ls -r lacks /steps/batch_hash"
$PY - "$receipt" <<'PYEOF' || fail "h5py"
import sys, json, h5py
with h5py.File(sys.argv[1], "r") as f:
    m = f["manifest"].attrs
    assert int(m["schema_version"]) == 1 and int(m["complete"]) == 1
    assert json.loads(m["canary"])["preset"] == "micro"
    names = [n.decode() if isinstance(n, bytes) else n for n in f["hashes/names"][:]]
    assert names[0] == "wte" and names[-1] == "lnf.bias"
    assert f["hashes/params"].shape == (3, len(names))
    assert f["batches/tokens"].shape == (3, 2, 17)
    assert f["tensors/step_000000/wte"].shape == (128, 32)
PYEOF
finish
