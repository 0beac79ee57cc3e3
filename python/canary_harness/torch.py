"""Receipts from any PyTorch training loop: `canary_harness.torch.Recorder`.

    pack = read_pack("tiny-pack.h5", canary="tiny")
    model.load_state_dict(...)                       # the pack's init (pack.init), by your names
    recorder = Recorder("run.h5", model, optimizer, pack=pack, name_map=NAME_MAP,
                        budget_features="torch-cpu")
    for step in range(pack.steps):
        tokens = pack.batch(step)
        loss = model(torch.from_numpy(tokens).to(device))
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # norm before clipping
        optimizer.step()
        recorder.step(loss=loss, grad_norm=grad_norm, lr=lr, batch=tokens)   # after the step
        optimizer.zero_grad()
    recorder.close()

What each step records (docs/design.md, the receipt contract): the loss, the gradient norm
before clipping, the learning rate, the batch hash, and the hashes and sketches of the
parameters after the update, the gradients (after clipping: `.grad` as the optimizer used
it) and Adam's moments (`optimizer.state[p]["exp_avg"]`, `["exp_avg_sq"]`, as PyTorch's
Adam and AdamW keep them) of every canary tensor, in the canary's canonical order.

The recorder reads host values only in step(), which you call after optimizer.step(): it
installs no hooks (unless it traces ops) and touches nothing during the forward, backward
or update, so a step stays one graph under torch_xla (call `xm.mark_step()` before
`recorder.step()` there, as after any XLA step).

With `trace="ops"` it also writes op traces (/trace, docs/bisect.md): module hooks
(canary_harness.trace.OpTracer) keep the device tensors of every op's forward output and
of the gradients its backward writes during the step, and step() hashes and sketches
them, then the optimizer's: the gradient norm and every parameter after its update. Op
names are module paths (the package's GPT2's are the C++ op names), or `op_names`'s.

The name map ({your parameter name: canary tensor name}; None when
your names are the canary's) is checked in full before the receipt is created: a canary
tensor no parameter maps to, a parameter of the model that maps to none, a name that is
not a parameter, two parameters on one tensor, a shape that differs, or a parameter the
optimizer does not hold is a RecorderError naming it, and no file is written.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import xxhash

from .digest import SketchLayout, as_float32, batch_hash
from .philox import stream_id
from .receipt import PathLike, ReceiptWriter, TraceColumn
from .schema import HASH_FAMILIES, SKETCH_FAMILIES
from .stack import StackInfo


class RecorderError(ValueError):
    """A recorder that cannot record this model/optimizer as asked (one line, naming the tensor)."""


def _host_float(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().to(device="cpu", dtype=torch.float64))
    return float(value)


def _host_float32(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's values on the host as C-contiguous float32, copied only when they must be.

    A contiguous fp32 CPU tensor is its own numpy view (no copy); another device is read
    once (one transfer per tensor), and the hash and the sketch are then both taken from
    that one host copy. Anything else goes through as_float32 (its checks included).
    """
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.float32 and t.is_contiguous() and not t.is_conj() and not t.is_neg():
        return t.numpy()
    return as_float32(t)


def _check_name_map(model: torch.nn.Module, name_map: Optional[Mapping[str, str]], tensor_names: Sequence[str],
                    shapes: Optional[Mapping[str, Tuple[int, ...]]]) -> Dict[str, torch.nn.Parameter]:
    """{canary name: the model's parameter}, in canonical order; RecorderError naming what does not fit."""
    params = dict(model.named_parameters())  # a tied parameter appears once, under its first name
    if name_map is None:
        name_map = {n: n for n in params}
    for user in name_map:
        if user not in params:
            known = ", ".join(list(params)[:4])
            raise RecorderError(f"name_map: '{user}' is not a parameter of the model (its parameters: {known}, ...)")
    canary = set(tensor_names)
    by_canary: Dict[str, str] = {}
    for user, target in name_map.items():
        if target not in canary:
            raise RecorderError(f"name_map: '{user}' maps to '{target}', which is not a tensor of the canary")
        if target in by_canary:
            raise RecorderError(f"name_map: '{by_canary[target]}' and '{user}' both map to canary tensor '{target}'")
        by_canary[target] = user
    unmapped = [user for user in params if user not in name_map]
    for name in tensor_names:
        if name not in by_canary:
            hint = f" (the model's unmapped parameters: {', '.join(unmapped[:3])})" if unmapped else ""
            raise RecorderError(f"name_map misses canary tensor '{name}': map the model's parameter that holds it{hint}")
    if unmapped:
        raise RecorderError(f"name_map: the model's parameter '{unmapped[0]}' maps to no canary tensor "
                            "(the canary has no such tensor: the model is not the canary)")
    mapped = {name: params[by_canary[name]] for name in tensor_names}
    if shapes is not None:
        for name, param in mapped.items():
            if tuple(param.shape) != tuple(shapes[name]):
                raise RecorderError(f"parameter '{by_canary[name]}' has shape {tuple(param.shape)}, canary tensor "
                                    f"'{name}' has {tuple(shapes[name])}")
    return mapped


class Recorder:
    """Records a PyTorch training loop into a receipt, one step per step() call.

    The canary (its JSON, the tensor names and shapes, the seed and the steps) comes from
    `pack` (canary_harness.pack.CanaryPack), or from `canary`, `tensor_names`, `seed` and
    `steps` when you train without one. `lane` defaults to "<canary>/<engine>[+features]".
    `budget_features` is required: what separates this run from the bitwise reference
    ("torch-cpu", "torch-bf16", ...; docs/design.md, "Budget features are declared").
    `extra` adds manifest attributes (str, int or float); `record_batches` keeps every
    batch's tokens in /batches/tokens. `trace="ops"` writes op traces (the module docstring;
    `op_names`: module path -> op name, a mapping or a function, for canary_harness.trace).
    `audit=True` records, per step, the step's op graph fingerprint and compile counters in
    /compile (canary_harness.audit.CompileLog: UncachedCompile, CachedCompile, HostSync,
    Fingerprint): from the recorder's creation to the first step() call is step 0, from
    each step() call to the next the next step. It enters torch dispatch and function modes
    for that (left in step(), in close(), and on an exception when the recorder is used as a
    context manager), which change no number.
    `recorder.audit.findings` and `.summary()` give the audit's findings so far.
    """

    def __init__(self, path: PathLike, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 name_map: Optional[Mapping[str, str]] = None, *, budget_features: str, pack: Any = None,
                 canary: Union[str, Mapping[str, Any], None] = None, tensor_names: Optional[Sequence[str]] = None,
                 seed: Optional[int] = None, steps: Optional[int] = None, lane: Optional[str] = None,
                 engine: str = "torch", features: str = "", record_batches: bool = False,
                 extra: Optional[Mapping[str, Any]] = None, overwrite: bool = False,
                 stack: Optional[StackInfo] = None, trace: str = "none", op_names: Any = None,
                 audit: bool = False) -> None:
        if trace not in ("none", "ops"):
            raise RecorderError(f"trace='{trace}': use 'none' or 'ops'")
        shapes = None
        batch_shape = None
        if pack is not None:
            canary = pack.canary_json
            tensor_names = pack.tensor_names
            shapes = {n: tuple(pack.init[n].shape) for n in pack.tensor_names}
            seed = pack.seed if seed is None else seed
            steps = pack.steps if steps is None else steps
            batch_shape = pack.batch_shape
            if steps > pack.steps:
                raise RecorderError(f"steps {steps}: the pack {pack.path} holds {pack.steps} batches")
            canary_name = pack.name
        else:
            missing = [k for k, v in (("canary", canary), ("tensor_names", tensor_names), ("seed", seed),
                                      ("steps", steps)) if v is None]
            if missing:
                raise RecorderError(f"Recorder needs a pack, or {', '.join(missing)}")
            canary_name = (canary if isinstance(canary, Mapping) else json.loads(canary)).get("preset", "?")
        self.tensor_names: List[str] = list(tensor_names)
        self.parameters = _check_name_map(model, name_map, self.tensor_names, shapes)
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for name, param in self.parameters.items():
            if id(param) not in held:
                raise RecorderError(f"canary tensor '{name}': its parameter is not one the optimizer updates")
        self.optimizer = optimizer
        self.steps_recorded = 0
        manifest: Dict[str, Any] = {
            "lane": lane or f"{canary_name}/{engine}" + (f"+{features}" if features else ""),
            "engine": engine, "features": features, "budget_features": budget_features, "canary": canary,
            "seed": int(seed), "steps_planned": int(steps), "threads": torch.get_num_threads(),
        }
        if pack is not None:
            manifest["data_seed"] = pack.data_seed
            manifest["pack"] = os.path.basename(pack.path)
        manifest["trace"] = trace
        manifest.update(extra or {})
        self.writer = ReceiptWriter(path, manifest, self.tensor_names, overwrite=overwrite,
                                    batch_shape=batch_shape if record_batches else None, stack=stack)
        self.path = self.writer.path
        self._record_batches = record_batches and batch_shape is not None  # as the writer keeps batches
        # Params and grads of every tensor sketched in one pass (digest.SketchLayout): block
        # codes and gathers drawn here, scratch buffers at the first step, both kept.
        salts = [stream_id(n) for n in self.tensor_names]
        self._sketcher = SketchLayout([p.numel() for p in self.parameters.values()] * len(SKETCH_FAMILIES),
                                      salts * len(SKETCH_FAMILIES))
        self.tracer = None
        self._trace_columns: Optional[List[TraceColumn]] = None
        self._trace_sketcher: Optional[SketchLayout] = None
        if trace == "ops":
            from .trace import OpTracer  # hooks the model from here on: after any hook of yours (a fault)
            self.tracer = OpTracer(model, {id(p): n for n, p in self.parameters.items()}, op_names)
        self.audit = None
        if audit:
            # From here to each step() call is a step: its ops, fingerprinted (canary_harness.audit).
            from .audit import CompileLog
            self.audit = CompileLog()
            self.audit.begin(0)

    def _state(self, name: str, param: torch.Tensor, key: str) -> torch.Tensor:
        state = self.optimizer.state.get(param, {})
        if key not in state:
            raise RecorderError(f"canary tensor '{name}': optimizer.state has no '{key}' (an Adam-like optimizer "
                                "keeps exp_avg and exp_avg_sq; call step() after optimizer.step())")
        return state[key]

    def step(self, *, loss: Any, grad_norm: Any, batch: Any, lr: Any = None) -> None:
        """Records the step just taken: call it after optimizer.step() and before zero_grad().

        loss, grad_norm (before clipping) and lr may be tensors (read here, after the step)
        or numbers; lr defaults to the first param group's. batch: the step's int32 tokens
        (B, T+1), numpy or tensor.
        """
        compile_row = None
        if self.audit is not None:  # the step ends here, before anything below reads a value
            if not self.audit.active:
                raise RecorderError(f"audit: step {self.steps_recorded} was not recorded (an earlier step() failed)")
            from .audit import AuditError
            try:
                compile_row = self.audit.end()
            except AuditError as e:
                raise RecorderError(f"audit: step {self.steps_recorded}: {e}") from None
        grads: Dict[str, torch.Tensor] = {}
        for name, param in self.parameters.items():
            if param.grad is None:
                raise RecorderError(f"canary tensor '{name}' has no gradient at step {self.steps_recorded}: "
                                    "call step() after optimizer.step() and before optimizer.zero_grad()")
            grads[name] = param.grad
        adam_m = {name: self._state(name, p, "exp_avg") for name, p in self.parameters.items()}
        adam_v = {name: self._state(name, p, "exp_avg_sq") for name, p in self.parameters.items()}
        if lr is None:
            lr = self.optimizer.param_groups[0]["lr"]
        norm_value = None
        if self.tracer is not None:  # the traced norm: the fp32 value the update clipped with
            norm_value = _host_float32(grad_norm.detach().to(torch.float32)).reshape(-1) \
                if isinstance(grad_norm, torch.Tensor) else np.array([grad_norm], dtype=np.float32)
        loss, grad_norm, lr = _host_float(loss), _host_float(grad_norm), _host_float(lr)
        batch = batch.detach().cpu() if isinstance(batch, torch.Tensor) else batch
        # What ReceiptWriter.record_step computes, faster: each tensor read to the host once,
        # hashed from that buffer (no copy) and, for params and grads, sketched together.
        families = dict(zip(HASH_FAMILIES, (self.parameters, grads, adam_m, adam_v)))
        host = {fam: [_host_float32(tensors[n]) for n in self.tensor_names] for fam, tensors in families.items()}
        K = len(self.tensor_names)
        hashed, together = self._sketcher.hash_and_sketch([a for fam in SKETCH_FAMILIES for a in host[fam]])
        hashes = {fam: hashed[f * K:(f + 1) * K] for f, fam in enumerate(SKETCH_FAMILIES)}
        hashes.update({fam: [xxhash.xxh3_64_intdigest(a, seed=0) for a in host[fam]]
                       for fam in HASH_FAMILIES if fam not in SKETCH_FAMILIES})
        sketches = {fam: together[f * K:(f + 1) * K] for f, fam in enumerate(SKETCH_FAMILIES)}
        trace = self._trace_row(norm_value, host["params"]) if self.tracer is not None else None
        self.writer.append_step(loss=loss, grad_norm=grad_norm, lr=lr, batch_hash=batch_hash(batch), hashes=hashes,
                                sketches=sketches, batch_tokens=batch if self._record_batches else None, trace=trace,
                                compile=compile_row)
        self.steps_recorded += 1
        if self.audit is not None and self.steps_recorded < self.writer.steps_planned:
            self.audit.begin(self.steps_recorded)  # the next step starts here

    def _trace_row(self, grad_norm: Any, params: List[np.ndarray]):
        """The step's /trace row: the tracer's ops, then the optimizer's (the C++ update()):
        the gradient norm, and each parameter after its update (op named after it)."""
        from .trace import TraceError, number_ops

        try:
            sites, values = self.tracer.finish_step()
        except TraceError as e:
            raise RecorderError(f"{e} (step {self.steps_recorded})") from None
        if not sites:
            raise RecorderError(f"op trace: no module op ran with grad enabled in step {self.steps_recorded} "
                                "(trace='ops' needs the model's forward and backward between two step() calls)")
        host = [_host_float32(v).reshape(-1) for v in values]
        sites.append(("optimizer", -1, "optimizer", "grad_norm", "scalar"))
        host.append(grad_norm)
        for (name, param), value in zip(self.parameters.items(), params):
            sites.append((name, self.tracer.layer_of_parameter(param), "optimizer", name, "parameter"))
            host.append(value.reshape(-1))
        columns = number_ops(sites)
        if self._trace_columns is None:
            self._trace_columns = columns
            self._trace_sketcher = SketchLayout([a.size for a in host], [stream_id(c.tensor) for c in columns])
        elif columns != self._trace_columns:
            raise RecorderError(f"op trace: step {self.steps_recorded} traced {len(columns)} outputs, other ones "
                                f"than step 0's {len(self._trace_columns)}; the op sequence must not change from "
                                "step to step")
        hashes, sketches = self._trace_sketcher.hash_and_sketch(host)
        return columns, hashes, sketches

    def dump_tensors(self, step: int) -> None:
        """/tensors/step_XXXXXX: the parameters now (at the start of `step`), by canary name."""
        self.writer.dump_tensors(step, {n: p.detach() for n, p in self.parameters.items()})

    def close(self) -> None:
        """Closes the receipt: complete = 1 when every planned step was recorded (and removes
        the op tracer's hooks and the audit's modes)."""
        if self.audit is not None:
            self.audit.abandon()
        if self.tracer is not None:
            self.tracer.close()
        self.writer.close()

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.audit is not None:
            self.audit.abandon()
        if self.tracer is not None:
            self.tracer.close()
        self.writer.__exit__(exc_type, exc, tb)
