"""Python canaries for the runner's tests: a small two-layer model, and canaries that break
the contract one way each (python/tests/test_python_canary.py)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import canary_harness as ch

STEPS = 6
CLIP = 0.5  # below the norms of the first steps: clipping acts


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.hidden = nn.Linear(16, 32)
        self.out = nn.Linear(32, 32)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.hidden(self.embed(x)))
        h = h + torch.softmax(h, dim=-1)  # functional ops between modules
        return self.out(h)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.logits(x).view(-1, 32), y.view(-1))


def batch(i: int):
    g = torch.Generator().manual_seed(1000 + i)
    x = torch.randint(32, (4, 8), generator=g)
    return x, (x + 1) % 32


def train_step(model, optimizer, batch, i):
    x, y = batch
    optimizer.zero_grad()
    loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    optimizer.step()
    return loss


def make(step=train_step, batch_fn=batch, optimizer=None, **kwargs) -> ch.Canary:
    model = Net()
    opt = optimizer(model) if optimizer else torch.optim.AdamW(model.parameters(), lr=1e-2)
    return ch.Canary(name=kwargs.pop("name", "small"), model=model, optimizer=opt, batch=batch_fn, step=step,
                     steps=kwargs.pop("steps", STEPS), seed=kwargs.pop("seed", 7), **kwargs)


def canary() -> ch.Canary:
    return make()


def zeroes_after_update() -> ch.Canary:
    """Zeroes the gradients in place after the update, as torch 1.13's zero_grad() does."""
    def step(model, optimizer, batch, i):
        loss = train_step(model, optimizer, batch, i)
        optimizer.zero_grad(set_to_none=False)
        return loss
    return make(step=step)


def returns_norm() -> ch.Canary:
    def step(model, optimizer, batch, i):
        x, y = batch
        optimizer.zero_grad()
        loss = model(x, y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        return loss, norm
    return make(step=step)


def sgd() -> ch.Canary:
    return make(optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9))


def raising() -> ch.Canary:
    raise RuntimeError("the config file is missing")


def returns_model() -> Net:
    return Net()


def flaky_batch() -> ch.Canary:
    """batch(i) draws from the global generator: two calls give two batches."""
    def draw(i):
        x = torch.randint(32, (4, 8))
        return x, (x + 1) % 32
    return make(batch_fn=draw)


def vector_loss() -> ch.Canary:
    def step(model, optimizer, batch, i):
        loss = train_step(model, optimizer, batch, i)
        return loss.expand(3)
    return make(step=step)


def step_fails_at_3() -> ch.Canary:
    def step(model, optimizer, batch, i):
        if i == 3:
            raise FloatingPointError("loss went NaN")
        return train_step(model, optimizer, batch, i)
    return make(step=step)


def bad_name() -> ch.Canary:
    return make(name="a/b")


def not_optimized() -> ch.Canary:
    model = Net()
    return ch.Canary(name="small", model=model, optimizer=torch.optim.AdamW(model.out.parameters()), batch=batch,
                     step=train_step, steps=STEPS)


NOT_A_FUNCTION = 3


def flaky_from_step_2() -> ch.Canary:
    """batch(i) is stable for steps 0 and 1, then draws from the global generator."""
    def draw(i):
        return batch(i) if i < 2 else batch(i + int(torch.randint(1000, ())))
    return make(batch_fn=draw)


def batch_fails_at_3() -> ch.Canary:
    """The team's batch() raises its own ValueError at step 3: the team's error, not a contract breach."""
    def fails(i):
        if i == 3:
            raise ValueError("shard 3 is missing")
        return batch(i)
    return make(batch_fn=fails)


class Pair(nn.Module):
    def forward(self, x):
        return x, x


def tuple_output() -> ch.Canary:
    """A module whose output is a tuple of token ids: no fault can nudge its first result."""
    c = make()
    c.model.pair = Pair()
    inner = c.model.forward
    c.model.forward = lambda x, y: inner(c.model.pair(x)[0], y)
    return c


def held_out():
    """A batch no step trains on (its own generator seed): the evaluation's."""
    g = torch.Generator().manual_seed(99)
    x = torch.randint(32, (3, 8), generator=g)
    return x, (x + 1) % 32


def with_eval(**kwargs) -> ch.Canary:
    """small with a held-out batch: its logits every 2 steps (docs/logit-kl.md)."""
    kwargs.setdefault("eval_rows", 3)
    return make(eval_batch=held_out(), eval_every=2, eval_logits=lambda model, batch: model.logits(batch[0]), **kwargs)


def with_eval_one_row() -> ch.Canary:
    return with_eval(eval_rows=1)


def eval_without_batch() -> ch.Canary:
    return make(eval_every=2)


def eval_float_targets() -> ch.Canary:
    x, y = held_out()
    return make(eval_batch=(x, y.float()), eval_logits=lambda model, batch: model.logits(batch[0]))


def eval_no_such_module() -> ch.Canary:
    return make(eval_batch=held_out(), eval_logits=ch.output_of("lm_head"))


def renamed() -> ch.Canary:
    """The same model and data under another name: another canary (a checkpoint of it is not small's)."""
    return make(name="renamed")


def rank_1_dies_at_3() -> ch.Canary:
    """Under --layout: the process of rank 1 kills itself (SIGKILL) at step 3, as a rank
    lost to the machine would go; a one-process run is the plain canary."""
    import os
    import signal

    def step(model, optimizer, batch, i):
        import torch.distributed as dist

        if i == 3 and dist.is_initialized() and dist.get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return train_step(model, optimizer, batch, i)
    return make(step=step)


def odd_batch() -> ch.Canary:
    """Batches of 3 rows: they do not divide among 2 ranks."""
    def three_rows(i: int):
        x, y = batch(i)
        return x[:3], y[:3]
    return make(batch_fn=three_rows)


def reads_loss_in_step() -> ch.Canary:
    """Reads the loss to the host before the update (`float(loss)`): under XLA the step's
    graph is cut there and the device waited for, every step."""
    def step(model, optimizer, batch, i):
        x, y = batch
        optimizer.zero_grad()
        loss = model(x, y)
        if float(loss) > 1e6:  # a host read inside the step: XLA's .item() trap
            raise RuntimeError("diverged")
        loss.backward()
        optimizer.step()
        return loss
    return make(step=step, name="reads_loss_in_step")



def bakes_step_into_graph() -> ch.Canary:
    """Scales the loss by a Python float that changes every step. The static audit calls it a
    varying constant; torch_xla uploads a Python float other than 0 and 1 as device data (its
    "special scalars", XLA_NO_SPECIAL_SCALARS), so only the step where it is 1.0 differs."""
    def step(model, optimizer, batch, i):
        x, y = batch
        optimizer.zero_grad()
        loss = model(x, y) * (1.0 + 0.01 * i)
        loss.backward()
        optimizer.step()
        return loss
    return make(step=step, name="bakes_step_into_graph")


def varies_batch_shape() -> ch.Canary:
    """Trains on a prefix of the sequence whose length changes with the step: a new shape,
    so XLA compiles the step again for each length."""
    def step(model, optimizer, batch, i):
        x, y = batch
        n = 8 - i % 4
        return train_step(model, optimizer, (x[:, :n], y[:, :n]), i)
    return make(step=step, name="varies_batch_shape")


class Bf16Linear(nn.Linear):
    """A Linear that computes through bf16 though its run is fp32: its input and weight cast
    down, its product in bf16, cast back (what the op oracle must name, and nothing else)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.bfloat16(), self.weight.bfloat16(), self.bias.bfloat16()).float()


def hidden_in_bf16() -> ch.Canary:
    canary = make(name="small-hidden-bf16")
    fp32 = canary.model.hidden
    canary.model.hidden = Bf16Linear(fp32.in_features, fp32.out_features)
    canary.model.hidden.load_state_dict(fp32.state_dict())
    canary.optimizer = torch.optim.AdamW(canary.model.parameters(), lr=1e-2)
    return canary
