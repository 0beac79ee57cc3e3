#!/usr/bin/env bash
# `harness export`: a canary pack holds exactly what a run of the same canary, steps and
# seed starts from and trains on (init tensors bit for bit, every batch by its receipt
# batch_hash, the canary JSON byte for byte), in the checksummed format; bad flags exit 2
# with one line; a failed or killed export leaves no file under the requested name.
source "$(dirname "$0")/lib.sh"
REPO=$(cd "$HERE/../.." && pwd)
packs="$WORK/packs"; mkdir -p "$packs"

# ---- a pack equals what `harness run` starts from and trains on ---------------------------
check_pack() {  # check_pack CANARY STEPS SEED
  local canary=$1 steps=$2 seed=$3
  local pack="$packs/$canary-$seed.h5" receipt="$WORK/$canary-$seed.h5"
  expect_exit 0 "" -- "$HARNESS" export --canary "$canary" --steps "$steps" --seed "$seed" --out "$pack"
  grep -q "^pack        $pack" "$WORK/stdout" || fail "export's summary does not name the pack: $(cat "$WORK/stdout")"
  [ ! -e "$pack.partial" ] || fail "export left $pack.partial behind"
  "$HARNESS" run --canary "$canary" --steps "$steps" --seed "$seed" --dump-tensors 0 --record-batches \
    --out "$receipt" >/dev/null 2>&1 || { fail "harness run --canary $canary failed"; return; }
  PYTHONPATH="$REPO/python" "$PY" - "$pack" "$receipt" "$steps" "$seed" <<'EOF' || fail "pack $canary seed $3 differs from its run"
import json, sys
import h5py, numpy as np
from canary_harness.receipts.digest import batch_hash
pack_path, receipt_path, steps, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
problems = []
with h5py.File(pack_path, "r") as pack, h5py.File(receipt_path, "r") as receipt:
    m, rm = pack["manifest"].attrs, receipt["manifest"].attrs
    if m["pack_version"] != 1: problems.append(f"pack_version {m['pack_version']}")
    if m["canary"] != rm["canary"]: problems.append(f"canary JSON {m['canary']!r} != receipt's {rm['canary']!r}")
    canary = json.loads(m["canary"])
    if (m["seed"], m["steps"], canary["steps"]) != (seed, steps, steps): problems.append("seed/steps")
    if m["data_seed"] != canary["data_seed"]: problems.append("data_seed is not the canary's")
    if m["git_commit"] != rm["git_commit"] or not m["created_utc"].endswith(b"Z"): problems.append("git_commit/created_utc")
    names = [n.decode() for n in pack["init/names"][()]]
    if names != [n.decode() for n in receipt["hashes/names"][()]]: problems.append("init/names != receipt names")
    if sorted(names) != sorted(k for k in pack["init"] if k != "names"): problems.append("init tensors != init/names")
    dump = receipt["tensors/step_000000"]
    for n in names:
        t = pack["init"][n]
        if t.dtype != np.dtype("<f4") or t.shape != dump[n].shape: problems.append(f"init/{n}: {t.dtype} {t.shape}")
        elif t[()].tobytes() != dump[n][()].tobytes(): problems.append(f"init/{n}: values differ from --dump-tensors 0")
    tokens = pack["batches/tokens"]
    B, T1 = canary["batch_size"], canary["context_length"] + 1
    if tokens.dtype != np.dtype("<i4") or tokens.shape != (steps, B, T1): problems.append(f"tokens {tokens.dtype} {tokens.shape}")
    hashes = [batch_hash(tokens[s]) for s in range(tokens.shape[0])]
    if hashes != [int(h) for h in receipt["steps/batch_hash"][()]]: problems.append("batch hashes != receipt /steps/batch_hash")
    if not np.array_equal(tokens[()], receipt["batches/tokens"][()]): problems.append("tokens != receipt /batches/tokens")
    # the receipt's file format: checksummed metadata, fixed-length strings, Fletcher32 everywhere
    def visit(name, obj):
        if isinstance(obj, h5py.Dataset) and not (obj.fletcher32 and obj.chunks):
            problems.append(f"{name}: not chunked with Fletcher32")
    pack.visititems(visit)
    if h5py.check_string_dtype(pack["init/names"].dtype).length is None: problems.append("init/names: variable-length")
    for key in ("canary", "created_utc", "git_commit"):
        if pack["manifest"].attrs.get_id(key).get_type().is_variable_str(): problems.append(f"{key}: variable-length")
with open(pack_path, "rb") as f:
    head = f.read(9)
if head[:8] != b"\x89HDF\r\n\x1a\n" or head[8] != 3: problems.append(f"superblock version {head[8]}, not 3 (HDF5 1.10 format)")
for p in problems: print(f"{pack_path}: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
}
check_pack micro 6 1337
check_pack micro 4 7
check_pack tiny 2 1337

# Another seed: other init, the same data.
PYTHONPATH="$REPO/python" "$PY" - "$packs/micro-1337.h5" "$packs/micro-7.h5" <<'EOF' || fail "seed 7 and 1337 packs"
import sys, h5py, numpy as np
a, b = (h5py.File(p, "r") for p in sys.argv[1:3])
assert not np.array_equal(a["init/wte"][()], b["init/wte"][()]), "seed does not change the init"
assert np.array_equal(a["batches/tokens"][:4], b["batches/tokens"][()]), "seed changes the data"
EOF

# ---- bad flags: exit 2, one line naming the flag, nothing written ---------------------------
out="$WORK/rejected"; mkdir -p "$out"
expect_exit 2 "unknown canary 'huge'" -- "$HARNESS" export --canary huge --steps 3 --out "$out/p.h5"
expect_exit 2 "--steps"  -- "$HARNESS" export --canary micro --steps 0 --out "$out/p.h5"
expect_exit 2 "--steps"  -- "$HARNESS" export --canary micro --steps 1000001 --out "$out/p.h5"
expect_exit 2 "--steps"  -- "$HARNESS" export --canary micro --steps many --out "$out/p.h5"
expect_exit 2 "--seed"   -- "$HARNESS" export --canary micro --seed -1 --out "$out/p.h5"
expect_exit 2 "--seed"   -- "$HARNESS" export --canary micro --seed x --out "$out/p.h5"
expect_exit 2 "--out"    -- "$HARNESS" export --canary micro --steps 3
expect_exit 2 "--bogus"  -- "$HARNESS" export --canary micro --bogus --out "$out/p.h5"
expect_exit 2 "is a directory" -- "$HARNESS" export --canary micro --out "$out"
expect_exit 2 "does not exist" -- "$HARNESS" export --canary micro --out "$WORK/nowhere/p.h5"
mkdir "$out/q.h5.partial"
expect_exit 2 "q.h5.partial' .*exists and is not a file" -- "$HARNESS" export --canary micro --out "$out/q.h5"
rmdir "$out/q.h5.partial"
[ -z "$(ls -A "$out")" ] || fail "rejected exports left files: $(ls "$out")"

# An existing pack is never overwritten without --force, and stays byte-identical.
keep="$packs/micro-1337.h5"; before=$(sha256sum <"$keep")
expect_exit 2 "exists; pass --force" -- "$HARNESS" export --canary micro --steps 3 --out "$keep"
[ "$before" = "$(sha256sum <"$keep")" ] || fail "a refused export changed the existing pack"
expect_exit 0 "" -- "$HARNESS" export --canary micro --steps 3 --out "$keep" --force
"$PY" -c "import h5py,sys; sys.exit(h5py.File('$keep','r')['batches/tokens'].shape[0] != 3)" || fail "--force did not rewrite the pack"

# ---- a failure while writing leaves nothing ---------------------------------------------------
# A file size limit: the harness ignores SIGXFSZ itself, so the write fails with EFBIG
# whatever the caller's disposition of the signal: exit 2, one line, no pack and no partial file.
failed="$WORK/failed"; mkdir -p "$failed"
(trap '' XFSZ; ulimit -f 64; expect_exit 2 "big.h5.partial: cannot write the pack \(File too large\)" -- \
  "$HARNESS" export --canary tiny --steps 100 --out "$failed/big.h5"; exit "$failures") || failures=$((failures + 1))
[ -z "$(ls -A "$failed")" ] || fail "a failed export left files: $(ls "$failed")"
(ulimit -f 64; expect_exit 2 "big.h5.partial: cannot write the pack \(File too large\)" -- \
  "$HARNESS" export --canary tiny --steps 100 --out "$failed/big.h5"; exit "$failures") || failures=$((failures + 1))
[ -z "$(ls -A "$failed")" ] || fail "an export past the file size limit left files: $(ls "$failed")"

finish
