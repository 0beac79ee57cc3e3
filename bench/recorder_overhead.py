#!/usr/bin/env python3
"""What canary_harness.torch.Recorder costs on the tiny PyTorch CPU step (issue 14).

Copies of the PyTorch lane's training (canary_harness.models.gpt2 + CanaryAdamW, the
lane's own canary_harness.runs.pack_step.train_step, from the pack's init and batches) run side by
side in this process, taking turns step by step so that all see the same machine load:
one bare, the others followed by Recorder.step() into a receipt. After the warm-up, N steps of
each are timed; the medians give the overhead ratio (recorded / bare - 1), and the
recorder's own median (its step() alone) gives the same thing measured directly.

Then the digest alone: the Python hashing (XXH3 over params, grads, m, v) and sketching
(params and grads in one SketchLayout pass) of the recorded model's tensors, and the digest
library's DigestPlan over the same tensors, in MB/s of fp32 tensor data, beside the C++
recorder's (`build/bench/step_bench`, BM_RecordStep: the
same digests plus its HDF5 row and flush), when that benchmark is built.

By default two recorded copies run beside the bare one (three lanes in turn, the order
rotating every step): Recorder(overlap=False) (the digest inside step()) and overlap=True
(step() copies the step's tensors and a background thread digests them beside the next
step); the CPU time reported for overlap=True is step()'s plus the worker's, which a
machine with no spare core pays in wall time too.

Usage:
    /usr/bin/python3 bench/recorder_overhead.py [--pack PACK.h5] [--steps 30] [--warmup 5]
        [--threads N] [--json FILE] [--no-cpp] [--overlap both|on|off]

Without --pack, one is written by `build/bin/harness export --canary tiny` into a
temporary directory, with a batch for every step (`--steps 300` runs 305 rounds: the longer
run is what steadies the medians). Besides the ratio of the medians, each round's recorded
step is set against the bare step of the same round (they share the machine's load): the
median and quartiles of those per-round overheads are the paired figure. The Recorders digest with the digest library the build made
(build/lib, canary_harness.receipts.native) where it is there; CANARY_HARNESS_DIGEST=python measures
the pure-Python digest instead. The digest section times numpy, and the library where one
is found (not with CANARY_HARNESS_DIGEST=python). This is a benchmark, not a
test: numbers depend on the machine and its load (the report prints the load average).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, os.pardir)
sys.path.insert(0, os.path.join(ROOT, "python"))

# The digest library the build made (build/lib, found next to HARNESS_BIN: canary_harness.receipts.native).
if os.access(os.path.join(ROOT, "build", "bin", "harness"), os.X_OK):
    os.environ.setdefault("HARNESS_BIN", os.path.join(ROOT, "build", "bin", "harness"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import xxhash  # noqa: E402

from canary_harness.receipts.digest import SketchLayout  # noqa: E402
from canary_harness.receipts.digest_plan import DigestPlan  # noqa: E402
from canary_harness.receipts.native import NativeDigestError  # noqa: E402
from canary_harness.runs.pack_step import train_step  # noqa: E402
from canary_harness.models import gpt2  # noqa: E402
from canary_harness.runs.optim import CanaryAdamW  # noqa: E402
from canary_harness.pack import read_pack  # noqa: E402
from tiny_pack import export_tiny_pack  # noqa: E402
from canary_harness.receipts.philox import stream_id  # noqa: E402
from canary_harness.torch import Recorder  # noqa: E402


class Lane:
    """One copy of the lane's training loop (lane.run without the CLI)."""

    def __init__(self, pack, cfg):
        self.pack, self.cfg = pack, cfg
        self.model = gpt2.GPT2(cfg, pack.init)
        self.optimizer = CanaryAdamW(self.model.named_parameters(), cfg)

    def step(self, step):
        tokens = self.pack.batch(step)
        lr = self.optimizer.set_lr(gpt2.lr_at(step, self.cfg))
        loss, norm = train_step(self.model, self.optimizer, torch.from_numpy(np.ascontiguousarray(tokens)))
        return tokens, lr, loss, norm


def time_steps(pack, cfg, tmp, steps, warmup, modes):
    """A bare lane and one recorded lane per mode (Recorder(overlap=mode)), in turn step by step.

    Every lane sees the same machine load: the order rotates every step. Returns, per mode,
    (bare_ms, recorded_ms, recorder_ms, append_ms, cpu) and the last recorded Lane. With
    overlap the worker's digest of step n is meant to run beside its lane's step n + 1 (what
    it does in a real loop), never beside another lane's step, which would slow that one
    down and flatter the ratio: a gate holds each job until its lane's next step starts.
    The worker's CPU time is taken on its own thread (time.thread_time).
    """
    bare = Lane(pack, cfg)
    lanes, recorders, gates, timings = {}, {}, {}, {}
    for overlap in modes:
        lanes[overlap] = Lane(pack, cfg)
        recorders[overlap] = Recorder(os.path.join(tmp, f"bench-{int(overlap)}.h5"), lanes[overlap].model,
                                      lanes[overlap].optimizer, pack=pack, steps=warmup + steps, engine="torch",
                                      budget_features="torch-cpu", overwrite=True, overlap=overlap)
        timings[overlap] = {"recorded": [], "recorder": [], "append": [], "cpu": [], "worker_cpu": {}}
        gates[overlap] = threading.Event()
        gates[overlap].set()
        _instrument(recorders[overlap], gates[overlap], timings[overlap])
    bare_ms, bare_cpu = [], []
    order = [None, *modes]
    for step in range(warmup + steps):
        for which in order[step % len(order):] + order[:step % len(order)]:  # rotate who goes first
            c0, t0 = time.process_time(), time.perf_counter()
            if which is None:
                bare.step(step)
                if step >= warmup:
                    bare_ms.append((time.perf_counter() - t0) * 1e3)
                    bare_cpu.append((time.process_time() - c0) * 1e3)
                continue
            gates[which].set()  # the previous step's digest may run now, beside this step
            tokens, lr, loss, norm = lanes[which].step(step)
            gates[which].clear()  # this step's own digest waits for the lane's next step
            c1, t1 = time.process_time(), time.perf_counter()
            recorders[which].step(loss=loss, grad_norm=norm, lr=lr, batch=tokens)  # after the step
            c2, t2 = time.process_time(), time.perf_counter()
            if step >= warmup:
                timings[which]["recorded"].append((t2 - t0) * 1e3)
                timings[which]["recorder"].append((t2 - t1) * 1e3)
                timings[which]["cpu"].append((c2 - c1) * 1e3)
    results = {}
    for overlap in modes:
        gates[overlap].set()
        recorders[overlap].close()  # with overlap: waits for the last step's row
        t = timings[overlap]
        worker_cpu = [ms for s, ms in sorted(t["worker_cpu"].items()) if s >= warmup] or [0.0]
        results[overlap] = (bare_ms, t["recorded"], t["recorder"], t["append"][warmup:],
                            {"bare": bare_cpu, "recorder": t["cpu"], "worker": worker_cpu})
    return results, lanes[modes[-1]]


def _instrument(recorder, gate, timings):
    """Times the receipt's HDF5 row (ReceiptWriter.append_step) and, with overlap, gates and
    times the worker's job (bench only: see time_steps)."""
    append_step = recorder.writer.append_step

    def timed_append_step(**kwargs):  # the HDF5 row and flush (on the worker with overlap)
        t0 = time.perf_counter()
        append_step(**kwargs)
        timings["append"].append((time.perf_counter() - t0) * 1e3)

    recorder.writer.append_step = timed_append_step
    if recorder.overlap:
        write_job = recorder._write_job

        def gated_write_job(job):
            gate.wait()
            c0 = time.thread_time()
            write_job(job)
            timings["worker_cpu"][job.step] = (time.thread_time() - c0) * 1e3

        recorder._write_job = gated_write_job


def time_digest(lane, names, repeats):
    """Python hash + sketch of the four families (what Recorder.step computes), ms per step."""
    params, grads, m, v = lane_families(lane)
    layout = SketchLayout([a.size for a in params] * 2, [stream_id(n) for n in names] * 2)
    hash_ms, sketch_ms, both_ms = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for family in (params, grads, m, v):
            for a in family:
                xxhash.xxh3_64_intdigest(a, seed=0)
        t1 = time.perf_counter()
        layout.sketch(params + grads)
        t2 = time.perf_counter()
        layout.hash_and_sketch(params + grads)  # as Recorder.step(): hashed as they are sketched
        for a in m + v:
            xxhash.xxh3_64_intdigest(a, seed=0)
        t3 = time.perf_counter()
        hash_ms.append((t1 - t0) * 1e3)
        sketch_ms.append((t2 - t1) * 1e3)
        both_ms.append((t3 - t2) * 1e3)
    family_mb = sum(a.nbytes for a in params) / 1e6
    return statistics.median(hash_ms), statistics.median(sketch_ms), statistics.median(both_ms), family_mb


def time_library_digest(lane, names, repeats):
    """The digest library's DigestPlan over the four families (what Recorder.step computes with
    it), ms per step at 1 and 2 threads; None when no library is found."""
    tensors = [t for family in lane_families(lane) for t in family]
    numels = [t.size for t in tensors]
    salts = [stream_id(n) for n in names] * 4
    sketched = [family < 2 for family in range(4) for _ in names]
    try:
        plan = DigestPlan(numels, salts, sketched, native=True)
    except NativeDigestError:
        return None
    times = {}
    for threads in (1, 2):
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            plan.run(tensors, threads=threads)
            runs.append((time.perf_counter() - t0) * 1e3)
        times[threads] = statistics.median(runs)
    return times


def lane_families(lane):
    """params, grads, Adam m and v of a trained Lane, as numpy views, in the model's order."""
    params = list(lane.model.parameters())
    state = [lane.optimizer.state[p] for p in params]
    return ([p.detach().numpy() for p in params], [p.grad.detach().numpy() for p in params],
            [s["exp_avg"].numpy() for s in state], [s["exp_avg_sq"].numpy() for s in state])


def runs_digest_implementation():
    """What the Recorders above digested with: the digest library's path, or "python"."""
    try:
        return DigestPlan([1], [1], [True]).implementation
    except NativeDigestError as e:  # CANARY_HARNESS_DIGEST names a library that cannot be used
        sys.exit(f"recorder_overhead: {e}")


def cpp_record_step():
    """C++ BM_RecordStep at 1 and 2 threads, ms per step (real time), or None when not built."""
    bench = os.path.join(ROOT, "build", "bench", "step_bench")
    if not os.access(bench, os.X_OK):
        return None
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        result = subprocess.run([bench, "--benchmark_filter=BM_RecordStep", "--benchmark_min_time=1",
                                 f"--benchmark_out={out.name}", "--benchmark_out_format=json"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            return None
        runs = json.load(open(out.name))["benchmarks"]
    return {int(b["name"].split("/")[1]): (b["real_time"], b["cpu_time"]) for b in runs}


def main(argv=None):
    ap = argparse.ArgumentParser(description="Recorder overhead on the tiny PyTorch CPU step.")
    ap.add_argument("--pack", help="tiny pack (`harness export --canary tiny`); default: exported to a temp dir")
    ap.add_argument("--steps", type=int, default=30, help="timed steps of each kind (median reported)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed warm-up steps")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON to FILE")
    ap.add_argument("--no-cpp", action="store_true", help="skip the C++ BM_RecordStep comparison")
    ap.add_argument("--overlap", choices=("both", "on", "off"), default="both",
                    help="Recorder(overlap=...): both (the default: a lane for each), on or off")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    modes = {"both": (False, True), "on": (True,), "off": (False,)}[args.overlap]
    with tempfile.TemporaryDirectory() as tmp:
        # Without --pack: one with a batch for every step (the canary's own 100 if that is enough).
        pack = read_pack(args.pack or export_tiny_pack(tmp, max(100, args.warmup + args.steps)), canary="tiny")
        if args.warmup + args.steps > pack.steps:
            ap.error(f"--warmup + --steps: the pack holds {pack.steps} batches")
        cfg = gpt2.CanaryConfig.from_json(pack.canary_json)
        runs, lane = time_steps(pack, cfg, tmp, args.steps, args.warmup, modes)
        hash_ms, sketch_ms, digest_ms, family_mb = time_digest(lane, pack.tensor_names, max(args.steps, 20))
        library_ms = time_library_digest(lane, pack.tensor_names, max(args.steps, 20))
        implementation = runs_digest_implementation()
    cpp = None if args.no_cpp else cpp_record_step()

    results = {
        "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "load_average": os.getloadavg(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "numpy": np.__version__, "steps": args.steps, "warmup": args.warmup, "modes": {},
        "python_hash_ms": hash_ms, "python_sketch_ms": sketch_ms,
        "python_digest_ms": digest_ms, "family_mb": family_mb,
        "python_digest_mb_s": 4 * family_mb / (digest_ms / 1e3),
        "python_hash_mb_s": 4 * family_mb / (hash_ms / 1e3), "python_sketch_mb_s": 2 * family_mb / (sketch_ms / 1e3),
        "cpp_record_step_ms": {t: real for t, (real, _) in cpp.items()} if cpp else None,
        "library_digest_ms": library_ms, "recorder_digest": implementation,
    }
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), numpy {np.__version__}; "
          f"{os.cpu_count()} CPUs, load average {results['load_average'][0]:.2f}; tiny (pack {pack.path}), "
          f"{args.warmup} warm-up + {args.steps} timed steps of each lane, in turn, median; "
          f"the Recorder digests with {implementation}")
    for overlap, (bare, recorded, recorder, append, cpu) in runs.items():
        bare_med, rec_med, recorder_med, append_med = (statistics.median(x) for x in (bare, recorded, recorder,
                                                                                     append))
        bare_cpu, main_cpu, worker_cpu = (statistics.median(cpu[k]) for k in ("bare", "recorder", "worker"))
        # Paired: each round's recorded step against the bare step of the same round (the
        # rounds share the machine's load), the median and quartiles of those overheads.
        per_round = [r / b - 1 for r, b in zip(recorded, bare)]
        paired_q1, paired_median, paired_q3 = statistics.quantiles(per_round, n=4) if len(per_round) > 1 \
            else (per_round[0],) * 3
        mode = {
            "bare_ms": bare_med, "recorded_ms": rec_med, "recorder_step_ms": recorder_med,
            "append_step_ms": append_med, "bare_cpu_ms": bare_cpu, "recorder_cpu_ms": main_cpu,
            "worker_cpu_ms": worker_cpu, "overhead_ratio": rec_med / bare_med - 1,
            "recorder_share_of_bare": recorder_med / bare_med,
            "paired_overhead": {"median": paired_median, "q1": paired_q1, "q3": paired_q3},
        }
        results["modes"]["overlap" if overlap else "sync"] = mode
        print(f"Recorder(overlap={overlap}):")
        print(f"  bare step                 {bare_med:8.2f} ms")
        print(f"  step + Recorder.step()    {rec_med:8.2f} ms   overhead {100 * mode['overhead_ratio']:+.1f}%")
        print(f"  paired by round           overhead {100 * paired_median:+.1f}% (quartiles {100 * paired_q1:+.1f}%, "
              f"{100 * paired_q3:+.1f}%)")
        print(f"  Recorder.step() alone     {recorder_med:8.2f} ms   = {100 * mode['recorder_share_of_bare']:.1f}% "
              "of the bare step")
        print(f"  CPU time, median: bare step {bare_cpu:.2f} ms, Recorder.step() {main_cpu:.2f} ms = "
              f"{100 * main_cpu / bare_cpu:.1f}%" + (f"; background digest + row {worker_cpu:.2f} ms, total "
                                                    f"{100 * (main_cpu + worker_cpu) / bare_cpu:.1f}%"
                                                    if overlap else ""))
        print(f"    of which HDF5 row+flush {append_med:8.2f} ms   (ReceiptWriter.append_step"
              + (", on the worker)" if overlap else ")"))
    print(f"digest of one step (4 families x {family_mb:.2f} MB fp32 hashed, 2 of them sketched), median:")
    print(f"  Python hash (XXH3)        {hash_ms:8.2f} ms   {results['python_hash_mb_s']:8.0f} MB/s")
    print(f"  Python sketch             {sketch_ms:8.2f} ms   {results['python_sketch_mb_s']:8.0f} MB/s")
    print(f"  Python digest, as Recorder {digest_ms:7.2f} ms   {results['python_digest_mb_s']:8.0f} MB/s "
          "(hash_and_sketch of params + grads, hash of m, v; hashed bytes / time)")
    if library_ms:
        for threads, ms in sorted(library_ms.items()):
            print(f"  digest library, {threads} thread{'s' if threads > 1 else ' '} {ms:6.2f} ms   "
                  f"{4 * family_mb / (ms / 1e3):8.0f} MB/s "
                  "(DigestPlan: the Recorder's digest where the library is found)")
    else:
        print("  digest library            (not found: canary_harness.receipts.native)")
    if cpp:
        for threads, (real, cpu) in sorted(cpp.items()):
            print(f"  C++ BM_RecordStep/{threads}      {real:8.2f} ms   {4 * family_mb / (real / 1e3):8.0f} MB/s "
                  f"(digest + HDF5 row + flush; cpu {cpu:.2f} ms)")
    else:
        print("  C++ BM_RecordStep         (not run: build/bench/step_bench not built, or --no-cpp)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
