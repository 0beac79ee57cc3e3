"""The lane stacks' descriptions (canary_harness/cli/lane_stacks.json, `harness schema
--lane-stacks`): the package's copy is the harness's, and the package reads it as the
harness does: every example the C++ made from it (each combination of a stack's options,
with the lane name, budget features and command the description gives) comes out the same
here; every example's command is one its module takes, meaning what its options say; the
lanes the package writes are named by it."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest

from canary_harness.cli import lane_stacks
from canary_harness.cli.usage import UsageError
from canary_harness.lane import budget_features as pack_lane_budget_features

pytestmark = pytest.mark.torch_agnostic  # read from the description: no torch runs


def test_the_package_holds_what_the_harness_describes(harness_bin: Path) -> None:
    exported = subprocess.run([str(harness_bin), "schema", "--lane-stacks"], capture_output=True, text=True,
                              check=True).stdout
    assert json.loads(exported) == json.loads(lane_stacks.DESCRIPTION_FILE.read_text()), (
        "python/canary_harness/cli/lane_stacks.json is not `harness schema --lane-stacks`'s output: regenerate it with "
        "`build/bin/harness schema --lane-stacks > python/canary_harness/cli/lane_stacks.json`")


@pytest.mark.parametrize("stack_id", ["torch-pack", "torch-canary", "jax"])
def test_the_package_reads_each_stack_as_the_harness_does(stack_id: str) -> None:
    examples = lane_stacks.stack(stack_id)["examples"]
    assert len(examples) >= 8
    for example in examples:
        options = example["options"]
        assert lane_stacks.lane_name(stack_id, options) == example["lane"], example
        assert lane_stacks.budget_features(stack_id, options) == example["budget_features"], example
        assert lane_stacks.command(stack_id, options) == example["command"], example


# What the job puts where the command holds its placeholders.
JOB_VALUES = {"{pack}": "pack.h5", "{out}": "out.h5", "{steps}": "5", "{seed}": "7"}


def parsed(module: str, argv: List[str]) -> Dict[str, object]:
    """The parse of `argv` by what `python -m module` runs (a package's __main__): its
    parse_args, where argparse exits 2 on what it refuses."""
    if importlib.util.find_spec(module).submodule_search_locations is not None:
        module += ".__main__"
    return vars(importlib.import_module(module).parse_args([JOB_VALUES.get(word, word) for word in argv]))


@pytest.mark.parametrize("stack_id", ["torch-pack", "torch-canary", "jax"])
def test_every_example_command_is_one_its_module_takes(stack_id: str) -> None:
    """The description's command is the module's CLI: each example parses, and each option
    arrives as the flag that carries it (a flag dropped or renamed on either side fails)."""
    described = lane_stacks.stack(stack_id)
    for example in described["examples"]:
        argv, options = example["command"], example["options"]
        assert argv[:2] == ["-m", described["module"]], argv
        args = parsed(described["module"], argv[2:])
        assert args["out"] == "out.h5" and args["precision"] == options["precision"], (argv, args)
        # `harness power` appends the stack's fault flag and a regression to the command.
        regression = "step=1,kind=lr-scale,scale=1e-3"
        assert parsed(described["module"], argv[2:] + [described["fault_flag"], regression])["inject_fault"] == regression
        if described["threads_flag"]:  # the job's thread count, where the lane takes it
            assert parsed(described["module"], argv[2:] + [described["threads_flag"], "2"])["threads"] in (2, "2")
        if stack_id == "jax":
            assert (args["pack"], args["mesh"], args["shard_plan"]) == ("pack.h5", options["mesh"], options["shard_plan"])
            continue
        assert args["device"] == options["device"] + options.get("device_index", ""), (argv, args)
        assert bool(args["compile"]) == (options.get("compile") == "true"), (argv, args)
        assert bool(args["versioned"]) == bool(options.get("release")), (argv, args)
        assert (args["layout"] or "") == options.get("layout", ""), (argv, args)
        if stack_id == "torch-pack":
            assert args["pack"] == "pack.h5", (argv, args)
            continue
        assert (args["command"], args["canary"], str(args["threads"]), str(args["steps"])) == (
            "run", options["canary_spec"], options["threads"], "5"), (argv, args)
        assert (str(args["seed"]) if args["seed"] is not None else "") == ("7" if options.get("seeded") else "")
        assert (args["trace"] or "none") == (options.get("trace") or "none"), (argv, args)


def test_a_device_index_is_an_option_of_its_own() -> None:
    options = lane_stacks.stack_options("tiny", device="cuda:1", precision="fp32")
    assert (options["device"], options["device_index"]) == ("cuda", ":1")
    assert lane_stacks.lane_name("torch-pack", options) == "tiny/torch+cuda"
    assert lane_stacks.command("torch-pack", options)[4:6] == ["--device", "cuda:1"]


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


def _options_with(base: Dict[str, str], key: str, value: str) -> Dict[str, str]:
    """`base` with a matrix lane's `key = value` as the options it fills (matrix.cpp's
    runners: a device is its type and its index, a switch is "true")."""
    options = dict(base)
    if key == "device":
        device_type, _, index = value.partition(":")
        options.update(device=device_type, device_index=f":{index}" if index else "")
    elif key == "compile":
        options["compile"] = "true"
    else:
        options[key.replace("-", "_")] = value
    return options


@pytest.mark.parametrize("stack_id", ["torch-pack", "torch-canary", "jax"])
def test_every_value_a_lane_key_takes_is_one_its_module_takes(stack_id: str) -> None:
    """Each value a stack's lane key takes by its description (a choice's values, "cuda:N" as
    cuda:2, a count's range ends, a switch on) makes a command its module parses to that
    value: a value the matrix takes and the lane refuses, or reads otherwise, fails here."""
    described = lane_stacks.stack(stack_id)
    base = described["examples"][0]["options"]
    checked = 0
    for key in described["lane_keys"]:
        if key["job_only"]:  # the nightly's (resume-at), never the lane command's
            continue
        kind = key["kind"]
        values = ([v.replace(":N", ":2") for v in key["values"]] if kind == "choice" else
                  [str(n) for n in key["range"]] if kind == "count" else ["true"] if kind == "switch" else [])
        for value in values:
            argv = lane_stacks.command(stack_id, _options_with(base, key["key"], value))
            got = parsed(described["module"], argv[2:])[key["key"].replace("-", "_")]
            assert (bool(got) if kind == "switch" else str(got)) == (True if kind == "switch" else value), (key, argv)
            checked += 1
    assert checked >= (5 if stack_id == "jax" else 9), checked  # every choice's values, a switch, a count


def _takes(check: object, value: str) -> bool:
    try:
        check(value)  # type: ignore[operator]
        return True
    except UsageError:
        return False


def test_the_lanes_check_their_flags_by_the_description() -> None:
    """The package's lanes refuse what the matrix refuses: their device, precision, layout
    and thread checks read the torch stacks' keys (lane_args, distributed.LAYOUTS)."""
    from canary_harness.cli.lane_args import MAX_THREADS, check_choice, check_device_name, check_precision
    from canary_harness.runs.distributed import LAYOUTS

    for key, check, values in (("device", check_device_name, ["cpu", "cuda", "cuda:0", "cuda:12", "xla", "tpu", "cuda:",
                                                               "cuda:x", "CPU", "cuda:1:2", "xla:0"]),
                               ("precision", check_precision, ["fp32", "bf16", "fp16", "FP32", ""])):
        described = lane_stacks.lane_key("torch-pack", key)
        for value in values:
            assert _takes(check, value) == lane_stacks.takes(described, value), (key, value)
    for key, noun in (("shard-plan", "plan"), ("precision", "precision")):  # the JAX lane's, by its own stack
        described = lane_stacks.lane_key("jax", key)
        for value in described["values"] + ["ep", "fp8", ""]:
            assert _takes(lambda v: check_choice(key, v, noun, stack_id="jax"), value) == lane_stacks.takes(described, value)
    assert list(LAYOUTS) == lane_stacks.lane_key("torch-pack", "layout")["values"]
    assert MAX_THREADS == lane_stacks.lane_key("torch-canary", "threads")["range"][1]
    with pytest.raises(UsageError, match=r"--device: unknown device 'tpu'; use cpu, cuda, cuda:N or xla"):
        check_device_name("tpu")
