#!/usr/bin/env bash
# C++ users (docs/cpp.md): `cmake --install` of this build tree into a fresh prefix holds
# the receipt library, its headers, the CanaryHarness CMake package, bin/harness and the
# digest library (its C ABI, loaded by python3), and
# nothing of the tests or benchmarks; every installed header compiles on its own against
# the package; examples/cpp-receipt configures and builds against that prefix alone, and
# its receipt passes the installed `harness validate`, its digests equal to the Python
# package's; a damaged receipt, an existing output and a wrong version are refused.
#   cpp_consumer.sh path/to/build/bin/harness [BUILD_DIR]   (default: the binary's ../..)
source "$(dirname "$0")/lib.sh"
REPO=$(cd "$HERE/../.." && pwd)
BUILD=${2:-$(cd "$(dirname "$HARNESS")/.." && pwd)}
PREFIX="$WORK/prefix"
# Only this prefix: no package registry, no other install of the package.
CONSUMER=(-DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_BUILD_TYPE=Release
          -DCMAKE_CXX_FLAGS="-Wall -Wextra -Wpedantic -Werror")

run_quiet() {  # run_quiet WHAT -- command...: its output only when it fails
  local what=$1; shift 2
  "$@" >"$WORK/log" 2>&1 || { fail "$what failed: $(tail -n 30 "$WORK/log")"; return 1; }
}

# compile_c NAME LIB: $WORK/NAME.c, a C99 program, against the installed headers and the
# library LIB (a path in the prefix) alone, into $WORK/NAME_c.
compile_c() {
  local libdir
  libdir=$(dirname "$PREFIX/$2")
  run_quiet "compiling a C program against the $1 library" -- \
    cc -std=c99 -Wall -Wextra -Wpedantic -Werror -I"$PREFIX/include" "$WORK/$1.c" -L"$libdir" \
    -lcanary_harness_"$1" -Wl,-rpath,"$libdir" -o "$WORK/$1_c"
}

# ---- the installed prefix ---------------------------------------------------------------------
run_quiet "cmake --install $BUILD" -- cmake --install "$BUILD" --prefix "$PREFIX" || { finish; exit 1; }
PKG=$(dirname "$(find "$PREFIX" -name CanaryHarnessConfig.cmake | head -n 1)")
[ -x "$PREFIX/bin/harness" ] || fail "no bin/harness in the prefix"
for f in CanaryHarnessConfig.cmake CanaryHarnessConfigVersion.cmake CanaryHarnessTargets.cmake; do
  [ -f "$PKG/$f" ] || fail "no $f in the prefix's package directory ($PKG)"
done
libs=$(cd "$PREFIX" && find . -name '*.a' -printf '%f\n' | sort | tr '\n' ' ')
[ "$libs" = "libharness_engine_api.a libharness_numerics.a libharness_receipt.a " ] || fail "installed libraries: $libs"
for h in receipt/receipt_writer.h receipt/receipt_reader.h receipt/receipt_validator.h receipt/receipt_schema.h receipt/digest.h \
         receipt/hdf5_file.h api/engine.h api/tensor_table.h numerics/philox.h; do
  [ -f "$PREFIX/include/canary_harness/$h" ] || fail "header canary_harness/$h not installed"
done
# The digest library behind its C ABI (docs/cpp.md): the file, its SONAME link, and that it
# loads into Debian's python3 and passes canary_harness.receipts.native's checks (ABI, probe digests).
digest_lib=$(cd "$PREFIX" && find . -name 'libcanary_harness_digest.so.1' | head -n 1)
[ -n "$digest_lib" ] && [ -e "$PREFIX/$digest_lib" ] || fail "no libcanary_harness_digest.so.1 in the prefix"
[ -z "$digest_lib" ] || PYTHONPATH="$REPO/python" CANARY_HARNESS_DIGEST="$PREFIX/$digest_lib" "$PY" -c \
  'from canary_harness.receipts.native import native_digest; import sys; sys.exit(native_digest() is None)' ||
  fail "the installed digest library does not load or digests differently"
# ... and a C99 program builds against the installed header and library alone, and hashes
# as canary_harness does.
if [ -n "$digest_lib" ]; then
  cat >"$WORK/digest.c" <<'CSRC'
#include <canary_harness/receipt/digest_c_api.h>
#include <stdio.h>
int main(void) {
  const float values[5] = {1.0f, -2.5f, 0.0f, 3.0f, 1e-3f};
  if (canary_digest_abi_version() != CANARY_DIGEST_ABI_VERSION) return 1;
  printf("%llu\n", (unsigned long long)canary_digest_hash_f32(values, 5));
  return 0;
}
CSRC
  if compile_c digest "$digest_lib"; then
    c_hash=$("$WORK/digest_c") || fail "the C program against the digest library failed"
    py_hash=$(PYTHONPATH="$REPO/python" "$PY" -c 'import numpy as np; from canary_harness import tensor_hash
print(tensor_hash(np.array([1.0, -2.5, 0.0, 3.0, 1e-3], dtype=np.float32)))')
    [ "$c_hash" = "$py_hash" ] || fail "the C ABI's hash $c_hash is not canary_harness's $py_hash"
  fi
fi
# The receipt writer behind its C ABI (docs/cpp.md): it loads into python3 and passes
# canary_harness.receipts.receipt_native's checks (ABI, schema), and a C99 program built against the
# installed header and library alone writes a receipt the installed harness validates.
receipt_lib=$(cd "$PREFIX" && find . -name 'libcanary_harness_receipt.so.1' | head -n 1)
[ -n "$receipt_lib" ] && [ -e "$PREFIX/$receipt_lib" ] || fail "no libcanary_harness_receipt.so.1 in the prefix"
if [ -n "$receipt_lib" ]; then
  PYTHONPATH="$REPO/python" CANARY_HARNESS_WRITER="$PREFIX/$receipt_lib" "$PY" -c \
    'from canary_harness.receipts.receipt_native import receipt_library; import sys; sys.exit(receipt_library() is None)' ||
    fail "the installed receipt library does not load or writes another schema"
  "$PREFIX/bin/harness" schema >"$WORK/description.json"
  cat >"$WORK/receipt.c" <<'CSRC'
#include <canary_harness/receipt/receipt_c_api.h>
#include <stdio.h>
#include <stdlib.h>
/* receipt DESCRIPTION.json OUT.h5: one step of one tensor, finished. */
int main(int argc, char** argv) {
  char error[512];
  FILE* f = fopen(argv[1], "rb");
  if (argc != 3 || !f) return 2;
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  rewind(f);
  char* description = calloc((size_t)size + 1, 1);
  if (!description || fread(description, 1, (size_t)size, f) != (size_t)size) return 2;
  fclose(f);
  const canary_receipt_attribute manifest[] = {
      {"schema_version", 1, NULL, canary_receipt_schema_version(), 0}, {"schema_minor", 1, NULL, canary_receipt_schema_minor(), 0},
      {"lane", 0, "c/consumer", 0, 0}, {"engine", 0, "consumer", 0, 0}, {"features", 0, "", 0, 0},
      {"budget_features", 0, "", 0, 0}, {"canary", 0, "{\"name\": \"consumer\"}", 0, 0}, {"seed", 1, NULL, 1, 0},
      {"steps_planned", 1, NULL, 1, 0}, {"threads", 1, NULL, 1, 0}, {"complete", 1, NULL, 0, 0},
      {"created_utc", 0, "2026-11-30T00:00:00Z", 0, 0}, {"git_commit", 0, "unknown", 0, 0},
      {"toolchain", 0, "cc", 0, 0}, {"libraries", 0, "", 0, 0}, {"host", 0, "", 0, 0}, {"cpu", 0, "", 0, 0}};
  const char* names[] = {"w"};
  canary_receipt_writer* w = canary_receipt_create(argv[2], 0, description, sizeof manifest / sizeof manifest[0],
                                                   manifest, 1, names, 0, 0, error, sizeof error);
  if (!w) { fprintf(stderr, "%s\n", error); return 1; }
  const uint64_t hashes[4] = {1, 2, 3, 4};
  const double l2[2] = {0.5, 0.25};
  double projection[32] = {0};
  if (canary_receipt_append_step(w, 2.5, 1.0, 1e-3, 7, hashes, l2, projection, NULL, error, sizeof error) != 0 ||
      canary_receipt_finish(w, error, sizeof error) != 0) {
    fprintf(stderr, "%s\n", error);
    return 1;
  }
  canary_receipt_close(w, 0);
  free(description);
  return 0;
}
CSRC
  if compile_c receipt "$receipt_lib"; then
    run_quiet "the C program writing a receipt" -- "$WORK/receipt_c" "$WORK/description.json" "$WORK/c.h5" &&
      run_quiet "harness validate of the C program's receipt" -- "$PREFIX/bin/harness" validate "$WORK/c.h5"
  fi
fi
extra=$(cd "$PREFIX" && find . -type f | grep -vE '^\./(bin/harness|include/canary_harness/(receipt|api|numerics)/[a-z0-9_]+\.h|include/canary_harness/api/engine_ops\.inc|.*/cmake/CanaryHarness/CanaryHarness[A-Za-z-]*\.cmake|.*/libharness_(receipt|engine_api|numerics)\.a|.*/libcanary_harness_(digest|receipt)\.so\.[0-9.]+)$')
[ -z "$extra" ] || fail "installed beyond the package: $extra"
grep -l -F "$REPO" "$PKG"/*.cmake >/dev/null && fail "the package's CMake files name the source or build tree: $(grep -h -F "$REPO" "$PKG"/*.cmake | head -n 3)"

# ---- every installed header on its own; a version the package is not refuses -----------------
mkdir -p "$WORK/headers"
headers=$(cd "$PREFIX/include" && find canary_harness -name '*.h' | sort)
for h in $headers; do echo "#include <$h>" >"$WORK/headers/$(echo "$h" | tr '/.' '__').cpp"; done
cat >"$WORK/headers/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.25)
project(header_check LANGUAGES C CXX)
find_package(CanaryHarness 9.0 QUIET)
if(CanaryHarness_FOUND)
  message(FATAL_ERROR "find_package(CanaryHarness 9.0) accepted version ${CanaryHarness_VERSION}")
endif()
find_package(CanaryHarness 0.1 REQUIRED)
file(GLOB sources *.cpp)
add_library(header_check OBJECT ${sources})
target_link_libraries(header_check PRIVATE CanaryHarness::receipt)
EOF
if run_quiet "the installed headers' check" -- cmake -S "$WORK/headers" -B "$WORK/headers/build" "${CONSUMER[@]}"; then
  grep -q "^CanaryHarness_DIR:PATH=$PKG\$" "$WORK/headers/build/CMakeCache.txt" ||
    fail "find_package found another CanaryHarness: $(grep CanaryHarness_DIR "$WORK/headers/build/CMakeCache.txt")"
  run_quiet "compiling each installed header alone" -- cmake --build "$WORK/headers/build" -j 2
fi

# ---- the example: a toy training loop's receipt, valid ----------------------------------------
example="$WORK/example"
run_quiet "configuring examples/cpp-receipt" -- cmake -S "$REPO/examples/cpp-receipt" -B "$example" "${CONSUMER[@]}" &&
  run_quiet "building examples/cpp-receipt" -- cmake --build "$example" -j 2 || { finish; exit 1; }
receipt="$WORK/toy.h5"
expect_exit 0 "" -- "$example/cpp_receipt" "$receipt"
[ "$(grep -c '^step ' "$WORK/stdout")" -eq 8 ] || fail "the example did not train 8 steps: $(cat "$WORK/stdout")"
awk '/^step 0 /{first=$4} /^step 7 /{last=$4} END{exit !(last < first)}' "$WORK/stdout" ||
  fail "the toy loss did not go down: $(cat "$WORK/stdout")"
"$PREFIX/bin/harness" schema > "$WORK/schema.json" || fail "harness schema of the installed harness"
expect_exit 0 "" -- "$PREFIX/bin/harness" validate --json "$receipt"
"$PY" - "$WORK/stdout" "$WORK/schema.json" <<'EOF' || fail "validate --json of the example's receipt: $(cat "$WORK/stdout")"
import json, sys
r = json.load(open(sys.argv[1]))
schema = json.load(open(sys.argv[2]))  # the installed harness's own version: the example writes it
assert r["valid"] and r["problems"] == [] and r["unknown"] == [], r
version = "%d.%d" % (schema["schema_version"], schema["schema_minor"])
assert (r["receipt_schema"], r["steps"], r["tensors"]) == (version, 8, 2), (r, version)
EOF

# The example's hashes and sketches are the harness's: the Python package (held to the C++
# recorder by its own tests) recomputes them from the dumped final parameters and batches.
PYTHONPATH="$REPO/python" "$PY" - "$receipt" <<'EOF' || fail "the example's digests differ from canary_harness.receipts.digest"
import sys
import h5py, numpy as np
from canary_harness.receipts.digest import batch_hash, sketch, tensor_hash
with h5py.File(sys.argv[1], "r") as f:
    m = f["manifest"].attrs
    assert m["complete"] == 1 and m["budget_features"] == b"", dict(m)
    names = [n.decode() for n in f["hashes/names"][()]]
    for k, name in enumerate(names):
        values = f[f"tensors/step_000008/{name}"][()]
        assert f["hashes/params"][7, k] == tensor_hash(values), name
        s = sketch(values, name)
        assert f["sketches/params_l2"][7, k].tobytes() == np.float64(s.l2).tobytes(), name
        assert f["sketches/params_projection"][7, k].tobytes() == np.asarray(s.projection, "<f8").tobytes(), name
    tokens = f["batches/tokens"]
    for step in range(8):
        assert f["steps/batch_hash"][step] == batch_hash(tokens[step]), step
EOF

# ---- refused honestly -------------------------------------------------------------------------
# The writer never overwrites: the existing receipt stays as it was.
before=$(sha256sum <"$receipt")
expect_exit 2 "^cpp_receipt: .*toy\.h5" -- "$example/cpp_receipt" "$receipt"
[ "$(sha256sum <"$receipt")" = "$before" ] || fail "a refused run changed the existing receipt"
# A receipt missing a dataset is named by the installed validate, exit 2.
cp "$receipt" "$WORK/broken.h5"
"$PY" -c 'import h5py, sys; f = h5py.File(sys.argv[1], "r+"); del f["sketches/grads_l2"]; f.close()' "$WORK/broken.h5" ||
  fail "could not delete a dataset with h5py"
expect_exit 2 "broken\.h5: /sketches/grads_l2: missing$" -- "$PREFIX/bin/harness" validate "$WORK/broken.h5"

finish
