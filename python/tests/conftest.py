"""Shared fixtures: the C++ harness binary and receipts it wrote.

The conformance tests need the real binary: without it they fail (never skip), because a
Python package that was never held against the C++ harness proves nothing.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, FrozenSet, Tuple

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]

# Inductor (torch 2.x) finds the vector ISAs it may use, in each process, by building a test
# library per ISA and loading it in a fresh interpreter that imports torch: 2.5 s of a
# compiled child's 9.6 on a 2-core Zen 4 (2026-12-01). The suite's compiled children take
# the CPU's flags' answer (TORCHINDUCTOR_VEC_ISA_OK), which is the probe's wherever the
# system compiler builds those ISAs (Debian 12's GCC 12 builds AVX2 and AVX-512); a user's
# run probes as Inductor does. Children inherit it from this process's environment.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")


def pytest_configure(config: pytest.Config) -> None:
    # The suite runs once per torch: Debian's 1.13 (python.canary_harness) runs every test; torch
    # 2.x (python.torch2) deselects these, whose outcome the package decides before torch
    # computes anything (docs/testing.md, "One suite, two torches").
    config.addinivalue_line("markers", "torch_agnostic: a refusal the package makes before torch computes: "
                                       "the torch 1.13 suite runs it, the torch 2.x suite does not")


def _harness_bin() -> Path:
    candidates = [os.environ["HARNESS_BIN"]] if os.environ.get("HARNESS_BIN") else []
    candidates.append(str(REPO / "build" / "bin" / "harness"))
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return Path(candidate)
    pytest.fail(f"no harness binary: set HARNESS_BIN or build it (cmake --build build) so that "
                f"{REPO / 'build' / 'bin' / 'harness'} exists; tried {', '.join(candidates)}", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def harness_bin() -> Path:
    """The harness, exported as HARNESS_BIN for every canary_harness process the tests start
    (they find the digest library beside it, as a harness-started child does)."""
    path = _harness_bin()
    os.environ.setdefault("HARNESS_BIN", str(path))
    return path


def _built_library(harness_bin: Path, file_name: str, what: str) -> str:
    """A library the build made next to the harness binary, or the test fails saying so."""
    path = harness_bin.resolve().parent.parent / "lib" / file_name
    if not path.exists():
        pytest.fail(f"{path}: the build makes the {what} library next to {harness_bin} (cmake --build build)",
                    pytrace=False)
    return str(path)


@pytest.fixture(scope="session")
def digest_library(harness_bin: Path) -> str:
    """The digest library the build made next to the harness binary (canary_harness.receipts.native)."""
    from canary_harness.receipts.native import LIBRARY_FILE

    return _built_library(harness_bin, LIBRARY_FILE, "digest")


@pytest.fixture(scope="session")
def writer_library(harness_bin: Path) -> str:
    """The receipt writer library beside it (canary_harness.receipts.receipt_native)."""
    from canary_harness.receipts.receipt_native import LIBRARY_FILE

    return _built_library(harness_bin, LIBRARY_FILE, "receipt")


def run_module(module: str, *args: str, check: bool = True, unset: tuple = ()) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` with this interpreter and the canary_harness under test first on
    its path (the checkout's, or the installed copy in the virtual-environment check);
    `unset`: environment variables the child must not see. A non-zero exit fails the test
    with the child's output unless check is False."""
    import canary_harness

    package_root = str(Path(canary_harness.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": package_root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for name in unset:
        env.pop(name, None)
    result = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=600,
                            env=env)
    if check and result.returncode != 0:
        pytest.fail(f"{module} {' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}",
                    pytrace=False)
    return result


def run_harness(harness_bin: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([str(harness_bin), *args], capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        pytest.fail(f"harness {' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}",
                    pytrace=False)
    return result


def precision_report(harness_bin: Path, receipt: Path, step: int, *flags: str) -> tuple:
    """`harness precision RECEIPT --step K --json`: its exit code (0 within, 1 over) and its report."""
    result = run_harness(harness_bin, "precision", str(receipt), "--step", str(step), "--json", *flags, check=False)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


# own_canaries/small.py, the suite's own small canary.
SMALL_CANARY = str(Path(__file__).parent / "own_canaries" / "small.py")


@pytest.fixture(scope="session")
def small_canary_receipt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`small.py:canary` run once as it is (6 steps, fp32, no flag), for every test that
    needs that run and only reads its receipt (each such run costs a child and its torch)."""
    out = tmp_path_factory.mktemp("small-canary") / "small.h5"
    run_module("canary_harness", "run", f"{SMALL_CANARY}:canary", "--out", str(out))
    return out


@pytest.fixture(scope="session")
def small_canary_3_steps(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`small.py:canary --precision P --steps 3`, run once a session per precision (fp32, the
    default, or bf16) for the tests that only read its receipt: a function P -> receipt."""
    receipts: Dict[str, Path] = {}

    def receipt(precision: str) -> Path:
        if precision not in receipts:
            out = tmp_path_factory.mktemp(f"small-canary-3-{precision}") / f"small-{precision}.h5"
            run_module("canary_harness", "run", f"{SMALL_CANARY}:canary", "--out", str(out), "--precision", precision,
                       "--steps", "3")
            receipts[precision] = out
        return receipts[precision]

    return receipt


@pytest.fixture(scope="session")
def small_canary_fsdp(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """`small.py:canary --layout fsdp`, run once a session for the tests that only read it:
    (the child's CompletedProcess, the receipt). Torch 1.13 has no FSDP2: the result is its
    refusal (not checked here; each test asserts it) and no receipt is written."""
    from canary_harness.runs.distributed import fsdp_available

    out = tmp_path_factory.mktemp("small-fsdp") / "fsdp.h5"
    result = run_module("canary_harness", "run", f"{SMALL_CANARY}:canary", "--out", str(out), "--layout", "fsdp",
                        check=fsdp_available())
    return result, out


@pytest.fixture(scope="session")
def cpp_receipt(harness_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """micro, 3 steps, parameters dumped at the start of steps 0..3, batches recorded."""
    out = tmp_path_factory.mktemp("cpp") / "micro.h5"
    run_harness(harness_bin, "run", "--canary", "micro", "--steps", "3", "--dump-tensors", "0,1,2,3",
                "--record-batches", "--out", str(out))
    return out


@pytest.fixture(scope="session")
def cpp_trace_receipt(harness_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """micro, 2 steps with op traces: the traced loss is a 1-element tensor (a partial block)."""
    out = tmp_path_factory.mktemp("cpp") / "trace.h5"
    run_harness(harness_bin, "run", "--canary", "micro", "--steps", "2", "--trace", "ops", "--out", str(out))
    return out


def budgets_tightened(out: Path, features: Tuple[str, ...], factor: float) -> Path:
    """The shipped budgets with the tolerances of `features`' entries times `factor`."""
    lines, section = [], None
    for line in (REPO / "canaries" / "budgets.toml").read_text().splitlines(keepends=True):
        header = re.match(r"^\[([^\]]+)\]", line)
        section = header.group(1) if header else section
        if section in features:
            line = re.sub(r"(atol|rtol) = ([0-9.e+-]+)", lambda g: f"{g.group(1)} = {float(g.group(2)) * factor:.3g}",
                          line)
        lines.append(line)
    out.write_text("".join(lines))
    return out


def assert_rounding_at_first_module(harness_bin: Path, a: Path, b: Path, pack: Path, budgets: Path,
                                    module: str) -> None:
    """`harness bisect A B --pack --budgets` parts at step 0 at `module`'s output, found in the
    lanes' op traces, and the oracle judges each side on its own inputs: both within their
    bounds, rounding."""
    result = run_harness(harness_bin, "bisect", str(a), str(b), "--pack", str(pack), "--budgets", str(budgets),
                         "--json", check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    op = report["first_divergent_op"]
    assert (report["first_divergent_step"], op["level"], op["name"], op["phase"]) == (0, "ops", module, "forward"), op
    oracle = report["oracle"]
    for side in ("a", "b"):
        assert oracle[side]["judged"] and oracle[side]["within"], oracle
        assert 0 < oracle[side]["error_ulps"] <= oracle[side]["bound_ulps"], oracle
    assert oracle["verdict"] == "both within their bounds: rounding"


def export_pack(harness_bin: Path, out: Path, canary: str = "micro", steps: int = 3, seed: int = 1337) -> Path:
    """`harness export` of a canary pack (the C++ harness's own init and batches)."""
    run_harness(harness_bin, "export", "--canary", canary, "--steps", str(steps), "--seed", str(seed), "--out", str(out))
    return out


@pytest.fixture(scope="session")
def micro_pack(harness_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """micro, 3 steps, seed 1337: the pack of what cpp_receipt ran."""
    return export_pack(harness_bin, tmp_path_factory.mktemp("pack") / "micro-pack.h5")


def flipped_byte_failures(data: bytes, path: Path, read, error: type, samples: int, stride: int) -> list:
    """The property both readers hold to (test_receipt.py, test_pack.py): `data` with one bit
    flipped at each of `samples` seeded random offsets and every `stride`-th offset of its
    first 2 KB (the superblock and root headers), written to `path`, is read by `read(path)`
    or refused with one `error` line that starts with the path. Returns (offset, repr) of
    every other outcome."""
    rng = np.random.default_rng(20261124)
    offsets = sorted(set(rng.integers(0, len(data), samples).tolist()) | set(range(0, min(len(data), 2048), stride)))
    failures = []
    for offset in offsets:
        flipped = bytearray(data)
        flipped[offset] ^= 1 << int(rng.integers(0, 8))
        path.write_bytes(bytes(flipped))
        try:
            read(path)
        except error as e:
            if not str(e).startswith(f"{path}: ") or "\n" in str(e):
                failures.append((offset, repr(e)))
        except Exception as e:  # noqa: BLE001  (what the property is about)
            failures.append((offset, repr(e)))
    return failures


def bf16_mm_rounds_its_partial_sums() -> bool:
    """An independent probe of this torch's CPU kernel: does a bf16 `mm` of row-major operands
    exceed the bound of fp32 accumulation and one rounding to bf16 (gamma_K sum|ab| + 2^-8
    |ab|)? Debian's torch 1.13 on a CPU without AVX512-BF16 does (its partial sums rounded
    to bf16: an error near 2^-7 sum|ab|); torch 2.9 does not."""
    import torch

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 256, generator=g).bfloat16(), torch.randn(256, 64, generator=g).bfloat16()
    exact, magnitude = a.double() @ b.double(), a.double().abs() @ b.double().abs()
    gamma = 256 * 2.0**-24 / (1 - 256 * 2.0**-24)
    return bool(((torch.mm(a, b).double() - exact).abs() > gamma * magnitude + 2.0**-8 * exact.abs()).any())


@functools.lru_cache(maxsize=None)
def bf16_ops_rounding_inside() -> FrozenSet[str]:
    """The aten ops whose bf16 CPU kernels round inside on this torch and CPU, by the probes
    below: they are over the bound of fp32 arithmetic and one rounding to bf16."""
    return frozenset(({"aten.mm.default", "aten.bmm.default"} if bf16_mm_rounds_its_partial_sums() else set()) |
                     ({"aten._softmax_backward_data.default"} if bf16_softmax_backward_rounds_inside() else set()) |
                     ({"aten.gelu.default"} if bf16_gelu_rounds_inside() else set()))


def bf16_gelu_rounds_inside() -> bool:
    """An independent probe of this torch's CPU kernel: is a bf16 GELU, of either form, further
    from the exact value than fp32 arithmetic and one rounding to bf16 allow (2^-8 |y| and a
    few fp32 roundings)? Debian's torch 1.13 is (its bf16 vector arithmetic rounds the
    intermediates to bf16), torch 2.9 is not."""
    import torch

    x = (torch.rand(1 << 14, generator=torch.Generator().manual_seed(0)) * 8 - 4).bfloat16()
    x64 = x.double()
    exact = {"tanh": 0.5 * x64 * (1 + torch.tanh((2 / np.pi) ** 0.5 * (x64 + 0.044715 * x64 ** 3))),
             "none": 0.5 * x64 * (1 + torch.erf(x64 * 0.5 ** 0.5))}
    return any(bool(((torch.nn.functional.gelu(x, approximate=form).double() - y).abs() >
                     2.0**-8 * y.abs() + 2.0**-20 * x64.abs()).any()) for form, y in exact.items())


def bf16_softmax_backward_rounds_inside() -> bool:
    """An independent probe of this torch's CPU kernel: does a bf16 softmax backward,
    p (g - sum p g), exceed the bound of fp32 arithmetic and one rounding to bf16
    (gamma_{n+2} p (|g| + sum |p g|) + 2^-8 |result|)? Debian's torch 1.13 does (its bf16
    vector arithmetic rounds each intermediate to bf16, the row's sum too); torch 2.9 does not."""
    import torch

    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(64, 64, generator=g), dim=-1).bfloat16()
    grad = torch.randn(64, 64, generator=g).bfloat16()
    p64, grad64 = p.double(), grad.double()
    exact = p64 * (grad64 - (p64 * grad64).sum(-1, keepdim=True))
    magnitude = p64 * (grad64.abs() + (p64 * grad64).abs().sum(-1, keepdim=True))
    gamma = 66 * 2.0**-24 / (1 - 66 * 2.0**-24)
    got = torch._softmax_backward_data(grad, p, -1, torch.bfloat16).double()
    return bool(((got - exact).abs() > gamma * magnitude + 2.0**-8 * exact.abs()).any())
