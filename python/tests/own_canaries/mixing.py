"""Python canaries for the invariance check's tests (python/tests/test_invariance.py): a model
whose submodule `center` mixes the rows of its batch on purpose, and a batch whose tensors
disagree on their leading size."""

from __future__ import annotations

from typing import Dict

import torch
import torch.nn as nn
import torch.nn.functional as F

import canary_harness as ch


class Center(nn.Module):
    """Subtracts the batch's mean row: each row's output depends on the other rows."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h - h.mean(dim=0, keepdim=True)


class Mixer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.center = Center()  # right after the lookup, which copies rows: the first module to differ
        self.hidden = nn.Linear(16, 32)
        self.drop = nn.Dropout(0.5)  # on in training; the check runs the forward in eval mode
        self.out = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.drop(F.gelu(self.hidden(self.center(self.embed(x)))))
        return F.cross_entropy(self.out(h).view(-1, 32), y.view(-1))


def batch(i: int) -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(2000 + i)
    x = torch.randint(32, (3, 8), generator=g)
    return {"x": x, "y": (x + 1) % 32}


def step(model, optimizer, batch, i):
    optimizer.zero_grad()
    loss = model(**batch)
    loss.backward()
    optimizer.step()
    return loss


def make(batch_fn=batch) -> ch.Canary:
    model = Mixer()
    return ch.Canary(name="mixing", model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                     batch=batch_fn, step=step, steps=4, seed=3)


def canary() -> ch.Canary:
    return make()


def ragged() -> ch.Canary:
    """batch(i)'s targets hold one row fewer than its inputs: no one batch dimension."""
    def short_targets(i: int) -> Dict[str, torch.Tensor]:
        b = batch(i)
        return {"x": b["x"], "y": b["y"][:2]}
    return make(short_targets)
