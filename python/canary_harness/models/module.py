"""What every canary architecture's PyTorch module shares (canary_harness.models.gpt2, .llama):
parameters named and ordered as the canary's tensor table, loaded from a pack's init, and a
forward whose optional hook sees every op's output by the C++ op names.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import torch
import torch.nn as nn

from .table import NORMAL, ONES, RESIDUAL_NORMAL, ZEROS, TensorSpec

Hook = Callable[[str, torch.Tensor], torch.Tensor]


def random_parameters(specs: Sequence[TensorSpec], init_std: float, layers: int, seed: int) -> Dict[str, torch.Tensor]:
    """float32 parameters drawn by each tensor's init role (models/table.py), from torch's
    generator: the contract's distributions, not the C++ engines' values (for benchmarks;
    the lanes start from a pack's init)."""
    g = torch.Generator().manual_seed(seed)
    std = {NORMAL: init_std, RESIDUAL_NORMAL: init_std / math.sqrt(2 * layers)}
    params = {}
    for spec in specs:
        if spec.init == ONES:
            t = torch.ones(spec.shape)
        elif spec.init == ZEROS:
            t = torch.zeros(spec.shape)
        else:
            t = torch.randn(spec.shape, generator=g) * std[spec.init]
        params[spec.name] = t.to(torch.float32)
    return params


class CanaryModule(nn.Module):
    """Base of GPT2 and Llama: a subclass builds its op modules (named as the C++ ops), and
    defines op_names() (the forward ops in order) and _forward(tokens) -> loss."""

    # The op whose output is the (B, T, V) logits the loss reads (Canary::token_logits in C++).
    LOGITS_OP = "lm_head"

    def op_names(self) -> List[str]:
        raise NotImplementedError

    def _forward(self, tokens: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def load_canary_tensors(self, values: Mapping[str, Any]) -> None:
        """Sets every parameter from {canary name: value}; a missing name or wrong shape is a ValueError."""
        for name, param in self.named_parameters():
            if name not in values:
                raise ValueError(f"no value for parameter {name}")
            value = torch.as_tensor(values[name]).detach()
            if tuple(value.shape) != tuple(param.shape):
                raise ValueError(f"{name} has shape {tuple(value.shape)}, the canary's is {tuple(param.shape)}")
            param.copy_(value.to(dtype=torch.float32))

    def canary_tensors(self) -> Dict[str, torch.Tensor]:
        """{canary name: parameter}, canonical order."""
        return dict(self.named_parameters())

    def forward(self, tokens: torch.Tensor, hook: Optional[Hook] = None) -> torch.Tensor:
        """The loss of tokens (B, T+1). `hook(name, output) -> output`, when given, sees (and
        may replace) every op's output; it is installed as forward hooks on the op modules
        for this call only."""
        if hook is None:
            return self._forward(tokens)
        handles = [self.get_submodule(op).register_forward_hook(lambda module, args, out, op=op: hook(op, out))
                   for op in self.op_names()]
        try:
            return self._forward(tokens)
        finally:
            for handle in handles:
                handle.remove()
