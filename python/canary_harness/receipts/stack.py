"""The stack line of a Python run: what ran it, so that two receipts that disagree can say why.

It fills the same manifest attributes as harness/run/stack_info.cpp, read the same way:
`toolchain` is the interpreter and the settings that change numerics (the C++ puts its
compiler and numerics flags there), `libraries` the versions of every library on the
numerics path, `host` and `cpu` the machine, and `kernels` the kernel choices that could
matter (for torch: the device and its determinism switches).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
import types
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

# Environment variables that change numerics (or how XLA/cuBLAS pick kernels) when set.
NUMERICS_ENV = (
    "XLA_FLAGS",
    "XLA_NO_SPECIAL_SCALARS",
    "XLA_USE_BF16",
    "PJRT_DEVICE",
    "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "OMP_NUM_THREADS",
    # The CPU kernels a torch picks (the emulated hosts of `harness calibrate --hosts`): ATen's
    # ISA, oneDNN's, and the fp32 GEMM's BLAS (MKL in the wheels, OpenBLAS in Debian's). Set,
    # a run is another platform than one without them (docs/budgets.md, "Hosts").
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "MKL_CBWR",
    "OPENBLAS_CORETYPE",
)


@dataclass(frozen=True)
class StackInfo:
    """The manifest's stack attributes (docs/receipt-schema.md, /manifest)."""

    toolchain: str
    libraries: str
    host: str
    cpu: str
    kernels: str
    # The CPU kernels' ISA ATen dispatched to ("" without torch). Not part of the platform that
    # `check` compares (the cpu, toolchain, libraries and kernels are): the CPU and the numerics
    # env decide it, and goldens recorded before it was would all become another platform.
    cpu_capability: str = ""

    def as_manifest(self) -> Dict[str, str]:
        manifest = {"toolchain": self.toolchain, "libraries": self.libraries, "host": self.host, "cpu": self.cpu,
                    "kernels": self.kernels}
        if self.cpu_capability:
            manifest["cpu_capability"] = self.cpu_capability
        return manifest


def _version(distribution: str) -> Optional[str]:
    """An installed distribution's version without importing it (torch_xla, libtpu are heavy)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


# The x86 instruction-set extensions whose presence changes which kernels a math library
# (oneDNN, MKL, OpenBLAS, ATen's dispatch) runs, and so a real stack's bits: two hosts that
# report the same model name (a VM's "Intel(R) Xeon(R) Processor") but differ here are two
# platforms (docs/budgets.md, "Real stacks across hosts").
KERNEL_ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                    "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


def cpu_model(cpuinfo_path: str = "/proc/cpuinfo") -> str:
    """The CPU model as /proc/cpuinfo names it (what the C++ records), followed by the
    kernel-relevant ISA extensions it lists, e.g. "AMD EPYC [avx avx2 fma]"; else platform's guess."""
    model, flags = None, set()
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
                if model is not None and flags:
                    break
    except OSError:
        pass
    if model is None:
        return platform.processor() or platform.machine() or "unknown"
    isa = [f for f in KERNEL_ISA_FLAGS if f in flags]
    return f"{model} [{' '.join(isa)}]" if isa else model


def aten_cpu_capability(torch: types.ModuleType) -> str:
    """The CPU kernels' ISA a loaded torch's ATen dispatches to, as torch names it: on 2.x
    torch.backends.cpu says it (AVX2, AVX512, DEFAULT, ...); torch 1.13 only in its build
    summary ("CPU capability usage: AVX2", or "NO AVX" under ATEN_CPU_CAPABILITY=default).
    "" where neither does."""
    get_capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    if get_capability is not None:
        return str(get_capability())
    for line in torch.__config__.show().splitlines():
        key, _, value = line.strip().lstrip("- ").partition(":")
        if key == "CPU capability usage":
            return value.strip()
    return ""


def numerics_env() -> Dict[str, str]:
    """The numerics-changing environment variables that are set, by name."""
    return {name: os.environ[name] for name in NUMERICS_ENV if name in os.environ}


def _torch_parts(torch) -> tuple[List[str], List[str]]:
    """(library versions, kernel settings) of a loaded torch."""
    libraries = [f"torch {torch.__version__}"]
    kernels = ["device=cpu"]
    if torch.cuda.is_available():
        libraries.append(f"CUDA {torch.version.cuda}")
        libraries.append(f"cuDNN {torch.backends.cudnn.version()}")
        try:
            nccl = torch.cuda.nccl.version()
            libraries.append("NCCL " + (".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)))
        except Exception:  # NCCL is optional in a torch build: its absence is not an error
            pass
        kernels = [f"device={torch.cuda.get_device_name()}"]
    with warnings.catch_warnings():  # torch 2.9 warns that the allow_tf32 flags have a newer API: still read them
        warnings.simplefilter("ignore")
        tf32 = (int(torch.backends.cuda.matmul.allow_tf32), int(torch.backends.cudnn.allow_tf32))
    kernels += [
        f"threads={torch.get_num_threads()}",
        f"deterministic_algorithms={int(torch.are_deterministic_algorithms_enabled())}",
        f"cudnn.deterministic={int(torch.backends.cudnn.deterministic)}",
        f"cudnn.benchmark={int(torch.backends.cudnn.benchmark)}",
        f"matmul.allow_tf32={tf32[0]}",
        f"cudnn.allow_tf32={tf32[1]}",
    ]
    if hasattr(torch, "get_float32_matmul_precision"):
        kernels.append(f"float32_matmul_precision={torch.get_float32_matmul_precision()}")
    return libraries, kernels


def _xla_kernels() -> List[str]:
    """The PJRT client torch_xla (or JAX) runs on, where this process uses it; on XLA's CPU
    client also the cores it may spread an op over: its results are bitwise repeatable on one
    host at one core count, and another count splits its dots and reductions otherwise
    (measured: docs/xla.md), so the count is part of the platform."""
    if "torch_xla" in sys.modules and os.environ.get("PJRT_DEVICE"):
        client = os.environ["PJRT_DEVICE"]
    elif "jax" in sys.modules:  # a JAX run (canary_harness.jax): its backend, which JAX_PLATFORMS picks
        client = os.environ.get("JAX_PLATFORMS", "default").upper()
    else:
        return []
    kernels = [f"pjrt={client}"]
    if client.startswith("CPU"):
        kernels.append(f"xla_cpu_cores={len(os.sched_getaffinity(0))}")
    return kernels


def git_commit_of(path: str) -> str:
    """The commit of the git work tree holding `path`, with "-dirty" when tracked files have
    uncommitted changes (as the C++ build stamps git_commit); "unknown" outside a work
    tree or without git."""
    directory = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    try:
        head = subprocess.run(["git", "-C", directory, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        changes = subprocess.run(["git", "-C", directory, "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if changes.returncode != 0 or changes.stdout.strip() else "")


def imported_distributions(module: types.ModuleType) -> List[str]:
    """"NAME VERSION" of every installed distribution that `module` (a canary file) imports
    from, sorted: what the team's code put on the numerics path (transformers, ...), found from
    the names its globals hold (modules, and the classes and functions it imported from them)
    and, through the team's own modules it imports (files of no installed distribution),
    theirs. The packages the stack line names anyway are left out."""
    owners = importlib.metadata.packages_distributions()
    found: set = set()
    seen: set = set()
    pending = [module]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for value in list(vars(current).values()):
            origin = value if isinstance(value, types.ModuleType) else \
                sys.modules.get(getattr(value, "__module__", None) or "")
            if origin is None:
                continue
            distributions = owners.get(origin.__name__.partition(".")[0], [])
            if distributions:
                found.update(d for d in distributions if d.lower().replace("_", "-") not in _NAMED_ANYWAY)
            elif _is_team_module(origin):
                pending.append(origin)
    return sorted((f"{d} {_version(d)}" for d in found if _version(d)), key=str.lower)


def _is_team_module(module: types.ModuleType) -> bool:
    """A module from a file outside the standard library and site-packages: the team's own."""
    path = getattr(module, "__file__", None)
    top = module.__name__.partition(".")[0]
    if not path or top in sys.stdlib_module_names or top == __name__.partition(".")[0]:  # this package: not the team's
        return False
    return "site-packages" not in path and "dist-packages" not in path


# Named by collect_stack_info itself (or the package under test): not repeated.
_NAMED_ANYWAY = {"torch", "numpy", "h5py", "xxhash", "torch-xla", "jax", "jaxlib", "canary-harness"}


def attention_implementations(model: Any) -> List[str]:
    """The attention implementations `model`'s modules declare they run, sorted: the
    `_attn_implementation` their `config` carries (transformers sets it per model: "sdpa",
    "eager", "flash_attention_2", ...; sdpa and eager move a run's bits from step 0), read
    from the modules whatever the model is. Empty when no module declares one."""
    found = set()
    for module in model.modules():
        declared = getattr(getattr(module, "config", None), "_attn_implementation", None)
        if isinstance(declared, str) and declared:
            found.add(declared)
    return sorted(found)


def with_model(stack: StackInfo, model: Any, distributions: Sequence[str]) -> StackInfo:
    """`stack` with `distributions` ("NAME VERSION": imported_distributions') among its
    libraries and the attention implementations `model`'s modules declare among its kernels
    (sdpa and eager differ in the bits from step 0): a team's model's stack line."""
    libraries = "; ".join([stack.libraries, *distributions])
    attention = attention_implementations(model)
    kernels = stack.kernels
    if attention:
        declared = f"attention={','.join(attention)}"
        kernels = declared if kernels == "none" else f"{kernels} {declared}"
    return dataclasses.replace(stack, libraries=libraries, kernels=kernels)


def collect_stack_info(include_torch: Optional[bool] = None) -> StackInfo:
    """Describe the running stack.

    include_torch=None describes torch only if the program already imported it: a run that
    never touched torch should not pay its import time, nor name it as part of its stack.
    """
    import h5py
    import numpy
    import xxhash

    toolchain = f"{platform.python_implementation()} {platform.python_version()} ({platform.python_compiler()})"
    env = numerics_env()
    toolchain += "; numerics env: " + (" ".join(f"{k}={v}" for k, v in env.items()) if env else "none")

    libraries = [f"numpy {numpy.__version__}", f"h5py {h5py.__version__} (HDF5 {h5py.version.hdf5_version})",
                 f"xxhash {xxhash.VERSION}"]
    kernels: List[str] = []
    cpu_capability = ""
    if include_torch is None:
        include_torch = "torch" in sys.modules
    if include_torch:
        import torch

        torch_libraries, kernels = _torch_parts(torch)
        cpu_capability = aten_cpu_capability(torch)
        libraries += torch_libraries
        kernels += _xla_kernels()
        if "torch_xla" in sys.modules:  # torch's XLA backend, where the run uses it (installed is not used)
            for distribution in ("torch_xla", "libtpu", "libtpu-nightly"):
                version = _version(distribution)
                if version:
                    libraries.append(f"{distribution} {version}")
    if "jax" in sys.modules:  # a JAX run (canary_harness.jax)
        libraries += [f"{distribution} {_version(distribution)}" for distribution in ("jax", "jaxlib")
                      if _version(distribution)]
    return StackInfo(toolchain=toolchain, libraries="; ".join(libraries), host=socket.gethostname(), cpu=cpu_model(),
                     kernels=" ".join(kernels) if kernels else "none", cpu_capability=cpu_capability)
