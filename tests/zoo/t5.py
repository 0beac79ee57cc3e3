"""Zoo member: T5 (`T5ForConditionalGeneration`), an encoder-decoder trained on a
sequence-to-sequence task (each window's second half from its first), built from a config,
HF's dropout (0.1) left on.

    .venv/bin/python -m canary_harness run tests/zoo/t5.py:canary --out t5.h5
"""

from __future__ import annotations

import os
import sys

from transformers import T5Config, T5ForConditionalGeneration

import canary_harness as ch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import team  # noqa: E402

STEPS = 12


def config() -> T5Config:
    # Byte 0 never occurs in the stream: it is the pad and the decoder's start token.
    return T5Config(vocab_size=team.VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                    num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                    pad_token_id=0, decoder_start_token_id=0, eos_token_id=1)


def canary() -> ch.Canary:
    cfg = config()
    model = T5ForConditionalGeneration(cfg)
    optimizer, schedule = team.optimizer_and_schedule(model, STEPS)
    data = team.byte_stream()
    half = team.SEQ // 2

    def batch(i: int) -> dict:
        tokens = team.windows(data, i)
        # contiguous: T5 flattens its labels with .view
        return {"input_ids": tokens[:, :half].contiguous(), "labels": tokens[:, half:].contiguous()}

    held_out = batch(1_000_000)
    # The decoder's logits at position t predict labels[t] (T5 shifts the labels right itself).
    return ch.Canary(name="zoo-t5", model=model, optimizer=optimizer, batch=batch,
                     step=team.train_step(schedule), steps=STEPS, seed=1337, schedulers=[schedule],
                     eval_batch=held_out, eval_every=4, eval_targets=held_out["labels"], config=cfg.to_dict())
