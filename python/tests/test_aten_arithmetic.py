"""ARITHMETIC's counts and magnitudes (tracing/op_capture.py) against this torch's CPU kernels,
on randomized and adversarial inputs: each op's fp32 result is within the bound its entry
gives (gamma_count times its magnitude for `rounded`, gamma_{count-1} for `sum`: the
harness's rounding_bounds.h, restated here as the test's oracle), and the same op computed
through bf16 is over it (the bound bites). The harness's own judging of these ops on a
whole step is test_op_oracle.py's."""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import pytest
import torch
from torch.utils._pytree import tree_map

from canary_harness.tracing.aten_trace import flat_outputs
from canary_harness.tracing.op_capture import Several, arithmetic_of, float64_on_cpu

aten = torch.ops.aten
U = 2.0 ** -24  # fp32's unit roundoff


def gamma(n: int) -> float:
    return n * U / (1 - n * U)


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _lerp(seed: int) -> Tuple[Any, tuple, dict]:
    """A moment update near cancellation: end close to self, the weight either side of 1/2."""
    start = _randn(4096, seed=seed)
    end = start + _randn(4096, seed=seed + 1, scale=1e-3)
    return aten.lerp_.Scalar, (start, end, (0.1, 0.5, 0.9, 0.999)[seed % 4]), {}


def _norm(seed: int) -> Tuple[Any, tuple, dict]:
    x = _randn(1 << (10 + seed % 10), seed=seed, scale=10.0 ** (seed % 5 - 2))
    if seed % 2:
        return aten.linalg_vector_norm.default, (x,), {}
    return aten.norm.ScalarOpt_dim, (x.reshape(32, -1), 2, [1]), {}


def _embedding_backward(seed: int) -> Tuple[Any, tuple, dict]:
    """Many occurrences of few indices: long sums per row."""
    indices = torch.randint(0, 5, (64, 33), generator=torch.Generator().manual_seed(seed))
    return aten.embedding_dense_backward.default, (_randn(64, 33, 16, seed=seed), indices, 7, -1, bool(seed % 2)), {}


def _pow(seed: int) -> Tuple[Any, tuple, dict]:
    """Every mantissa of a binade (its exponent's parity by seed) to the kernel's multiply exponents."""
    binade = torch.arange(1 << 23, dtype=torch.int32) + ((127 + seed % 2 - 8 * (seed // 2)) << 23)
    return aten.pow.Tensor_Scalar, (binade.view(torch.float32), (2, 3, -1)[seed // 2]), {}


def _rsqrt(seed: int) -> Tuple[Any, tuple, dict]:
    binade = torch.arange(1 << 23, dtype=torch.int32) + ((127 + seed % 2 - 20 * (seed // 2)) << 23)
    return aten.rsqrt.default, (binade.view(torch.float32),), {}


def _nll_loss(seed: int) -> Tuple[Any, tuple, dict]:
    """log-probabilities of 512 rows, weighted or not (weights of both signs too), some targets
    ignored; reduction none, mean or sum."""
    g = torch.Generator().manual_seed(seed)
    logp = torch.log_softmax(torch.randn(512, 40, generator=g) * 4, -1)
    target = torch.randint(0, 40, (512,), generator=g)
    target[::7] = -100
    weight = torch.rand(40, generator=g) * 3 - (0.5 if seed % 4 == 3 else 0.0) if seed % 2 else None
    return aten.nll_loss_forward.default, (logp, target, weight, seed % 3, -100), {}


def _nll_loss_backward(seed: int) -> Tuple[Any, tuple, dict]:
    func, (logp, target, weight, reduction, ignore), _ = _nll_loss(seed)
    total = func(logp, target, weight, reduction, ignore)[1]
    grad = _randn(logp.shape[0], seed=seed) if reduction == 0 else torch.tensor(0.37 + seed)  # none: one per row
    return aten.nll_loss_backward.default, (grad, logp, target, weight, reduction, ignore, total), {}


def _layer_norm(seed: int) -> Tuple[Any, tuple, dict]:
    """Rows near zero and far from it (100 or 10^4 + noise), C from 8 to 1024."""
    x = _randn(16, 8 << (seed % 8), seed=seed) + (0.0, 100.0, 1e4)[seed % 3]
    C = x.shape[-1]
    return aten.native_layer_norm.default, (x, [C], _randn(C, seed=seed + 1), _randn(C, seed=seed + 2), 1e-5), {}


def _layer_norm_backward(seed: int) -> Tuple[Any, tuple, dict]:
    """The gradients of a layer norm's weight and bias over 16 to 2048 rows, rows far from zero too."""
    func, (x, shape, weight, bias, eps), _ = _layer_norm(seed)
    x = x.repeat(1 << (seed % 8), 1)
    _, mean, rstd = func(x, shape, weight, bias, eps)
    grad = _randn(*x.shape, seed=seed + 3)
    return aten.native_layer_norm_backward.default, (grad, x, shape, mean, rstd, weight, bias, [True, True, True]), {}


def _tanh_backward(seed: int) -> Tuple[Any, tuple, dict]:
    """Outputs near +-1 too, where 1 - y^2 cancels."""
    y = torch.tanh(_randn(1 << 16, seed=seed, scale=(0.5, 3.0, 9.0)[seed % 3]))
    return aten.tanh_backward.default, (_randn(1 << 16, seed=seed + 1), y), {}


# Each case's calls by seed, how many seeds (pow: 3 exponents x 2 parities; rsqrt: 2 ranges x
# 2) and the result judged where the op has several (its place among the op's outputs).
CALLS: Dict[str, Tuple[Callable[[int], Tuple[Any, tuple, dict]], int, Any]] = {
    "lerp_": (_lerp, 12, None), "2-norm": (_norm, 12, None), "embedding_dense_backward": (_embedding_backward, 12, None),
    "pow": (_pow, 6, None), "rsqrt": (_rsqrt, 4, None), "nll_loss_forward's loss": (_nll_loss, 12, 0),
    "nll_loss_forward's total weight": (_nll_loss, 12, 1), "nll_loss_backward": (_nll_loss_backward, 12, None),
    "native_layer_norm's mean": (_layer_norm, 16, 1), "tanh_backward": (_tanh_backward, 6, None),
    "native_layer_norm_backward's weight": (_layer_norm_backward, 16, 1),
    "native_layer_norm_backward's bias": (_layer_norm_backward, 16, 2),
}


def _bound(func: Any, args: tuple, kwargs: dict, output: Any) -> Tuple[torch.Tensor, torch.Tensor]:
    """The op's float64 result (`output` of several) and its entry's bound on these operands."""
    arithmetic = arithmetic_of(func, args, kwargs)
    if isinstance(arithmetic, Several):
        arithmetic = arithmetic.at(output)
    assert arithmetic is not None, func
    args64 = tree_map(float64_on_cpu, args)
    exact = func(*tree_map(float64_on_cpu, args), **kwargs)
    exact = exact if output is None else flat_outputs(exact)[output]
    count = arithmetic.count(args64, kwargs, exact)
    magnitude = arithmetic.magnitude(func, args64, kwargs, exact)
    assert arithmetic.kind in ("rounded", "sum", "dot", "two_norm"), arithmetic.kind  # the kinds restated here
    return exact, (gamma(count - 1) if arithmetic.kind == "sum" else gamma(count)) * magnitude


def _through_bf16(value: Any) -> Any:
    return value.to(torch.bfloat16).to(torch.float32) if isinstance(value, torch.Tensor) and value.is_floating_point() else value


@pytest.mark.parametrize("name", sorted(CALLS))
def test_each_entry_holds_this_torchs_kernel_and_a_bf16_one_is_over(name: str) -> None:
    worst, bf16_worst = 0.0, 0.0
    calls, seeds, output = CALLS[name]
    pick = (lambda out: out) if output is None else (lambda out: flat_outputs(out)[output])
    for seed in range(seeds):
        func, args, kwargs = calls(seed)
        exact, bound = _bound(func, args, kwargs, output)
        got = pick(func(*tree_map(lambda a: a.clone() if isinstance(a, torch.Tensor) else a, args), **kwargs))
        worst = max(worst, float(((got.double() - exact).abs() / bound.clamp_min(1e-300)).max()))
        low = pick(func(*tree_map(_through_bf16, args), **kwargs)).to(torch.bfloat16)
        bf16_worst = max(bf16_worst, float(((low.double() - exact).abs() / bound.clamp_min(1e-300)).max()))
    assert worst <= 1.0, (name, worst)
    assert bf16_worst > 1.0, (name, bf16_worst)


def test_calls_an_entry_does_not_hold_are_not_judged() -> None:
    """A norm of another order; libm's pow; a threshold fp32 does not hold (the comparison
    flips near it); a bf16 embedding gradient (summed by bf16 adds); a layer norm's weight and
    bias gradients from a bf16 dy (torch sums them in bf16); a bf16 layer norm and log-softmax
    (their kernels round inside)."""
    x = _randn(100, seed=1)
    assert arithmetic_of(aten.threshold_backward.default, (x, x, 0.1), {}) is None
    assert arithmetic_of(aten.threshold_backward.default, (x, x, 0.0), {}) is not None
    _, (grad, indices, *rest), _ = _embedding_backward(0)
    assert arithmetic_of(aten.embedding_dense_backward.default, (grad.to(torch.bfloat16), indices, *rest), {}) is None
    func, (x, *rest), _ = _layer_norm(0)  # a bf16 layer norm (torch 1.13 rounds inside), a bf16 log-softmax
    assert arithmetic_of(func, (x.to(torch.bfloat16), *rest), {}) is None
    assert arithmetic_of(aten._log_softmax.default, (x.to(torch.bfloat16), 1, False), {}) is None
    assert arithmetic_of(aten._log_softmax.default, (x, 1, False), {}) is not None
    _, (grad, *rest), _ = _layer_norm_backward(0)  # a bf16 gradient into an fp32 layer norm: summed in bf16
    assert arithmetic_of(aten.native_layer_norm_backward.default, (grad.to(torch.bfloat16), *rest), {}) is None
    assert arithmetic_of(aten.native_layer_norm_backward.default, (grad, *rest), {}).at(2) is not None
    assert arithmetic_of(aten.linalg_vector_norm.default, (x, 1), {}) is None
    assert arithmetic_of(aten.norm.ScalarOpt_dim, (x, 3, [0]), {}) is None
    assert arithmetic_of(aten.norm.ScalarOpt_dim, (x, None, [0]), {}) is not None  # p None: the 2-norm
    assert arithmetic_of(aten.pow.Tensor_Scalar, (x, 2.5), {}) is None  # libm's pow: no measured bound
    assert arithmetic_of(aten.pow.Tensor_Tensor, (x, x), {}) is None


def test_a_bf16_cube_is_not_judged_as_fp32_arithmetic() -> None:
    """torch's bf16 x^3 rounds x x to bf16 before the last multiply (both torches): not the
    two fp32 roundings its entry counts, so not judged; an fp32 cube and a bf16 square are."""
    x = _randn(100, seed=2)
    assert arithmetic_of(aten.pow.Tensor_Scalar, (x.to(torch.bfloat16), 3), {}) is None
    assert arithmetic_of(aten.pow.Tensor_Scalar, (x, 3), {}) is not None
    assert arithmetic_of(aten.pow.Tensor_Scalar, (x.to(torch.bfloat16), 2), {}) is not None
