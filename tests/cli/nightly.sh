#!/usr/bin/env bash
# The goldens workflow and the nightly job end to end on the micro canary: refresh writes
# candidates and leaves goldens byte-identical; approve updates goldens and the log
# together; CI refuses to write; a clean tree passes; a fault fails naming its step; a
# perturbed budget fails with the right headroom and BF16-first triage; shards merge into
# the verdicts of one run; orphaned and missing goldens are reported; bad input exits 2.
source "$(dirname "$0")/lib.sh"
MATRIX="$HERE/data/micro_nightly.toml"
BUDGETS="$HERE/../../canaries/budgets.toml"
G="$WORK/goldens"
mkdir -p "$G"
unset CI
golden() { "$HARNESS" golden "$@" --goldens "$G"; }
# nightly with the test's matrix and budgets; M=FILE or B=FILE before the call swaps one
nightly() { "$HARNESS" nightly --matrix "${M:-$MATRIX}" --goldens "$G" --budgets "${B:-$BUDGETS}" "$@"; }
hashes() { (cd "$G" && find . -name '*.h5' ! -name '*.candidate.h5' | sort | xargs -r sha256sum; cat provenance.jsonl 2>/dev/null); }

# CI guard: nothing is written
expect_exit 2 "CI is set.*--allow-ci" -- env CI=true "$HARNESS" golden refresh --matrix "$MATRIX" --goldens "$G" --reason x
[ -z "$(ls -A "$G")" ] || fail "refresh under CI wrote $(ls -A "$G")"

# status before any golden: every lane missing, exit 1
expect_exit 1 "" -- golden status --matrix "$MATRIX"
[ "$(grep -c '^missing' "$WORK/stdout")" -eq 5 ] || fail "status does not list 5 missing goldens: $(cat "$WORK/stdout")"

# refresh writes candidates and a review, no golden; approve promotes and logs them
expect_exit 0 "" -- golden refresh --matrix "$MATRIX" --reason "first goldens"
[ "$(find "$G" -name '*.candidate.h5' | wc -l)" -eq 5 ] || fail "refresh did not write 5 candidates"
[ -z "$(hashes)" ] || fail "refresh wrote a golden or a log"
grep -q "## micro/accel+bf16 (bf16)" "$G/review.md" || fail "review.md lacks the bf16 lane"
expect_exit 2 "CI is set" -- env CI=1 "$HARNESS" golden approve --goldens "$G" --approved-by ci
expect_exit 0 "" -- golden approve --approved-by "Ada Lovelace" --allow-dirty
[ "$(find "$G" -name '*.candidate.h5' | wc -l)" -eq 0 ] || fail "approve left candidates"
[ ! -e "$G/candidates.json" ] && [ ! -e "$G/review.md" ] || fail "approve left the candidates record or review"
"$PY" - "$G" <<'PY' || fail "provenance log does not record the 5 goldens"
import json, subprocess, sys, pathlib
g = pathlib.Path(sys.argv[1])
log = [json.loads(l) for l in (g / "provenance.jsonl").read_text().splitlines()]
assert len(log) == 5, log
for e in log:
    keys = {"date_utc", "lane", "old_hash", "new_hash", "reason", "approver", "git_commit", "toolchain", "comparison"}
    assert set(e) - {"allow_dirty"} == keys, e
    assert e.get("allow_dirty", False) == e["git_commit"].endswith("-dirty"), e
    assert e["approver"] == "Ada Lovelace" and e["reason"] == "first goldens" and e["old_hash"] is None
    assert e["comparison"]["verdict"] == "new" and e["toolchain"].startswith(("GNU", "Clang"))
    # the recorded hash is the file's XXH3-128, as xxhsum -H2 prints it
    digest = subprocess.run(["xxhsum", "-H2", str(g / (e["lane"] + ".h5"))], capture_output=True, text=True).stdout.split()[0]
    assert e["new_hash"] == "xxh128:" + digest, (e["new_hash"], digest)
PY
expect_exit 0 "" -- golden status --matrix "$MATRIX"

# a clean tree passes; every report is written; JUnit has one case per check
expect_exit 0 "" -- nightly --out "$WORK/run"
for f in summary.json report.html junit.xml summary.md; do [ -s "$WORK/run/$f" ] || fail "nightly wrote no $f"; done
"$PY" - "$WORK/run" <<'PY' || fail "nightly reports lack what docs/nightly.md promises"
import json, sys, xml.etree.ElementTree as ET
d = sys.argv[1]
s = json.load(open(d + "/summary.json"))
assert s["schema_version"] == 1 and s["kind"] == "nightly" and s["verdict"] == "pass"
assert [l["id"] for l in s["lanes"]] == ["ref", "bf16", "fp8", "tp", "zero3"]
for lane in s["lanes"]:
    checks = {c["check"]: c for c in lane["checks"]}
    assert checks["golden"]["status"] == "pass" and checks["golden"]["verdict"]["budget"]["bitwise"] is True
    if lane["id"] != "ref":
        assert checks["reference"]["status"] == "pass" and not checks["reference"]["verdict"]["budget"]["bitwise"]
        env = lane["series"]["envelope"]
        assert len(env["loss_deviation"]) == 12 and all(a > 0 for a in env["loss_allowed"])
root = ET.parse(d + "/junit.xml").getroot()
cases = root.findall(".//testcase")
assert len(cases) == 12 and root.get("failures") == "0" and root.get("errors") == "0", ET.tostring(root)[:300]
assert [c.get("name") for c in root.findall(".//testcase[@classname='nightly.controls']")] == ["fault", "noise", "replay"]
md = open(d + "/summary.md").read()
assert md.startswith("## Canary nightly: ✅ pass") and md.count("| `micro/") == 5
# the negative controls: a 1-ulp fault in micro's first op at step 6 seen, and both seeded lanes differ
controls = {c["control"]: c for c in s["controls"]}
assert controls["fault"]["status"] == "seen" and controls["fault"]["fault"] == "step=6,op=embedding,ulps=1", controls
assert controls["fault"]["absorbed"] == [], controls
assert "fails the golden check at step 6; bisect names embedding" in controls["fault"]["summary"], controls
assert controls["noise"]["status"] == "seen" and controls["noise"]["summary"].startswith("bf16, fp8 differ"), controls
assert controls["replay"]["status"] == "seen", controls
assert controls["replay"]["summary"].startswith("lane bf16 replayed with --noise-seed 12 is refused"), controls
PY
grep -q "^  control seen    fault  a 1-ulp fault in embedding at step 6" "$WORK/stdout" \
  || fail "no control line: $(cat "$WORK/stdout")"

# A control that cannot show anything makes the nightly an infrastructure error (exit 2),
# whatever its lanes say: 1 ulp in moe-tiny's second router logits at step 5 changes no
# recorded bit of the run (the softmax absorbs it), so the control cannot tell.
printf '%s\n' 'schema_version = 1' 'canary = "moe-tiny"' 'steps = 8' 'seed = 1337' 'reference = "ref"' \
  'control-fault = "step=5,op=blocks.1.moe.router,ulps=1"' '[[lanes]]' 'id = "ref"' 'engine = "cpu-ref"' \
  > "$WORK/blind.toml"
expect_exit 0 "" -- golden refresh --matrix "$WORK/blind.toml" --reason "the blind control's reference"
expect_exit 0 "" -- golden approve --approved-by "Ada Lovelace" --allow-dirty
M="$WORK/blind.toml" expect_exit 2 "" -- nightly --out "$WORK/blind"
grep -q "^harness: negative control fault could not run: every fault tried (step=5,op=blocks.1.moe.router,ulps=1) moved no recorded bit" \
  "$WORK/stderr" || fail "the absorbed control fault is not named: $(cat "$WORK/stderr")"
"$PY" - "$WORK/blind/summary.json" <<'PY' || fail "the blind control is not the job's error"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["verdict"] == "error" and [l["status"] for l in s["lanes"]] == ["pass"], s["verdict"]
assert [(c["control"], c["status"]) for c in s["controls"]] == [("fault", "error"), ("noise", "skipped"),
                                                              ("replay", "skipped")], s["controls"]
assert s["controls"][0]["absorbed"] == ["step=5,op=blocks.1.moe.router,ulps=1"], s["controls"][0]
PY
grep -q 'type="control_error"' "$WORK/blind/junit.xml" || fail "JUnit does not report the control's error"
grep -q "^| fault | error | " "$WORK/blind/summary.md" || fail "summary.md does not list the control's error"

# refresh of a clean tree: candidates equal their goldens, goldens byte-identical; reject drops them
before=$(hashes)
expect_exit 0 "" -- golden refresh --matrix "$MATRIX" --lanes ref,tp --reason "no change expected"
[ "$before" = "$(hashes)" ] || fail "refresh changed a golden or the log"
grep -q "against the golden: \*\*pass\*\*" "$G/review.md" || fail "review does not say the candidate passes: $(cat "$G/review.md")"
expect_exit 0 "" -- golden reject --lanes tp
[ "$(find "$G" -name '*.candidate.h5' | wc -l)" -eq 1 ] || fail "reject --lanes tp did not drop exactly tp"
# a candidate altered after review is refused, and the golden stays
cp "$G/micro/accel+bf16.h5" "$G/micro/cpu-ref.candidate.h5"
expect_exit 2 "changed since refresh" -- golden approve --approved-by x --allow-dirty
[ "$before" = "$(hashes)" ] || fail "a refused approval changed a golden or the log"
# all or nothing: one altered candidate among good ones, and no golden moves
expect_exit 0 "" -- golden refresh --matrix "$MATRIX" --lanes ref,tp --reason "two lanes"
cp "$G/micro/accel+bf16.h5" "$G/micro/tpu-mesh@2x2+tp.candidate.h5"
expect_exit 2 "tpu-mesh@2x2\+tp.candidate.h5: changed since refresh" -- golden approve --approved-by x --allow-dirty
[ "$before" = "$(hashes)" ] || fail "a refused approval promoted the good candidate"
expect_exit 0 "" -- golden reject
# approving a changed lane: the log's old hash is the replaced golden's
old=$(xxhsum -H2 "$G/micro/cpu-ref.h5" | cut -d' ' -f1)
sed 's/^seed = 7/seed = 8/' "$MATRIX" > "$WORK/seed8.toml"
expect_exit 0 "" -- golden refresh --matrix "$WORK/seed8.toml" --lanes ref --reason "new init seed"
grep -q "against the golden: \*\*incomparable\*\*" "$G/review.md" || fail "a new seed is not incomparable: $(cat "$G/review.md")"
before_dirty=$(hashes)
# a candidate built from a tree with uncommitted changes is refused without --allow-dirty,
# and then nothing is approved (all or nothing); with it, the log records the exception
"$PY" - "$G" <<'PY' || fail "could not make a dirty-tree candidate"
import h5py, json, pathlib, subprocess, sys
g = pathlib.Path(sys.argv[1])
candidate = g / "micro" / "cpu-ref.candidate.h5"
with h5py.File(candidate, "r+") as f:
    commit = f["manifest"].attrs["git_commit"]
    commit = commit.decode() if isinstance(commit, bytes) else commit
    if not commit.endswith("-dirty"):
        value = (commit + "-dirty").encode()
        del f["manifest"].attrs["git_commit"]
        f["manifest"].attrs.create("git_commit", value, dtype=h5py.string_dtype("utf-8", len(value)))
record = json.loads((g / "candidates.json").read_text())
digest = subprocess.run(["xxhsum", "-H2", str(candidate)], capture_output=True, text=True).stdout.split()[0]
for c in record["candidates"]:
    if c["lane"] == "micro/cpu-ref":
        c["content_hash"] = "xxh128:" + digest
(g / "candidates.json").write_text(json.dumps(record))
PY
expect_exit 2 "cpu-ref.candidate.h5: built from a tree with uncommitted changes .*--allow-dirty" -- golden approve --approved-by "Grace Hopper"
[ "$(hashes)" = "$before_dirty" ] || fail "a refused approve wrote a golden or the log"
expect_exit 0 "" -- golden approve --approved-by "Grace Hopper" --allow-dirty
tail -1 "$G/provenance.jsonl" | grep -q "\"old_hash\":\"xxh128:$old\"" || fail "log lacks the replaced golden's hash"
tail -1 "$G/provenance.jsonl" | grep -q '"allow_dirty":true' || fail "the log does not record --allow-dirty"
expect_exit 0 "" -- golden refresh --matrix "$MATRIX" --lanes ref --reason "back to seed 7"
expect_exit 0 "" -- golden approve --approved-by "Grace Hopper" --allow-dirty

# Never a corrupted golden: approve validates the reviewed file itself (a candidate whose
# recorded hash was made to match is refused when it is damaged or of another lane), and a
# damaged log or a review path it cannot rewrite stops it before anything is renamed.
expect_exit 0 "" -- golden refresh --matrix "$MATRIX" --lanes ref --reason "guards"
cp "$G/micro/cpu-ref.candidate.h5" "$WORK/good.candidate.h5"
before_guards=$(hashes)
rehash_candidate() {  # records the candidate file's current content hash, as a reviewer's would be
  "$PY" - "$G" <<'PY' || fail "could not rehash the candidate"
import json, pathlib, subprocess, sys
g = pathlib.Path(sys.argv[1])
record = json.loads((g / "candidates.json").read_text())
digest = subprocess.run(["xxhsum", "-H2", str(g / "micro" / "cpu-ref.candidate.h5")], capture_output=True,
                        text=True).stdout.split()[0]
for c in record["candidates"]:
    if c["lane"] == "micro/cpu-ref":
        c["content_hash"] = "xxh128:" + digest
(g / "candidates.json").write_text(json.dumps(record))
PY
}
cp "$G/micro/tpu-mesh@2x2+tp.h5" "$G/micro/cpu-ref.candidate.h5" && rehash_candidate
expect_exit 2 "cpu-ref.candidate.h5: a receipt of lane micro/tpu-mesh@2x2\\+tp, not micro/cpu-ref" -- \
  golden approve --approved-by x --allow-dirty
cp "$WORK/good.candidate.h5" "$G/micro/cpu-ref.candidate.h5"
"$PY" - "$G/micro/cpu-ref.candidate.h5" <<'PY' || fail "could not damage a chunk"
import h5py, sys
with h5py.File(sys.argv[1], "r") as f:
    offset = f["hashes/params"].id.get_chunk_info(0).byte_offset
with open(sys.argv[1], "r+b") as f:
    f.seek(offset + 8)
    data = f.read(4)
    f.seek(offset + 8)
    f.write(bytes(b ^ 0xFF for b in data))
PY
rehash_candidate
expect_exit 2 "cpu-ref.candidate.h5: /hashes/params: .*Fletcher32.*a candidate must validate" -- \
  golden approve --approved-by x --allow-dirty
cp "$WORK/good.candidate.h5" "$G/micro/cpu-ref.candidate.h5" && rehash_candidate
rm "$G/review.md" && mkdir "$G/review.md"
expect_exit 2 "review.md: not a regular file" -- golden approve --approved-by x --allow-dirty
expect_exit 2 "review.md: not a regular file" -- golden reject --lanes ref
rmdir "$G/review.md"
cp "$G/provenance.jsonl" "$WORK/log.jsonl" && echo "not json" >> "$G/provenance.jsonl"
expect_exit 2 "provenance.jsonl:[0-9]+: not a provenance entry" -- golden approve --approved-by x --allow-dirty
cp "$WORK/log.jsonl" "$G/provenance.jsonl"
[ "$(hashes)" = "$before_guards" ] || fail "a refused approve changed a golden or the log"
[ -e "$G/micro/cpu-ref.candidate.h5" ] || fail "a refused reject dropped the candidate"
expect_exit 0 "" -- golden approve --approved-by "Grace Hopper" --allow-dirty

# a fault fails the golden check with exit 1 and names the step
"$HARNESS" run --canary micro --steps 12 --seed 7 --inject-fault step=5,op=blocks.1.mlp.fc --out "$WORK/fault.h5" \
  >/dev/null 2>&1 || fail "fault run"
expect_exit 1 "" -- "$HARNESS" check "$WORK/fault.h5" --goldens "$G"
grep -q "first failing step 5" "$WORK/stdout" || fail "check does not name step 5: $(cat "$WORK/stdout")"

# a perturbed budget: half the observed loss deviation fails with headroom -100% and triage
"$PY" - "$BUDGETS" "$WORK/run/summary.json" "$WORK/tight.toml" <<'PY' || fail "could not write the perturbed budgets"
import json, re, sys
budgets, summary, out = sys.argv[1:]
lane = next(l for l in json.load(open(summary))["lanes"] if l["id"] == "fp8")
worst = max(lane["series"]["envelope"]["loss_deviation"])
# the fp8 lane's budget composes noise + bf16 + fp8: give each a third of half the worst deviation
third = worst / 6
text = open(budgets).read()
for feature in ("noise", "bf16", "fp8"):
    head = text.index("[%s]" % feature)
    end = text.index("\n[", head + 1)
    section = re.sub(r"^loss = .*$", 'loss = [ { steps = "0-", atol = %r } ]' % third, text[head:end], flags=re.M)
    text = text[:head] + section + text[end:]
open(out, "w").write(text)
PY
B="$WORK/tight.toml" expect_exit 1 "" -- nightly --out "$WORK/tight"
"$PY" - "$WORK/tight/summary.json" <<'PY' || fail "the perturbed budget's failure is not reported right"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["verdict"] == "fail"
lane = next(l for l in s["lanes"] if l["id"] == "fp8")
ref = lane["checks"][1]
loss = next(m for m in ref["verdict"]["metrics"] if m["metric"] == "loss")
assert ref["status"] == "fail" and not loss["pass"], loss
assert abs(loss["headroom_pct"] - (-100.0)) < 1e-6, loss["headroom_pct"]
assert lane["triage"].startswith(("shared math or plumbing", "quantisation drift")), lane["triage"]
assert "the bf16-only lane bf16 " in lane["triage"], lane["triage"]  # its twin, found without triage-with
PY
grep -q 'type="regression"' "$WORK/tight/junit.xml" || fail "JUnit has no regression failure"

# shards merge into the verdicts of one unsharded run
expect_exit 0 "" -- nightly --out "$WORK/s0" --shard 0/2
expect_exit 0 "" -- nightly --out "$WORK/s1" --shard 1/2
expect_exit 0 "" -- "$HARNESS" merge "$WORK/s0" "$WORK/s1" --out "$WORK/merged"
"$PY" - "$WORK/run/summary.json" "$WORK/merged/summary.json" "$WORK/s0/summary.json" <<'PY' || fail "merged shards differ from one run"
import json, sys
def verdicts(path):
    lanes = json.load(open(path))["lanes"]
    def strip(check):
        v = dict(check.get("verdict", {}))
        v.pop("a", None); v.pop("b", None)
        return check["check"], check["status"], check["summary"], json.dumps(v, sort_keys=True)
    return [(l["id"], l["status"], [strip(c) for c in l["checks"]]) for l in lanes]
one, merged, shard0 = (json.load(open(p)) for p in sys.argv[1:])
assert verdicts(sys.argv[1]) == verdicts(sys.argv[2])
# the controls too: the fault control from the shard holding the reference, the others from both
statuses = lambda s: [(c["control"], c["status"]) for c in s["controls"]]
assert statuses(merged) == statuses(one) == [("fault", "seen"), ("noise", "seen"), ("replay", "seen")], statuses(merged)
assert "bf16 differs" in merged["controls"][1]["summary"] and "fp8 differs" in merged["controls"][1]["summary"]
assert [l["id"] for l in shard0["lanes"]] == ["ref", "fp8", "zero3"]
assert len(merged["shards"]) == 2
PY
# A shard cut by a signal: the merge says so (exit 130, the cut lane named) whichever shard it was
cp -r "$WORK/s1" "$WORK/s1-cut"
"$PY" - "$WORK/s1-cut/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["interrupted"] = {"signal": 2, "lane": "tp", "after_lane": None}
json.dump(s, open(sys.argv[1], "w"))
PY
expect_exit 130 "harness: interrupted in lane tp \(signal 2\)" -- "$HARNESS" merge "$WORK/s0" "$WORK/s1-cut" --out "$WORK/merged-cut"
# --jobs 2: the same shards at once in child processes, merged into one report with the
# verdicts of the unsharded run; the shards' reports and consoles under shards/i, each
# receipt path of the summary a file under the report
expect_exit 0 "" -- nightly --out "$WORK/jobs" --jobs 2
grep -q "^shard 1/2 done in" "$WORK/stderr" || fail "--jobs 2 did not say when shard 1/2 was done"
"$PY" - "$WORK/run/summary.json" "$WORK/jobs" <<'PY' || fail "--jobs 2 differs from one run"
import json, pathlib, sys
one, out = json.load(open(sys.argv[1])), pathlib.Path(sys.argv[2])
jobs = json.load(open(out / "summary.json"))
strip = lambda s: [(l["id"], l["status"], [(c["check"], c["status"], c["summary"]) for c in l["checks"]]) for l in s["lanes"]]
assert strip(jobs) == strip(one), (strip(jobs), strip(one))
assert [(c["control"], c["status"]) for c in jobs["controls"]] == [(c["control"], c["status"]) for c in one["controls"]]
assert len(jobs["shards"]) == 2 and jobs["verdict"] == one["verdict"] == "pass"
for lane in jobs["lanes"]:
    assert (out / lane["receipt"]).is_file() and lane["receipt"].startswith("shards/"), lane["receipt"]
for i in (0, 1):
    assert (out / f"shards/{i}/summary.json").is_file() and "nightly" in (out / f"shards/{i}/console.log").read_text()
assert (out / "report.html").is_file()
PY
# --jobs with --lanes: the shards hold the chosen lanes between them, and the merge finds
# those (it once asked for every lane of the matrix and failed)
expect_exit 0 "" -- nightly --out "$WORK/jobs-lanes" --jobs 2 --lanes zero3,bf16
"$PY" - "$WORK/jobs-lanes/summary.json" <<'PY' || fail "--jobs 2 --lanes did not merge the chosen lanes"
import json, sys
s = json.load(open(sys.argv[1]))
assert [l["id"] for l in s["lanes"]] == s["matrix"]["selected"] == ["bf16", "zero3"], s["lanes"]
assert s["verdict"] == "pass" and len(s["shards"]) == 2
PY
# shards of jobs that chose other lanes are not one job
expect_exit 0 "" -- nightly --out "$WORK/lanes-s0" --shard 0/2 --lanes bf16
expect_exit 2 "merge: .*/s1 ran other lanes" -- "$HARNESS" merge "$WORK/lanes-s0" "$WORK/s1" --out "$WORK/lanes-merged"
[ ! -e "$WORK/lanes-merged" ] || fail "a refused merge left a report directory"
expect_exit 2 "--jobs: runs the job's shards itself; give either --jobs or --shard" -- \
  nightly --out "$WORK/jobs-shard" --jobs 2 --shard 0/2
[ ! -e "$WORK/jobs-shard" ] || fail "--jobs with --shard left a report directory"
# An --out already in use is refused before any shard starts
mkdir -p "$WORK/jobs-bad/shards/1" && touch "$WORK/jobs-bad/shards/1/taken"
expect_exit 2 "--out: .*jobs-bad' exists and is not an empty directory" -- nightly --out "$WORK/jobs-bad" --jobs 2
[ "$(find "$WORK/jobs-bad" -type f)" = "$WORK/jobs-bad/shards/1/taken" ] || fail "--jobs wrote into a taken --out"
# --shard auto: the shard from the scheduler's environment, the same lanes as the explicit one
expect_exit 0 "" -- env HARNESS_SHARD_INDEX=1 HARNESS_SHARD_COUNT=2 "$HARNESS" nightly --matrix "$MATRIX" --goldens "$G" \
  --budgets "$BUDGETS" --shard auto --out "$WORK/s1-auto"
expect_exit 0 "" -- env -u HARNESS_SHARD_INDEX SLURM_ARRAY_TASK_ID=5 SLURM_ARRAY_TASK_MIN=4 SLURM_ARRAY_TASK_COUNT=2 \
  "$HARNESS" nightly --matrix "$MATRIX" --goldens "$G" --budgets "$BUDGETS" --shard auto --out "$WORK/s1-slurm"
"$PY" - "$WORK/s1" "$WORK/s1-auto" "$WORK/s1-slurm" <<'PY' || fail "--shard auto did not take the scheduler's shard"
import json, sys
ids = [[l["id"] for l in json.load(open(d + "/summary.json"))["lanes"]] for d in sys.argv[1:]]
assert ids[0] == ids[1] == ids[2] == ["bf16", "tp"], ids
PY
expect_exit 2 "--shard auto: no scheduler told this runner its shard" -- \
  env -u HARNESS_SHARD_INDEX -u HARNESS_SHARD_COUNT -u SLURM_ARRAY_TASK_ID -u JOB_COMPLETION_INDEX \
  "$HARNESS" nightly --matrix "$MATRIX" --goldens "$G" --budgets "$BUDGETS" --shard auto --out "$WORK/s-none"
[ ! -e "$WORK/s-none" ] || fail "--shard auto without a scheduler left a report directory"
expect_exit 2 "lane bf16 is in no shard" -- "$HARNESS" merge "$WORK/s0" --out "$WORK/m2"
expect_exit 2 "appears in two shards" -- "$HARNESS" merge "$WORK/s0" "$WORK/s0" --out "$WORK/m3"

# orphaned and missing goldens are reported
cp "$G/micro/cpu-ref.h5" "$G/micro/retired-lane.h5"
mkdir -p "$G/other-canary" && cp "$G/micro/cpu-ref.h5" "$G/other-canary/cpu-ref.h5"  # another matrix's golden
mv "$G/micro/tpu-mesh@2x2+tp.h5" "$WORK/tp.h5"
expect_exit 1 "" -- golden status --matrix "$MATRIX"
grep -q "^orphaned .*retired-lane.h5" "$WORK/stdout" || fail "status does not report the orphan: $(cat "$WORK/stdout")"
grep -q "other-canary" "$WORK/stdout" && fail "status calls another canary's golden an orphan: $(cat "$WORK/stdout")"
rm -r "$G/other-canary"
grep -q "^missing .*tp " "$WORK/stdout" || fail "status does not report the missing golden: $(cat "$WORK/stdout")"
expect_exit 2 "" -- nightly --out "$WORK/missing"
grep -q '"kind": "missing_golden"' "$WORK/missing/summary.json" || fail "nightly does not name the missing golden"
mv "$WORK/tp.h5" "$G/micro/tpu-mesh@2x2+tp.h5"
rm "$G/micro/retired-lane.h5"
# a golden changed by hand is "unrecorded"
cp "$G/micro/cpu-ref.h5" "$WORK/ref.h5"
cp "$G/micro/accel+bf16.h5" "$WORK/bf16.h5"
cp "$WORK/fault.h5" "$G/micro/accel+bf16.h5"
expect_exit 1 "" -- golden status --matrix "$MATRIX"
grep -q "^unrecorded .*bf16" "$WORK/stdout" || fail "status does not flag a hand-edited golden: $(cat "$WORK/stdout")"
# ... and no command uses it: check, nightly and bisect name it and the way back
bf16_golden="$G/micro/accel+bf16.h5"
expect_exit 2 "accel\+bf16.h5: changed outside .harness golden approve. .*git checkout -- .*golden refresh --lanes micro/accel\+bf16" -- \
  "$HARNESS" check "$WORK/fault.h5" --golden "$bf16_golden"
expect_exit 2 "accel\+bf16.h5: changed outside" -- "$HARNESS" bisect "$WORK/fault.h5" "$bf16_golden"
expect_exit 2 "" -- nightly --out "$WORK/tampered"
grep -q '"kind": "golden_integrity"' "$WORK/tampered/summary.json" || fail "nightly used a tampered golden"
cp "$WORK/bf16.h5" "$G/micro/accel+bf16.h5"
expect_exit 0 "" -- golden status --matrix "$MATRIX"
# a provenance log governs only its own canaries' goldens: a stray copy in a parent
# directory does not turn the receipts beside it into goldens
cp "$G/provenance.jsonl" "$WORK/provenance.jsonl"
expect_exit 0 "" -- "$HARNESS" bisect "$WORK/fault.h5" "$WORK/bf16.h5"   # within the bf16 budget, not exit 2
rm "$WORK/provenance.jsonl"
# ... but the log of a goldens directory named as such governs every golden in it: an
# emptied log is no licence for a golden it never recorded
cp "$G/provenance.jsonl" "$WORK/log.jsonl"
: > "$G/provenance.jsonl"
expect_exit 2 "cpu-ref.h5: a golden that .*provenance.jsonl never recorded" -- \
  "$HARNESS" check "$WORK/fault.h5" --goldens "$G"
expect_exit 2 "" -- nightly --out "$WORK/emptied"
grep -q '"kind": "golden_integrity"' "$WORK/emptied/summary.json" || fail "nightly used a golden of an emptied log"
cp "$WORK/log.jsonl" "$G/provenance.jsonl"

# bad input: one line, exit 2
head -c 4000 "$WORK/ref.h5" > "$G/micro/cpu-ref.h5"   # a corrupt golden
expect_exit 2 "" -- nightly --out "$WORK/corrupt"
grep -q '"kind": "golden_integrity"' "$WORK/corrupt/summary.json" || fail "a corrupt golden is not named"
cp "$WORK/ref.h5" "$G/micro/cpu-ref.h5"
sed 's/^steps = 12/steps = 10/' "$MATRIX" > "$WORK/short.toml"
M="$WORK/short.toml" expect_exit 2 "" -- nightly --out "$WORK/short"
grep -q '"kind": "step_range"' "$WORK/short/summary.json" || fail "a step-range mismatch is not named"
sed 's/^shard-plan = "tp"/shard-plan = "tp"\nmesh-size = 4/' "$MATRIX" > "$WORK/badkey.toml"
M="$WORK/badkey.toml" expect_exit 2 "badkey.toml: lanes\[3\] \(tp\)\.mesh-size: unknown key" -- nightly --out "$WORK/x1"
[ ! -e "$WORK/x1" ] || fail "a bad matrix left a report directory"
sed 's/^\[bf16\]$/[bf16]\nwindow = 3/' "$BUDGETS" > "$WORK/badbudget.toml"
B="$WORK/badbudget.toml" expect_exit 2 "badbudget.toml: \[bf16\]\.window: unknown key" -- nightly --out "$WORK/x2"
[ ! -e "$WORK/x2" ] || fail "bad budgets left a report directory"
expect_exit 2 "--shard: '2/2' is not i/N" -- nightly --shard 2/2 --out "$WORK/x3"
expect_exit 2 "--out: .* exists and is not an empty directory" -- nightly --out "$WORK/run"
expect_exit 2 "--lanes: 'nope' is not a lane" -- golden refresh --matrix "$MATRIX" --lanes nope --reason x
expect_exit 2 "no candidates" -- golden approve --approved-by x --allow-dirty
sed 's/^reference = "ref"/reference = "gone"/' "$MATRIX" > "$WORK/noref.toml"
M="$WORK/noref.toml" expect_exit 2 "reference: 'gone' is not the id of a lane" -- nightly --out "$WORK/x4"
finish
