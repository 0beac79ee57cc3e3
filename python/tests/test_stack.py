"""The stack line: what a receipt says about the Python stack that wrote it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from canary_harness.receipts import stack
from canary_harness.receipts.stack import collect_stack_info


def test_stack_line_names_python_libraries_host_and_cpu():
    info = collect_stack_info(include_torch=False)
    assert info.toolchain.startswith(f"CPython {sys.version_info.major}.{sys.version_info.minor}")
    assert "numpy " in info.libraries and "h5py " in info.libraries and re.search(r"\(HDF5 \d+\.\d+", info.libraries)
    assert "xxhash " in info.libraries and "torch" not in info.libraries
    assert info.host and info.cpu and info.kernels == "none"
    assert set(info.as_manifest()) == {"toolchain", "libraries", "host", "cpu", "kernels"}


def test_numerics_environment_is_recorded(monkeypatch: pytest.MonkeyPatch):
    for name in stack.NUMERICS_ENV:
        monkeypatch.delenv(name, raising=False)
    assert collect_stack_info(include_torch=False).toolchain.endswith("numerics env: none")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("UNRELATED", "1")
    toolchain = collect_stack_info(include_torch=False).toolchain
    assert "XLA_FLAGS=--xla_cpu_enable_fast_math=false" in toolchain and "OMP_NUM_THREADS=3" in toolchain
    assert "UNRELATED" not in toolchain


def test_every_host_a_python_stack_reads_is_recorded(harness_bin: Path, monkeypatch: pytest.MonkeyPatch):
    """Each variable the emulated hosts set (`harness hosts`) is in the stack line when set,
    but the harness engines' own (HARNESS_*, recorded in their receipts' kernels): a run under
    a host is another platform than its golden's."""
    listing = subprocess.run([str(harness_bin), "hosts"], capture_output=True, text=True, check=True).stdout
    variables = {assignment.split("=")[0] for line in listing.splitlines() for assignment in line.split("\t")[1].split()}
    python_read = {name for name in variables if not name.startswith("HARNESS_")}
    assert {"ATEN_CPU_CAPABILITY", "MKL_CBWR", "OPENBLAS_CORETYPE"} <= python_read, listing
    for name in python_read:
        monkeypatch.setenv(name, "X1")
        assert f"{name}=X1" in collect_stack_info(include_torch=False).toolchain, name
        monkeypatch.delenv(name)


def test_torch_versions_and_determinism_settings():
    torch = pytest.importorskip("torch")
    info = collect_stack_info(include_torch=True)
    assert f"torch {torch.__version__}" in info.libraries
    assert "deterministic_algorithms=0" in info.kernels and "matmul.allow_tf32=" in info.kernels
    torch.use_deterministic_algorithms(True)
    try:
        assert "deterministic_algorithms=1" in collect_stack_info(include_torch=True).kernels
    finally:
        torch.use_deterministic_algorithms(False)
    assert ("torch " in collect_stack_info().libraries) == ("torch" in sys.modules)  # None: only if imported


def test_the_aten_capability_is_recorded_and_follows_the_emulated_host():
    """ATen picks its CPU kernels at start-up from the CPU and ATEN_CPU_CAPABILITY; the
    manifest's cpu_capability says what it picked, on torch 1.13 as on 2.x, and a run
    without torch records none."""
    script = ("import torch; from canary_harness.receipts.stack import collect_stack_info; "
              "print(collect_stack_info(include_torch=True).as_manifest()['cpu_capability'])")
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    env["PYTHONPATH"] = str(Path(stack.__file__).resolve().parents[2])

    def capability(**assignments: str) -> str:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                              env={**env, **assignments})
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    scalar = {"DEFAULT", "NO AVX"}  # 2.x's name of ATen's scalar kernels, and 1.13's
    assert capability(ATEN_CPU_CAPABILITY="default") in scalar
    if "avx2" in stack.cpu_model().split("[")[-1].split():
        assert capability() in {"AVX2", "AVX512"}, capability()
    assert "cpu_capability" not in collect_stack_info(include_torch=False).as_manifest()


def test_cuda_stack_is_described():
    # No GPU here: a stand-in torch with CUDA, to run the branch a GPU host takes.
    flag = SimpleNamespace
    fake = SimpleNamespace(
        __version__="2.3.0+cu121",
        version=SimpleNamespace(cuda="12.1"),
        cuda=SimpleNamespace(is_available=lambda: True, get_device_name=lambda: "NVIDIA H100 80GB HBM3",
                             nccl=SimpleNamespace(version=lambda: (2, 20, 5))),
        backends=SimpleNamespace(cudnn=flag(version=lambda: 8902, deterministic=True, benchmark=False,
                                            allow_tf32=True),
                                 cuda=flag(matmul=flag(allow_tf32=False))),
        get_num_threads=lambda: 8,
        are_deterministic_algorithms_enabled=lambda: True,
        get_float32_matmul_precision=lambda: "highest",
    )
    libraries, kernels = stack._torch_parts(fake)
    assert libraries == ["torch 2.3.0+cu121", "CUDA 12.1", "cuDNN 8902", "NCCL 2.20.5"]
    assert kernels[0] == "device=NVIDIA H100 80GB HBM3"
    assert {"deterministic_algorithms=1", "cudnn.deterministic=1", "cudnn.benchmark=0", "matmul.allow_tf32=0",
            "cudnn.allow_tf32=1", "float32_matmul_precision=highest"} <= set(kernels)


def _cpuinfo(tmp_path, model: str, flags: str) -> str:
    path = tmp_path / "cpuinfo"
    processor = f"processor\t: {{}}\nmodel name\t: {model}\nflags\t\t: {flags}\n\n"
    path.write_text(processor.format(0) + processor.format(1))
    return str(path)


def test_cpu_names_the_kernel_relevant_isa_so_two_hosts_of_one_model_name_differ(tmp_path):
    # Two VMs that both report "Intel(R) Xeon(R) Processor": one with AVX-512 only, one with
    # AMX and AVX512-FP16 too (oneDNN's bf16 kernels differ between them).
    plain = stack.cpu_model(_cpuinfo(tmp_path, "Intel(R) Xeon(R) Processor", "fpu sse2 avx avx2 fma avx512f avx512bw"))
    amx = stack.cpu_model(_cpuinfo(tmp_path, "Intel(R) Xeon(R) Processor",
                                   "fpu sse2 avx avx2 fma avx512f avx512bw avx512_fp16 amx_tile amx_bf16"))
    assert plain == "Intel(R) Xeon(R) Processor [avx avx2 fma avx512f avx512bw]"
    assert amx.startswith("Intel(R) Xeon(R) Processor [") and "amx_bf16" in amx and "avx512_fp16" in amx
    assert plain != amx
    # flags that do not pick kernels (and their order in /proc/cpuinfo) change nothing
    assert stack.cpu_model(_cpuinfo(tmp_path, "Intel(R) Xeon(R) Processor", "avx512bw fma ht avx512f avx2 avx")) == plain


def test_cpu_without_isa_flags_is_the_model_name_and_without_cpuinfo_a_guess(tmp_path):
    assert stack.cpu_model(_cpuinfo(tmp_path, "Some ARM core", "fp asimd")) == "Some ARM core"
    assert stack.cpu_model(str(tmp_path / "missing")) != ""
