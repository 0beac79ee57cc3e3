"""Python canaries for python/tests/test_replay_state.py: a learning-rate schedule stepped
inside the step (a LambdaLR made as transformers' get_cosine_schedule_with_warmup makes
it, or a team's own stateful object), declared on the Canary or not; and a config shaped
as an HF config's to_dict() is (int keys, tuples, small floats, nesting)."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

import canary_harness as ch

STEPS = 8
WARMUP = 2
BASE_LR = 1e-2

# What GPT2Config().to_dict() holds that JSON changes: int keys (id2label), tuples, floats
# such as 1e-5, nested mappings. Its layer_norm_epsilon is what the tests change.
CONFIG = {
    "model_type": "tiny-lm", "n_embd": 16, "layer_norm_epsilon": 1e-5, "dropout": 0.1, "tie": True, "pad": None,
    "id2label": {0: "LABEL_0", 1: "LABEL_1"}, "label2id": {"LABEL_0": 0, "LABEL_1": 1},
    "betas": (0.9, 0.95), "rope_scaling": {"factor": 2.0, "layers": {3: (1, 2), 7: [1e-12]}},
}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.out = nn.Linear(16, 32)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.out(F.gelu(self.embed(x))).view(-1, 32), y.view(-1))


def batch(i: int):
    g = torch.Generator().manual_seed(2000 + i)
    x = torch.randint(32, (4, 8), generator=g)
    return x, (x + 1) % 32


def _cosine_with_warmup_lr_lambda(current_step: int, *, num_warmup_steps: int, num_training_steps: int,
                                  num_cycles: float) -> float:
    """transformers' own (optimization.py), line for line."""
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1, num_warmup_steps))
    progress = float(current_step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))


def get_cosine_schedule_with_warmup(optimizer, num_warmup_steps: int, num_training_steps: int,
                                    num_cycles: float = 0.5, last_epoch: int = -1):
    lr_lambda = partial(_cosine_with_warmup_lr_lambda, num_warmup_steps=num_warmup_steps,
                        num_training_steps=num_training_steps, num_cycles=num_cycles)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda, last_epoch)


class OwnWarmup:
    """A team's own schedule: not a torch scheduler, just an object with state."""

    def __init__(self, optimizer) -> None:
        self.optimizer, self.count = optimizer, 0
        self.step()

    def step(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = BASE_LR * min(1.0, (self.count + 1) / (WARMUP + 1)) / (1 + 0.1 * self.count)
        self.count += 1

    def state_dict(self) -> dict:
        return {"count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.count = state["count"]


class Constant:
    """No schedule: the lr stays."""

    def step(self) -> None:
        pass


def make(schedule: str, declare: str, config=None) -> ch.Canary:
    """schedule: "cosine" (the LambdaLR), "own" (OwnWarmup) or "constant"; declare:
    "schedulers", "state" or "" (not declared)."""
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=BASE_LR)
    schedules = {"cosine": lambda: get_cosine_schedule_with_warmup(optimizer, WARMUP, STEPS),
                 "own": lambda: OwnWarmup(optimizer), "constant": Constant}
    scheduler = schedules[schedule]()

    def step(model, optimizer, batch, i):  # the HF loop: the schedule stepped after the update
        x, y = batch
        optimizer.zero_grad()
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        return loss

    declared = {"schedulers": {"schedulers": [scheduler]}, "state": {"state": {"schedule": scheduler}}, "": {}}
    return ch.Canary(name="scheduled", model=model, optimizer=optimizer, batch=batch, step=step, steps=STEPS,
                     seed=7, config=config or {}, **declared[declare])


def cosine_declared() -> ch.Canary:
    return make("cosine", "schedulers")


def cosine_undeclared() -> ch.Canary:
    return make("cosine", "")


def own_in_state() -> ch.Canary:
    return make("own", "state")


def own_undeclared() -> ch.Canary:
    return make("own", "")


def hf_config() -> ch.Canary:
    return make("constant", "", config=CONFIG)


def colliding_keys() -> ch.Canary:
    """Two keys that JSON writes as one ("1")."""
    return make("constant", "", config={"id2label": {1: "a", "1": "b"}})


def not_stateful() -> ch.Canary:
    made = make("cosine", "")
    made.schedulers = [lambda step: 1.0]
    return made
