"""The op oracle's capture of one step at module outputs (`capture-ops --level modules`;
docs/oracle.md, "At module outputs").

Where a step's aten ops cannot be seen one by one as they compute (torch_xla runs the step
as one compiled graph, where the dispatch mode sees lazy tensors; torch.compile runs
Inductor's fused kernels, which no dispatch mode sees), the oracle judges what the
modules hand each other: during the step's forward each op module (a module call during
which no other module is called, as `--trace ops` names ops: tracing/trace.py) has its
inputs, its own parameters (before the optimizer updates them in place) and its output
cloned on the device; after the step each is read to the CPU and recomputed in float64
with what its rounding bound scales. MODULES says, by module class, what a module
computes; the harness judges (engines/numerics/rounding_bounds.h, through
harness/run/python_oracle.cpp), as it does capture-ops' aten results:

- nn.Linear: a dot product of in_features terms, its bias one more (`dot`);
- the LM head (x @ wte^T): a dot product of C terms;
- a residual add and the embedding (wte[token] + wpe[position]): one rounding of an exact
  sum (`rounded`);
- nn.LayerNorm: `layer_norm`, judged from its input, weight and bias alone, whatever order
  its kernel sums in (the bound in engines/numerics/rounding_bounds.h): the mean, the
  variance and the output's terms are written beside the values;
- Llama's RMSNorm: the same bound, of a layer norm whose mean is exactly 0 (none is
  computed or subtracted) and that adds no bias;
- Llama's RoPE (x1 c - x2 s, x2 c + x1 s): two roundings of an exact sum of two products
  (`rounded`, also where a fused multiply-add saves one); its embedding (wte[token]): a
  copy, exact.

- the attention core (gpt2's from qkv, Llama's grouped-query from q, k and v): causal
  softmax(q k^T / sqrt(hs)) v, whose probabilities the oracle does not see: `attention`,
  judged from q, k and v alone with exp at the stacks' measured worst case (the bound in
  engines/numerics/function_bounds.h): per output element its row's keys, largest sum |q k_j|
  and |q . k_j| and the scores' spread, and sum |v_jc|, written beside the values.

- nn.GELU, either form (`approximate`): `gelu_tanh` or `gelu_erf`, its tanh or erf at the
  stacks' measured worst case (the bound in engines/numerics/function_bounds.h): the input,
  the exact argument and f of it written beside the values.

- Llama's SwiGLU, silu(gate) up: `swiglu`, SiLU within the stacks' measured relative error
  and the product's rounding (engines/numerics/function_bounds.h), |up| written beside.

- the loss (GPT-2's and Llama's, the mean cross-entropy over all positions): `cross_entropy`,
  its exp and log at the stacks' measured worst case (engines/numerics/function_bounds.h):
  per row its max, log of its softmax's sum, its target's logit and its spread written
  beside the one value.

Any other op module is listed as not judged, by class,
as are modules under bf16 autocast (their operands are rounded inside the module, which the
fp32 bounds here do not allow) and calls made with grad disabled (a held-out evaluation).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ..models import llama
from ..models.gpt2 import Attention, Embedding, LmHead, Loss, Residual, embed
from .op_capture import (FORMATS, GELU_KINDS, CapturedResult, StepCapture, clone, flat_float64, float64_on_cpu,
                         gelu_terms, layer_norm_exact)
from .aten_trace import user_site
from .trace import output_column


class Recomputed(NamedTuple):
    """A module's exact output in float64, the count its bound takes (K, roundings, C, hs or
    V), its magnitude and any further terms its kind's bound reads (by name, each shaped as
    the output but the loss's, which are per row)."""

    exact: torch.Tensor
    count: int
    magnitude: torch.Tensor
    terms: Dict[str, torch.Tensor]


class ModuleArithmetic(NamedTuple):
    """What a module class computes: `kind` (dot, rounded, layer_norm, attention, gelu_*, swiglu,
    cross_entropy),
    `operands(module, args)` (the tensors it computes from: its arguments and own parameters,
    in the order `recompute` takes them), `recompute(module, float64 operands)`, and where a
    module's attribute chooses the kind (nn.GELU's `approximate`), `kind_of(module)`."""

    kind: str
    operands: Callable[[torch.nn.Module, Tuple[Any, ...]], List[Optional[torch.Tensor]]]
    recompute: Callable[[torch.nn.Module, List[Optional[torch.Tensor]]], Recomputed]
    kind_of: Optional[Callable[[torch.nn.Module], str]] = None


def _abs(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.abs()


def _linear(module: torch.nn.Module, ops: List[Optional[torch.Tensor]]) -> Recomputed:
    x, weight, bias = ops
    terms = int(weight.shape[-1]) + (0 if bias is None else 1)
    return Recomputed(F.linear(x, weight, bias), terms, F.linear(x.abs(), weight.abs(), _abs(bias)), {})


def _lm_head(module: torch.nn.Module, ops: List[Optional[torch.Tensor]]) -> Recomputed:
    x, wte = ops
    return Recomputed(F.linear(x, wte), int(wte.shape[-1]), F.linear(x.abs(), wte.abs()), {})


def _residual(module: torch.nn.Module, ops: List[Optional[torch.Tensor]]) -> Recomputed:
    x, branch = ops
    return Recomputed(x + branch, 1, x.abs() + branch.abs(), {})


def _embedding(module: torch.nn.Module, ops: List[Optional[torch.Tensor]]) -> Recomputed:
    tokens, wte, wpe = ops
    return Recomputed(embed({"wte": wte, "wpe": wpe}, tokens), 1, embed({"wte": wte.abs(), "wpe": wpe.abs()}, tokens), {})


def _layer_norm(module: torch.nn.Module, ops: List[Optional[torch.Tensor]]) -> Recomputed:
    """The exact output and the terms of layer_norm_output_bound (rounding_bounds.h), per
    element: |x - mu| r |w|, |w| r A, |b| and the row's rho = (S + mu^2) / (v + eps)."""
    x, weight, bias = ops
    exact = layer_norm_exact(x, module.normalized_shape, weight, bias, module.eps)
    return Recomputed(exact.out, int(np.prod(module.normalized_shape)), exact.scaled,
                      {"offset": exact.offset, "mean_term": exact.mean_term,
                       "conditioning": exact.conditioning.expand(exact.out.shape)})


def _rms_norm(module: torch.nn.Module, ops: List[Optional[torch.Tensor]]) -> Recomputed:
    """x r w with r = (S + eps)^(-1/2), S the row's mean square: a layer norm's terms
    (_layer_norm) with mean 0, no offset, and rho = S / (S + eps)."""
    x, weight = ops
    square = (x * x).mean(-1, keepdim=True)
    r = 1.0 / torch.sqrt(square + module.eps)
    scaled = x * r * weight
    shape, nothing = scaled.shape, torch.zeros(scaled.shape, dtype=x.dtype)
    return Recomputed(scaled, int(x.shape[-1]), scaled.abs(),
                      {"offset": nothing, "mean_term": nothing, "conditioning": (square / (square + module.eps)).expand(shape)})


def _rope(module: torch.nn.Module, ops: List[Optional[torch.Tensor]]) -> Recomputed:
    """The module's own forward in float64. Its terms |x1 c| + |x2 s| and |x2 c| + |x1 s|
    are, element by element, the larger of the forward of |x|, |c|, |s| (whose first half
    subtracts them) and of |x|, |c|, -|s| (whose second half does)."""
    x, cos, sin = ops
    magnitude = torch.maximum(module.forward(x.abs(), cos.abs(), sin.abs()),
                              module.forward(x.abs(), cos.abs(), -sin.abs()))
    return Recomputed(module.forward(x, cos, sin), 2, magnitude, {})


def _gelu(module: torch.nn.Module, ops: List[Optional[torch.Tensor]]) -> Recomputed:
    """nn.GELU's form (`approximate`) in float64, and the terms of gelu_output_bound."""
    (x,) = ops
    exact = F.gelu(x, approximate=module.approximate)
    return Recomputed(exact, 1, exact.abs(), gelu_terms(x, module.approximate))


def _swiglu(module: torch.nn.Module, ops: List[Optional[torch.Tensor]]) -> Recomputed:
    """silu(gate) * up in float64; |up| beside, as the result's shape (swiglu_output_bound)."""
    gate, up = ops
    exact = F.silu(gate) * up
    return Recomputed(exact, 1, exact.abs(), {"up": up.abs().expand_as(exact)})


def _cross_entropy(module: torch.nn.Module, ops: List[Optional[torch.Tensor]]) -> Recomputed:
    """The mean cross-entropy over all B*T positions in float64, and per row the terms of
    cross_entropy_mean_bound: its max, log of its softmax's sum, its target's logit and its
    spread (max less min); count V, the row's length."""
    logits, targets = ops
    rows, target = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    top = rows.amax(-1, keepdim=True)
    terms = {"max": top[:, 0], "log_sum": torch.log(torch.exp(rows - top).sum(-1)),
             "target": rows.gather(1, target[:, None])[:, 0], "spread": (top - rows).amax(-1)}
    exact = F.cross_entropy(rows, target)
    return Recomputed(exact, int(rows.shape[-1]), exact.abs(), terms)


def _llama_embedding(module: torch.nn.Module, ops: List[Optional[torch.Tensor]]) -> Recomputed:
    tokens, wte = ops
    exact = F.embedding(tokens, wte)
    return Recomputed(exact, 0, exact.abs(), {})  # a copy: no rounding


def _attention_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Recomputed:
    """Causal softmax(q k^T / sqrt(hs)) v per head, q, k, v (B,NH,T,hs) in float64, and per
    output element the terms of attention_output_bound (engines/numerics/function_bounds.h):
    count hs; its row's keys, max_j sum |q k_j| and max_j |q . k_j|, and spread max_j |s_j - m|
    (scores s = q . k / sqrt(hs)); M = sum_j p_j |v_jc| the magnitude, V = sum_j |v_jc|."""
    T, hs = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(hs)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    dots = q @ k.transpose(-2, -1)                                        # (B,NH,T,T)
    scores = (dots * scale).masked_fill(~causal, float("-inf"))
    p = torch.softmax(scores, dim=-1)

    def row(t: torch.Tensor) -> torch.Tensor:  # a row's value (B,NH,T) for each of its output elements
        return t[..., None].expand(q.shape)
    terms = {
        "keys": row(causal.sum(-1).to(q.dtype).expand(q.shape[:-1])),  # t + 1 in row t
        "abs_products": row((q.abs() @ k.abs().transpose(-2, -1)).masked_fill(~causal, 0).amax(-1)),
        "abs_dot": row(dots.abs().masked_fill(~causal, 0).amax(-1)),
        "spread": row(scores.amax(-1) - scores.masked_fill(~causal, float("inf")).amin(-1)),
        "abs_values": causal.to(q.dtype) @ v.abs(),
    }
    return Recomputed(p @ v, hs, p @ v.abs(), terms)


def _rejoined(r: Recomputed) -> Recomputed:
    """(B,NH,T,hs) heads back to (B,T,NH*hs), as the attention modules re-join them."""
    def join(t: torch.Tensor) -> torch.Tensor:
        B, NH, T, hs = t.shape
        return t.transpose(1, 2).reshape(B, T, NH * hs)
    return Recomputed(join(r.exact), r.count, join(r.magnitude), {name: join(t) for name, t in r.terms.items()})


def _gpt2_attention(module: torch.nn.Module, ops: List[Optional[torch.Tensor]]) -> Recomputed:
    """gpt2's attention core from qkv (B,T,3C): q, k, v split and viewed as attention_core does."""
    (qkv,) = ops
    B, T, C3 = qkv.shape
    C = C3 // 3
    heads = [t.reshape(B, T, module.heads, C // module.heads).transpose(1, 2) for t in qkv.split(C, dim=-1)]
    return _rejoined(_attention_heads(*heads))


def _llama_attention(module: torch.nn.Module, ops: List[Optional[torch.Tensor]]) -> Recomputed:
    """Llama's grouped-query attention: kv head h // (NH/NKV) for query head h, as gqa_attention."""
    q, k, v = ops
    B, T, width = q.shape
    hd = width // module.heads

    def heads(t: torch.Tensor, count: int) -> torch.Tensor:
        return t.reshape(B, T, count, hd).transpose(1, 2).repeat_interleave(width // hd // count, dim=1)
    return _rejoined(_attention_heads(heads(q, module.heads), heads(k, module.kv_heads), heads(v, module.kv_heads)))


def _arguments(count: int) -> Callable[[torch.nn.Module, Tuple[Any, ...]], List[Optional[torch.Tensor]]]:
    return lambda module, args: list(args[:count])


def _with_parameters(module: torch.nn.Module, args: Tuple[Any, ...]) -> List[Optional[torch.Tensor]]:
    return [args[0], module.weight, module.bias]


def _with_weight(module: torch.nn.Module, args: Tuple[Any, ...]) -> List[Optional[torch.Tensor]]:
    return [args[0], module.weight]


# By module class (the model's own op modules, models/gpt2.py, and torch's): the one table.
MODULES: Dict[type, ModuleArithmetic] = {
    torch.nn.Linear: ModuleArithmetic("dot", _with_parameters, _linear),
    torch.nn.LayerNorm: ModuleArithmetic("layer_norm", _with_parameters, _layer_norm),
    torch.nn.GELU: ModuleArithmetic("gelu", _arguments(1), _gelu, lambda module: GELU_KINDS[module.approximate]),
    LmHead: ModuleArithmetic("dot", _arguments(2), _lm_head),
    Residual: ModuleArithmetic("rounded", _arguments(2), _residual),
    Attention: ModuleArithmetic("attention", _arguments(1), _gpt2_attention),
    llama.Attention: ModuleArithmetic("attention", _arguments(3), _llama_attention),
    llama.Residual: ModuleArithmetic("rounded", _arguments(2), _residual),
    Embedding: ModuleArithmetic("rounded", _arguments(3), _embedding),
    llama.RMSNorm: ModuleArithmetic("layer_norm", _with_weight, _rms_norm),
    llama.Rope: ModuleArithmetic("rounded", _arguments(3), _rope),
    llama.Embedding: ModuleArithmetic("rounded", _arguments(2), _llama_embedding),
    llama.SwiGLU: ModuleArithmetic("swiglu", _arguments(2), _swiglu),
    Loss: ModuleArithmetic("cross_entropy", _arguments(2), _cross_entropy),
    llama.Loss: ModuleArithmetic("cross_entropy", _arguments(2), _cross_entropy),
}


# The kinds whose bounds take an elementary function at its worst case as measured on the CPU
# stacks (engines/numerics/function_bounds.h): judged only where the module ran on a CPU (eager,
# compiled, or torch_xla's PJRT CPU client), never on CUDA's or a TPU's functions.
FUNCTION_KINDS = {"attention", "gelu", "swiglu", "cross_entropy"}


def _hardware(device: torch.device) -> str:
    """CPU for the CPU and torch_xla's PJRT CPU client; the device's hardware otherwise."""
    if device.type == "xla":
        import torch_xla.core.xla_model as xm
        return xm.xla_device_hw(device)
    return "CPU" if device.type == "cpu" else device.type.upper()


def _kind(call: "_Call") -> str:
    arithmetic = call.arithmetic
    return arithmetic.kind if arithmetic.kind_of is None else arithmetic.kind_of(call.module)


def _name(module: torch.nn.Module) -> str:
    return type(module).__name__.lstrip("_")  # a team's own op modules may be private


class _Call(NamedTuple):
    path: str
    module: torch.nn.Module
    arithmetic: ModuleArithmetic
    operands: List[Optional[torch.Tensor]]  # clones on the device
    output: torch.Tensor                    # a clone on the device
    occurrence: int
    site: str                               # the file:line of the team's code that called it


class ModuleCapture:
    """Captures the op modules of one training step of `model` (module docstring): `with
    capture.step():` around the whole step, then finish() for what it saw. `autocast`:
    whether the step runs under bf16 autocast (nothing is judged then)."""

    def __init__(self, model: torch.nn.Module, autocast: bool = False) -> None:
        self._autocast = autocast
        self._active = False
        self._calls_begun = 0  # to tell a leaf call: no module call begins inside it
        self._entered: List[Tuple[str, int, Optional[Tuple[Any, ...]], str]] = []
        self._calls: List[_Call] = []
        self._not_judged: Dict[str, int] = {}
        self._occurrences: Dict[str, int] = {}
        self._handles = []
        for path, module in model.named_modules():
            if path:  # the root is only ever a container
                self._handles.append(module.register_forward_pre_hook(self._enter(path)))
                self._handles.append(module.register_forward_hook(self._leave))

    def _enter(self, path: str) -> Any:
        def hook(module: torch.nn.Module, args: Tuple[Any, ...]) -> None:
            if not self._active:
                return
            self._calls_begun += 1
            arithmetic = MODULES.get(type(module))
            operands = None  # cloned as the call begins (the optimizer updates parameters in place), where judged
            if arithmetic is not None and not self._autocast and torch.is_grad_enabled():
                try:
                    operands = tuple(clone(t) for t in arithmetic.operands(module, args))
                except IndexError:  # called with keyword arguments, which a forward pre-hook does not see
                    operands = None
            self._entered.append((path, self._calls_begun, operands, user_site()))
        return hook

    def _leave(self, module: torch.nn.Module, args: Tuple[Any, ...], out: Any) -> None:
        if not self._active or not self._entered:
            return
        path, began_at, operands, site = self._entered.pop()
        if began_at != self._calls_begun:
            return  # another module was called inside it: a container, which computes nothing itself
        occurrence = self._occurrences.get(path, 0)
        self._occurrences[path] = occurrence + 1
        arithmetic = MODULES.get(type(module))
        why_not = self._why_not_judged(module, arithmetic, operands, out)
        if why_not is not None:
            self._not_judged[why_not] = self._not_judged.get(why_not, 0) + 1
            return
        self._calls.append(_Call(path, module, arithmetic, list(operands), out.detach().clone(), occurrence, site))

    def _why_not_judged(self, module: torch.nn.Module, arithmetic: Optional[ModuleArithmetic],
                        operands: Optional[Tuple[Any, ...]], out: Any) -> Optional[str]:
        if arithmetic is None:
            return f"{_name(module)} (no module-level bound yet)"
        if not torch.is_grad_enabled():
            return f"{_name(module)} (called with grad disabled)"
        if self._autocast:
            return f"{_name(module)} (under bf16 autocast: its operands are rounded inside it)"
        if operands is None:
            return f"{_name(module)} (called with keyword arguments)"
        if not isinstance(out, torch.Tensor) or out.dtype != torch.float32:
            return f"{_name(module)} ({getattr(out, 'dtype', type(out).__name__)})"
        hardware = _hardware(out.device)
        if arithmetic.kind in FUNCTION_KINDS and hardware != "CPU":
            return f"{_name(module)} (on {hardware}: its functions' worst cases are measured on CPU stacks only)"
        return None

    def step(self) -> "_CapturedStep":
        return _CapturedStep(self)

    def finish(self) -> StepCapture:
        """The step's judged results, read to the CPU and recomputed in float64 (after the
        step: no host read happens inside it)."""
        results = [self._recomputed(call) for call in self._calls]
        capture = StepCapture(results, dict(sorted(self._not_judged.items())))
        self._calls, self._not_judged, self._occurrences, self._entered = [], {}, {}, []
        return capture

    def _recomputed(self, call: _Call) -> CapturedResult:
        operands = [float64_on_cpu(t) for t in call.operands]
        r = call.arithmetic.recompute(call.module, operands)
        formats = sorted({FORMATS.get(t.dtype, str(t.dtype)) for t in call.operands
                          if t is not None and t.is_floating_point()})
        result = CapturedResult(call.path, _name(call.module), call.occurrence, "forward", call.site,
                                _kind(call), r.count, FORMATS[call.output.dtype], ",".join(formats),
                                flat_float64(call.output), flat_float64(r.exact), flat_float64(r.magnitude))
        result.tensor = output_column(call.path, call.output, 0, 1)
        result.terms = {name: flat_float64(t) for name, t in r.terms.items()}
        return result

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


class _CapturedStep:
    def __init__(self, capture: ModuleCapture) -> None:
        self.capture = capture

    def __enter__(self) -> ModuleCapture:
        self.capture._active = True
        return self.capture

    def __exit__(self, *exc: Any) -> None:
        self.capture._active = False
