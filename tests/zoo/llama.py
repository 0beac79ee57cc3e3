"""Zoo member: Llama (`LlamaForCausalLM`: RMSNorm, RoPE, grouped-query attention 4/2 heads,
SwiGLU, SDPA), built from a config.

    .venv/bin/python -m canary_harness run tests/zoo/llama.py:canary --out llama.h5
"""

from __future__ import annotations

import os
import sys

from transformers import LlamaConfig, LlamaForCausalLM

import canary_harness as ch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import team  # noqa: E402

STEPS = 12


def config() -> LlamaConfig:
    return LlamaConfig(vocab_size=team.VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=team.SEQ,
                       tie_word_embeddings=False)


def canary() -> ch.Canary:
    cfg = config()
    return team.causal_lm_canary("zoo-llama", LlamaForCausalLM(cfg), cfg.to_dict(), STEPS)
