"""Receipts from a `transformers.Trainer` run: `canary_harness.hf.ReceiptCallback` (docs/transformers.md).

    from canary_harness.hf import ReceiptCallback

    args = TrainingArguments(output_dir=..., max_steps=12, logging_steps=1, logging_nan_inf_filter=False, ...)
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[ReceiptCallback("run.h5", name="my-model")])
    trainer.train()                                   # run.h5: one row per optimizer step

Each optimizer step is recorded as `canary_harness run` and `canary_harness.torch.Recorder`
record a step (the same StepDigest, MomentSource and ReceiptWriter, so the same digests
and schema): the parameters after the update, the gradients the update applied (after
clipping), AdamW's moments, every tensor of `model.named_parameters()` in that order; the
step's loss and gradient norm before clipping, as the Trainer computed them; the learning
rate of the first parameter group at the update; the hash of the step's batch.

Where each comes from, and why there:
- tensors and lr: `on_optimizer_step`, which the Trainer calls right after
  `optimizer.step()`, before the schedule steps and `model.zero_grad()`: the point where
  the runner takes them (the end of optimizer.step()). Fp32 tensors on the CPU are digested
  there in place by the digest library (canary_harness.receipts.native); anything else is read to
  the host there, inside the Trainer's step.
- loss and grad_norm: `on_log`. The Trainer hands callbacks its per-step loss and
  pre-clipping norm only in its logs, so the callback needs `logging_steps=1` (a log each
  step, which reads both to the host: on an accelerator, a device sync a step), and
  `logging_nan_inf_filter=False` (with the filter on, the Trainer logs the average of
  earlier losses in place of a NaN or infinite one, and the receipt would record that).
  Both are checked when training begins: a one-line ReceiptCallbackError.
- the batch: a forward pre-hook on the model keeps what each training forward of the step
  was called with (the collated batch, less the Trainer's own `num_items_in_batch`), hashed
  after the step as a Python canary's batch is (digest.batch_tree_hash): one micro-batch is
  hashed as the batch itself, so it hashes as the canary's batch(i) of the same tensors;
  with gradient accumulation, the list of the micro-batches.

The receipt's canary JSON has the form a Python canary's has (canary.LoadedCanary.identity):
name, kind "python", source (`source=`: "transformers.Trainer" unless you name the canary
file, FILE.py:NAME, whose runs this Trainer run reproduces), steps (the Trainer's max_steps),
the tensor table, the optimizer's class and `config` (default: the model's
`config.to_dict()`). Two receipts compare (`harness compare`) only when these agree.

The receipt has no replay recipe (/manifest/run_options): the Trainer drives the steps, and
`harness replay` and `bisect` replay only what `canary_harness run` recorded.

transformers is imported here, never by `import canary_harness`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any, Dict, List, Mapping, Optional

try:
    import torch
    from transformers import TrainerCallback
except ImportError as _missing:  # one line naming what to install
    raise ImportError(f"canary_harness.hf needs torch and transformers ({_missing}); run it with .venv/bin/python "
                      "(docs/transformers.md)") from None

from .receipts.budget_features import format_features, parse_features
from .cli.lane_stacks import budget_features as stack_budget_features, lane_name as stack_lane_name, stack_options
from .runs.canary import canonical_json
from .receipts.digest import batch_tree_hash
from .receipts.receipt import ReceiptWriter
from .runs.recording import MomentSource, StepDigest
from .receipts import stack as stack_info

# Keywords the Trainer adds to the model's call that are not the batch's (its loss scaling).
_TRAINER_KWARGS = ("num_items_in_batch",)


class ReceiptCallbackError(ValueError):
    """A Trainer run the callback cannot record as asked (one line: what to change)."""


class ReceiptCallback(TrainerCallback):
    """Records a `transformers.Trainer` run into a receipt, one row per optimizer step (module docstring).

    path:    the receipt to write (refused when it exists, unless overwrite=True).
    name:    the canary's name: the lane is `<name>/torch[+features]`, as `canary_harness run`'s.
    source:  the canary JSON's source: "transformers.Trainer", or the FILE.py:NAME (base name)
             of the canary this run reproduces, so that the two receipts compare.
    config:  the canary JSON's config (default: the model's `config.to_dict()`, else {}).
    seed:    the manifest's seed (default: the TrainingArguments' seed).
    budget_features: what separates the run from the fp32 CPU reference (default: from the
             TrainingArguments as `canary_harness run` derives it from its flags: `torch-<device>`
             off the CPU, `torch-bf16` with bf16=True, `torch-compile` with torch_compile=True).
    extra:   more manifest attributes (str, int or float).
    """

    def __init__(self, path: str | os.PathLike, *, name: str, source: str = "transformers.Trainer",
                 config: Optional[Mapping[str, Any]] = None, seed: Optional[int] = None,
                 budget_features: Optional[str] = None, overwrite: bool = False,
                 extra: Optional[Mapping[str, Any]] = None) -> None:
        if not isinstance(name, str) or not name or "/" in name or name != name.strip():
            raise ReceiptCallbackError(f"name={name!r}: give a non-empty name without '/' or surrounding spaces "
                                       "(the lane is NAME/torch)")
        if not isinstance(source, str) or not source:
            raise ReceiptCallbackError(f"source={source!r}: give a non-empty str (FILE.py:NAME, or the default)")
        if config is not None and not isinstance(config, Mapping):
            raise ReceiptCallbackError(f"config is a {type(config).__name__}, not a mapping")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
            raise ReceiptCallbackError(f"seed={seed!r}: give an int in 0..2**63-1")
        if budget_features is not None:
            try:
                parse_features(budget_features)
            except (TypeError, ValueError, AttributeError) as e:
                raise ReceiptCallbackError(f"budget_features={budget_features!r}: {e}") from None
        self.path = os.fspath(path)
        self.name, self.source, self.config, self.seed = name, source, config, seed
        self.budget_features, self.overwrite, self.extra = budget_features, overwrite, dict(extra or {})
        self.writer: Optional[ReceiptWriter] = None
        self._params: List[torch.nn.Parameter] = []
        self._optimizer: Any = None
        self._moments: Optional[MomentSource] = None
        self._digest: Optional[StepDigest] = None
        self._hook: Any = None
        self._micro_batches: List[Any] = []   # what the step's training forwards were called with
        self._pending: Optional[Dict[str, Any]] = None  # the step's digests and lr, until its log

    # ---- the Trainer's events ---------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        _check_arguments(args)
        if model is None or optimizer is None:
            raise ReceiptCallbackError("on_train_begin: the Trainer handed no model or optimizer to the callback")
        names, self._params = _parameters(model, optimizer)
        self._optimizer = _inner_optimizer(optimizer)
        self._moments = MomentSource(self._optimizer)
        self._digest = StepDigest(names, [p.numel() for p in self._params])
        self.writer = ReceiptWriter(self.path, self._manifest(args, state, model, names), names,
                                    overwrite=self.overwrite, stack=_stack(model))
        self._hook = model.register_forward_pre_hook(self._keep_batch, with_kwargs=True)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._pending is not None:  # the previous step never reached on_log
            raise self._fail(f"step {state.global_step - 1} was not logged; the callback needs logging_steps=1")
        self._micro_batches = []

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Right after optimizer.step(): params updated, grads as applied, before zero_grad.
        tensors = [*self._params, *(self._grad(p) for p in self._params),
                   *(self._moments.moment(p, "adam_m") for p in self._params),
                   *(self._moments.moment(p, "adam_v") for p in self._params)]
        self._pending = {"digests": self._digest.rows(tensors), "lr": self._optimizer.param_groups[0]["lr"],
                         "batches": self._micro_batches, "step": state.global_step}
        self._micro_batches = []

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[Mapping[str, Any]] = None,
               **kwargs: Any) -> None:
        if self._pending is None or not logs or "loss" not in logs:
            return  # not a training step's log (evaluation, the run's summary)
        pending, self._pending = self._pending, None
        digests = pending["digests"]
        grad_norm = logs.get("grad_norm")
        if grad_norm is None:  # the runner's rule for a step that gives none: the norm of the applied gradients
            grad_norm = self._digest.grad_norm(digests)
        batches = pending["batches"]
        if not batches:
            raise self._fail(f"step {pending['step']}: no training forward of the model was seen; the callback "
                             "hashes the batch the model is called with")
        hashes, sketches = self._digest.split(digests)
        self.writer.append_step(loss=float(logs["loss"]), grad_norm=float(grad_norm), lr=_host_float(pending["lr"]),
                                batch_hash=batch_tree_hash(batches[0] if len(batches) == 1 else batches),
                                hashes=hashes, sketches=sketches)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._pending is not None:
            raise self._fail(f"step {self._pending['step']} was not logged; the callback needs logging_steps=1")
        self._release()
        if self.writer is not None:
            self.writer.close()  # complete = 1 when every one of max_steps was recorded

    def close(self) -> None:
        """Removes the forward hook from the model and closes the receipt, complete = 0 unless
        the run ended: for a `trainer.train()` that raised, after which the Trainer calls no
        `on_train_end` (`try: trainer.train() finally: callback.close()`). Idempotent."""
        self._release()
        if self.writer is not None:
            self.writer.__exit__(ReceiptCallbackError, None, None)  # a finished receipt is closed already

    # ---- helpers ----------------------------------------------------------------------------

    def _keep_batch(self, module: Any, args: tuple, kwargs: Dict[str, Any]) -> None:
        if not module.training:  # an evaluation inside the run: not the step's batch
            return
        inputs = {k: v for k, v in kwargs.items() if k not in _TRAINER_KWARGS}
        self._micro_batches.append(inputs if not args else (tuple(args), inputs) if inputs else tuple(args))

    def _grad(self, p: torch.Tensor) -> torch.Tensor:
        return p.grad if p.grad is not None else self._moments.zeros_like(p)

    def _manifest(self, args: Any, state: Any, model: Any, names: List[str]) -> Dict[str, Any]:
        device = torch.device(args.device) if hasattr(args, "device") else self._params[0].device
        features = _lane_features(args, device)
        bf16 = bool(getattr(args, "bf16", False))
        described = stack_options(self.name, device=device.type, precision="bf16" if bf16 else "fp32",
                                  compiled=bool(getattr(args, "torch_compile", False)))
        budget = self.budget_features if self.budget_features is not None else format_features(
            stack_budget_features("torch-canary", described))
        seed = self.seed if self.seed is not None else int(args.seed)
        steps = int(state.max_steps)
        shapes = {n: tuple(p.shape) for n, p in zip(names, self._params)}
        identity = _identity(self.name, self.source, steps, names, shapes, type(self._optimizer).__name__,
                             self._config(model))
        made = {"lane": stack_lane_name("torch-canary", described), "engine": "torch",
                "features": "+".join(features), "budget_features": budget, "canary": identity, "seed": seed,
                "steps_planned": steps, "threads": torch.get_num_threads(), "device": str(device),
                "precision": "bf16" if bf16 else "fp32", "autocast": "bfloat16" if bf16 else "none",
                "fault_injection": "none", "trace": "none", "git_commit": stack_info.git_commit_of(_script_path())}
        clash = sorted(set(self.extra) & set(made))
        if clash:
            raise ReceiptCallbackError(f"extra: '{clash[0]}' is set by the callback; rename it, or pass it as its "
                                       "own argument")
        return {**made, **self.extra}

    def _config(self, model: Any) -> Dict[str, Any]:
        if self.config is not None:
            return dict(self.config)
        to_dict = getattr(getattr(model, "config", None), "to_dict", None)
        return to_dict() if callable(to_dict) else {}

    def _release(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def _fail(self, message: str) -> ReceiptCallbackError:
        """The error to raise: the hook removed and the receipt closed (complete = 0) first."""
        self._release()
        if self.writer is not None:
            self.writer.__exit__(ReceiptCallbackError, None, None)
        return ReceiptCallbackError(f"{self.path}: {message}")


def _check_arguments(args: Any) -> None:
    """What the callback needs of the TrainingArguments (module docstring), one line each."""
    strategy = getattr(getattr(args, "logging_strategy", None), "value", getattr(args, "logging_strategy", None))
    if strategy != "steps" or args.logging_steps != 1:
        raise ReceiptCallbackError(
            f"logging_strategy={strategy!r}, logging_steps={args.logging_steps!r}: give logging_strategy='steps' and "
            "logging_steps=1 (the Trainer hands callbacks each step's loss and grad_norm only in its logs)")
    if getattr(args, "logging_nan_inf_filter", False):
        raise ReceiptCallbackError("logging_nan_inf_filter=True: give False (the Trainer would log the average of "
                                   "earlier losses in place of a NaN or infinite one, and the receipt record it)")
    if getattr(args, "fp16", False):
        raise ReceiptCallbackError("fp16=True: a receipt's precision is fp32 or bf16 (docs/receipt-schema.md, "
                                   "/manifest precision); train with bf16=True or in fp32")
    if getattr(args, "world_size", 1) != 1:
        raise ReceiptCallbackError(f"world_size={args.world_size}: the callback records one process's run; "
                                   "train on one process")


def _inner_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside accelerate's wrapper (AcceleratedOptimizer keeps it as .optimizer)."""
    inner = getattr(optimizer, "optimizer", None)
    return inner if isinstance(inner, torch.optim.Optimizer) else optimizer


def _parameters(model: Any, optimizer: Any) -> tuple:
    """(names, parameters) in named_parameters() order (a tied parameter once, as the runner
    records them); every one must be one the optimizer updates."""
    params = dict(model.named_parameters())
    if not params:
        raise ReceiptCallbackError("the model has no parameters")
    held = {id(p) for group in _inner_optimizer(optimizer).param_groups for p in group["params"]}
    for name, p in params.items():
        if id(p) not in held:
            raise ReceiptCallbackError(f"parameter '{name}' is not one the optimizer updates; the receipt records "
                                       "every parameter of the model: give it to the optimizer, or make it a buffer")
    return list(params), list(params.values())


def _identity(name: str, source: str, steps: int, names: List[str], shapes: Mapping[str, tuple], optimizer: str,
              config: Mapping[str, Any]) -> Dict[str, Any]:
    """The canary JSON, in the form canary.LoadedCanary.identity gives a Python canary's (the
    same fields, the same tensor table hash), so that a Trainer run that reproduces a canary's
    run compares with it."""
    table = json.dumps([[n, list(shapes[n])] for n in names], separators=(",", ":"))
    try:
        return canonical_json({"name": name, "kind": "python", "source": source, "steps": steps,
                               "tensors": len(names),
                               "tensor_table_sha256": hashlib.sha256(table.encode()).hexdigest(),
                               "optimizer": optimizer, "config": dict(config)})
    except (TypeError, ValueError) as e:
        raise ReceiptCallbackError(f"config does not convert to JSON ({e}); give config= explicitly") from None


def _lane_features(args: Any, device: torch.device) -> List[str]:
    """As runner.lane_features derives them from `run`'s flags: device, bf16, compile."""
    return ([device.type] if device.type != "cpu" else []) + (["bf16"] if getattr(args, "bf16", False) else []) + \
        (["compile"] if getattr(args, "torch_compile", False) else [])


def _stack(model: Any) -> stack_info.StackInfo:
    """The stack line as a run of the same model writes it (stack.with_model): the
    distributions the training script (the __main__ module) imports, and the attention the
    model's modules declare."""
    main = sys.modules.get("__main__")
    imported = stack_info.imported_distributions(main) if main is not None else []
    return stack_info.with_model(stack_info.collect_stack_info(include_torch=True), model, imported)


def _script_path() -> str:
    """The training script (the __main__ module's file), else the working directory: what git_commit names."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return path if isinstance(path, str) and os.path.exists(path) else os.getcwd()


def _host_float(value: Any) -> float:
    return float(value.detach().cpu()) if isinstance(value, torch.Tensor) else float(value)


__all__ = ["ReceiptCallback", "ReceiptCallbackError"]
