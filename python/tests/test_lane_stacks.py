"""The lane stacks' descriptions (canary_harness/lane_stacks.json, `harness schema
--lane-stacks`): the package's copy is the harness's, and the package reads it as the
harness does: every example the C++ made from it (each combination of a stack's options,
with the lane name and budget features the description gives) comes out the same here; the
lanes the package writes are named by it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from canary_harness import lane_stacks
from canary_harness.lane import budget_features as pack_lane_budget_features

pytestmark = pytest.mark.torch_agnostic  # read from the description: no torch runs


def test_the_package_holds_what_the_harness_describes(harness_bin: Path) -> None:
    exported = subprocess.run([str(harness_bin), "schema", "--lane-stacks"], capture_output=True, text=True,
                              check=True).stdout
    assert json.loads(exported) == json.loads(lane_stacks.DESCRIPTION_FILE.read_text()), (
        "python/canary_harness/lane_stacks.json is not `harness schema --lane-stacks`'s output: regenerate it with "
        "`build/bin/harness schema --lane-stacks > python/canary_harness/lane_stacks.json`")


@pytest.mark.parametrize("stack_id", ["torch-pack", "torch-canary", "jax"])
def test_the_package_reads_each_stack_as_the_harness_does(stack_id: str) -> None:
    examples = lane_stacks.stack(stack_id)["examples"]
    assert len(examples) >= 8
    for example in examples:
        options = example["options"]
        assert lane_stacks.lane_name(stack_id, options) == example["lane"], example
        assert lane_stacks.budget_features(stack_id, options) == example["budget_features"], example


def test_stack_options_are_the_descriptions_keys() -> None:
    """What the package's lanes pass (stack_options) is what the examples are made of."""
    options = lane_stacks.stack_options("tiny", release="2.9", device="cpu", precision="bf16", compiled=True,
                                        layout="ddp")
    assert lane_stacks.lane_name("torch-pack", options) == "tiny/torch@2.9+bf16+compile+ddp"
    assert lane_stacks.budget_features("torch-pack", options) == ["torch-bf16", "torch-compile", "torch-ddp"]
    keys = set()
    for described in (lane_stacks.stack(s) for s in ("torch-pack", "torch-canary", "jax")):
        for example in described["examples"]:
            keys |= set(example["options"])
    assert keys <= set(options)
    # the PyTorch lane's manifest takes its budget features from the description
    assert pack_lane_budget_features("cpu", "fp32") == "torch-cpu"
    assert pack_lane_budget_features("cuda", "bf16", layout=None) == "torch-cuda+torch-bf16"
