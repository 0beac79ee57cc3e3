"""The example's canary: model.py's GPT as the harness runs it (docs/own-model.md).

    python3 -m canary_harness run examples/own-model/canary.py:canary --out run.h5

The model, its optimizer and its training step are model.py's, untouched; this file only
says which run is the canary: the sizes, the data (batch(i): step i's inputs, the same on
every call) and the length.
"""

from __future__ import annotations

import os
import sys

import torch

import canary_harness as ch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import GPT, GPTConfig, train_step  # noqa: E402

STEPS = 40
BATCH = 8


def token_stream(length: int = 1 << 15, seed: int = 2026) -> torch.Tensor:
    """A learnable byte stream: sentences drawn from a small vocabulary of words, from a
    generator of its own (the data does not depend on the global seed)."""
    words = [w.encode() for w in "the a canary sings at night when every lane agrees and goldens hold".split()]
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(words), (length // 3,), generator=generator).tolist()
    data = b" ".join(words[i] for i in picks)[:length]
    return torch.tensor(list(data), dtype=torch.long)


def canary() -> ch.Canary:
    return gpt_canary(BATCH)


def small() -> ch.Canary:
    """The same GPT on 2 sequences a step (about 8 ms a step on one CPU thread): the size at
    which bench/own_model_overhead.py measures what recording costs a short step."""
    return gpt_canary(2)


def gpt_canary(batch_size: int) -> ch.Canary:
    cfg = GPTConfig()
    model = GPT(cfg)
    optimizer = model.configure_optimizer(lr=3e-3, weight_decay=0.1)
    data = token_stream()

    def batch(i: int):
        # Step i's windows from a generator seeded by i: the same batch on every call.
        starts = torch.randint(len(data) - cfg.block_size - 1, (batch_size,),
                               generator=torch.Generator().manual_seed(i))
        x = torch.stack([data[s:s + cfg.block_size] for s in starts.tolist()])
        y = torch.stack([data[s + 1:s + 1 + cfg.block_size] for s in starts.tolist()])
        return x, y

    # The held-out batch (docs/logit-kl.md): windows of a generator no step uses. The GPT's
    # forward returns its loss only, so its logits are what its lm_head outputs.
    held_out = torch.Generator().manual_seed(1_000_000)
    starts = torch.randint(len(data) - cfg.block_size - 1, (2,), generator=held_out).tolist()
    eval_batch = (torch.stack([data[s:s + cfg.block_size] for s in starts]),
                  torch.stack([data[s + 1:s + 1 + cfg.block_size] for s in starts]))

    return ch.Canary(name="own-gpt", model=model, optimizer=optimizer, batch=batch, step=train_step,
                     steps=STEPS, seed=1337, eval_batch=eval_batch, eval_logits=ch.output_of("lm_head"),
                     config={"n_layer": cfg.n_layer, "n_embd": cfg.n_embd, "n_head": cfg.n_head,
                             "block_size": cfg.block_size, "vocab_size": cfg.vocab_size, "batch": batch_size})
