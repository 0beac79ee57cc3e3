"""The held-out evaluation of a Python canary or the PyTorch lane (docs/logit-kl.md).

Every `eval_every` steps, at the start of the step (and after the last one when the step
count is a multiple), the model's logits on the canary's fixed held-out batch are recorded
into the receipt's /eval, as the C++ engines record theirs (harness/run/held_out_eval.h):
`harness check` and `compare` then judge KL(reference || run), the largest move of a target's
log-probability and top-1 agreement beside the losses.

The pass changes no trained bit: it runs outside the step, under torch.no_grad() (so no op
trace or autograd state sees it), with the module in eval mode and put back, and with
torch's RNG state (CPU and the device's) restored after it. It runs under the run's
autocast: a bf16 lane's logits are its own. Its host reads come after the forward, outside
any step.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, NamedTuple, Optional

import numpy as np
import torch

from .canary import CanaryError, LoadedCanary, call_model
from .devices import to_device
from ..receipts.digest import batch_hash, batch_tree_hash
from ..xla.device import mark_step


class EvalRow(NamedTuple):
    """One evaluation: its step, the mean cross-entropy over every row, the recorded rows'
    logits (rows, T, V) as float32, and the programs it compiled (XLA; 0 elsewhere)."""
    step: int
    loss: float
    logits: np.ndarray
    compiles: float


class EvalDeclaration(NamedTuple):
    """What every evaluation of a run shares (the receipt's /eval attributes and targets)."""
    every: int
    held_out_hash: str
    source: str
    targets: np.ndarray  # (rows, T) int32
    vocab: int


def default_logits(model: torch.nn.Module, batch: Any) -> Any:
    """The model called on the batch as a step would (canary.call_model); of its output, the
    tensor itself, a tuple's or list's first element, or an object's `.logits`."""
    out = call_model(model, batch)
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    return getattr(out, "logits", out)


def default_targets(batch: Any) -> Optional[torch.Tensor]:
    """The batch's last integer tensor (a tuple's or list's last element, a dict's `labels`
    or `targets`): the next tokens of (inputs, targets) batches."""
    if isinstance(batch, (tuple, list)) and batch:
        last = batch[-1]
    elif isinstance(batch, dict):
        last = batch.get("labels", batch.get("targets"))
    else:
        last = None
    if isinstance(last, torch.Tensor) and not last.is_floating_point() and not last.is_complex():
        return last
    return None


class HeldOutEval:
    """A canary's held-out evaluation on `device` (module docstring); `autocast` is the run's."""

    def __init__(self, loaded: LoadedCanary, device: torch.device, autocast: Any,
                 counters: Any = None) -> None:
        canary = loaded.canary
        self.spec = loaded.spec
        self.every = canary.eval_every
        self.rows = canary.eval_rows
        self.device = device
        self.autocast = autocast
        self.counters = counters  # XlaStepCounters on XLA: the evaluation's own compiles
        self.logits_of: Callable[[Any, Any], Any] = canary.eval_logits or default_logits
        self.host_batch = canary.eval_batch
        self.hash = f"{batch_hash(canary.eval_batch.numpy()):016x}" if loaded.token_batches \
            else f"{batch_tree_hash(canary.eval_batch):016x}"
        self.source = "the canary pack's held-out batch" if loaded.token_batches \
            else f"eval_batch of {loaded.spec}"
        targets = canary.eval_targets if canary.eval_targets is not None else default_targets(canary.eval_batch)
        if not isinstance(targets, torch.Tensor) or targets.is_floating_point():
            raise CanaryError(f"{self.spec}: eval_targets: give the held-out batch's next tokens as an integer "
                              "tensor (the batch's last element is not one)")
        self.targets = targets
        self.batch: Any = None  # on the device, at the first evaluation
        self.declaration: Optional[EvalDeclaration] = None

    def due(self, step: int) -> bool:
        return step > 0 and step % self.every == 0

    def evaluate(self, model: torch.nn.Module, step: int) -> EvalRow:
        if self.batch is None:
            self.batch = to_device(self.host_batch, self.device)
            self.targets = self.targets.to(self.device)  # once: every evaluation reads them
        if self.counters is not None:
            self.counters.begin(step)
        devices = [self.device] if self.device.type == "cuda" else []
        was_training = model.training
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            model.eval()
            try:
                with self.autocast if self.autocast is not None else contextlib.nullcontext():
                    logits = self.logits_of(model, self.batch)
            finally:
                model.train(was_training)
            loss, recorded = self._measure(logits)
        compiles = 0.0
        if self.counters is not None:
            mark_step()
            compiles = float(self.counters.end().get("UncachedCompile", 0.0))
        return EvalRow(step, loss, recorded, compiles)

    def _measure(self, logits: Any) -> tuple:
        if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.dim() < 2:
            raise CanaryError(f"{self.spec}: eval_logits: the model gave {type(logits).__name__}, not a tensor of "
                              "logits (..., V); give eval_logits=lambda model, batch: LOGITS")
        targets = self.targets
        if tuple(targets.shape) != tuple(logits.shape[:-1]):
            raise CanaryError(f"{self.spec}: eval_targets: shape {tuple(targets.shape)} is not the logits' "
                              f"{tuple(logits.shape[:-1])} without the vocabulary")
        vocab = int(logits.shape[-1])
        rows = min(self.rows, int(logits.shape[0]))
        flat = logits.float().reshape(int(logits.shape[0]), -1, vocab)
        loss = torch.nn.functional.cross_entropy(flat.reshape(-1, vocab), targets.reshape(-1).long())
        recorded = flat[:rows].cpu().numpy().astype(np.float32, copy=False)
        if self.declaration is None:
            host_targets = targets.reshape(int(logits.shape[0]), -1)[:rows].cpu().numpy().astype(np.int32)
            if host_targets.min(initial=0) < 0 or host_targets.max(initial=0) >= vocab:
                raise CanaryError(f"{self.spec}: eval_targets: a target is outside the vocabulary 0..{vocab - 1}")
            self.declaration = EvalDeclaration(self.every, self.hash, self.source, host_targets, vocab)
        return float(loss.item()), recorded
