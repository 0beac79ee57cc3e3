"""What every canary architecture's PyTorch module shares (canary_harness.models.gpt2, .llama):
parameters named and ordered as the canary's tensor table, loaded from a pack's init, and a
forward whose optional hook sees every op's output by the C++ op names.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional

import torch
import torch.nn as nn

Hook = Callable[[str, torch.Tensor], torch.Tensor]


class CanaryModule(nn.Module):
    """Base of GPT2 and Llama: a subclass builds its op modules (named as the C++ ops), and
    defines op_names() (the forward ops in order) and _forward(tokens) -> loss."""

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
