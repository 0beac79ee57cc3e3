"""The canary's optimizer step in PyTorch, XLA-safe (torch required).

Global-norm clipping and AdamW exactly as docs/design.md writes them, in the pattern that keeps
a step one fixed graph under torch_xla (docs/python.md, "The safe patterns"):
- per-step scalars (the learning rate, Adam's bias corrections, the clip factor) live in
  0-D device tensors filled in place, never in Python floats baked into an op;
- Adam's step counter lives on the device and is incremented there (what PyTorch's
  `capturable=True` does; torch 1.13 allows that on CUDA only, hence this optimizer);
- nothing reads a value back to the host: no `.item()`, no `if norm > max` in Python; the
  clip is a `torch.where` and a multiply on every step.
The fp32 constants (beta1, 1 - beta1, ...) are rounded as the C++ kernel rounds them.
"""

from __future__ import annotations

from typing import Iterable, List, Sequence, Tuple

import numpy as np
import torch

from ..models.gpt2 import CLIP_EPS, CanaryConfig
from ..models.table import is_decayed


def _f32(x: float) -> float:
    return float(np.float32(x))


def global_grad_norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """The L2 norm over all gradients as a 0-D fp32 device tensor (no host read).

    Squares are summed in float64 where the device has it (CPU, CUDA), as the C++ engines
    do, and in float32 on XLA devices (TPUs have no float64 arithmetic)."""
    device = grads[0].device
    acc = torch.float32 if device.type == "xla" else torch.float64
    total = torch.stack([g.to(acc).pow(2).sum() for g in grads]).sum()
    return total.sqrt().to(torch.float32)


def clip_grads_(grads: Sequence[torch.Tensor], norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scales every gradient by max_norm / (norm + 1e-6) where norm > max_norm, else by 1
    (exact), with the factor computed on the device. Returns the 0-D factor."""
    max_norm = _f32(max_norm)
    factor = torch.where(norm > max_norm, max_norm / (norm + _f32(CLIP_EPS)), torch.ones_like(norm))
    for g in grads:
        g.mul_(factor)
    return factor


class CanaryAdamW(torch.optim.Optimizer):
    """AdamW of the canary contract (= PyTorch's AdamW with decay on 2-D tensors only):

        p *= 1 - lr*wd                      (2-D tensors: wte, wpe, weight matrices)
        m  = b1 m + (1-b1) g
        v  = b2 v + (1-b2) g^2
        p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps),   t = the device step counter

    Call set_lr(lr) before step(): it fills the 0-D lr tensor in place (a host-to-device
    copy of data, not a constant in the graph). state[p] holds "step" (the shared device
    counter), "exp_avg" and "exp_avg_sq", as torch.optim.AdamW names them, so
    canary_harness.torch.Recorder records the moments of this optimizer like any other.

    The param groups' "lr" and "eps" are honoured as torch.optim's are, so that what changes
    them from outside (a regression of `harness power`: canary_harness.runs.regressions) changes
    the update: step() uses each group's eps (rounded to fp32), and a rate written into the
    groups after set_lr() (every group's, the canary's one rate) is copied into the lr
    tensor before the update.
    """

    def __init__(self, named_parameters: Iterable[Tuple[str, torch.nn.Parameter]], cfg: CanaryConfig):
        named: List[Tuple[str, torch.nn.Parameter]] = list(named_parameters)
        if not named:
            raise ValueError("CanaryAdamW: no parameters")
        decay = [p for _, p in named if is_decayed(tuple(p.shape))]
        other = [p for _, p in named if not is_decayed(tuple(p.shape))]
        super().__init__([{"params": decay, "weight_decay": cfg.weight_decay},
                          {"params": other, "weight_decay": 0.0}],
                         {"lr": cfg.peak_lr, "betas": (cfg.beta1, cfg.beta2), "eps": cfg.adam_eps,
                          "weight_decay": cfg.weight_decay})
        device = named[0][1].device
        zero = lambda: torch.zeros((), dtype=torch.float32, device=device)  # noqa: E731
        self.lr_t = zero()                 # filled in place by set_lr()
        self.step_t = zero()               # t: the device-side step counter
        self.bias_correction1 = zero()
        self.bias_correction2 = zero()
        self.decay_t = zero()              # 1 - lr*wd
        self.beta1, self.beta2 = _f32(cfg.beta1), _f32(cfg.beta2)
        self.one_minus_beta1 = float(np.float32(1) - np.float32(cfg.beta1))
        self.one_minus_beta2 = float(np.float32(1) - np.float32(cfg.beta2))
        self.weight_decay = _f32(cfg.weight_decay)
        self._lr_set = None  # the fp32 rate set_lr() last wrote into the groups
        for _, p in named:
            self.state[p] = {"step": self.step_t, "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                             "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}

    def set_lr(self, lr: float) -> float:
        """The learning rate of the coming step, rounded to fp32 (what the update uses) and
        copied into the device's lr tensor in place. Returns the fp32 value."""
        lr32 = np.float32(lr)
        self.lr_t.copy_(torch.from_numpy(np.array(lr32)), non_blocking=False)
        for group in self.param_groups:
            group["lr"] = float(lr32)
        self._lr_set = float(lr32)
        return float(lr32)

    def _lr_from_groups(self) -> None:
        """The groups' rate into the lr tensor where it is no longer the one set_lr() wrote
        (a host comparison of Python floats: nothing read from the device)."""
        rate = self.param_groups[0]["lr"]
        if any(group["lr"] != rate for group in self.param_groups):
            raise ValueError("CanaryAdamW: its param groups share one learning rate; they hold "
                             f"{[group['lr'] for group in self.param_groups]}")
        if rate != self._lr_set:
            self.set_lr(rate)

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("CanaryAdamW.step takes no closure")
        self._lr_from_groups()
        self.step_t.add_(1.0)
        self.bias_correction1.copy_(1.0 - torch.pow(self.beta1, self.step_t))
        self.bias_correction2.copy_(1.0 - torch.pow(self.beta2, self.step_t))
        self.decay_t.copy_(1.0 - self.lr_t * self.weight_decay)
        for group in self.param_groups:
            decayed = group["weight_decay"] != 0.0
            eps = _f32(group["eps"])
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                state = self.state[p]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                if decayed:
                    p.mul_(self.decay_t)                            # decoupled decay first
                m.mul_(self.beta1).add_(g * self.one_minus_beta1)   # b1 m + (1-b1) g
                v.mul_(self.beta2).add_(g * self.one_minus_beta2 * g)  # b2 v + ((1-b2) g) g
                m_hat = m / self.bias_correction1
                v_hat = v / self.bias_correction2
                p.sub_(self.lr_t * m_hat / (v_hat.sqrt() + eps))
        return None
