"""What a team writes around a HuggingFace model: the zoo members' shared training code.

Written as training repositories write it, not for the harness: AdamW over two decay groups
(no decay on biases and norm weights, found from the parameters' shapes), a transformers
schedule (`get_cosine_schedule_with_warmup`, a LambdaLR) stepped inside the step, gradient
clipping, dict batches, and HF's default dropout left on. Every member of the zoo
(tests/zoo/*.py, docs/zoo.md) builds its model from a config and hands these pieces to
`canary_harness.Canary`; the harness sees an `nn.Module`, an optimizer, a scheduler and a step.

Shapes: B = batch rows, T = sequence length, V = vocabulary (bytes: 256).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

import torch
from transformers import get_cosine_schedule_with_warmup

import canary_harness as ch

VOCAB = 256      # byte-level tokens: no tokenizer file to download
SEQ = 16         # T
ROWS = 4         # B
LR = 3e-3
WARMUP = 3
CLIP = 1.0


def byte_stream(length: int = 1 << 14, seed: int = 2026) -> torch.Tensor:
    """A learnable byte stream (sentences of a small vocabulary of words) from a generator of
    its own: the data does not depend on the global seed. (length,) int64."""
    words = [w.encode() for w in "the zoo keeps every lane honest when canaries sing at night".split()]
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(words), (length // 4,), generator=generator).tolist()
    return torch.tensor(list(b" ".join(words[i] for i in picks)[:length]), dtype=torch.long)


def windows(data: torch.Tensor, index: int, rows: int = ROWS, seq: int = SEQ) -> torch.Tensor:
    """Batch `index`'s rows: windows of `data` from a generator seeded by the index, so the
    same index gives the same batch on every call. (rows, seq) int64."""
    starts = torch.randint(len(data) - seq - 1, (rows,), generator=torch.Generator().manual_seed(index))
    return torch.stack([data[s:s + seq] for s in starts.tolist()])


def decay_groups(model: torch.nn.Module, weight_decay: float = 0.1) -> List[Dict[str, Any]]:
    """AdamW's two groups as nanoGPT and HF's Trainer make them: matrices decay, vectors
    (biases, norm weights) do not."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def optimizer_and_schedule(model: torch.nn.Module, steps: int) -> tuple:
    optimizer = torch.optim.AdamW(decay_groups(model), lr=LR, betas=(0.9, 0.95), eps=1e-8)
    return optimizer, get_cosine_schedule_with_warmup(optimizer, WARMUP, steps)


def train_step(scheduler: Any, micro_batches: int = 1) -> Callable[[Any, Any, Dict[str, torch.Tensor], int], Any]:
    """The team's step: forward on a dict batch (HF computes the loss from `labels`), backward,
    clip, AdamW, the schedule. With micro_batches > 1 the batch's rows are split and the
    gradients accumulated, each micro-batch's loss scaled by 1/micro_batches.
    Returns (loss, the gradient norm before clipping), both tensors: no host read."""

    def step(model: Any, optimizer: Any, batch: Dict[str, torch.Tensor], i: int) -> Any:
        total = None
        for part in _split(batch, micro_batches):
            loss = model(**part).loss / micro_batches
            loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return total, norm

    return step


def _split(batch: Dict[str, torch.Tensor], parts: int) -> List[Dict[str, torch.Tensor]]:
    if parts == 1:
        return [batch]
    pieces = {key: value.chunk(parts) for key, value in batch.items()}
    return [{key: chunks[j] for key, chunks in pieces.items()} for j in range(parts)]


def next_token_logits(model: Any, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
    """A causal LM's held-out logits, aligned with next_token_targets: position t predicts
    token t+1, so the last position (which predicts nothing in the batch) is dropped.
    (B, T-1, V)."""
    return model(**batch).logits[:, :-1]


def next_token_targets(batch: Dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, T-1): the tokens the causal LM's logits predict."""
    return batch["labels"][:, 1:]


def causal_lm_canary(name: str, model: torch.nn.Module, config: Dict[str, Any], steps: int,
                     rows: int = ROWS, micro_batches: int = 1) -> ch.Canary:
    """A causal LM trained on the byte stream (labels = inputs: HF shifts them), `rows`
    windows a step in `micro_batches` parts, with its held-out batch (batch 1,000,000)
    evaluated every 4 steps."""
    optimizer, schedule = optimizer_and_schedule(model, steps)
    data = byte_stream()

    def batch(i: int) -> Dict[str, torch.Tensor]:
        tokens = windows(data, i, rows=rows)
        return {"input_ids": tokens, "labels": tokens}

    held_out = batch(1_000_000)
    return ch.Canary(name=name, model=model, optimizer=optimizer, batch=batch,
                     step=train_step(schedule, micro_batches), steps=steps, seed=1337, schedulers=[schedule],
                     eval_batch=held_out, eval_every=4, eval_logits=next_token_logits,
                     eval_targets=next_token_targets(held_out), config=config)
