"""The PyTorch canary lane's own step (canary_harness.runs.pack_step.CanaryStep), on the pack that
CANARY_AUDIT_PACK names (`harness export --canary micro --out PACK.h5`), with
CANARY_AUDIT_PRECISION (fp32 or bf16) and CANARY_AUDIT_FAULT (an --inject-fault spec)."""

import os

from canary_harness.runs.pack_step import CanaryStep


def lane_step(device="cpu"):
    pack = os.environ.get("CANARY_AUDIT_PACK")
    if not pack:
        raise RuntimeError("set CANARY_AUDIT_PACK to a canary pack (harness export --canary micro --out PACK.h5)")
    return CanaryStep.from_pack(pack, device=device, precision=os.environ.get("CANARY_AUDIT_PRECISION", "fp32"),
                                inject_fault=os.environ.get("CANARY_AUDIT_FAULT") or None)
