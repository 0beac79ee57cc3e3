"""The op oracle's capture of one step of a Python canary (`harness precision`; docs/oracle.md).

Every aten op the step runs is seen by a TorchDispatchMode below every module, functional
call and autograd (as aten_trace's). An op whose arithmetic ARITHMETIC describes has its
operands cloned on the device just before it runs (an in-place op overwrites them) and its
result just after; once the step is over, each is recomputed on the CPU in float64 from
those operands, with the magnitude its rounding bound scales (sum |a_i b_i| for a dot
product). Nothing here judges: the bounds live in the harness (engines/numerics/
rounding_bounds.h, run through harness/run/python_oracle.cpp), which reads what this
captures. This module says, per aten op, what its arithmetic is:

- `dot`: a dot product of K terms per output (mm, bmm; addmm and baddbmm with their addend
  as one more term, and one more rounding for each scaling by alpha or beta other than 1;
  softmax's backward, p (g - sum p g), as n + 2 terms of p_j (|g_j| + sum |p g|));
- `log_softmax`, `log_softmax_backward`: a log-softmax's outputs from the scores it was
  given (the mean cross-entropy's row, exp and log at the stacks' measured worst case: each
  row's max, log of its sum of exps and spread, and each score written beside the values)
  and its backward, g - exp(y) sum g (exp of each output and the row's |sum g| and sum |g|);
- `softmax`: softmax's probabilities from the scores it was given, its exp at the stacks'
  measured worst case (engines/numerics/function_bounds.h), each score's distance from its
  row's max and the row's largest written beside the values;
- `gelu_tanh`, `gelu_erf`: GELU's two forms (its `approximate` argument), tanh or erf at
  the stacks' measured worst case, the input, the exact argument and f of it written beside;
- `gelu_erf_backward`: GELU's backward in the erf form, g (Phi(x) + x phi(x)), erf and exp at
  the stacks' measured worst case (x, g, Phi(x) and phi(x) written beside);
- `silu`: SiLU within the stacks' measured relative error;
- `sum`: a sum of n terms (sum; mean as n + 1: its division is one more rounding; the
  embedding's gradient, each row a sum over its index's occurrences);
- `rounded`: a few roundings of exact operations (add, sub, mul, div, reciprocal: one; sqrt
  two, as measured; addcmul and addcdiv: two; lerp four, of |self| + |end| + (|w| + |1 - w|)
  |end - self|; nll_loss's backward two; the 2-norm n + 2 of |y|; a conversion, copy,
  gather, fill, masked fill or clamp: none, as the exact value is then the result's own
  value rounded to its format, which the harness adds for a narrower format), with one more
  for each scaling by alpha or value other than 1 and for each operand the op must round to
  fp32 first (a float64 tensor, a Python float fp32 does not hold).

Results in bf16 are computed by torch's CPU kernels in
fp32 and rounded once to their format (the counts here are those of the CPU kernels: a
result on another device, whose kernels round differently, e.g. CUDA's division by a
scalar as a multiply by its rounded reciprocal, is listed as not judged); the harness adds that rounding where the run
declared the format and judges the result against fp32 where it did not. float64 and fp16
results are listed with the ops ARITHMETIC does not describe:
as not judged, by aten op, never counted as within.

Cost: a clone of every judged op's operands and result on the device during the step and
a float64 recomputation after it: a diagnosis of one step, never a recording.

One call may be kept whole (`OpCapture(keep=OpKey(...))`, what `harness repro` asks for):
its operands and result as the op saw them, on their device, in StepCapture.kept, for
tracing/op_repro.py to write.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple, Union

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from .aten_trace import StepPhases, flat_outputs, traced_output_places, user_site

# The formats a judged result may have, by the names the harness's bounds know them by
# (fp16 has no bound there yet: its results are listed as not judged).
FORMATS = {torch.float32: "fp32", torch.bfloat16: "bf16"}


class Arithmetic(NamedTuple):
    """What an aten op computes, as its rounding bound needs it: `kind` (module docstring),
    `count` (K, n or roundings) from the op's float64 operands and result, the magnitude
    the bound scales, from the op, its float64 operands and its exact result, and where
    its kind's bound reads more, those `terms` (each shaped as the result)."""

    kind: str
    count: Callable[[Tuple[Any, ...], Dict[str, Any], torch.Tensor], int]
    magnitude: Callable[[Any, Tuple[Any, ...], Dict[str, Any], torch.Tensor], torch.Tensor]
    terms: Optional[Callable[[Tuple[Any, ...], Dict[str, Any]], Dict[str, torch.Tensor]]] = None
    kind_of: Optional[Callable[[Dict[str, Any]], str]] = None  # where the call's arguments choose the kind
    applies: Optional[Callable[[Tuple[Any, ...], Dict[str, Any]], bool]] = None  # where they choose whether it is


class Several(NamedTuple):
    """An op of several results: each traced output's Arithmetic by its place among the op's
    outputs (None: not judged); or, for a Tensor[] return (a foreach op), `each`: output j is
    that entry's op on element j of the first operand (a list), the other operands as they are."""

    outputs: Tuple[Optional[Arithmetic], ...] = ()
    each: Optional[Arithmetic] = None

    def at(self, place: int) -> Optional[Arithmetic]:
        if self.each is not None:
            return self.each
        return self.outputs[place] if place < len(self.outputs) else None


def _absolute(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(torch.float64).abs()  # a bool or integer operand too
    return abs(value) if isinstance(value, (int, float)) else value


def _on_absolute_values(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], exact: torch.Tensor) -> torch.Tensor:
    """The op on |operands| (and |alpha|, |beta|): sum |a_i b_i| (plus |beta addend|) for a dot
    product, sum |x_i| for a sum; an in-place op's first operand is a clone here."""
    return func(*[_absolute(a) for a in args], **{k: _absolute(v) for k, v in kwargs.items()})


def _exact_magnitude(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], exact: torch.Tensor) -> torch.Tensor:
    return exact.abs()


def _sum_magnitude(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], exact: torch.Tensor) -> torch.Tensor:
    """|a| + |alpha b|: the terms an add or sub rounds (broadcast to the result's shape)."""
    alpha = abs(kwargs.get("alpha", 1))
    a, b = (_absolute(x) if isinstance(x, torch.Tensor) else torch.tensor(abs(float(x)), dtype=torch.float64)
            for x in args[:2])
    return (a + alpha * b).expand_as(exact)


def _scalings(kwargs: Dict[str, Any]) -> int:
    """One rounding for each of alpha, beta and value that is not 1 (a scaled term is rounded)."""
    return sum(1 for key in ("alpha", "beta", "value") if kwargs.get(key, 1) != 1)


def _inner(index: int) -> Callable[[Tuple[Any, ...], Dict[str, Any], torch.Tensor], int]:
    """K: the last dimension of operand `index` (mat1 of addmm, the left operand of mm)."""
    return lambda args, kwargs, exact: int(args[index].shape[-1])


def _with_addend(index: int) -> Callable[[Tuple[Any, ...], Dict[str, Any], torch.Tensor], int]:
    return lambda args, kwargs, exact: int(args[index].shape[-1]) + 1 + _scalings(kwargs)


def _summed(extra: int) -> Callable[[Tuple[Any, ...], Dict[str, Any], torch.Tensor], int]:
    """n (+ extra): the terms per result of a reduction, from the operand's and result's sizes."""
    return lambda args, kwargs, exact: max(1, args[0].numel() // max(1, exact.numel())) + extra


def _rounded(base: int) -> Callable[[Tuple[Any, ...], Dict[str, Any], torch.Tensor], int]:
    return lambda args, kwargs, exact: base + _scalings(kwargs)


# GELU's two forms, by torch's `approximate` argument, as the harness's kinds name them.
GELU_KINDS = {"tanh": "gelu_tanh", "none": "gelu_erf"}


def gelu_terms(x: torch.Tensor, approximate: str) -> Dict[str, torch.Tensor]:
    """The terms of gelu_output_bound (engines/numerics/function_bounds.h) from the float64
    input: x, the exact argument a of the form's function f, and f(a)."""
    if approximate == "tanh":
        argument = math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)
        return {"input": x, "argument": argument, "function": torch.tanh(argument)}
    argument = x * math.sqrt(0.5)
    return {"input": x, "argument": argument, "function": torch.erf(argument)}


def _gelu_approximate(kwargs: Dict[str, Any]) -> str:
    return kwargs.get("approximate", "none")


def _gelu_backward_terms(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """The terms of gelu_erf_backward_bound (engines/numerics/function_bounds.h) from the float64
    gradient and input: x, g, Phi(x) and phi(x)."""
    grad, x = args[0], args[1]
    return {"input": x, "grad": grad, "cdf": 0.5 * (1 + torch.erf(x * math.sqrt(0.5))),
            "pdf": torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)}


def _fp32_erf_gelu(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
    """GELU's backward judged in its erf form on fp32 (the tanh form's derivative, and a bf16
    kernel's arithmetic, have no bound yet)."""
    return _gelu_approximate(kwargs) == "none" and args[1].dtype == torch.float32


def _lerp_magnitude(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], exact: torch.Tensor) -> torch.Tensor:
    """|self| + |end| + (|w| + |1 - w|) |end - self|: the terms either form of torch's CPU
    kernel rounds (self + w (end - self) below w = 1/2, end - (1 - w) (end - self) above)."""
    start, end, weight = args[0], args[1], args[2]
    spread = (end - start).abs()
    return (start.abs() + end.abs() + (_absolute(weight) + _absolute(1 - weight)) * spread).expand_as(exact)


# Tensor ** exponent: the roundings of the exponents torch's CPU kernel computes by multiplies.
POW_ROUNDINGS = {2: 1, 3: 2, -1: 1}


def _pow_by_multiplies(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
    """Whether the call is pow.Tensor_Scalar of an exponent POW_ROUNDINGS holds. Not x^3 of a
    bf16 tensor: torch's kernel rounds x x to bf16 before the last multiply (on 1.13 and 2.9,
    a quarter of the results differ from x^3 rounded once), so its arithmetic is not fp32's."""
    if len(args) < 2 or not isinstance(args[1], (int, float)) or isinstance(args[1], bool):
        return False  # pow.Scalar, pow.Tensor_Tensor
    return args[1] in POW_ROUNDINGS and not (args[1] == 3 and args[0].dtype != torch.float32)


def _two_norm(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
    """Whether a norm's order (p of norm, ord of linalg_vector_norm; default 2) is 2."""
    order = args[1] if len(args) > 1 else kwargs.get("p", kwargs.get("ord", 2))
    return order is None or order == 2


def _embedding_backward_magnitude(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any],
                                  exact: torch.Tensor) -> torch.Tensor:
    """sum |g| over each row's occurrences: the op on |grad|, its indices as they are."""
    return func(args[0].abs(), *args[1:], **kwargs)


def _most_occurrences(args: Tuple[Any, ...], kwargs: Dict[str, Any], exact: torch.Tensor) -> int:
    """The terms of the longest sum: the most occurrences of one index (two more roundings
    where each gradient is scaled by its index's frequency first: 1 / count, and the product)."""
    indices = args[1].reshape(-1)
    most = int(torch.bincount(indices).max()) if indices.numel() else 0
    return most + (2 if args[4] else 0)


class LayerNormExact(NamedTuple):
    """A layer norm in float64 with the terms of its bounds (rounding_bounds.h), each shaped
    as its output or, keeping the normalized dimensions as 1, as its row: the output, s =
    |x - mu| r |w|, o = |b|, m = |w| r A; the row's A = mean |x| and rho = (S + mu^2) / (v +
    eps), mu its mean, S its mean square, v its variance and r = (v + eps)^-1/2."""

    out: torch.Tensor
    scaled: torch.Tensor
    offset: torch.Tensor
    mean_term: torch.Tensor
    mean_abs: torch.Tensor
    conditioning: torch.Tensor


def layer_norm_exact(x: torch.Tensor, normalized_shape: Any, weight: Optional[torch.Tensor],
                     bias: Optional[torch.Tensor], eps: float) -> LayerNormExact:
    """nn.LayerNorm's (and aten.native_layer_norm's) arithmetic over the last
    len(normalized_shape) dimensions of the float64 `x` (module_capture.py and ARITHMETIC)."""
    dims = tuple(range(-len(normalized_shape), 0))
    weight = torch.ones(tuple(normalized_shape), dtype=x.dtype) if weight is None else weight
    bias = torch.zeros(tuple(normalized_shape), dtype=x.dtype) if bias is None else bias
    mu = x.mean(dims, keepdim=True)
    variance = ((x - mu) ** 2).mean(dims, keepdim=True)
    r = 1.0 / torch.sqrt(variance + eps)
    scaled = (x - mu) * r * weight
    mean_abs = x.abs().mean(dims, keepdim=True)
    rho = ((x * x).mean(dims, keepdim=True) + mu * mu) / (variance + eps)
    return LayerNormExact(scaled + bias, scaled.abs(), bias.abs().expand(scaled.shape),
                          (weight.abs() * r * mean_abs).expand(scaled.shape), mean_abs, rho)


def _channels(args: Tuple[Any, ...], kwargs: Dict[str, Any], exact: torch.Tensor) -> int:
    """C: the elements of one normalized row (native_layer_norm's normalized_shape)."""
    return int(np.prod(args[1]))


def _layer_norm_of(args: Tuple[Any, ...]) -> LayerNormExact:
    x, normalized_shape, weight, bias, eps = args[:5]
    return layer_norm_exact(x, normalized_shape, weight, bias, eps)


def _layer_norm_out_terms(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    exact = _layer_norm_of(args)
    return {"offset": exact.offset, "mean_term": exact.mean_term, "conditioning": exact.conditioning}


# native_layer_norm's three results: the output (the module's bound, its mean and variance
# from the row's values), the mean (any order of the C adds and the divide, or Welford's
# updates: gamma_{2C+3} A) and the reciprocal standard deviation (its relative error from the
# row's conditioning: layer_norm_rstd_error in rounding_bounds.h).
def _fp32_input(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
    """Whether the op's first operand is fp32: torch's bf16 log-softmax (both torches) and
    torch 1.13's bf16 layer norm round inside (2 to 36 times over fp32 arithmetic and one
    rounding, measured), so a bf16 one is not judged; under autocast both run in fp32."""
    return args[0].dtype == torch.float32


_LAYER_NORM = Several((
    Arithmetic("layer_norm", _channels, lambda func, args, kwargs, exact: _layer_norm_of(args).scaled,
               _layer_norm_out_terms, applies=_fp32_input),
    Arithmetic("rounded", lambda args, kwargs, exact: 2 * _channels(args, kwargs, exact) + 3,
               lambda func, args, kwargs, exact: _layer_norm_of(args).mean_abs, applies=_fp32_input),
    Arithmetic("layer_norm_rstd", _channels, _exact_magnitude,
               lambda args, kwargs: {"conditioning": _layer_norm_of(args).conditioning}, applies=_fp32_input),
))


def _normalized_rows(args: Tuple[Any, ...], kwargs: Dict[str, Any], exact: torch.Tensor) -> int:
    """N: the rows native_layer_norm_backward sums its weight's and bias's gradients over."""
    return max(1, args[1].numel() // max(1, int(np.prod(args[2]))))


def _row_dims(args: Tuple[Any, ...]) -> Tuple[int, ...]:
    """The leading (row) dimensions of native_layer_norm_backward's input."""
    return tuple(range(args[1].dim() - len(args[2])))


def _weight_grad_magnitude(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], exact: torch.Tensor) -> torch.Tensor:
    """sum over rows of |dy| (|x| + |mean|) rstd, from the mean and rstd the op was given: the
    kernel's x rstd and mean rstd are rounded before they cancel (rows far from zero)."""
    grad, x, _, mean, rstd = args[:5]
    return (grad.abs() * (x.abs() + mean.abs()) * rstd.abs()).sum(_row_dims(args))


def _bias_grad_magnitude(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], exact: torch.Tensor) -> torch.Tensor:
    return args[0].abs().sum(_row_dims(args))


# native_layer_norm_backward's results: the input's gradient (not judged yet: two row sums
# through rstd), the weight's, sum over N rows of dy (x - mean) rstd (each term the
# difference, its products and the kernel's x rstd - mean rstd form: four roundings, gamma_{N+3},
# of |dy| (|x| + |mean|) rstd: those products are rounded before they cancel),
# and the bias's, sum over N rows of dy. Where dy is bf16 (a bf16 layer's gradient into an
# fp32 layer norm, BERT's under autocast), torch 2.9's kernel sums in bf16 (measured: 10^3
# times over these bounds): not judged.
_LAYER_NORM_BACKWARD = Several((
    None,
    Arithmetic("dot", lambda args, kwargs, exact: _normalized_rows(args, kwargs, exact) + 3, _weight_grad_magnitude,
               applies=lambda args, kwargs: args[0].dtype == torch.float32),
    Arithmetic("sum", _normalized_rows, _bias_grad_magnitude, applies=lambda args, kwargs: args[0].dtype == torch.float32),
))


def _nll_rows(args: Tuple[Any, ...]) -> int:
    return int(args[0].shape[0]) if args[0].dim() > 1 else 1


def _on_absolute_loss(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[torch.Tensor, torch.Tensor]:
    """nll_loss_forward on |x| and |w|: (sum |w_t x_t| / sum |w_t| for a mean, sum |w_t x_t|
    for a sum, |w_t x_t| each for none; sum |w_t|), negated losses made positive."""
    weight = None if args[2] is None else args[2].abs()
    loss, total = func(args[0].abs(), args[1], weight, *args[3:], **kwargs)
    return loss.abs(), total


def _nll_loss_magnitude(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], exact: torch.Tensor) -> torch.Tensor:
    """sum |w_t x_t| / |W| times sum |w_t| / |W| for a mean (W's own error, relative to |W|,
    is that of a sum of weights that may cancel: 1 for weights of one sign); sum |w_t x_t|
    for a sum; |w_t x_t| for none."""
    loss, total = _on_absolute_loss(func, args, kwargs)
    if args[3] != 1:  # reduction none (0) or sum (2): no division by W
        return loss
    weights = func(args[0], args[1], args[2], *args[3:], **kwargs)[1].abs()
    return loss * (total / weights) * (total / weights)


# nll_loss_forward's loss and total weight W. The loss: N products w_t x_t (exact unweighted)
# summed, divided by W, itself a sum of N weights: gamma_{2N+1} (gamma_{N+1} unweighted) of
# its magnitude (to first order where weights of both signs cancel in W). W: a sum of N
# weights, gamma_{N-1} sum |w_t| (a count unweighted, exact).
_NLL_LOSS = Several((
    Arithmetic("rounded", lambda args, kwargs, exact: (1 if args[2] is None else 2) * _nll_rows(args) + 1,
               _nll_loss_magnitude),
    Arithmetic("sum", lambda args, kwargs, exact: _nll_rows(args),
               lambda func, args, kwargs, exact: _on_absolute_loss(func, args, kwargs)[1]),
))


def _softmax_size(args: Tuple[Any, ...], kwargs: Dict[str, Any], exact: torch.Tensor) -> int:
    return int(args[0].shape[args[1]])


def _softmax_terms(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """Each score's distance from its row's max, and the row's largest (masked scores, -inf,
    at distance 0: their probability is exactly 0 on every kernel)."""
    scores, dim = args[0], args[1]
    masked = torch.isinf(scores) & (scores < 0)
    distance = (scores.amax(dim, keepdim=True) - scores).masked_fill(masked, 0.0)
    return {"distance": distance, "spread": distance.amax(dim, keepdim=True)}  # expanded by _recompute


def _log_softmax_terms(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """Each row's max, log of its sum of exps and spread (its scores' largest distance from the
    max, masked scores, -inf, at 0: their exps are exactly 0), and each score (`value`)."""
    scores, dim = args[0], args[1]
    masked = torch.isinf(scores) & (scores < 0)
    top = scores.amax(dim, keepdim=True)
    return {"max": top, "log_sum": torch.log(torch.exp(scores - top).sum(dim, keepdim=True)), "value": scores,
            "spread": (top - scores).masked_fill(masked, 0.0).amax(dim, keepdim=True)}


def _log_softmax_backward_terms(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """exp of each output it was given, and its row's |sum g| and sum |g|."""
    grad, output, dim = args[0], args[1], args[2]
    return {"probability": torch.exp(output), "sum": grad.sum(dim, keepdim=True).abs(),
            "sum_abs": grad.abs().sum(dim, keepdim=True)}


def _tanh_backward_magnitude(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], exact: torch.Tensor) -> torch.Tensor:
    """|g| (y^2 + |1 - y^2|): g (1 - y y) from the output y it was given, whose square's
    rounding is not cancelled by 1 - y^2 near +-1 (three roundings, fewer fused)."""
    grad, y = args[0], args[1]
    return grad.abs() * (y * y + (1 - y * y).abs())


def _softmax_backward_magnitude(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any],
                                exact: torch.Tensor) -> torch.Tensor:
    """p_j (|g_j| + sum_k |p_k g_k|): grad_input = p (g - sum p g), the row's dot product of
    n terms, the subtraction and the multiply, within gamma_{n+2} of it."""
    grad, p, dim = args[0], args[1], args[2]
    return p.abs() * (grad.abs() + (p.abs() * grad.abs()).sum(dim, keepdim=True))


def _softmax_backward_count(args: Tuple[Any, ...], kwargs: Dict[str, Any], exact: torch.Tensor) -> int:
    return int(args[0].shape[args[2]]) + 2


_DOT = Arithmetic("dot", _inner(0), _on_absolute_values)
_TWO_NORM = Arithmetic("two_norm", _summed(2), _exact_magnitude, applies=_two_norm)
_DOT_WITH_ADDEND = Arithmetic("dot", _with_addend(1), _on_absolute_values)
_ONE_ROUNDING = Arithmetic("rounded", _rounded(1), _exact_magnitude)
_ADD = Arithmetic("rounded", _rounded(1), _sum_magnitude)
_EXACT = Arithmetic("rounded", _rounded(0), _exact_magnitude)
# self + value * (t1 * t2) or (t1 / t2): the product or quotient and the add rounded.
_ADD_PRODUCT = Arithmetic("rounded", _rounded(2), _on_absolute_values)

# By schema name (every overload but out=, whose result is a tensor the caller gave). What
# an op computes is not in its tags, so the ops are named here, the one table of them.
ARITHMETIC: Dict[str, Union[Arithmetic, Several]] = {
    "aten::mm": _DOT, "aten::bmm": _DOT,
    "aten::addmm": _DOT_WITH_ADDEND, "aten::baddbmm": _DOT_WITH_ADDEND,
    "aten::sum": Arithmetic("sum", _summed(0), _on_absolute_values),
    "aten::mean": Arithmetic("sum", _summed(1), _on_absolute_values),
    "aten::add": _ADD, "aten::add_": _ADD, "aten::sub": _ADD, "aten::sub_": _ADD,
    "aten::mul": _ONE_ROUNDING, "aten::mul_": _ONE_ROUNDING,
    "aten::div": _ONE_ROUNDING, "aten::div_": _ONE_ROUNDING,
    "aten::reciprocal": _ONE_ROUNDING,  # correctly rounded on every CPU build measured
    # Not correctly rounded on every build: torch 2.9's AVX-512 CPU kernel is within 0.75
    # ulps (measured; 1.13's 0.5), so two roundings (gamma_2 |y| >= 1 ulp; docs/oracle.md).
    "aten::sqrt": Arithmetic("rounded", _rounded(2), _exact_magnitude),
    "aten::addcmul": _ADD_PRODUCT, "aten::addcmul_": _ADD_PRODUCT,
    "aten::addcdiv": _ADD_PRODUCT, "aten::addcdiv_": _ADD_PRODUCT,
    # Values moved, never computed: exact, or one rounding where they change format.
    "aten::_to_copy": _EXACT, "aten::clone": _EXACT, "aten::copy_": _EXACT, "aten::_unsafe_view": _EXACT,
    "aten::cat": _EXACT, "aten::stack": _EXACT, "aten::embedding": _EXACT, "aten::neg": _EXACT,
    "aten::zero_": _EXACT, "aten::zeros": _EXACT, "aten::ones_like": _EXACT, "aten::fill_": _EXACT,
    "aten::masked_fill": _EXACT, "aten::masked_fill_": _EXACT, "aten::scalar_tensor": _EXACT,
    "aten::slice_backward": _EXACT,
    # Chosen, never computed: a bound a Python float fp32 does not hold is one rounding.
    "aten::clamp": _EXACT, "aten::clamp_": _EXACT, "aten::clamp_min": _EXACT, "aten::clamp_max": _EXACT,
    "aten::where": _EXACT, "aten::relu": _EXACT, "aten::relu_": _EXACT,
    # Unless its threshold is a Python float fp32 does not hold: the comparison then flips
    # near it, and a gradient becomes 0, no rounding.
    "aten::threshold_backward": Arithmetic("rounded", _rounded(0), _exact_magnitude,
                                           applies=lambda args, kwargs: not _rounded_to_fp32(args[2])),
    # x^2 and 1/x one rounding, x^3 two (x x x), as torch's CPU kernel computes them (measured
    # over every fp32 of two binades: 1.0, 1.0 and 1.98 u); rsqrt two (1.5 u measured).
    "aten::pow": Arithmetic("rounded", lambda args, kwargs, exact: POW_ROUNDINGS[args[1]], _exact_magnitude,
                            applies=_pow_by_multiplies),
    "aten::rsqrt": Arithmetic("rounded", _rounded(2), _exact_magnitude),
    "aten::tanh_backward": Arithmetic("rounded", _rounded(3), _tanh_backward_magnitude),
    # AdamW's first moment (torch 2.x): a difference, a scaling and a sum, in either form.
    "aten::lerp": Arithmetic("rounded", _rounded(4), _lerp_magnitude),
    "aten::lerp_": Arithmetic("rounded", _rounded(4), _lerp_magnitude),
    # The 2-norm (gradient clipping's): n squares summed, then sqrt (two roundings, as sqrt's
    # entry): the sum within gamma_n, sqrt halving it, gamma_{n+2} |y| in all (Higham, Lemma 3.3).
    "aten::norm": _TWO_NORM, "aten::linalg_vector_norm": _TWO_NORM,
    "aten::_foreach_norm": Several(each=_TWO_NORM),  # torch 2.x's clip_grad_norm_: a 2-norm per tensor
    "aten::native_layer_norm": _LAYER_NORM,
    "aten::native_layer_norm_backward": _LAYER_NORM_BACKWARD,
    "aten::nll_loss_forward": _NLL_LOSS,
    # The embedding's gradient: each row a sum of the gradients of its index's occurrences, in
    # fp32 (a bf16 gradient is summed by bf16 adds, each rounded: not judged).
    "aten::embedding_dense_backward": Arithmetic("sum", _most_occurrences, _embedding_backward_magnitude,
                                                 applies=lambda args, kwargs: args[0].dtype == torch.float32),
    # -g w_t / total_weight at each row's target (0 elsewhere): a division, or a multiply by
    # its reciprocal, and the weight's product.
    "aten::nll_loss_backward": Arithmetic("rounded", _rounded(2), _exact_magnitude),
    # Its exp at the stacks' measured worst case (engines/numerics/function_bounds.h).
    "aten::_softmax": Arithmetic("softmax", _softmax_size, _exact_magnitude, _softmax_terms),
    # torch 2.5's softmax for attention masks: a row wholly masked is 0s (exact), else _softmax.
    "aten::_safe_softmax": Arithmetic("softmax", _softmax_size, _exact_magnitude, _softmax_terms),
    "aten::_softmax_backward_data": Arithmetic("dot", _softmax_backward_count, _softmax_backward_magnitude),
    # The cross-entropy's row (engines/numerics/function_bounds.h), exp and log at the stacks'
    # measured worst; its backward, g - exp(y) sum g, with exp at its worst.
    "aten::_log_softmax": Arithmetic("log_softmax", _softmax_size, _exact_magnitude, _log_softmax_terms,
                                     applies=_fp32_input),
    "aten::_log_softmax_backward_data": Arithmetic("log_softmax_backward",
                                                   lambda args, kwargs, exact: int(args[0].shape[args[2]]),
                                                   _exact_magnitude, _log_softmax_backward_terms),
    # At the stacks' measured worst case (engines/numerics/function_bounds.h); count 1, the
    # function's one evaluation.
    "aten::silu": Arithmetic("silu", lambda args, kwargs, exact: 1, _exact_magnitude),
    "aten::gelu": Arithmetic("gelu", lambda args, kwargs, exact: 1, _exact_magnitude,
                             lambda args, kwargs: gelu_terms(args[0], _gelu_approximate(kwargs)),
                             lambda kwargs: GELU_KINDS[_gelu_approximate(kwargs)]),
    "aten::gelu_backward": Arithmetic("gelu_erf_backward", lambda args, kwargs, exact: 1, _exact_magnitude,
                                      _gelu_backward_terms, applies=_fp32_erf_gelu),
}


def arithmetic_of(func: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Union[Arithmetic, Several]]:
    """The op's entry in ARITHMETIC; None for an op it does not describe, an out= overload, a
    division that rounds to an integer (rounding_mode), a call its entry does not apply to
    (a norm of another order than 2); an op of several results with only the entries that
    apply to the call."""
    if any(a.is_out for a in func._schema.arguments) or kwargs.get("rounding_mode") is not None:
        return None
    arithmetic = ARITHMETIC.get(func._schema.name)
    applies = lambda entry: entry is not None and (entry.applies is None or entry.applies(args, kwargs))
    if isinstance(arithmetic, Several) and arithmetic.each is None:  # each result's entry, where it applies
        outputs = tuple(entry if applies(entry) else None for entry in arithmetic.outputs)
        return Several(outputs) if any(outputs) else None
    entry = arithmetic.each if isinstance(arithmetic, Several) else arithmetic
    return arithmetic if applies(entry) else None


def _rounded_to_fp32(value: Any) -> bool:
    """Whether an operand must be rounded before an fp32 computation uses it: a float64
    tensor, or a Python float fp32 does not hold exactly."""
    if isinstance(value, torch.Tensor):
        return value.dtype == torch.float64
    return isinstance(value, float) and float(np.float32(value)) != value


@dataclass
class CapturedResult:
    """One judged result: where it ran, what its arithmetic is, and its values in float64."""

    op: str          # the module path it ran in, `<backward:...>`, `<optimizer>`, `<step>`
    aten: str        # aten.addmm.default
    occurrence: int  # how many traced outputs of the step before it have its op, phase and aten name
    phase: str
    site: str        # file:line of the team's code that led to it
    kind: str        # dot, sum, rounded, softmax, gelu_tanh, gelu_erf, silu (modules: layer_norm, attention,
    #                  swiglu, cross_entropy)
    count: int       # K, n or roundings
    stored: str      # fp32, bf16, fp16
    operands: str    # the operands' formats, as the op saw them (bf16, fp32)
    got: np.ndarray = field(repr=False)
    exact: np.ndarray = field(repr=False)
    magnitude: np.ndarray = field(repr=False)
    tensor: Optional[str] = None  # a module output's trace column (`<op>.out`); an aten result's is its aten op
    terms: Dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # further terms its kind's bound reads


class OpKey(NamedTuple):
    """One traced output of a step, as bisect names it: the module it ran in, its phase, its
    trace column (the aten overload) and its place among the step's outputs of those three."""

    op: str
    phase: str
    tensor: str
    occurrence: int


class KeptCall(NamedTuple):
    """A judged call kept whole: the op, its operands cloned just before it ran and its result
    just after (on their device, in their formats)."""

    func: Any
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    result: torch.Tensor
    output: Optional[int] = None  # the result's place among the op's outputs, where it has several
    layout: Any = None            # the operands' strides as the op saw them (operand_layout)


class _Pending(NamedTuple):
    """A judged result waiting for its float64 recomputation after the step."""

    func: Any
    arithmetic: Arithmetic
    before: Tuple[Tuple[Any, ...], Dict[str, Any]]  # the operands, cloned just before the op ran
    result: torch.Tensor
    op: str
    phase: str
    site: str
    occurrence: int
    output: Optional[int]  # its place among the op's outputs, where it has several
    tensor: Optional[str]  # its trace name (`<aten op>.outJ`), where the op has several
    element: bool          # a foreach op's: `arithmetic` reads element `output` of the first operand


@dataclass
class StepCapture:
    """What one step's capture holds: the judged results in execution order, and the aten
    ops with floating-point results it does not judge, with their counts; the call asked
    to be kept, where the step ran it and it was judged."""

    results: List[CapturedResult] = field(default_factory=list)
    not_judged: Dict[str, int] = field(default_factory=dict)
    kept: Optional[KeptCall] = None


def clone(value: Any) -> Any:
    """A tensor's detached copy on its device (anything else as it is)."""
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def operand_layout(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """Each tensor operand's strides as the op saw them ((args, kwargs) with a list at each
    tensor): a clone of an expanded or sliced operand is laid out anew, and the layout picks
    the kernel (what a kept call's repro runs again)."""
    return tree_map(lambda value: list(value.stride()) if isinstance(value, torch.Tensor) else None, (args, kwargs))


def float64_on_cpu(value: Any) -> Any:
    """A copy on the CPU (float64 where floating): an in-place op recomputed writes its copy."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to("cpu", torch.float64, copy=True)
    return value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else value


class _Mode(TorchDispatchMode):
    def __init__(self, capture: "OpCapture") -> None:
        super().__init__()
        self.capture = capture

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        arithmetic = arithmetic_of(func, args, kwargs)
        before = tree_map(clone, (args, kwargs)) if arithmetic is not None else None
        layout = operand_layout(args, kwargs) if arithmetic is not None and self.capture.keeping else None
        out = func(*args, **kwargs)
        self.capture._seen(func, arithmetic, before, out, layout)
        return out


class OpCapture:
    """Captures the aten ops of one training step of `model` (module docstring): `with
    capture.step():` around the whole step, then finish() for what it saw."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, keep: Optional[OpKey] = None) -> None:
        self.phases = StepPhases(model, optimizer)
        self._keep = keep
        self._kept: Optional[KeptCall] = None
        self._pending: List[_Pending] = []
        self._not_judged: Dict[str, int] = {}
        self._occurrences: Dict[Tuple[str, str, str], int] = {}
        self._results: List[CapturedResult] = []

    def _not_judging(self, name: str) -> None:
        self._not_judged[name] = self._not_judged.get(name, 0) + 1

    @property
    def keeping(self) -> bool:
        """Whether a call is to be kept whole (its operands' layout is then noted for each call)."""
        return self._keep is not None

    def _seen(self, func: Any, arithmetic: Optional[Union[Arithmetic, Several]], before: Any, out: Any,
              layout: Any = None) -> None:
        places = traced_output_places(func, out)  # what an aten trace of the step records, by the same names
        if not places:
            return
        op, _, phase = self.phases.where()
        occurrence = []
        for _, tensor, _ in places:  # each output's place among the step's of its op, phase and name
            key = (op, phase, tensor)
            occurrence.append(self._occurrences.get(key, 0))
            self._occurrences[key] = occurrence[-1] + 1
        if arithmetic is None or (isinstance(arithmetic, Arithmetic) and len(places) != 1):
            self._not_judging(str(func))
            return
        site = user_site()
        for (place, tensor, value), occurs in zip(places, occurrence):
            entry = arithmetic if isinstance(arithmetic, Arithmetic) else arithmetic.at(place)
            label = str(func) if len(places) == 1 else tensor
            if entry is None:
                self._not_judging(label)
            elif value.dtype not in FORMATS:
                self._not_judging(f"{label} ({value.dtype})")
            elif value.device.type != "cpu":  # ARITHMETIC's counts are those of torch's CPU kernels
                self._not_judging(f"{label} (on {value.device.type})")
            else:
                # An op of several results (by its schema, however many it traced: a layer norm's
                # backward with one gradient asked, a foreach op of one tensor) names its place.
                output = place if isinstance(arithmetic, Several) else None
                kept = value.detach().clone()
                element = isinstance(arithmetic, Several) and arithmetic.each is not None
                self._pending.append(_Pending(func, entry, before, kept, op, phase, site, occurs, output,
                                              None if output is None else tensor, element))
                if self._keep == OpKey(op, phase, tensor, occurs):
                    self._kept = KeptCall(func, *before, kept, output, layout)

    def step(self) -> "_CapturedStep":
        return _CapturedStep(self)

    def finish(self) -> StepCapture:
        """The step's judged results, each recomputed in float64 on the CPU (after the step:
        no host read happens inside it)."""
        pending, self._pending = self._pending, []
        for judged in pending:
            try:
                self._results.append(_recompute(judged))
            except (RuntimeError, TypeError, ValueError) as e:  # an operand the float64 copy cannot take
                self._not_judging(f"{judged.tensor or judged.func} (not recomputed: {type(e).__name__})")
        capture = StepCapture(self._results, dict(sorted(self._not_judged.items())), self._kept)
        self._results, self._not_judged, self._occurrences, self._kept = [], {}, {}, None
        return capture

    def close(self) -> None:
        self.phases.close()


def _recompute(judged: _Pending) -> CapturedResult:
    func, arithmetic, (args, kwargs), result = judged.func, judged.arithmetic, judged.before, judged.result
    operands = tree_flatten((args, kwargs))[0]  # a list operand's (cat's) members too
    formats = sorted({FORMATS.get(a.dtype, str(a.dtype).replace("torch.", "")) for a in operands
                      if isinstance(a, torch.Tensor) and a.is_floating_point()})
    rounded_first = sum(1 for a in operands if _rounded_to_fp32(a))
    args64 = tree_map(float64_on_cpu, args)
    kwargs64 = {k: (torch.float64 if k == "dtype" else tree_map(float64_on_cpu, v)) for k, v in kwargs.items()}
    kwargs64.pop("device", None)
    exact = func(*tree_map(float64_on_cpu, args), **kwargs64)  # its own copies: an in-place op writes them
    if judged.output is not None:
        exact = flat_outputs(exact)[judged.output]
    if judged.element:  # a foreach op's output j: its entry's op on element j
        args64 = (args64[0][judged.output], *args64[1:])
        rounded_first = sum(1 for a in tree_flatten((args[0][judged.output], args[1:], kwargs))[0] if _rounded_to_fp32(a))
    magnitude = arithmetic.magnitude(func, args64, kwargs64, exact)
    count = arithmetic.count(args64, kwargs64, exact) + rounded_first
    kind = arithmetic.kind if arithmetic.kind_of is None else arithmetic.kind_of(kwargs64)
    captured = CapturedResult(judged.op, str(func), judged.occurrence, judged.phase, judged.site, kind, count,
                              FORMATS[result.dtype], ",".join(formats), flat_float64(result), flat_float64(exact),
                              flat_float64(magnitude.expand_as(exact)), tensor=judged.tensor)
    if arithmetic.terms is not None:
        captured.terms = {name: flat_float64(t.expand_as(exact))
                          for name, t in arithmetic.terms(args64, kwargs64).items()}
    return captured


def flat_float64(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as a contiguous float64 vector on the host (what write_values stores)."""
    return np.ascontiguousarray(t.detach().to("cpu", torch.float64).numpy().reshape(-1))


class _CapturedStep:
    def __init__(self, capture: OpCapture) -> None:
        self.capture = capture

    def __enter__(self) -> OpCapture:
        self._phases = self.capture.phases.step()
        self._phases.__enter__()
        self._mode = _Mode(self.capture)
        self._mode.__enter__()
        return self.capture

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)
        self._phases.__exit__(*exc)


def capture_json(capture: StepCapture) -> Dict[str, Any]:
    """The capture's description (what `capture-ops --json-out` writes; its values are in
    write_values' file, result i's under results/i)."""
    results = [{"op": r.op, "aten": r.aten, "occurrence": r.occurrence, "phase": r.phase, "site": r.site, "kind": r.kind, "count": r.count,
                "stored": r.stored, "operands": r.operands, "elements": int(r.got.size),
                **({"tensor": r.tensor} if r.tensor is not None else {})} for r in capture.results]
    return {"results": results, "not_judged": capture.not_judged}


def write_values(path: str, capture: StepCapture) -> None:
    """Each judged result's values, exact values and magnitudes (float64) into an HDF5 file at
    `path`: results/I/got, exact, magnitude (and the terms its kind's bound reads, by name:
    a layer norm's offset, mean_term and conditioning, ...). Written beside it and renamed:
    whole or absent."""
    import os
    import tempfile

    import h5py

    directory = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=".capture-", suffix=".h5", dir=directory)
    os.close(fd)
    try:
        with h5py.File(temp, "w") as f:
            for i, r in enumerate(capture.results):
                group = f.create_group(f"results/{i}")
                for name in ("got", "exact", "magnitude"):
                    group.create_dataset(name, data=getattr(r, name))
                for name, values in r.terms.items():
                    group.create_dataset(name, data=values)
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise
