"""A Python canary with dropout on, as HF's configs leave it (python/tests/test_aten_allocations.py):
an nn.Dropout, and scaled_dot_product_attention's own dropout where torch has it (2.0+).
Each draws its mask into memory that an allocation (aten.empty_like) hands out unwritten."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import canary_harness as ch

STEPS = 3
WIDTH, HEADS, SEQ, BATCH = 16, 2, 8, 4
SDPA = getattr(F, "scaled_dot_product_attention", None)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.drop = nn.Dropout(0.25)
        self.out = nn.Linear(WIDTH, 32)

    def attend(self, h: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.view(BATCH, SEQ, HEADS, WIDTH // HEADS).transpose(1, 2) for t in self.qkv(h).chunk(3, dim=-1))
        if SDPA is not None:
            a = SDPA(q, k, v, dropout_p=0.2 if self.training else 0.0)
        else:  # torch 1.13: the same attention written out, its probabilities dropped as SDPA drops them
            a = F.dropout(torch.softmax(q @ k.transpose(-1, -2) / (WIDTH // HEADS) ** 0.5, dim=-1), 0.2,
                          self.training) @ v
        return a.transpose(1, 2).reshape(BATCH, SEQ, WIDTH)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.embed(x))
        h = h + self.attend(h)
        return F.cross_entropy(self.out(h).view(-1, 32), y.view(-1))


def batch(i: int):
    g = torch.Generator().manual_seed(2000 + i)
    x = torch.randint(32, (BATCH, SEQ), generator=g)
    return x, (x + 1) % 32


def train_step(model, optimizer, batch, i):
    x, y = batch
    optimizer.zero_grad()
    loss = model(x, y)
    loss.backward()
    optimizer.step()
    return loss


def canary() -> ch.Canary:
    model = Net()
    return ch.Canary(name="dropout", model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                     batch=batch, step=train_step, steps=STEPS, seed=11)
