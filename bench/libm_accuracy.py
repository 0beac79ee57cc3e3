#!/usr/bin/env python3
"""The measured worst case of exp as each stack computes it, in ulps of fp32, exhaustively
over every fp32 input of softmax's domain (docs/oracle.md, "The attention core at its
output"): x in [-87.33, 0], where exp(x) is at least the least normal fp32, so that a
relative error says all. The oracle's bound of an attention core or a softmax takes the
worst of these (engines/numerics/softmax_bounds.h, kStackExpUlps); a stack measured worse
than it must raise it there.

Stacks, each where it is installed:
- eager: torch.exp under each ATen CPU capability this host runs (ATEN_CPU_CAPABILITY,
  a child process each: default, avx2, avx512), and the exp inside torch.softmax, read
  through rows [0, x, -inf, ...] whose sum rounds to exactly 1 for x <= -17 (so the
  softmax's probability is its exp(x) itself);
- compiled: torch.compile (Inductor's C++ kernels) of torch.exp and of the softmax rows;
- xla: torch_xla's exp on its CPU device; jax: jax.numpy.exp on the CPU.

The reference is float64 exp (within 1 ulp of float64: 2^-29 ulps of fp32). An input's
error is |got - exp(x)| / ulp(exp(x)), ulp the spacing of fp32 at the exact value.

Usage (torch 2.x for compiled, xla and jax: the pinned environment, docs/python-env.md):
    .venv/bin/python bench/libm_accuracy.py [--stacks eager,compiled,xla,jax] [--stride 1] [--json FILE]
--stride S reads every S-th input only (a sample: quicker, no longer exhaustive).
This is a measurement, not a test: it prints the host it ran on.
"""

import argparse
import json
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


def inputs(first: int, last: int, stride: int) -> Iterator[np.ndarray]:
    """The fp32 inputs with bit patterns first..last, every stride-th, in chunks."""
    for start in range(first, last + 1, CHUNK * stride):
        stop = min(start + CHUNK * stride, last + 1)
        yield np.arange(start, stop, stride, dtype=np.uint64).astype(np.uint32).view(np.float32)


def ulps(got: np.ndarray, x: np.ndarray) -> float:
    exact = np.exp(x.astype(np.float64))
    _, exponent = np.frexp(exact)  # exact = m 2^e, m in [0.5, 1): fp32's spacing there is 2^(e - 24)
    return float(np.max(np.abs(got.astype(np.float64) - exact) / np.ldexp(1.0, exponent - 24)))


def worst(fn: Callable[[np.ndarray], np.ndarray], first: int, last: int, stride: int) -> float:
    return max(ulps(fn(x), x) for x in inputs(first, last, stride))


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


def eager(stride: int) -> Dict[str, float]:
    import torch
    torch.set_num_threads(1)
    return {
        "exp": worst(lambda x: torch.exp(torch.from_numpy(x)).numpy(), NEGATIVE_ZERO, LEAST_NORMAL_EXP_INPUT, stride),
        "softmax exp": worst(softmax_rows(lambda r: torch.softmax(r, dim=-1)), SOFTMAX_EXACT_SUM_INPUT,
                             LEAST_NORMAL_EXP_INPUT, stride),
    }


def compiled(stride: int) -> Dict[str, float]:
    import torch
    torch.set_num_threads(1)
    exp = torch.compile(torch.exp, dynamic=False)
    softmax = torch.compile(lambda r: torch.softmax(r, dim=-1), dynamic=False)
    return {
        "exp": worst(lambda x: exp(torch.from_numpy(x)).numpy(), NEGATIVE_ZERO, LEAST_NORMAL_EXP_INPUT, stride),
        "softmax exp": worst(softmax_rows(softmax), SOFTMAX_EXACT_SUM_INPUT, LEAST_NORMAL_EXP_INPUT, stride),
    }


def xla(stride: int) -> Dict[str, float]:
    import torch
    import torch_xla.core.xla_model as xm
    device = xm.xla_device()

    def fn(x: np.ndarray) -> np.ndarray:
        padded = np.zeros(CHUNK, dtype=np.float32)  # one shape: one compile
        padded[:x.size] = x
        return torch.exp(torch.from_numpy(padded).to(device)).cpu().numpy()[:x.size]
    return {"exp": worst(fn, NEGATIVE_ZERO, LEAST_NORMAL_EXP_INPUT, stride)}


def jax_stack(stride: int) -> Dict[str, float]:
    import jax
    import jax.numpy as jnp
    exp = jax.jit(jnp.exp)
    return {"exp": worst(lambda x: np.asarray(exp(x)), NEGATIVE_ZERO, LEAST_NORMAL_EXP_INPUT, stride)}


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
            print(f"{name:<22} " + ", ".join(f"{k}: {v:.3f} ulps" if isinstance(v, float) else f"{k}: {v}"
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
