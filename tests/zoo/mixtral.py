"""Zoo member: Mixtral (`MixtralForCausalLM`: a top-2 mixture of 4 experts per layer, the
router's load-balancing loss added to the loss), built from a config.

    .venv/bin/python -m canary_harness run tests/zoo/mixtral.py:canary --out mixtral.h5
"""

from __future__ import annotations

import os
import sys

from transformers import MixtralConfig, MixtralForCausalLM

import canary_harness as ch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import team  # noqa: E402

STEPS = 12


def config() -> MixtralConfig:
    # output_router_logits: the forward adds router_aux_loss_coef x the balance loss to `loss`.
    return MixtralConfig(vocab_size=team.VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=team.SEQ,
                         num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
                         router_aux_loss_coef=0.02, tie_word_embeddings=False)


def canary() -> ch.Canary:
    cfg = config()
    return team.causal_lm_canary("zoo-mixtral", MixtralForCausalLM(cfg), cfg.to_dict(), STEPS)
