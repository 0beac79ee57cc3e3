"""Zoo member: GPT-2 (`GPT2LMHeadModel`), built from a config, HF's dropout (0.1) left on.

    .venv/bin/python -m canary_harness run tests/zoo/gpt2.py:canary --out gpt2.h5
"""

from __future__ import annotations

import os
import sys

from transformers import GPT2Config, GPT2LMHeadModel

import canary_harness as ch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import team  # noqa: E402

STEPS = 12


def config() -> GPT2Config:
    return GPT2Config(vocab_size=team.VOCAB, n_positions=team.SEQ, n_embd=32, n_layer=2, n_head=4,
                      bos_token_id=1, eos_token_id=1)  # byte 1 never occurs in the stream


def canary() -> ch.Canary:
    cfg = config()
    return team.causal_lm_canary("zoo-gpt2", GPT2LMHeadModel(cfg), cfg.to_dict(), STEPS)
