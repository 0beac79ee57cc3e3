#!/usr/bin/env bash
# A clean tree passes: the default matrix (canaries/nightly.toml) against the committed
# goldens under the committed budgets, every lane bit for bit equal to its golden (a real
# stack's lane on another platform than its golden's: within that feature's
# across_platforms budget and nothing else), and the goldens directory in order (no lane
# without a golden, no orphan, every golden logged).
source "$(dirname "$0")/lib.sh"
unset CI
expect_exit 0 "" -- "$HARNESS" golden status
# CI (.ci/run) has just run this job as README command 1 (scripts/run-canary.sh, which exits
# with the nightly's status) with this tree's harness, and names that report in
# HARNESS_DEFAULT_NIGHTLY_REPORT: the assertions below judge it instead of a second run of
# the same lanes (8-10 minutes of CI's two cores). It is taken only when this harness was
# built from a clean commit and every receipt of the report the harness wrote records that
# commit (its Python lanes' receipts record "unknown": the package is not told the commit of
# the checkout that ran it, the same one in the same job); otherwise the job runs here.
report=$WORK/nightly
commit=$("$HARNESS" --version | sed -n 's/.*(commit \([0-9a-f]*\),.*/\1/p')
if [ -n "${HARNESS_DEFAULT_NIGHTLY_REPORT:-}" ] && [ -n "$commit" ] &&
   "$PY" - "$HARNESS_DEFAULT_NIGHTLY_REPORT" "$commit" <<'PY'
import h5py, pathlib, sys
report, commit = pathlib.Path(sys.argv[1]), sys.argv[2]
receipts = sorted(report.glob("**/receipts/*.h5"))  # --jobs: each shard's under shards/i/
assert (report / "summary.json").is_file() and receipts, "no summary or no receipts"
commits = set()
for path in receipts:
    with h5py.File(path, "r") as f:
        written = f["manifest"].attrs["git_commit"]
        commits.add(written.decode() if isinstance(written, bytes) else written)
assert commits - {"unknown"} == {commit}, (sorted(commits), commit)
PY
then
  report=$HARNESS_DEFAULT_NIGHTLY_REPORT
  echo "judging command 1's report $report (commit $commit)"
else
  expect_exit 0 "" -- "$HARNESS" nightly --out "$report" --jobs 2
fi
"$PY" - "$report/summary.json" "$HERE/../../canaries/budgets.toml" <<'PY' || fail "the default nightly is not a bitwise pass against its goldens"
import json, sys, tomllib
s = json.load(open(sys.argv[1]))
budgets = tomllib.load(open(sys.argv[2], "rb"))
across = {e["across_platforms"] for e in budgets.values() if isinstance(e, dict) and "across_platforms" in e}
assert s["verdict"] == "pass" and len(s["lanes"]) >= 5
for lane in s["lanes"]:
    golden = next(c for c in lane["checks"] if c["check"] == "golden")
    if golden["summary"] != "bitwise equal":
        features = golden["verdict"]["budget"]["features"]
        assert features and set(features) <= across and golden["status"] == "pass", (lane["id"], golden["summary"], features)
PY
# The torch lanes of both stacks and the JAX lanes (docs/nightly.md, "External lanes"):
# named after the interpreter's release (torch) or the mesh and plan (JAX), the .venv/ lanes
# bitwise to their goldens where they were recorded (on another CPU: within the feature's
# across_platforms entry alone), each within its declared budget of cpu-ref.
"$PY" - "$report/summary.json" "$HERE/../../canaries/budgets.toml" <<'PY' || fail "the torch lanes are not judged as the matrix says"
import json, sys, tomllib
lanes = {l["id"]: l for l in json.load(open(sys.argv[1]))["lanes"]}
budgets = tomllib.load(open(sys.argv[2], "rb"))
across = {e["across_platforms"] for e in budgets.values() if isinstance(e, dict) and "across_platforms" in e}
wanted = {"torch-fp32": ("tiny/torch", ["torch-cpu"]), "torch-bf16": ("tiny/torch+bf16", ["torch-bf16"]),
          "torch2-fp32": ("tiny/torch@2.9", ["torch-cpu"]), "torch2-bf16": ("tiny/torch@2.9+bf16", ["torch-bf16"]),
          "torch2-compile": ("tiny/torch@2.9+compile", ["torch-compile", "torch-cpu"]),
          "torch-xla": ("tiny/torch@2.9+xla", ["torch-xla"]),
          "jax-fp32": ("tiny/jax@1x1+dp", ["jax"]), "jax-tp": ("tiny/jax@2x2+tp", ["jax", "mesh-fp32"]),
          "jax-zero3-bf16": ("tiny/jax@2x2+zero3+bf16", ["jax", "jax-bf16", "mesh-bf16"])}
for id, (lane, features) in wanted.items():
    assert lanes[id]["lane"] == lane, (id, lanes[id]["lane"])
    checks = {c["check"]: c for c in lanes[id]["checks"]}
    assert checks["golden"]["status"] == "pass", (id, checks["golden"])
    if id.startswith(("torch2", "jax")) or id == "torch-xla":  # bitwise, or another CPU than the golden's
        golden_budget = checks["golden"]["verdict"]["budget"]
        assert golden_budget["bitwise"] is True or set(golden_budget["features"]) <= across, (id, checks["golden"])
    ref = checks["reference"]
    assert ref["status"] == "pass" and sorted(ref["verdict"]["budget"]["features"]) == features, (id, ref)
    if id == "torch-xla":  # torch_xla's own counters, gated: one compile at step 0, none after, no host read
        gates = {m["metric"]: m["pass"] for m in ref["verdict"]["metrics"]}
        assert gates["compile_stability.uncached_compiles"] is gates["compile_stability.host_syncs"] is True, gates
PY
# Logit KL (docs/logit-kl.md): tiny's held-out logits judged in every lane that records them,
# exactly equal for cpu-ref against its golden, and inside their budget (not merely reported)
# for the bf16 lanes of accel and of real PyTorch.
"$PY" - "$report/summary.json" <<'PY' || fail "the held-out logits are not judged as docs/logit-kl.md says"
import json, sys
lanes = {l["id"]: l for l in json.load(open(sys.argv[1]))["lanes"]}
def logits(id, check):
    c = next(c for c in lanes[id]["checks"] if c["check"] == check)
    assert c["verdict"]["logits_not_compared"] is None, (id, check, c["verdict"]["logits_not_compared"])
    return {m["metric"]: m for m in c["verdict"]["metrics"] if m["metric"] in ("logit_kl", "logprob_delta", "top1_mismatch")}
for id in lanes:  # every golden of the default matrix records its lane's logits
    logits(id, "golden")
exact = logits("cpu-ref", "golden")
assert len(exact) == 3 and all(m["judged"] and m["pass"] and m["max_deviation"] == 0 for m in exact.values()), exact
for id in ("accel-bf16", "torch-bf16", "torch2-bf16"):
    judged = logits(id, "reference")
    assert len(judged) == 3 and all(m["judged"] and m["pass"] for m in judged.values()), (id, judged)
    assert judged["logit_kl"]["max_deviation"] > 0, (id, judged["logit_kl"])
    # the envelope the report charts: each judged logit metric at tiny's evaluations (every 25 of 100 steps)
    charted = {m["metric"]: m for m in lanes[id]["series"]["envelope"]["metrics"] if "steps" in m}
    assert sorted(charted) == sorted(judged), (id, sorted(charted))
    for m in charted.values():
        assert m["steps"] == [25, 50, 75, 100] and len(m["deviation"]) == len(m["allowed"]) == 4, (id, m)
        assert all(0 <= d <= a for d, a in zip(m["deviation"], m["allowed"])), (id, m)
PY
grep -q 'data-metric="logit_kl"' "$report/report.html" || fail "report.html does not chart logit_kl"
finish
