"""How a PyTorch step's tensors become a receipt row: the one digest path of every PyTorch run.

The runner (canary_harness.runs.runner: Python canaries and the built-in canaries' PyTorch
lane) and the Recorder (canary_harness.torch: a team's own loop) both record a step as
the params after the update, the gradients the update applied and the optimizer's two
moments, family-major (schema.HASH_FAMILIES), each family the canary's tensors in
canonical order, digested by one StepDigest. Where the tensors are contiguous fp32 in CPU
memory and the harness's digest library is found, it reads them where they are; anything
else is read to the host once per tensor.

What is recorded as the two moments is one rule too (MOMENT_STATE, MomentSource). The
Recorder may overlap the digest with the next step (Overlap: the same StepDigest over host
copies made at the step's end, a Snapshot, on one background Worker); the runner appends
its rows on a Worker as well.
"""

from __future__ import annotations

import math
import queue
import threading
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from ..receipts.digest import as_float32
from ..receipts.digest_plan import DigestPlan, DigestRows
from ..receipts.philox import stream_id
from ..receipts.receipt import SketchRows
from ..receipts.schema import HASH_FAMILIES, SKETCH_FAMILIES


def host_float(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().to(device="cpu", dtype=torch.float64))
    return float(value)


def host_float32(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's values on the host as C-contiguous float32, copied only when they must be.

    A contiguous fp32 CPU tensor is its own numpy view (no copy); another device is read
    once (one transfer per tensor), and the hash and the sketch are then both taken from
    that one host copy. Anything else goes through as_float32 (its checks included).
    """
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.float32 and t.is_contiguous() and not t.is_conj() and not t.is_neg():
        return t.numpy()
    return as_float32(t)


def addresses_in_place(tensors: Sequence[torch.Tensor], numels: Sequence[int]) -> Optional[List[int]]:
    """The tensors' data addresses when every one is contiguous fp32 in CPU memory, of the
    size the plan digests (`numels`): then the digest library may read them where they are
    (DigestPlan.rows_at). None when one is not. One pass: this runs on every step."""
    addresses = []
    for t, n in zip(tensors, numels):
        if not (t.dtype is torch.float32 and t.is_cpu and t.is_contiguous() and not t.is_neg() and t.numel() == n):
            return None
        addresses.append(t.data_ptr())
    return addresses


def step_digest_plan(names: Sequence[str], numels: Sequence[int]) -> DigestPlan:
    """One plan over a step's every tensor, family-major (HASH_FAMILIES), each family the
    canary's tensors in canonical order: all hashed, the SKETCH_FAMILIES sketched."""
    salts = [stream_id(n) for n in names]
    return DigestPlan(list(numels) * len(HASH_FAMILIES), salts * len(HASH_FAMILIES),
                      [fam in SKETCH_FAMILIES for fam in HASH_FAMILIES for _ in numels])


def family_rows(digests: DigestRows, count: int) -> Tuple[Dict[str, np.ndarray], Dict[str, SketchRows]]:
    """append_step's hashes and sketches from a DigestPlan's rows over every family,
    family-major (HASH_FAMILIES), `count` tensors each in canonical order."""
    K = count
    hashes = {fam: digests.hashes[f * K:(f + 1) * K] for f, fam in enumerate(HASH_FAMILIES)}
    sketches = {fam: SketchRows(digests.l2[f * K:(f + 1) * K], digests.projection[f * K:(f + 1) * K])
                for f, fam in enumerate(HASH_FAMILIES) if fam in SKETCH_FAMILIES}
    return hashes, sketches


# Which optimizer state is recorded as the receipt's Adam moments, in order of preference.
# Adam, AdamW (and their fused and foreach forms) keep exp_avg / exp_avg_sq; SGD with
# momentum keeps momentum_buffer. A family an optimizer does not keep is recorded as zeros.
MOMENT_STATE = {"adam_m": ("exp_avg", "momentum_buffer"), "adam_v": ("exp_avg_sq",)}


class MomentSource:
    """What a step records as adam_m and adam_v for each parameter (MOMENT_STATE): the
    optimizer's state tensor of the parameter's shape, else zeros (one tensor per parameter,
    made once). The runner and the Recorder both record by this rule."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self._zeros: Dict[int, torch.Tensor] = {}

    def zeros_like(self, p: torch.Tensor) -> torch.Tensor:
        if id(p) not in self._zeros:
            self._zeros[id(p)] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        return self._zeros[id(p)]

    def moment(self, p: torch.Tensor, family: str) -> torch.Tensor:
        state = self.optimizer.state.get(p, {})
        for key in MOMENT_STATE[family]:
            value = state.get(key)
            if isinstance(value, torch.Tensor) and value.shape == p.shape:
                return value
        return self.zeros_like(p)


class StepDigest:
    """One step's every tensor digested in one call (StepDigest.rows), and the row it makes."""

    def __init__(self, names: Sequence[str], numels: Sequence[int]) -> None:
        self.names = list(names)
        self.plan = step_digest_plan(self.names, numels)

    @property
    def native(self) -> bool:
        return self.plan.native

    def rows(self, tensors: Sequence[torch.Tensor]) -> DigestRows:
        """The digests of `tensors` (family-major, canonical order) as they stand now: read in
        place by the library where it can (addresses_in_place), else one host copy each."""
        addresses = addresses_in_place(tensors, self.plan.numels) if self.plan.native else None
        if addresses is not None:
            return self.plan.rows_at(addresses)
        return self.plan.rows([host_float32(t).reshape(-1) for t in tensors])

    def split(self, digests: DigestRows) -> Tuple[Dict[str, np.ndarray], Dict[str, SketchRows]]:
        """append_step's hashes and sketches."""
        return family_rows(digests, len(self.names))

    def grad_norm(self, digests: DigestRows) -> float:
        """The L2 norm of the recorded gradients, from their sketches' norms."""
        K = len(self.names)
        grads = HASH_FAMILIES.index("grads")
        return math.sqrt(float(np.sum(np.square(digests.l2[grads * K:(grads + 1) * K]))))


# Dtypes whose values convert to float32 exactly, so that torch's copy_ into a float32 buffer
# gives the bytes as_float32 would (any other dtype goes through as_float32 and its checks).
_EXACT_IN_FLOAT32 = (torch.float32, torch.bfloat16, torch.float16)


class Snapshot:
    """Host float32 copies of one step's params, grads, Adam m and v, reused from step to step.

    Why a copy: the background digest reads these while the next step runs, and on the CPU
    that step updates params, grads and moments in place. One flat buffer holds all four
    families (allocated once: the tiny canary's is 13.4 MB), and each tensor is a view of it,
    so a step allocates nothing. On CUDA the buffer is pinned and filled from a device-side
    staging buffer with one non_blocking copy, then `ready` (an event) marks when the bytes
    have landed: the training thread never waits for the transfer, the worker does.
    """

    def __init__(self, tensors: Sequence[torch.Tensor], families: int) -> None:
        numels = [t.numel() for t in tensors]
        total = sum(numels) * families
        self.device = tensors[0].device if tensors else torch.device("cpu")
        self.cuda = self.device.type == "cuda" and all(t.device == self.device for t in tensors)
        self.host = torch.empty(total, dtype=torch.float32, pin_memory=self.cuda)
        self.staging = torch.empty(total, dtype=torch.float32, device=self.device) if self.cuda else None
        target = self.staging if self.cuda else self.host
        self.views: List[torch.Tensor] = []  # where each (family, tensor) is written, family-major
        self.arrays: List[np.ndarray] = []  # the same bytes on the host, as the digest reads them
        host_np = self.host.numpy()
        offset = 0
        for _ in range(families):
            for n in numels:
                self.views.append(target[offset:offset + n])
                self.arrays.append(host_np[offset:offset + n])
                offset += n
        self.ready: Optional[Any] = None  # the CUDA event of the last fill, None on the host
        # loss, grad_norm, lr of a CUDA step, copied here without a host read (Recorder's overlap)
        self.scalars = torch.empty(3, dtype=torch.float64, pin_memory=True) if self.cuda else None

    def fill(self, tensors: Sequence[torch.Tensor]) -> None:
        """Copies `tensors` (family-major, as the views) in; on CUDA only enqueues the copies."""
        with torch.no_grad():
            for view, t in zip(self.views, tensors):
                t = t.detach()
                if t.dtype in _EXACT_IN_FLOAT32 and (t.device == view.device or not self.cuda):
                    view.copy_(t.reshape(-1))  # a D2H copy when t is on another device (XLA, MPS)
                else:  # float64 and others: as_float32 refuses what float32 cannot hold exactly
                    exact = torch.from_numpy(as_float32(t).reshape(-1))
                    view.copy_(exact.to(view.device) if self.cuda else exact)
            if self.cuda:
                self.host.copy_(self.staging, non_blocking=True)
                self.ready = torch.cuda.Event()
                self.ready.record()

    def wait(self) -> None:
        """Until the bytes are on the host (called by the worker, never by the training thread)."""
        if self.ready is not None:
            self.ready.synchronize()


class Job(NamedTuple):
    """What the worker needs to write one step: everything but the tensors, read at step() time."""
    step: int
    scalars: Tuple[Any, Any, Any]  # loss, grad_norm, lr: floats, or a pinned float64 (3,) tensor on CUDA
    batch_hash: int
    batch_tokens: Optional[np.ndarray]
    compile: Optional[Mapping[str, float]]


class Worker:
    """One background thread that writes the steps handed to it, one at a time: the
    Recorder's overlap (Overlap) and the runner's row appends (runner.run_canary).

    At most one step is in flight: the caller waits for the previous one before it hands
    over the next (honest back-pressure: a writer slower than the training step slows
    training down instead of piling up memory). An exception in the job is kept, not lost,
    for the caller to raise on its next call. The thread is not a daemon, so an interpreter that
    exits without close() still writes the step in flight; it notices the exit (the main
    thread has ended) while idle and stops then.
    """

    def __init__(self, run: Callable[[Any], None], name: str) -> None:
        self._run = run
        self._jobs: "queue.Queue[Optional[Job]]" = queue.Queue(maxsize=1)
        self._idle = threading.Event()
        self._idle.set()
        self.error: Optional[BaseException] = None
        self.failed_step: Optional[int] = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=False)
        self._thread.start()

    def _loop(self) -> None:
        main = threading.main_thread()
        while True:
            try:
                job = self._jobs.get(timeout=0.25)
            except queue.Empty:
                if not main.is_alive():  # interpreter shutdown, nothing pending: let it exit
                    return
                continue
            if job is None:
                return
            try:
                if self.error is None:  # after a failure nothing more is written (no gap in the rows)
                    self._run(job)
            except BaseException as e:  # noqa: B902 -- kept for the caller, whatever it is
                self.error, self.failed_step = e, job.step
            finally:
                self._idle.set()

    def submit(self, job: Job) -> None:
        self._idle.clear()
        self._jobs.put(job)

    def wait(self) -> None:
        """Until the step in flight (if any) is written or has failed."""
        self._idle.wait()

    def stop(self) -> None:
        """Drains (the step in flight is written) and ends the thread; a second call does nothing."""
        if not self._thread.is_alive():  # ended already: a put would wait for a reader forever
            return
        self._idle.wait()
        self._jobs.put(None)
        self._thread.join()


class Overlap:
    """Each step's digest and row handed to one background thread (Worker) from host copies
    (Snapshot), while the next step trains: what Recorder(overlap=True) does. The row is
    appended by `write(digests, scalars, batch_hash, tokens, compile_row)`, the call the
    inline path makes too, so the bits are the same. The thread starts at the first submit()."""

    def __init__(self, digest: StepDigest, write: Callable[..., None], name: str) -> None:
        self._digest, self._append, self._name = digest, write, name
        self._snapshot: Optional[Snapshot] = None
        self._worker: Optional[Worker] = None

    @property
    def error(self) -> Optional[BaseException]:
        """The exception a written step raised (nothing after it is written), or None."""
        return self._worker.error if self._worker is not None else None

    @property
    def failed_step(self) -> Optional[int]:
        return self._worker.failed_step if self._worker is not None else None

    def wait(self) -> None:
        """Until the step in flight (if any) is written or has failed."""
        if self._worker is not None:
            self._worker.wait()

    def stop(self) -> None:
        """Drains (the step in flight is written) and ends the thread."""
        if self._worker is not None:
            self._worker.stop()

    def submit(self, step: int, tensors: Sequence[torch.Tensor], scalars: Tuple[Any, Any, Any], hashed_batch: int,
               tokens: Optional[np.ndarray], compile_row: Optional[Mapping[str, float]]) -> None:
        """After wait(): `tensors` (family-major) copied into the snapshot and the row queued.
        scalars: loss, grad_norm, lr (numbers, or one-element tensors)."""
        if self._worker is None:
            self._snapshot = Snapshot(tensors[:len(self._digest.names)], len(HASH_FAMILIES))
            self._worker = Worker(self._run, name=self._name)
        self._snapshot.fill(tensors)
        given = [v for v in scalars if isinstance(v, torch.Tensor)]
        if self._snapshot.cuda and any(v.is_cuda for v in given) and all(v.numel() == 1 for v in given):
            # No host read here: the scalars follow the tensors to pinned memory, as float64
            # (exact from any float dtype, the value host_float gives), read by the worker.
            pinned = self._snapshot.scalars  # the worker is done with it (waited before)
            for i, v in enumerate(scalars):
                if isinstance(v, torch.Tensor):
                    pinned[i].copy_(v.detach().reshape(()), non_blocking=True)
                else:
                    pinned[i] = float(v)
            self._snapshot.ready = torch.cuda.Event()
            self._snapshot.ready.record()  # after the scalars' copies: one event for both
            values: Tuple[Any, Any, Any] = (pinned, None, None)
        else:
            values = (host_float(scalars[0]), host_float(scalars[1]), host_float(scalars[2]))
        self._worker.submit(Job(step, values, hashed_batch, tokens, compile_row))

    def _run(self, job: Job) -> None:
        """The worker's part of a step: wait for the snapshot's bytes, digest them, append the row."""
        self._snapshot.wait()
        scalars = job.scalars
        if isinstance(scalars[0], torch.Tensor):
            scalars = tuple(float(x) for x in scalars[0].tolist())
        digests = self._digest.plan.rows(self._snapshot.arrays, threads=1)  # one thread: training runs beside it
        self._append(digests, scalars, job.batch_hash, job.batch_tokens, job.compile)
