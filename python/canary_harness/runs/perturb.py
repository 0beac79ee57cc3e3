"""A seeded one-ulp perturbation of a canary's initial weights, bit for bit as the C++
(engines/numerics/perturbation.h): element i of parameter NAME moves one ulp up when bit 0
of philox_at(SEED, stream_id("perturb/" + NAME), i)'s first word is 1, down when it is 0.

`python3 -m canary_harness run FILE.py:NAME --perturb-init SEED` applies it after NAME()
built the model and before step 0; `harness calibrate --perturb N` runs N such seeds and
proposes budgets from how far they spread (docs/budgets.md, "Perturbation calibration").
"""

from __future__ import annotations

from typing import Dict

import numpy as np
import torch

from .canary import CanaryError
from ..receipts.philox import philox_words, stream_id

# Per floating dtype: the integer dtype of its bits.
_BITS: Dict[torch.dtype, torch.dtype] = {
    torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16, torch.float16: torch.int16,
}


def directions_up(seed: int, name: str, count: int) -> np.ndarray:
    """Per element of parameter `name`: True where it moves up, False where down."""
    words = philox_words(seed, stream_id("perturb/" + name), np.arange(count, dtype=np.uint64))
    return (words[0] & 1).astype(bool)


def one_ulp_step(values: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """`values` with each element one ulp toward +inf where `up`, toward -inf elsewhere (on
    the bits: +-0 to the smallest subnormal of the direction's sign, the largest finite to
    inf; NaN and inf stay). Read as a signed integer of its width, a finite non-zero value
    moves away from zero by +1 and toward it by -1, whatever its sign."""
    int_dtype = _BITS[values.dtype]
    bits = values.contiguous().view(int_dtype)
    smallest = torch.iinfo(int_dtype).min  # the bits of -0.0
    zero = (bits == 0) | (bits == smallest)
    away_from_zero = up == (bits >= 0)
    moved = torch.where(away_from_zero, bits + 1, bits - 1)
    from_zero = torch.where(up, torch.ones_like(bits), torch.full_like(bits, smallest + 1))
    moved = torch.where(zero, from_zero, moved)
    moved = torch.where(torch.isfinite(values), moved, bits)
    return moved.view(values.dtype).reshape(values.shape)


@torch.no_grad()
def perturb_parameters(model: torch.nn.Module, seed: int) -> int:
    """Every floating-point parameter of `model` moved one ulp of its own dtype in place (fp32
    weights: one fp32 ulp, as the C++), named as model.named_parameters() names them (a tied
    parameter once). Returns how many elements moved; a model with none is a CanaryError."""
    moved = 0
    for name, parameter in model.named_parameters():
        if parameter.dtype not in _BITS:
            continue
        host = parameter.detach().to("cpu")
        up = torch.from_numpy(directions_up(seed, name, host.numel())).reshape(host.shape)
        parameter.copy_(one_ulp_step(host, up).to(parameter.device))
        moved += host.numel()
    if moved == 0:
        raise CanaryError("--perturb-init: the model has no floating-point parameter to perturb")
    return moved
