"""The restart gate's example (docs/own-model.md, "The restart gate"): one small model with
dropout, AdamW and an HF-style LambdaLR, whose save(state_dir) and load(state_dir) checkpoint
what `kept` names, as a team's training code would. `everything` keeps the model, the
optimizer, the schedule and the RNG state, and resumes bit for bit; each other canary leaves
one out, and `python3 -m canary_harness resume-check` names it
(python/tests/test_resume_check.py)."""

import os

import torch

import canary_harness as ch


def _canary(kept):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.25), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # an HF-style schedule: lr_lambda of the step count, stepped after every optimizer step
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1.0 + step))
    data = torch.Generator().manual_seed(7)
    xs, ys = torch.randn(8, 6, 8, generator=data), torch.randn(8, 6, 4, generator=data)

    def step(model, optimizer, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        return loss

    objects = {"model": model, "optimizer": optimizer, "scheduler": scheduler}

    def save(state_dir):
        state = {name: objects[name].state_dict() for name in kept if name in objects}
        if "rng" in kept:
            state["rng"] = torch.get_rng_state()
        torch.save(state, os.path.join(state_dir, "checkpoint.pt"))

    def load(state_dir):
        state = torch.load(os.path.join(state_dir, "checkpoint.pt"))
        for name, value in state.items():
            if name == "rng":
                torch.set_rng_state(value)
            else:
                objects[name].load_state_dict(value)

    return ch.Canary(name="resume-demo", model=model, optimizer=optimizer, batch=lambda i: (xs[i], ys[i]),
                     step=step, steps=8, seed=3, schedulers=[scheduler], save=save, load=load)


def everything():
    return _canary({"model", "optimizer", "scheduler", "rng"})


def no_scheduler():
    return _canary({"model", "optimizer", "rng"})


def no_optimizer():
    return _canary({"model", "scheduler", "rng"})


def no_model():
    return _canary({"optimizer", "scheduler", "rng"})


def no_rng():
    return _canary({"model", "optimizer", "scheduler"})


def no_save():
    canary = everything()
    canary.save = canary.load = None
    return canary


def save_only():
    canary = everything()
    canary.load = None
    return canary


def unrepeatable():
    """A step that reseeds its dropout from the OS: no two runs of it repeat, restarted or not."""
    canary = everything()
    step = canary.step

    def reseeded(model, optimizer, batch, i):
        torch.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
        return step(model, optimizer, batch, i)

    canary.step = reseeded
    return canary
