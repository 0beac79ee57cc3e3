"""Op traces of any PyTorch model from module hooks (`--trace ops`; docs/bisect.md, "Op traces").

OpTracer hooks an nn.Module and, during each training step, keeps references to the
device tensors the C++ model hands its engine's trace() (canaries/architectures/gpt2/gpt2.cpp): every op's
forward output, then, op by op in reverse, the gradients its backward writes (the input
gradients first, then the parameter gradients), each as it stands once that op's backward
has added to it. Nothing is read to the host during the step; finish_step(), called after
optimizer.step() (canary_harness.torch.Recorder does), hands back the columns and tensors,
which the recorder hashes and sketches into the receipt's /trace row.

What an op is, from the module tree alone (no name matching):
- An op is a module call during which no other module is called (a leaf call, e.g.
  nn.Linear, nn.LayerNorm, or a module computing attention from qkv); a call that calls
  other modules is a container (a block, the model) and traces nothing itself. The root
  module is only ever a container. Calls made with grad disabled are not traced.
- Its name is the module's path in the model (`blocks.2.attn.proj`), or what `op_names`
  maps that path to; its layer is its index in the outermost nn.ModuleList above it
  (the block), -1 where there is none.
- Forward: each floating-point tensor output, tensor `<op>.out` kind `activation`
  (`<op>.out<j>` for the j-th of several); a 0-D output is kind `scalar` named `<op>`
  (the C++ `loss`). Forward hooks registered on the module before the tracer's (a fault's
  nudge) have run, so the traced value is what the next op reads.
- Backward, ops in reverse forward order: per tensor argument that requires grad, the
  gradient of that tensor after this op's backward added to it: a parameter passed in
  (the tied `wte` of `lm_head`) kind `gradient` under its canary name, another tensor
  kind `activation_grad` under its producer's `<op>.out`; then the op's own parameters
  (kind `gradient`). A tensor that several ops read (the residual stream, a tied
  weight) has its gradient summed in backward order: the first op to add to it traces its
  own contribution, the last one the whole gradient (a hook on the tensor itself, or on
  the parameter). An op's contribution is what the autograd nodes it made send to the
  argument (post-hooks on those nodes, found from the op's outputs when the op returns);
  where an op reads its argument more than once (an RMSNorm: x * rsqrt(mean(x^2))) its
  parts are added here, after the step, in the order autograd made them, as are the
  partial sums of the readers in between where three or more ops read a tensor.

Limits: one forward and one backward per step (no gradient accumulation over
micro-batches); the op sequence must be the same every step; an op output modified in
place after the op (an `inplace=True` activation after it) is refused at finish_step, as
the value the op produced is gone; a parameter a module owns and another module also
reads is traced with its whole gradient at the owner.

Hooks cost no host read and change no number: the graph autograd runs is the model's own
(no node is added: an argument handed to an op as a view of it would make the op's reads
of it one subtotal, and a gradient summed from three or more reads, the op's and others',
would be added in another order), hooks only keep references, and the parameters'
gradients are copied on the device (the update's clipping scales .grad in place).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..receipts.digest_plan import DigestPlan
from ..receipts.philox import stream_id
from ..receipts.receipt import TraceColumn
from ..runs.recording import host_float32

Site = Tuple[str, int, str, str, str]  # op, layer, phase, tensor, kind
OpNames = Union[Mapping[str, str], Callable[[str], str], None]


def output_column(op: str, output: torch.Tensor, index: int, outputs: int) -> str:
    """The trace column of output `index` of an op's `outputs` floating-point outputs: `<op>`
    for a 0-D one (the loss), `<op>.out`, or `<op>.out<j>` of several (module docstring)."""
    return op if output.dim() == 0 else (f"{op}.out" if outputs == 1 else f"{op}.out{index}")


class TraceError(ValueError):
    """A step whose op trace cannot be taken as asked (one line, naming the op)."""


def number_ops(sites: Sequence[Site]) -> List[TraceColumn]:
    """TraceColumns with op_index as the C++ numbers them (harness/run/op_trace.cpp):
    consecutive outputs of one (op, layer, phase) share an index."""
    columns: List[TraceColumn] = []
    for op, layer, phase, tensor, kind in sites:
        if not columns:
            index = 0
        else:
            last = columns[-1]
            index = last.op_index if (last.op, last.layer, last.phase) == (op, layer, phase) else last.op_index + 1
        columns.append(TraceColumn(index, op, int(layer), phase, tensor, kind))
    return columns


def module_layers(model: torch.nn.Module) -> Dict[torch.nn.Module, int]:
    """{module: its index in the outermost nn.ModuleList above it} for every module under one."""
    layers: Dict[torch.nn.Module, int] = {}
    for _, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList):
            for index, child in enumerate(module):
                for inner in child.modules():
                    layers.setdefault(inner, index)  # pre-order: the outermost list comes first
    return layers


class _Root:
    """A tensor the step's ops read or write: an op's output, a parameter, or another input."""

    __slots__ = ("tensor", "name", "param", "consumers", "total")

    def __init__(self, tensor: torch.Tensor, name: str, param: bool) -> None:
        self.tensor = tensor
        self.name = name
        self.param = param
        self.consumers: List[Tuple["_Call", int]] = []  # (op, contribution slot), forward order
        self.total: Optional[torch.Tensor] = None  # its whole gradient (non-parameters)


class _Call:
    __slots__ = ("module", "container", "inputs", "outputs")

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.container = False
        self.inputs: List[Tuple[int, _Root, int]] = []  # (argument, root, contribution slot)
        self.outputs: List[Tuple[_Root, torch.Tensor, int]] = []  # (root, tensor, its version)


def _grad_edge(t: torch.Tensor) -> Tuple[Any, int]:
    """Where a gradient for `t` goes: (its grad_fn, its output index), or (t, -1) for a leaf,
    whose AccumulateGrad node names it as .variable."""
    return (t.grad_fn, t.output_nr) if t.grad_fn is not None else (t, -1)


class OpTracer:
    """Traces the ops of `model`'s training steps (see the module docstring).

    param_names: {id(parameter): its canary name} (default: the model's own names);
    op_names: module path -> op name (a mapping, where paths it lacks keep their path, or a
    function). The hooks stay until close().
    """

    def __init__(self, model: torch.nn.Module, param_names: Optional[Mapping[int, str]] = None,
                 op_names: OpNames = None) -> None:
        self.model = model
        paths = {}
        for path, module in model.named_modules():
            paths.setdefault(module, path)
        if op_names is None:
            self._op_name = {m: p for m, p in paths.items()}
        elif callable(op_names):
            self._op_name = {m: op_names(p) for m, p in paths.items()}
        else:
            self._op_name = {m: op_names.get(p, p) for m, p in paths.items()}
        self._layers = module_layers(model)
        self._params = {id(p): p for p in model.parameters()}
        self.param_names: Dict[int, str] = dict(param_names) if param_names is not None else \
            {id(p): n for n, p in model.named_parameters()}
        owners: Dict[int, torch.nn.Module] = {}
        for _, module in model.named_modules():
            for _, p in module.named_parameters(recurse=False):
                owners.setdefault(id(p), module)
        self._owner = owners
        self._handles = []
        for module in paths:
            self._handles.append(module.register_forward_pre_hook(self._before))
            self._handles.append(module.register_forward_hook(self._after))
        for p in self._params.values():
            if p.requires_grad:
                self._handles.append(p.register_hook(functools.partial(self._on_param_grad, id(p))))
        self._reset()

    # ---- per step ------------------------------------------------------------------------------

    def _reset(self) -> None:
        self._calls: List[_Call] = []
        self._stack: List[_Call] = []
        self._roots: Dict[int, _Root] = {}  # id(tensor) -> root; _keep holds the tensors alive
        self._keep: List[torch.Tensor] = []
        self._parts: List[List[torch.Tensor]] = []  # per contribution slot: what the op's nodes sent
        self._param_grads: Dict[int, torch.Tensor] = {}
        # Autograd nodes that existed before the op being returned from (grad_fns of the tensors
        # seen so far, nodes of earlier ops): held, so that id() names each one, and never walked again.
        self._known: Dict[int, Any] = {}
        for handle in getattr(self, "_node_handles", []):
            handle.remove()
        self._node_handles: List[Any] = []

    def layer_of_parameter(self, param: torch.Tensor) -> int:
        owner = self._owner.get(id(param))
        return self._layers.get(owner, -1) if owner is not None else -1

    def _root_of(self, t: torch.Tensor, call: _Call, argument: int) -> _Root:
        root = self._roots.get(id(t))
        if root is not None:
            return root
        if id(t) in self._params:
            root = _Root(t, self.param_names.get(id(t), self._op_name.get(call.module, "") + f".in{argument}"), True)
        else:  # read by an op, produced by none: a model input, or computed outside any module
            root = _Root(t, f"{self._op_name[call.module]}.in{argument}", False)
            t.register_hook(functools.partial(self._on_total, root))
        self._roots[id(t)] = root
        self._keep.append(t)
        self._know(t)
        return root

    def _know(self, t: torch.Tensor) -> None:
        if t.grad_fn is not None:
            self._known.setdefault(id(t.grad_fn), t.grad_fn)

    def _before(self, module: torch.nn.Module, args: Tuple[Any, ...]) -> Optional[Tuple[Any, ...]]:
        if self._stack:
            self._stack[-1].container = True  # it called a module: a container, not an op
        if not torch.is_grad_enabled():
            return None
        call = _Call(module)
        self._stack.append(call)
        self._calls.append(call)
        # The arguments are handed on as they are (never a view: see the module docstring); the
        # op's contribution to each is found from its nodes when it returns (_hook_readers).
        for i, a in enumerate(args):
            if not (isinstance(a, torch.Tensor) and a.requires_grad and a.is_floating_point()):
                continue
            root = self._root_of(a, call, i)
            if any(r is root for _, r, _ in call.inputs):
                continue  # the same tensor again: one contribution, under its first argument
            call.inputs.append((i, root, len(self._parts)))
            self._parts.append([])
        return None

    def _after(self, module: torch.nn.Module, args: Tuple[Any, ...], output: Any) -> None:
        if not self._stack or self._stack[-1].module is not module:
            return None  # a call that began with grad disabled
        call = self._stack.pop()
        if call.container:
            return None
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        tensors = [t for t in outputs if isinstance(t, torch.Tensor) and t.is_floating_point()]
        self._hook_readers(call, [t for t in tensors if t.requires_grad])
        name = self._op_name[module]
        for j, t in enumerate(tensors):
            tensor = output_column(name, t, j, len(tensors))
            root = _Root(t, tensor, False)
            # An argument returned as it came (an identity, a dropout of p=0) stays its argument's
            # root: the ops that read it add to that gradient, after this op in backward order.
            if not any(argument.tensor is t for _, argument, _ in call.inputs):
                if t.requires_grad:
                    t.register_hook(functools.partial(self._on_total, root))
                self._roots[id(t)] = root
                self._keep.append(t)
                self._know(t)
            call.outputs.append((root, t, t._version))
        return None

    def _hook_readers(self, call: _Call, outputs: Sequence[torch.Tensor]) -> None:
        """Hooks each autograd node the op made that reads one of its arguments, so that the
        gradient that node sends the argument is kept as a part of the op's contribution. The
        op's nodes are those reached from its outputs before a node that existed before it."""
        slots = {}
        for _, root, slot in call.inputs:
            node, index = _grad_edge(root.tensor)
            slots[(id(node), index)] = slot
        pending = [t.grad_fn for t in outputs if t.grad_fn is not None]
        while pending:
            node = pending.pop()
            if id(node) in self._known:
                continue
            self._known[id(node)] = node  # once walked, an earlier op's for every later op
            for k, (nxt, index) in enumerate(node.next_functions):
                if nxt is None:
                    continue
                variable = getattr(nxt, "variable", None)  # an AccumulateGrad: the leaf it adds to
                slot = slots.get((id(variable), -1) if variable is not None else (id(nxt), index))
                if slot is not None:
                    self._node_handles.append(node.register_hook(functools.partial(self._on_part, slot, k)))
                elif id(nxt) not in self._known:
                    pending.append(nxt)

    def _on_part(self, slot: int, k: int, grad_inputs: Sequence[Optional[torch.Tensor]], _: Any) -> None:
        if grad_inputs[k] is not None:
            self._parts[slot].append(grad_inputs[k])

    @staticmethod
    def _on_total(root: _Root, grad: torch.Tensor) -> None:
        root.total = grad

    def _on_param_grad(self, key: int, grad: torch.Tensor) -> None:
        # A copy: AccumulateGrad may make this very tensor .grad, which clipping scales in place.
        self._param_grads[key] = grad.detach().clone()

    # ---- after the step --------------------------------------------------------------------------

    def _total(self, root: _Root) -> Optional[torch.Tensor]:
        return self._param_grads.get(id(root.tensor)) if root.param else root.total

    def _contribution(self, slot: int) -> Optional[torch.Tensor]:
        """What one op added to one argument's gradient: its nodes' parts, summed in the order
        autograd made them (None where it made none: an op that returned its argument)."""
        value = None
        for part in self._parts[slot]:
            value = part if value is None else value + part
        return value

    def finish_step(self) -> Tuple[List[Site], List[torch.Tensor]]:
        """The step's traced outputs (op, layer, phase, tensor, kind) and their device tensors,
        forward then backward, and starts the next step. Call it after the step (no host read)."""
        try:
            if self._stack:
                raise TraceError(f"op trace: module '{self._op_name[self._stack[-1].module]}' was called and has "
                                 "not returned")
            ops = [c for c in self._calls if not c.container]
            sites: List[Site] = []
            values: List[torch.Tensor] = []
            for call in ops:
                name, layer = self._op_name[call.module], self._layers.get(call.module, -1)
                for root, t, version in call.outputs:
                    if t._version != version:
                        raise TraceError(f"op trace: the output of op '{name}' was modified in place after the op "
                                         "(an in-place op after it); its value is gone and cannot be traced")
                    sites.append((name, layer, "forward", root.name, "scalar" if t.dim() == 0 else "activation"))
                    values.append(t.detach())
                for _, root, slot in call.inputs:
                    root.consumers.append((call, slot))
            for call in reversed(ops):
                name, layer = self._op_name[call.module], self._layers.get(call.module, -1)
                for _, root, slot in call.inputs:
                    sites.append((name, layer, "backward", root.name, "gradient" if root.param else "activation_grad"))
                    values.append(self._gradient_after(root, slot))
                for _, p in call.module.named_parameters(recurse=False):
                    if not p.requires_grad:
                        continue
                    grad = self._param_grads.get(id(p))
                    sites.append((name, layer, "backward", self.param_names.get(id(p), f"{name}.param"), "gradient"))
                    values.append(grad if grad is not None else torch.zeros_like(p, dtype=torch.float32))
            return sites, values
        finally:
            self._reset()

    def _gradient_after(self, root: _Root, slot: int) -> torch.Tensor:
        """The root's gradient once the op holding `slot` has added to it (ops add in reverse
        forward order)."""
        backward = [s for _, s in reversed(root.consumers)]
        k = backward.index(slot)
        if k == len(backward) - 1:
            value = self._total(root)
        elif k == 0:
            value = self._contribution(slot)
        else:
            value = None
            for s in backward[:k + 1]:
                part = self._contribution(s)
                if part is not None:
                    value = part if value is None else value + part
        if value is None:  # nothing flowed back into it: the C++ traces the zeroed gradient
            value = torch.zeros_like(root.tensor, dtype=torch.float32)
        return value.detach()

    def close(self) -> None:
        """Removes every hook."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._reset()


class StepTraces:
    """The /trace row of each step of a run (`--trace ops`): the OpTracer's ops, then the
    optimizer's, as the C++ update() traces them (the gradient norm the update clipped with,
    then each parameter after its update, op named after it), digested with one plan made at
    the first step. Every step must trace the columns of the first (TraceError otherwise)."""

    def __init__(self, model: torch.nn.Module, param_names: Mapping[int, str], op_names: OpNames = None) -> None:
        self.tracer = OpTracer(model, param_names, op_names)
        self.columns: Optional[List[TraceColumn]] = None
        self._digest: Any = None

    def row(self, step: int, grad_norm: np.ndarray, params: Sequence[Tuple[str, torch.Tensor, np.ndarray]]) -> Tuple:
        """(columns, hashes, sketches) of `step`: grad_norm a 1-element float32 array, params
        (canary name, parameter, its value now as a flat float32 host array) in canonical order."""
        try:
            sites, values = self.tracer.finish_step()
        except TraceError as e:
            raise TraceError(f"{e} (step {step})") from None
        if not sites:
            raise TraceError(f"op trace: no module op ran with grad enabled in step {step} (the model's forward and "
                             "backward must run in the step: for the Recorder, between two step() calls)")
        host = [host_float32(v).reshape(-1) for v in values]
        sites.append(("optimizer", -1, "optimizer", "grad_norm", "scalar"))
        host.append(grad_norm)
        for name, param, value in params:
            sites.append((name, self.tracer.layer_of_parameter(param), "optimizer", name, "parameter"))
            host.append(value.reshape(-1))
        columns = number_ops(sites)
        if self.columns is None:
            self.columns = columns
            self._digest = DigestPlan([a.size for a in host], [stream_id(c.tensor) for c in columns], [True] * len(host))
        elif columns != self.columns:
            raise TraceError(f"op trace: step {step} traced {len(columns)} outputs, other ones than step 0's "
                             f"{len(self.columns)}; the op sequence must not change from step to step")
        hashes, sketches = self._digest.run(host)
        return columns, hashes, sketches

    def close(self) -> None:
        self.tracer.close()
