#!/usr/bin/env python3
"""The measured worst case of exp, tanh and erf as each stack computes them (docs/oracle.md,
"Functions as each stack computes them"), over the fp32 inputs of their domains:
- exp in ulps of fp32 over softmax's domain, x in [-87.33, 0], where exp(x) is at least the
  least normal fp32, so that a relative error says all;
- tanh and erf as GELU reads them, inside 1 + f: their absolute error, in units of
  u = 2^-24 (half an ulp of 1), over [-10, 10] and [-5, 5] (past which both are +-1 in fp32);
- GELU's two forms (torch's `approximate` "tanh" and "none"): the deviation |y^ - y| / (|x|/2)
  in units of u over |x| in [2^-125, 10], the function's error as the whole kernel shows it
  (its roundings included; a kernel may call another tanh or erf than torch.tanh and
  torch.erf: torch 2.9's GELU does);
- SiLU, x sigma(x) (SwiGLU's): its relative error in units of u over x in [-87.33, 20] less
  |x| < 2^-125;
- log, in ulps of fp32, over [1, 2^20] (a softmax's sum: cross-entropy's log-sum-exp).
The oracle's bounds of a softmax, an attention core and GELU take the worst of these
(engines/numerics/function_bounds.h: kStackExpUlps, kStackGeluTanhError, kStackGeluErfError,
kStackSiluError, kStackLogUlps);
a stack measured worse than them must raise them there.

Stacks, each where it is installed:
- eager: under each ATen CPU capability this host runs (ATEN_CPU_CAPABILITY, a child process
  each: default, avx2, avx512), and the exp inside torch.softmax, read
  through rows [0, x, -inf, ...] whose sum rounds to exactly 1 for x <= -17 (so the
  softmax's probability is its exp(x) itself);
- compiled: torch.compile (Inductor's C++ kernels) of each, and of the softmax rows;
- xla: torch_xla's on its CPU device; jax: jax.numpy's, jax.scipy's and jax.nn's on the CPU.

The references are float64 exp, tanh and erf (numpy's and torch's, within an ulp of float64:
2^-29 ulps of fp32). exp's error is |got - exp(x)| / ulp(exp(x)), ulp the spacing of fp32
at the exact value; tanh's and erf's |got - f(x)| / 2^-24.

Usage (torch 2.x for compiled, xla and jax: the pinned environment, docs/python-env.md):
    .venv/bin/python bench/libm_accuracy.py [--stacks eager,compiled,xla,jax] [--stride 1] [--json FILE]
--stride S reads every S-th input only (a sample: quicker, no longer exhaustive).
This is a measurement, not a test: it prints the host it ran on.
"""

import argparse
import json
import math
import os
import platform
import subprocess
import sys
from typing import Callable, Dict, Iterator, List

import numpy as np

CHUNK = 1 << 22
# exp(x) >= 2^-126 (the least normal fp32) for x >= -87.3365: the softmax domain's inputs
# with a normal result, as fp32 bit patterns (negative floats: the pattern grows with |x|).
NEGATIVE_ZERO = 0x80000000
LEAST_NORMAL_EXP_INPUT = int(np.array([-87.33654], dtype=np.float32).view(np.uint32)[0])
# For x <= -17 the row [0, x] sums to 1 + exp(x), which rounds to 1 exactly in fp32.
SOFTMAX_EXACT_SUM_INPUT = int(np.array([-17.0], dtype=np.float32).view(np.uint32)[0])
U = 2.0**-24


def bits(x: float) -> int:
    return int(np.array([x], dtype=np.float32).view(np.uint32)[0])


# tanh and erf are odd and saturate: the negative inputs down to -10 and -5 say all.
TANH_RANGE = (NEGATIVE_ZERO, bits(-10.0))
ERF_RANGE = (NEGATIVE_ZERO, bits(-5.0))
# GELU is neither odd nor even: both signs, from |x| = 2^-125 to 10 (past which it is x, or
# a value far below the bound's allowance e_f |x| / 2). Below 2^-125 GELU is subnormal: XLA
# flushes it to zero, an absolute error below 2^-126 the bound allows apart (function_bounds.h).
GELU_RANGE = (bits(-2.0**-125), bits(-10.0))
# SiLU, x sigma(x): from the least normal to -87.33 (below which the stacks lose its value:
# exp(-x) overflows, or XLA's logistic underflows; an absolute error below 2^-119.5 there, which
# the bound allows apart) and to +20 (past which it is x in fp32); -x for the positive side.
SILU_NEGATIVE = (bits(-2.0**-125), bits(-87.33))
SILU_POSITIVE = (bits(-2.0**-125), bits(-20.0))
# log of a softmax's sum, at least exp(0) = 1 and at most the row's length: [1, 2^20].
LOG_RANGE = (bits(1.0), bits(2.0**20))


def inputs(first: int, last: int, stride: int) -> Iterator[np.ndarray]:
    """The fp32 inputs with bit patterns first..last, every stride-th, in chunks."""
    for start in range(first, last + 1, CHUNK * stride):
        stop = min(start + CHUNK * stride, last + 1)
        yield np.arange(start, stop, stride, dtype=np.uint64).astype(np.uint32).view(np.float32)


def ulps(got: np.ndarray, x: np.ndarray) -> float:
    exact = np.exp(x.astype(np.float64))
    _, exponent = np.frexp(exact)  # exact = m 2^e, m in [0.5, 1): fp32's spacing there is 2^(e - 24)
    return float(np.max(np.abs(got.astype(np.float64) - exact) / np.ldexp(1.0, exponent - 24)))


def tanh_error(got: np.ndarray, x: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - np.tanh(x.astype(np.float64)))) / U)


def _erf64(x64: np.ndarray) -> np.ndarray:
    """float64 erf: torch's (within an ulp of float64; numpy has none, math.erf is per element)."""
    import torch
    return torch.erf(torch.from_numpy(x64)).numpy()


def erf_error(got: np.ndarray, x: np.ndarray) -> float:
    exact = _erf64(x.astype(np.float64))
    return float(np.max(np.abs(got.astype(np.float64) - exact)) / U)


def worst(fn: Callable[[np.ndarray], np.ndarray], first: int, last: int, stride: int,
          error: Callable[[np.ndarray, np.ndarray], float] = ulps) -> float:
    return max(error(fn(x), x) for x in inputs(first, last, stride))


def gelu_exact(x: np.ndarray, form: str) -> np.ndarray:
    x64 = x.astype(np.float64)
    if form == "tanh":
        return 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3)))
    return 0.5 * x64 * (1 + _erf64(x64 * math.sqrt(0.5)))


def gelu_error(form: str) -> Callable[[np.ndarray, np.ndarray], float]:
    """GELU's deviation in units of u |x| / 2: the function's error as the whole kernel shows
    it (y = x/2 (1 + f): f off by e moves y by e |x| / 2), its roundings included."""
    def error(got: np.ndarray, x: np.ndarray) -> float:
        x64 = x.astype(np.float64)
        keep = x64 != 0
        deviation = np.abs(got.astype(np.float64) - gelu_exact(x, form))[keep] / (0.5 * np.abs(x64[keep]))
        return float(np.max(deviation)) / U if deviation.size else 0.0
    return error


def log_ulps(got: np.ndarray, x: np.ndarray) -> float:
    """log's error in ulps of fp32 at the exact value (log(1) = 0 exactly: left out)."""
    exact = np.log(x.astype(np.float64))
    keep = exact != 0
    _, exponent = np.frexp(exact[keep])
    return float(np.max(np.abs(got.astype(np.float64)[keep] - exact[keep]) / np.ldexp(1.0, exponent - 24)))


def silu_error(got: np.ndarray, x: np.ndarray) -> float:
    """SiLU's relative error in units of u: x / (1 + exp(-x)) against float64's."""
    x64 = x.astype(np.float64)
    exact = x64 / (1 + np.exp(-x64))
    keep = exact != 0
    return float(np.max(np.abs(got.astype(np.float64)[keep] - exact[keep]) / np.abs(exact[keep]))) / U


def functions(apply: Callable[[Callable, np.ndarray], np.ndarray], exp: Callable, tanh: Callable, erf: Callable,
              gelu_tanh: Callable, gelu_erf: Callable, silu: Callable, log: Callable, stride: int) -> Dict[str, float]:
    """exp's and log's worst case in ulps, tanh's and erf's absolute in units of u, GELU's
    two forms' deviation in units of u |x| / 2 (gelu_error) and SiLU's relative error in
    units of u, each through `apply`."""
    return {
        "log": worst(lambda x: apply(log, x), *LOG_RANGE, stride, log_ulps),
        "silu": max(worst(lambda x: apply(silu, x), *SILU_NEGATIVE, stride, silu_error),
                    worst(lambda x: apply(silu, -x), *SILU_POSITIVE, stride, lambda g, x: silu_error(g, -x))),
        "exp": worst(lambda x: apply(exp, x), NEGATIVE_ZERO, LEAST_NORMAL_EXP_INPUT, stride),
        "tanh": worst(lambda x: apply(tanh, x), *TANH_RANGE, stride, tanh_error),
        "erf": worst(lambda x: apply(erf, x), *ERF_RANGE, stride, erf_error),
        "gelu tanh": max(worst(lambda x: apply(gelu_tanh, x), *GELU_RANGE, stride, gelu_error("tanh")),
                         worst(lambda x: apply(gelu_tanh, -x), *GELU_RANGE, stride, lambda g, x: gelu_error("tanh")(g, -x))),
        "gelu erf": max(worst(lambda x: apply(gelu_erf, x), *GELU_RANGE, stride, gelu_error("erf")),
                        worst(lambda x: apply(gelu_erf, -x), *GELU_RANGE, stride, lambda g, x: gelu_error("erf")(g, -x))),
    }


def softmax_rows(softmax: Callable) -> Callable[[np.ndarray], np.ndarray]:
    """exp(x) as a softmax computes it inside: row [0, x, -inf x 14] (16 wide, its vector
    path), whose sum rounds to 1 for x <= -17, so probability 1 is the kernel's exp(x)."""
    import torch

    def fn(x: np.ndarray) -> np.ndarray:
        rows = torch.full((x.size, 16), float("-inf"))
        rows[:, 0] = 0.0
        rows[:, 1] = torch.from_numpy(x)
        return softmax(rows)[:, 1].numpy()
    return fn


def on_cpu(fn: Callable, x: np.ndarray) -> np.ndarray:
    import torch
    return fn(torch.from_numpy(x)).numpy()


def eager(stride: int) -> Dict[str, float]:
    import torch
    torch.set_num_threads(1)
    gelu, silu = torch.nn.functional.gelu, torch.nn.functional.silu
    return {**functions(on_cpu, torch.exp, torch.tanh, torch.erf, lambda x: gelu(x, approximate="tanh"), gelu, silu,
                        torch.log, stride),
            "softmax exp": worst(softmax_rows(lambda r: torch.softmax(r, dim=-1)), SOFTMAX_EXACT_SUM_INPUT,
                                 LEAST_NORMAL_EXP_INPUT, stride)}


def compiled(stride: int) -> Dict[str, float]:
    import torch
    torch.set_num_threads(1)
    gelu = torch.nn.functional.gelu
    exp, tanh, erf, gelu_tanh, gelu_erf, silu, log = (torch.compile(f, dynamic=False) for f in (
        torch.exp, torch.tanh, torch.erf, lambda x: gelu(x, approximate="tanh"), gelu, torch.nn.functional.silu,
        torch.log))
    softmax = torch.compile(lambda r: torch.softmax(r, dim=-1), dynamic=False)
    return {**functions(on_cpu, exp, tanh, erf, gelu_tanh, gelu_erf, silu, log, stride),
            "softmax exp": worst(softmax_rows(softmax), SOFTMAX_EXACT_SUM_INPUT, LEAST_NORMAL_EXP_INPUT, stride)}


def xla(stride: int) -> Dict[str, float]:
    import torch
    import torch_xla.core.xla_model as xm
    device = xm.xla_device()

    def on_device(fn: Callable, x: np.ndarray) -> np.ndarray:
        padded = np.zeros(CHUNK, dtype=np.float32)  # one shape: one compile
        padded[:x.size] = x
        return fn(torch.from_numpy(padded).to(device)).cpu().numpy()[:x.size]
    gelu = torch.nn.functional.gelu
    return functions(on_device, torch.exp, torch.tanh, torch.erf, lambda x: gelu(x, approximate="tanh"), gelu,
                     torch.nn.functional.silu, torch.log, stride)


def jax_stack(stride: int) -> Dict[str, float]:
    import jax
    import jax.numpy as jnp
    import jax.scipy.special as special
    return functions(lambda fn, x: np.asarray(fn(x)), jax.jit(jnp.exp), jax.jit(jnp.tanh), jax.jit(special.erf),
                     jax.jit(lambda x: jax.nn.gelu(x, approximate=True)),
                     jax.jit(lambda x: jax.nn.gelu(x, approximate=False)), jax.jit(jax.nn.silu), jax.jit(jnp.log),
                     stride)


STACKS = {"eager": eager, "compiled": compiled, "xla": xla, "jax": jax_stack}
CAPABILITIES = ("default", "avx2", "avx512")


def host_capabilities() -> List[str]:
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    return [c for c in CAPABILITIES if c == "default" or (c == "avx2" and " avx2" in flags)
            or (c == "avx512" and " avx512f" in flags)]


def measure_in_child(stack: str, stride: int, environment: Dict[str, str]) -> Dict[str, float]:
    env = dict(os.environ, **environment)
    done = subprocess.run([sys.executable, __file__, "--child", stack, "--stride", str(stride)],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stacks", default="eager,compiled,xla,jax")
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(STACKS[args.child](args.stride)))
        return 0
    results: Dict[str, Dict[str, float]] = {}
    for stack in args.stacks.split(","):
        if stack not in STACKS:
            print(f"libm_accuracy: --stacks names '{stack}', not one of {', '.join(STACKS)}", file=sys.stderr)
            return 2
        variants = ([(f"{stack} ({c})", {"ATEN_CPU_CAPABILITY": c}) for c in host_capabilities()]
                    if stack in ("eager", "compiled") else [(stack, {"PJRT_DEVICE": "CPU"})])
        for name, environment in variants:
            results[name] = measure_in_child(stack, args.stride, environment)
            print(f"{name:<22} " + ", ".join(f"{k}: {v:.3f} {'ulps' if k in ('exp', 'softmax exp', 'log') else 'u'}"
                                            if isinstance(v, float) else f"{k}: {v}"
                                            for k, v in results[name].items()), flush=True)
    print(f"host: {cpu_model()}; stride {args.stride}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"host": cpu_model(), "stride": args.stride, "results": results}, f, indent=1)
    return 0


def cpu_model() -> str:
    if not os.path.exists("/proc/cpuinfo"):
        return platform.machine()
    pairs = (line.split(":", 1) for line in open("/proc/cpuinfo").read().split("\n\n")[0].splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in pairs}
    return ", ".join(f"{k} {fields[k]}" for k in ("model name", "cpu family", "model") if k in fields)


if __name__ == "__main__":
    sys.exit(main())
