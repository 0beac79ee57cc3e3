"""Python canaries: a team's own model as a canary, named `FILE.py:NAME` (docs/own-model.md).

    import canary_harness as ch

    def canary() -> ch.Canary:
        model = MyModel(...)                                # any nn.Module, untouched
        optimizer = torch.optim.AdamW(groups, lr=1e-3)      # any optimizer
        return ch.Canary(name="mymodel-tiny", model=model, optimizer=optimizer,
                         batch=lambda i: (x[i], y[i]), step=train_step, steps=40, seed=1337)

`load_canary("my_canary.py:canary")` imports the file as a fresh module, seeds torch,
`random` and numpy from the seed, calls NAME() and checks what it returned: every problem
is a CanaryError naming the file, the function and the field. The harness owns the loop
(canary_harness.runs.runner); the model and its step stay as the team wrote them.

This module imports torch only inside load_canary: `import canary_harness` stays torch-free.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

# The seed NAME() is first called under when the command line gives none; a canary that
# declares another seed is built again under its own (load_canary).
DEFAULT_BUILD_SEED = 0


class CanaryError(ValueError):
    """A Python canary that cannot be loaded or run as declared (one line, naming file and field)."""


class CanaryImportError(CanaryError):
    """The canary's file, or NAME(), imports a module this interpreter cannot import: another
    interpreter may load it (a matrix's `python =`). `module`: the one missing, where known."""

    def __init__(self, message: str, module: Optional[str]) -> None:
        super().__init__(message)
        self.module = module


def _load_error(message: str, error: BaseException) -> CanaryError:
    """The CanaryError for an exception raised while the canary loads: an ImportError (and
    ModuleNotFoundError) is the interpreter's lack, told apart by its type."""
    if isinstance(error, ImportError):
        return CanaryImportError(message, error.name)
    return CanaryError(message)


@dataclass
class Canary:
    """One training run of a team's own model, as the harness runs it.

    name:      the canary's name; lanes are `<name>/torch[+features]`, goldens
               goldens/<name>/torch[+features].h5.
    model:     any torch.nn.Module (the harness moves it to the run's device).
    optimizer: any torch.optim.Optimizer over the model's parameters (Adam and AdamW's
               moments, exp_avg and exp_avg_sq, are recorded as the receipt's adam_m/adam_v;
               another optimizer's are recorded as zeros and named in the manifest).
    batch:     batch(i) -> step i's inputs (a tensor, or tuples, lists and dicts of them),
               the same on every call: the harness hashes it (the data contract) and
               refuses a batch that differs between two calls for one step (checked
               at steps 0-3 and every power of two: runner.batch_checked_at).
    step:      step(model, optimizer, batch, i) -> loss: one whole training step as the team
               writes it (lr, forward, backward, clipping, optimizer.step()); the loss is a
               one-element tensor or a number. It may return (loss, grad_norm) to have its
               norm before clipping recorded; otherwise the receipt records the L2 norm of
               the gradients the optimizer applied.
    steps:     the run's length; seed: the seed the harness seeds torch, random and numpy
               with before it calls NAME() (`--seed` overrides it).
    config:    optional JSON-able mapping: what identifies the canary beyond its tensors
               (sizes, hyper-parameters; an HF config's to_dict()); it goes into the
               receipt's canary JSON, so two receipts of different configs never compare.
               It is compared as JSON gives it back (canonical_json: int keys become
               strings, tuples lists), on the receipt's side and the live one alike.
    schedulers: optional list of learning-rate schedulers the step steps (HF's LambdaLRs,
               any torch.optim.lr_scheduler), and
    state:     optional {name: object}: anything else the step uses that keeps state across
               steps. Every one needs state_dict() and load_state_dict(); their state is
               checkpointed and restored with the model's and the optimizer's
               (canary_harness.runs.canary_state), so that a replay from a checkpoint resumes the
               schedule where the run was.
    save, load: optional save(state_dir) and load(state_dir): the team's own checkpointing,
               as its training code does it, which `python3 -m canary_harness resume-check`
               holds to the uninterrupted run (canary_harness.runs.resume_check).
    eval_batch: optional held-out inputs (the form batch(i) returns), fixed: every
               `eval_every` steps (default steps // 4) the model's logits on it are recorded
               (docs/logit-kl.md). The logits are eval_logits(model, batch) (default: the
               model called on the batch as a step would, its first output or `.logits`);
               the targets eval_targets (default: the batch's last integer tensor); the
               first `eval_rows` rows are recorded.
    """

    name: str
    model: Any
    optimizer: Any
    batch: Callable[[int], Any]
    step: Callable[[Any, Any, Any, int], Any]
    steps: int
    seed: int = DEFAULT_BUILD_SEED
    config: Mapping[str, Any] = field(default_factory=dict)
    eval_batch: Any = None
    eval_every: int = 0
    eval_rows: int = 2
    eval_logits: Optional[Callable[[Any, Any], Any]] = None
    eval_targets: Any = None
    schedulers: Sequence[Any] = ()
    state: Mapping[str, Any] = field(default_factory=dict)
    save: Optional[Callable[[str], None]] = None
    load: Optional[Callable[[str], None]] = None


@dataclass
class LoadedCanary:
    """A checked Canary, with where it came from and the seed it was built under."""

    canary: Canary
    spec: str           # FILE.py:NAME as given
    path: str           # the file, absolute
    function: str       # NAME
    seed: int           # what torch, random and numpy were seeded with before NAME()
    tensor_names: List[str]
    shapes: Dict[str, Tuple[int, ...]]
    # The data contract the batches follow. False: a Python canary's batch, any tree of
    # tensors, hashed as a tree (digest.batch_tree_hash) and refused when a second batch(i)
    # differs. True: a built-in canary's int32 tokens from its checksummed pack, hashed as
    # the C++ engines hash them (digest.batch_hash): its lanes compare with theirs.
    token_batches: bool = False
    module: Any = None  # the imported FILE.py (what the stack line reads its imports from); None for a pack

    def identity(self) -> Dict[str, Any]:
        """The receipt's canary JSON: what makes two runs runs of one canary. The file is
        named by its base name (runs from other directories compare), the tensors by a
        hash of their names and shapes (a changed model is another canary). Returned as
        JSON gives it back (canonical_json), the form the receipt's copy is read in."""
        table = json.dumps([[n, list(self.shapes[n])] for n in self.tensor_names], separators=(",", ":"))
        return canonical_json({
            "name": self.canary.name,
            "kind": "python",
            "source": f"{os.path.basename(self.path)}:{self.function}",
            "steps": self.canary.steps,
            "tensors": len(self.tensor_names),
            "tensor_table_sha256": hashlib.sha256(table.encode()).hexdigest(),
            "optimizer": type(self.canary.optimizer).__name__,
            "config": dict(self.canary.config),
        })


def canonical_json(value: Any) -> Any:
    """`value` as one JSON round trip gives it back: what every comparison of a canary's
    identity compares, on both sides. A receipt stores its canary JSON as text, so its copy
    comes back with string keys ({0: "a"} -> {"0": "a"}) and lists for tuples; the live
    value has to take the same trip, or an HF config's int-keyed id2label never equals its
    own record again. ValueError (TypeError for an unsupported type) when `value` is no
    JSON, or two of a mapping's keys become one string ({1: .., "1": ..})."""
    return json.loads(json.dumps(value, allow_nan=False), object_pairs_hook=_unique_keys)


def _unique_keys(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    """A JSON object's pairs as a dict; ValueError where a key repeats (json would keep the last silently)."""
    made: Dict[str, Any] = {}
    for key, value in pairs:
        if key in made:
            raise ValueError(f"two keys of one mapping are both '{key}' in JSON")
        made[key] = value
    return made


def call_model(model: Any, batch: Any) -> Any:
    """The model called on a batch as a step would: a tuple or list spread as arguments, a
    dict as keywords, anything else as the one argument."""
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    if isinstance(batch, dict):
        return model(**batch)
    return model(batch)


def output_of(module: str) -> Callable[[Any, Any], Any]:
    """An `eval_logits` for a model whose forward returns only its loss (docs/logit-kl.md):
    the model called on the batch (call_model), and what its submodule `module` (a
    named_modules() name, e.g. "lm_head") output, taken with a forward hook."""

    def submodule(model: Any) -> Any:
        # The model as the step is handed it may be wrapped: DDP's .module, torch.compile's _orig_mod.
        for candidate in (model, getattr(model, "module", None), getattr(model, "_orig_mod", None)):
            try:
                return candidate.get_submodule(module)
            except AttributeError:
                continue
        raise CanaryError(f"eval_logits: the model has no module '{module}' (named_modules() names it)")

    def logits(model: Any, batch: Any) -> Any:
        target = submodule(model)
        seen: List[Any] = []
        handle = target.register_forward_hook(lambda _module, _args, out: seen.append(out))
        try:
            call_model(model, batch)
        finally:
            handle.remove()
        if not seen:
            raise CanaryError(f"eval_logits: module '{module}' did not run in the model's forward")
        return seen[-1]

    return logits


def split_spec(spec: str) -> Tuple[str, str]:
    """FILE.py:NAME -> (FILE.py, NAME); anything else is a CanaryError saying the form."""
    path, colon, name = spec.rpartition(":")
    if not colon or not path or not name.isidentifier() or not path.endswith(".py"):
        raise CanaryError(f"'{spec}': name a Python canary as FILE.py:NAME (a function in the file that returns "
                          "canary_harness.Canary)")
    return path, name


def seed_everything(seed: int) -> None:
    """torch, random and numpy seeded from `seed`, as before every NAME() call and replay."""
    import numpy as np
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def _import_file(path: str, spec: str) -> Any:
    """The file as a fresh module; its directory goes first on sys.path and stays there for
    the run (the file, NAME() and the step may import their neighbours, also lazily); an
    exception while importing is a CanaryError."""
    module_name = f"_canary_{hashlib.sha256(path.encode()).hexdigest()[:12]}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise CanaryError(f"{spec}: cannot import '{path}' as a Python file")
    module = importlib.util.module_from_spec(module_spec)
    directory = os.path.dirname(path)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # SystemExit: a training script that parses sys.argv on import
        sys.modules.pop(module_name, None)
        raise _load_error(f"{spec}: importing the file raised {type(e).__name__}: {_first_line(e)}", e) from None
    return module


def _first_line(error: BaseException) -> str:
    text = str(error)
    return text.splitlines()[0] if text else "(no message)"


def _call(function: Callable[[], Any], spec: str) -> Canary:
    try:
        made = function()
    except (Exception, SystemExit) as e:
        raise _load_error(f"{spec}: calling it raised {type(e).__name__}: {_first_line(e)}", e) from e
    if not isinstance(made, Canary):
        raise CanaryError(f"{spec}: returned a {type(made).__name__}, not a canary_harness.Canary")
    return made


def _check(canary: Canary, spec: str) -> Tuple[List[str], Dict[str, Tuple[int, ...]]]:
    """Every field of the canary checked; returns its tensor names (named_parameters'
    order: a tied parameter once, under its first name) and shapes."""
    import torch

    if not isinstance(canary.name, str) or not canary.name or "/" in canary.name or canary.name != canary.name.strip():
        raise CanaryError(f"{spec}: name={canary.name!r}: give a non-empty name without '/' or surrounding spaces "
                          "(lanes are NAME/torch)")
    if not isinstance(canary.model, torch.nn.Module):
        raise CanaryError(f"{spec}: model is a {type(canary.model).__name__}, not a torch.nn.Module")
    if not isinstance(canary.optimizer, torch.optim.Optimizer):
        raise CanaryError(f"{spec}: optimizer is a {type(canary.optimizer).__name__}, not a torch.optim.Optimizer")
    for what in ("batch", "step"):
        if not callable(getattr(canary, what)):
            raise CanaryError(f"{spec}: {what} is a {type(getattr(canary, what)).__name__}, not a function")
    for what, low in (("steps", 1), ("seed", 0)):
        value = getattr(canary, what)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 2**63:
            raise CanaryError(f"{spec}: {what}={value!r}: give an int in {low}..2**63-1")
    if not isinstance(canary.config, Mapping):
        raise CanaryError(f"{spec}: config is a {type(canary.config).__name__}, not a mapping")
    try:
        canonical_json(dict(canary.config))
    except (TypeError, ValueError, RecursionError) as e:
        raise CanaryError(f"{spec}: config does not convert to JSON ({e}); give numbers, strings, lists and "
                          "mappings") from None
    _check_eval(canary, spec)
    _check_state(canary, spec)
    params = dict(canary.model.named_parameters())
    if not params:
        raise CanaryError(f"{spec}: the model has no parameters")
    held = {id(p) for group in canary.optimizer.param_groups for p in group["params"]}
    for name, param in params.items():
        if param.is_meta:
            raise CanaryError(f"{spec}: parameter '{name}' is on the meta device (no values); materialize the model")
        if id(param) not in held:
            raise CanaryError(f"{spec}: parameter '{name}' is not one the optimizer updates; give the optimizer "
                              "every parameter (a frozen tensor belongs in a buffer)")
    return list(params), {n: tuple(p.shape) for n, p in params.items()}


def _check_eval(canary: Canary, spec: str) -> None:
    """The held-out evaluation's fields (docs/logit-kl.md); eval_every defaults to steps // 4."""
    for what, low in (("eval_every", 0), ("eval_rows", 1)):
        value = getattr(canary, what)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 2**31:
            raise CanaryError(f"{spec}: {what}={value!r}: give an int in {low}..2**31")
    if canary.eval_batch is None:
        for what in ("eval_logits", "eval_targets"):
            if getattr(canary, what) is not None:
                raise CanaryError(f"{spec}: {what} is given without eval_batch: give the held-out batch too")
        if canary.eval_every:
            raise CanaryError(f"{spec}: eval_every={canary.eval_every} is given without eval_batch: give the held-out "
                              "batch too")
        return
    if canary.eval_logits is not None and not callable(canary.eval_logits):
        raise CanaryError(f"{spec}: eval_logits is a {type(canary.eval_logits).__name__}, not a function")
    if canary.eval_every == 0:
        canary.eval_every = max(1, canary.steps // 4)


def _check_state(canary: Canary, spec: str) -> None:
    """schedulers and state: what the checkpoints hold beyond the model and optimizer (stateful_objects);
    save and load: callables, both or neither."""
    for what in ("save", "load"):
        if getattr(canary, what) is not None and not callable(getattr(canary, what)):
            raise CanaryError(f"{spec}: {what} is a {type(getattr(canary, what)).__name__}, not a function of a directory")
    if (canary.save is None) != (canary.load is None):
        raise CanaryError(f"{spec}: give save and load together (load reads what save writes)")
    if not isinstance(canary.schedulers, (list, tuple)):
        raise CanaryError(f"{spec}: schedulers is a {type(canary.schedulers).__name__}; give a list of the "
                          "schedulers the step steps (schedulers=[scheduler])")
    if not isinstance(canary.state, Mapping) or not all(isinstance(k, str) and k for k in canary.state):
        raise CanaryError(f"{spec}: state must map non-empty string names to objects (state={{'ema': ema}})")
    for label, obj in stateful_objects(canary).items():
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise CanaryError(f"{spec}: {label} is a {type(obj).__name__}, which has no state_dict() and "
                              "load_state_dict(); declare only objects that have both")


def stateful_objects(canary: Canary) -> Dict[str, Any]:
    """The canary's declared state beyond model and optimizer, by the label its checkpoint
    stores it under: schedulers[0], ..., state['name']."""
    found = {f"schedulers[{i}]": obj for i, obj in enumerate(canary.schedulers)}
    found.update({f"state[{name!r}]": obj for name, obj in canary.state.items()})
    return found


def load_canary(spec: str, seed: Optional[int] = None) -> LoadedCanary:
    """Imports FILE.py, seeds, calls NAME() and checks the Canary it returns.

    NAME() is called under `seed` when given; otherwise under DEFAULT_BUILD_SEED, and once
    more under the canary's own seed when it declares another one, so that the model
    is always built under the seed the receipt records."""
    path, function = split_spec(spec)
    if not os.path.isfile(path):
        raise CanaryError(f"{spec}: no file '{path}'")
    path = os.path.abspath(path)
    module = _import_file(path, spec)
    target = getattr(module, function, None)
    if target is None:
        raise CanaryError(f"{spec}: '{os.path.basename(path)}' defines no '{function}'; its functions: "
                          f"{', '.join(functions_of(module)) or 'none'}")
    if not callable(target):
        raise CanaryError(f"{spec}: '{function}' is a {type(target).__name__}, not a function")
    build_seed = DEFAULT_BUILD_SEED if seed is None else seed
    seed_everything(build_seed)
    canary = _call(target, spec)
    if seed is None and isinstance(canary.seed, int) and not isinstance(canary.seed, bool) \
            and canary.seed != build_seed and 0 <= canary.seed < 2**63:
        build_seed = canary.seed
        seed_everything(build_seed)
        canary = _call(target, spec)
    names, shapes = _check(canary, spec)
    return LoadedCanary(canary, spec, path, function, build_seed, names, shapes, module=module)


def functions_of(module: Any) -> List[str]:
    """The functions `module` defines itself (not those it imports), in the file's order:
    what a misspelled NAME could have meant."""
    return [name for name, value in vars(module).items()
            if callable(value) and getattr(value, "__module__", None) == module.__name__
            and not isinstance(value, type) and not name.startswith("_")]
