"""A pack's canary trained in PyTorch one step at a time: the step the PyTorch lane
(`python3 -m canary_harness.lane`) runs through the runner, which `python3 -m
canary_harness.audit` audits (python/tests/audit_cases/canary_lane.py) and the tests train
with. No host read inside a step: the loss and the norm stay device tensors."""

from __future__ import annotations

import os
from typing import Any, Optional, Tuple

from .architectures import Architecture, architecture_of, model_of
from .canary import Canary, LoadedCanary
from .faults import FaultSpec, nudge_first_result, parse_fault
from ..pack import PackError, read_pack
from ..cli.usage import UsageError


def pack_canary(pack: Any, architecture: "Architecture", cfg: Any, model: Any, optimizer: Any, steps: int):
    """The pack's canary as the runner runs it (canary_harness.runs.runner): its batches are the
    pack's int32 tokens (the C++ engines' data contract), its step the lane's (lane_step)."""
    import numpy as np
    import torch

    def batch(i: int) -> Any:
        return torch.from_numpy(np.ascontiguousarray(pack.batch(i)))

    def step(model: Any, optimizer: Any, tokens: Any, i: int) -> Tuple[Any, Any]:
        return lane_step(model, optimizer, tokens, i, architecture, cfg)

    held_out = pack.held_out
    evaluation = {}
    if held_out is not None:  # docs/logit-kl.md: the logits the loss reads (the model's LOGITS_OP)
        tokens = torch.from_numpy(np.ascontiguousarray(held_out.tokens))
        evaluation = dict(eval_batch=tokens, eval_every=held_out.every, eval_rows=held_out.rows,
                          eval_logits=held_out_logits, eval_targets=tokens[:, 1:])
    canary = Canary(name=pack.name, model=model, optimizer=optimizer, batch=batch, step=step, steps=steps,
                    seed=pack.seed, **evaluation)
    names = list(pack.tensor_names)
    return LoadedCanary(canary, f"{pack.path} (pack)", os.path.abspath(pack.path), "", pack.seed, names,
                        {n: tuple(pack.init[n].shape) for n in names}, token_batches=True)


def build_pack_canary(pack: Any, steps: int, device: Any) -> Tuple[LoadedCanary, Architecture, Any]:
    """The pack's canary built from its initial parameters on `device` (what the lane trains
    and a replay of a lane's receipt builds again), with its architecture and config. A
    config the package cannot read is a UsageError naming the pack."""
    from .optim import CanaryAdamW

    architecture = architecture_module(pack)
    try:
        cfg = architecture.config_class.from_json(pack.canary_json)
    except ValueError as e:
        raise UsageError(f"{pack.path}: {e}") from None
    model = architecture.model_class(cfg, pack.init, device=device)
    loaded = pack_canary(pack, architecture, cfg, model, CanaryAdamW(model.named_parameters(), cfg), steps)
    return loaded, architecture, cfg


def held_out_logits(model: Any, tokens: Any) -> Any:
    """The (B, T, V) logits of the model's forward on `tokens`: its LOGITS_OP's output."""
    core = getattr(model, "module", model)  # --layout ddp wraps it
    seen = []

    def keep(op: str, out: Any) -> Any:
        if op == core.LOGITS_OP:
            seen.append(out)
        return out

    model(tokens, keep)
    return seen[-1]


def lane_step(model: Any, optimizer: Any, tokens: Any, step: int, architecture: "Architecture", cfg: Any,
              autocast: Any = None) -> Tuple[Any, Any]:
    """Step `step` of the lane on tokens already on the device: the schedule's lr set, then
    train_step (autocast around the forward when given). Returns the loss and the norm
    before clipping as device tensors."""
    optimizer.set_lr(architecture.lr_at(step, cfg))
    return train_step(model, optimizer, tokens, autocast)


class CanaryStep:
    """The lane's training step: `step(i)` trains on the pack's batch i exactly as the lane
    does, and returns (loss, norm, lr, tokens): the loss and the norm before clipping as
    device tensors (nothing read to the host), the step's fp32 lr, the batch's int32 tokens.

    Made from a pack (canary_harness.pack.CanaryPack) and its config on `device`, with the
    lane's bf16 autocast (`autocast`: a torch.autocast, or None for fp32) and fault (a
    FaultSpec or None: a forward hook on the op's module, registered here, before any hook a
    Recorder's op tracer adds). `model` is the pack's architecture's module (GPT2 or Llama,
    picked by the canary JSON's `architecture` key) and `optimizer` the lane's CanaryAdamW.

    The step is XLA-safe: `python3 -m canary_harness.audit` finds it clean (the audit case
    python/tests/audit_cases/canary_lane.py: `CanaryStep.from_pack(path)`).
    """

    def __init__(self, pack, cfg, device="cpu", autocast=None, fault: Optional[FaultSpec] = None):
        import torch

        from .optim import CanaryAdamW

        self.pack, self.cfg, self.autocast, self.fault = pack, cfg, autocast, fault
        self.architecture = architecture_module(pack)
        self.device = torch.device(device) if isinstance(device, str) else device
        self.model = self.architecture.model_class(cfg, pack.init, device=self.device)
        self.optimizer = CanaryAdamW(self.model.named_parameters(), cfg)
        self.active = torch.zeros((), dtype=torch.bool, device=self.device)  # the fault's step, filled in place
        if fault is not None:
            # The op's module is the op (its path is the op's name); registered before the op
            # tracer's hooks, so a trace sees the nudged output, what the next op reads.
            active, ulps = self.active, fault.ulps
            self.model.get_submodule(fault.op).register_forward_hook(
                lambda module, args, out: nudge_first_result(out, active, ulps))

    @classmethod
    def from_pack(cls, path: str, device: str = "cpu", precision: str = "fp32",
                  inject_fault: Optional[str] = None) -> "CanaryStep":
        """The lane's step for a pack file, as `--pack PATH --device D --precision P
        [--inject-fault SPEC]` runs it (bad values are UsageErrors, one line)."""
        import torch

        if precision not in ("fp32", "bf16"):
            raise UsageError(f"precision: unknown precision '{precision}'; use fp32 or bf16")
        try:
            pack = load_pack(path)
        except PackError as e:
            raise UsageError(str(e)) from None
        model_module = architecture_module(pack)
        try:
            cfg = model_module.config_class.from_json(pack.canary_json)
        except ValueError as e:
            raise UsageError(f"{pack.path}: {e}") from None
        fault = parse_fault(inject_fault, model_module.forward_op_names(cfg), pack.steps) \
            if inject_fault is not None else None
        autocast = torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16) \
            if precision == "bf16" else None
        return cls(pack, cfg, device, autocast, fault)

    def __call__(self, step: int):
        import numpy as np
        import torch

        tokens = self.pack.batch(step)
        if self.fault is not None:
            self.active.copy_(torch.tensor(step == self.fault.step))  # data, not a constant of the graph
        inputs = torch.from_numpy(np.ascontiguousarray(tokens)).to(self.device)
        loss, norm = lane_step(self.model, self.optimizer, inputs, step, self.architecture, self.cfg, self.autocast)
        return loss, norm, self.optimizer.param_groups[0]["lr"], tokens


def train_step(model, optimizer, inputs, autocast=None, hook=None):
    """One step of the canary on the device, with no host read: forward (under autocast
    when given), backward, the global norm, the clip, the AdamW update. optimizer.set_lr()
    comes first. Returns the loss and the norm before clipping as device tensors."""
    import torch

    from .optim import clip_grads_, global_grad_norm

    core = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model  # --layout ddp
    params = list(model.parameters())
    for p in params:
        p.grad = None
    if autocast is not None:
        with autocast:
            loss = model(inputs, hook)
    else:
        loss = model(inputs, hook)
    loss.backward()
    grads = [p.grad for p in params]
    norm = global_grad_norm(grads)
    clip_grads_(grads, norm, core.cfg.max_grad_norm)
    optimizer.step()
    return loss, norm


# ---- architectures: the canary JSON's `architecture` key picks the model -----------------------

def architecture_module(pack_or_canary: Any) -> Architecture:
    """The model of a pack's (or a canary JSON's) architecture; another architecture is a UsageError."""
    canary = getattr(pack_or_canary, "canary", pack_or_canary)
    try:
        return model_of(architecture_of(canary))
    except ValueError as e:
        raise UsageError(str(e)) from None


def load_pack(path: str, canary: Optional[str] = None):
    """A pack of any architecture the lane runs, read and checked in full by
    canary_harness.pack.read_pack (a PackError, one line starting with the path, where it
    is damaged or does not fit)."""
    return read_pack(path, canary=canary)
