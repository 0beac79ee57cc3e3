"""Zoo member: GPT-NeoX (`GPTNeoXForCausalLM`: partial rotary embeddings, parallel residual)
trained with gradient accumulation: each step's 8 rows in 4 micro-batches of 2, the
gradients summed before one clipped AdamW update, as training repositories scale a batch
beyond memory. Built from a config.

    .venv/bin/python -m canary_harness run tests/zoo/accumulation.py:canary --out accumulation.h5
"""

from __future__ import annotations

import os
import sys

from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

import canary_harness as ch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import team  # noqa: E402

STEPS = 12
MICRO_BATCHES = 4


def config() -> GPTNeoXConfig:
    return GPTNeoXConfig(vocab_size=team.VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, rotary_pct=0.5, max_position_embeddings=team.SEQ,
                         use_parallel_residual=True, tie_word_embeddings=False)


def canary() -> ch.Canary:
    cfg = config()
    return team.causal_lm_canary("zoo-accumulation", GPTNeoXForCausalLM(cfg), cfg.to_dict(), STEPS,
                                 rows=2 * MICRO_BATCHES, micro_batches=MICRO_BATCHES)
