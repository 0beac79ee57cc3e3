"""The tiny canary's pack for the PyTorch benchmarks (recorder_overhead.py, torch_audit.py):
exported by the built harness (HARNESS_BIN, default build/bin/harness) into a directory
the caller owns, never into the checkout."""

import os
import subprocess
from typing import Optional

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)


def export_tiny_pack(directory: str, steps: Optional[int] = None) -> str:
    """Exports the pack (`steps` batches; the canary's own 100 when None) and returns its path."""
    harness = os.environ.get("HARNESS_BIN", os.path.join(ROOT, "build", "bin", "harness"))
    path = os.path.join(directory, "tiny-pack.h5")
    command = [harness, "export", "--canary", "tiny", "--out", path]
    if steps is not None:
        command += ["--steps", str(steps)]
    subprocess.run(command, check=True, capture_output=True)
    return path
