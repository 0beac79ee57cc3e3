"""A Python canary's whole training state at the start of a step: what its checkpoints hold.

`capture_state` takes, at the start of step K: the model's and the optimizer's state_dict
(parameters, buffers, the moments, step counters and param groups with their lr), the
state_dict of every object the canary declares beyond them (its `schedulers` and `state`:
a LambdaLR's step count and base lrs; its lr_lambdas, code, stay the canary's), the RNG
states (torch's CPU generator, every CUDA device's when the run is on CUDA, Python's
`random` and numpy's global generator) and the data position (K: batch(i) is indexed by
step, so the position is the step). It is stored in the receipt
(ReceiptWriter.append_checkpoint), whose content hash makes it tamper-evident, as
torch.save({"tensors": {key: tensor}, "meta": JSON}): the tensors by key, everything else
(the nesting, numbers, strings) as JSON text that names them. `restore_state` loads it
with torch.load(weights_only=True), so no pickled code runs (torch 1.13's weights-only
loader refuses a float, which every optimizer's lr is: hence the JSON), after checking it
is this canary's and this step's.
"""

from __future__ import annotations

import io
import json
import random
from typing import Any, Dict, List

import numpy as np
import torch

from .canary import CanaryError, LoadedCanary, stateful_objects

STATE_VERSION = 1


class _Flat:
    """A value _flatten made already (a state_dict flattened under its owner's name)."""

    def __init__(self, data: Any) -> None:
        self.data = data


def _flatten(value: Any, tensors: List[torch.Tensor], where: str) -> Any:
    """`value` as JSON-able data, its tensors appended to `tensors` and named by index;
    `where`: whose state_dict it is in, for the error."""
    if isinstance(value, _Flat):
        return value.data
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return {"tensor": len(tensors) - 1}
    if isinstance(value, dict):
        return {"dict": [[_flatten(k, tensors, where), _flatten(v, tensors, where)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return {"tuple" if isinstance(value, tuple) else "list": [_flatten(v, tensors, where) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise CanaryError(f"a checkpoint cannot hold a {type(value).__name__} (in {where}'s state_dict); keep tensors, "
                      "numbers, strings, lists and dicts there")


def _unflatten(data: Any, tensors: Dict[str, torch.Tensor]) -> Any:
    (kind, value), = data.items()
    if kind == "tensor":
        return tensors[str(value)]
    if kind == "dict":
        return {_unflatten(k, tensors): _unflatten(v, tensors) for k, v in value}
    if kind in ("list", "tuple"):
        items = [_unflatten(v, tensors) for v in value]
        return tuple(items) if kind == "tuple" else items
    return value


def _numpy_rng() -> Dict[str, Any]:
    kind, keys, position, has_gauss, cached = np.random.get_state()
    return {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def _python_rng() -> Dict[str, Any]:
    version, internal, gauss = random.getstate()
    return {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss}


def capture_state(loaded: LoadedCanary, step: int, device: torch.device) -> bytes:
    """The canary's state at the start of `step`, serialized (module docstring)."""
    canary = loaded.canary
    identity = loaded.identity()
    tensors: List[torch.Tensor] = []

    def owned(label: str, obj: Any) -> _Flat:  # flattened on its own: an error names whose state_dict it is
        return _Flat(_flatten(obj.state_dict(), tensors, label))

    state = {
        "version": STATE_VERSION, "canary": identity["name"], "tensor_table_sha256": identity["tensor_table_sha256"],
        "step": int(step), "data_position": int(step),
        "model": owned("the model", canary.model), "optimizer": owned("the optimizer", canary.optimizer),
        "rng": {"torch": torch.get_rng_state(), "python": _python_rng(), "numpy": _numpy_rng(),
                "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else []},
    }
    declared = stateful_objects(canary)
    if declared:  # absent otherwise: a canary that declares nothing keeps its checkpoints' bytes
        state["declared"] = {label: owned(label, obj) for label, obj in declared.items()}
    meta = json.dumps(_flatten(state, tensors, "the harness"))
    buffer = io.BytesIO()
    torch.save({"tensors": {str(i): t for i, t in enumerate(tensors)}, "meta": meta}, buffer)
    return buffer.getvalue()


def restore_state(loaded: LoadedCanary, blob: bytes, step: int, device: torch.device) -> List[str]:
    """Loads a checkpoint taken at the start of `step` into the loaded canary (model,
    optimizer, the declared schedulers and state, RNG states); returns the labels of the
    declared objects it loaded (stateful_objects). CanaryError when it is another canary's
    or another step's."""
    try:
        stored = torch.load(io.BytesIO(blob), map_location=device, weights_only=True)
        state = _unflatten(json.loads(stored["meta"]), stored["tensors"])
    except Exception as e:  # a blob torch cannot read: the receipt's content hash matched, so it was written so
        raise CanaryError(f"the checkpoint of step {step} cannot be loaded ({type(e).__name__}: {e})") from None
    identity = loaded.identity()
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise CanaryError(f"the checkpoint of step {step} is not a canary state of version {STATE_VERSION}")
    if state.get("canary") != identity["name"] or state.get("tensor_table_sha256") != identity["tensor_table_sha256"]:
        raise CanaryError(f"the checkpoint of step {step} is of canary '{state.get('canary')}' with other tensors, "
                          f"not of '{identity['name']}' as the receipt's run; it was taken from another receipt")
    if state.get("step") != step:
        raise CanaryError(f"the checkpoint recorded for step {step} holds step {state.get('step')}; not trusted")
    canary = loaded.canary
    canary.model.load_state_dict(state["model"])
    canary.optimizer.load_state_dict(state["optimizer"])
    restored = _restore_declared(loaded, state.get("declared", {}))
    rng = state["rng"]
    torch.set_rng_state(rng["torch"].cpu())
    if device.type == "cuda" and rng["cuda"]:
        torch.cuda.set_rng_state_all([s.cpu() for s in rng["cuda"]])
    py = rng["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["internal"].tolist()), py["gauss"]))
    npr = rng["numpy"]
    np.random.set_state((npr["kind"], npr["keys"].cpu().numpy().astype(np.uint32), npr["position"],
                         npr["has_gauss"], npr["cached_gaussian"]))
    return restored


def _restore_declared(loaded: LoadedCanary, held: Dict[str, Any]) -> List[str]:
    """The declared objects' state loaded from the checkpoint's (held: label -> state_dict);
    returns the labels loaded. An object the checkpoint holds no state of (it was recorded
    before the declaration) stays as NAME() built it, and state held for an object no longer
    declared is unused: if the step depends on either, the replay differs, and says so where
    the lr does (canary_harness.runs.replay)."""
    restored = []
    for label, obj in stateful_objects(loaded.canary).items():
        if label in held:
            obj.load_state_dict(held[label])
            restored.append(label)
    return restored
