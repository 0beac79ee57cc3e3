"""A zoo member trained by `transformers.Trainer`, recorded by `canary_harness.hf.ReceiptCallback`
(docs/transformers.md):

    .venv/bin/python tests/zoo/trainer.py tests/zoo/gpt2.py:canary --out /tmp/trainer.h5

The member's own model, AdamW over its decay groups, cosine schedule with warm-up and batches,
built as `canary_harness run` builds them (canary.load_canary: seeded with the member's seed,
checked), handed to a Trainer: optimizers=(the member's AdamW, its schedule), clipping at
team.CLIP, per_device_train_batch_size = the batch's rows, max_steps = the member's steps, a
dataset whose rows are the member's batches in order, read in order (the Trainer's default
sampler shuffles). Three settings make the Trainer's run the one `canary_harness run` records,
bit for bit; `--trainer-default NAME` leaves one as the Trainer has it (docs/transformers.md
gives what each moves, measured):

  seed       the Trainer seeds torch again at train() (set_seed(args.seed)); the harness seeds
             once, before the member builds its model, and dropout draws on from there. Here
             the generator is put back where the member's construction left it, at step 0.
  loss       the Trainer hands the model num_items_in_batch, the labels it counts, and the
             model divides its summed loss by it; the team's step takes the model's own mean.
             Here the model is told it takes no loss kwargs (accepts_loss_kwargs = False).
  use_cache  the Trainer sets the model's config.use_cache to args.use_cache (default False);
             the member's config keeps transformers' default (True). Here use_cache=True.

Members whose step accumulates micro-batches (accumulation.py) are not for this script.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any, Dict, List, Sequence

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from canary_harness.runs.canary import LoadedCanary, load_canary
from canary_harness.hf import ReceiptCallback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import team  # noqa: E402

SETTINGS = ("seed", "loss", "use_cache")


class MemberRows(torch.utils.data.Dataset):
    """Row k of the member's data: row k % B of its batch k // B, so that the Trainer's batch i
    (B rows, read in order, stacked by its default collator) is the member's batch(i)."""

    def __init__(self, loaded: LoadedCanary, rows: int) -> None:
        self.batch, self.rows, self.steps = loaded.canary.batch, rows, loaded.canary.steps

    def __len__(self) -> int:
        return self.steps * self.rows

    def __getitem__(self, k: int) -> Dict[str, torch.Tensor]:
        return {key: value[k % self.rows] for key, value in self.batch(k // self.rows).items()}


class ContinueRandomState(TrainerCallback):
    """Puts torch's generator back where the member's construction left it, at the first step
    (after the Trainer's set_seed at train() and its data loader's draw of a worker seed)."""

    def __init__(self, state: torch.Tensor) -> None:
        self.state = state

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 0:
            torch.set_rng_state(self.state)


def train(spec: str, out: str, trainer_defaults: Sequence[str] = ()) -> None:
    loaded = load_canary(spec)  # seeded with the member's seed, as `canary_harness run` builds it
    canary = loaded.canary
    continued = torch.get_rng_state()
    torch.set_num_threads(1)  # as `canary_harness run` (--threads 1)
    if "loss" not in trainer_defaults:
        canary.model.accepts_loss_kwargs = False
    rows = len(next(iter(canary.batch(0).values())))
    callbacks: List[TrainerCallback] = [ReceiptCallback(out, name=canary.name, source=os.path.basename(spec))]
    if "seed" not in trainer_defaults:
        callbacks.insert(0, ContinueRandomState(continued))
    with tempfile.TemporaryDirectory(prefix="zoo-trainer-") as scratch:
        args = TrainingArguments(
            output_dir=scratch, max_steps=canary.steps, per_device_train_batch_size=rows,
            max_grad_norm=team.CLIP, seed=loaded.seed, train_sampling_strategy="sequential",
            use_cache="use_cache" not in trainer_defaults, use_cpu=True, report_to=[], save_strategy="no",
            logging_steps=1, logging_nan_inf_filter=False, disable_tqdm=True)
        trainer = Trainer(model=canary.model, args=args, train_dataset=MemberRows(loaded, rows),
                          optimizers=(canary.optimizer, canary.schedulers[0]), callbacks=callbacks)
        trainer.train()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("canary", help="a zoo member, FILE.py:canary")
    ap.add_argument("--out", required=True, help="the receipt to write")
    ap.add_argument("--trainer-default", action="append", default=[], choices=SETTINGS,
                    help="leave this setting as the Trainer has it (repeatable)")
    args = ap.parse_args(argv)
    train(args.canary, args.out, args.trainer_default)
    return 0


if __name__ == "__main__":
    sys.exit(main())
