"""Zoo member: BERT (`BertForMaskedLM`), masked-language-model training as BERT's recipe
masks (15% of the tokens: 80% [MASK], 10% a random token, 10% kept; the loss on those
only), built from a config, HF's dropout (0.1) left on.

    .venv/bin/python -m canary_harness run tests/zoo/bert.py:canary --out bert.h5
"""

from __future__ import annotations

import os
import sys

import torch
from transformers import BertConfig, BertForMaskedLM

import canary_harness as ch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import team  # noqa: E402

STEPS = 12
MASK = 0  # the byte 0 never occurs in the stream: the [MASK] token


def config() -> BertConfig:
    return BertConfig(vocab_size=team.VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=team.SEQ, type_vocab_size=1)


def masked(tokens: torch.Tensor, index: int) -> dict:
    """BERT's masking of one batch, from a generator seeded by the batch index (the same
    masks on every call). labels: the original token where masked, -100 elsewhere."""
    generator = torch.Generator().manual_seed(index)
    chosen = torch.rand(tokens.shape, generator=generator) < 0.15
    roll = torch.rand(tokens.shape, generator=generator)
    noise = torch.randint(1, team.VOCAB, tokens.shape, generator=generator)
    inputs = torch.where(chosen & (roll < 0.8), torch.full_like(tokens, MASK), tokens)
    inputs = torch.where(chosen & (roll >= 0.8) & (roll < 0.9), noise, inputs)
    return {"input_ids": inputs, "attention_mask": torch.ones_like(tokens),
            "labels": torch.where(chosen, tokens, torch.full_like(tokens, -100))}


def canary() -> ch.Canary:
    cfg = config()
    model = BertForMaskedLM(cfg)
    optimizer, schedule = team.optimizer_and_schedule(model, STEPS)
    data = team.byte_stream()

    def batch(i: int) -> dict:
        return masked(team.windows(data, i), i)

    held_out = batch(1_000_000)
    # Logits and targets of the masked positions only (the others have no target).
    chosen = held_out["labels"] != -100
    return ch.Canary(name="zoo-bert", model=model, optimizer=optimizer, batch=batch,
                     step=team.train_step(schedule), steps=STEPS, seed=1337, schedulers=[schedule],
                     eval_batch=held_out, eval_every=4,
                     eval_logits=lambda model, b: model(**b).logits[chosen].unsqueeze(0),
                     eval_targets=held_out["labels"][chosen].unsqueeze(0), config=cfg.to_dict())
