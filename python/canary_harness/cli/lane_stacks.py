"""The lane stacks' descriptions: lane_stacks.json beside this module, what `harness schema
--lane-stacks` prints (harness/nightly/lane_stacks.h). Each stack (the PyTorch lane of a
built-in canary's pack, a Python canary's lane, the JAX lane) says how its lane's name,
budget features and command line are made from the options the lane is set up with; the C++
matrix reads the same description, so a lane is named and started once, in data
(python/tests/test_lane_stacks.py holds the copy to the harness, the package's lanes to it
and each example command to its module's own parser).

A part (a piece of the name, a budget feature, or some words of the command) is taken when
every option of its `when` holds ("*": any value set) and not every option of its `unless`
does; `{option}` in its text is the option's value, and the job's placeholders ({pack},
{out}, ...: `job_placeholders`) stay for the job. A command part is split at spaces into
words before its options are filled.

Each stack's `lane_keys` say what a matrix lane's keys mean: their kind, the values a choice
takes, a default, a count's range. The package's lanes check their flags by the same
entries (`lane_key`, `takes`), so a value means the same to the matrix and to the lane.

The lanes that run no stack are described beside them (`harness_lanes`: a harness engine's,
run in the nightly's own process; `command_lanes`: a team's own program): what names them,
what they declare and the keys they take."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

DESCRIPTION_FILE = Path(__file__).with_name("lane_stacks.json")


@lru_cache(maxsize=None)
def _description() -> Dict[str, Any]:
    return json.loads(DESCRIPTION_FILE.read_text())


@lru_cache(maxsize=None)
def _stacks() -> Dict[str, Dict[str, Any]]:
    return {stack["id"]: stack for stack in _description()["lane_stacks"]}


def stack(stack_id: str) -> Dict[str, Any]:
    """The description of stack `stack_id` (torch-pack, torch-canary, jax); KeyError for none."""
    return _stacks()[stack_id]


def stack_options(canary: str, *, release: Optional[str] = None, device: str = "", precision: str = "",
                  compiled: bool = False, layout: Optional[str] = None, mesh: str = "",
                  shard_plan: str = "", canary_spec: str = "", threads: str = "", seeded: bool = False,
                  trace: str = "") -> Dict[str, str]:
    """The options a lane is described by: `release` MAJOR.MINOR of a versioned torch (None:
    not versioned), `device` a torch device as the lane gives it (its type and its index,
    ":1" of cuda:1, are options of their own), `seeded` whether the job's seed is passed,
    the rest as the lane's flags give them."""
    device_type, _, index = device.partition(":")
    return {"canary": canary, "release": f"@{release}" if release else "", "device": device_type,
            "device_index": f":{index}" if index else "", "precision": precision,
            "compile": "true" if compiled else "", "layout": layout or "", "mesh": mesh, "shard_plan": shard_plan,
            "canary_spec": canary_spec, "threads": threads, "seeded": "true" if seeded else "", "trace": trace}


def _holds(condition: Mapping[str, str], options: Mapping[str, str]) -> bool:
    return all(options.get(key) and (value == "*" or options[key] == value) for key, value in condition.items())


def _taken(part: Mapping[str, Any], options: Mapping[str, str]) -> bool:
    return _holds(part["when"], options) and not (part["unless"] and _holds(part["unless"], options))


def _filled(text: str, options: Mapping[str, str]) -> str:
    out, at = [], 0
    while True:
        start = text.find("{", at)
        if start < 0:
            return "".join(out) + text[at:]
        end = text.index("}", start)
        placeholder = text[start:end + 1]
        job = placeholder in _description()["job_placeholders"]
        out += [text[at:start], placeholder if job else options.get(text[start + 1:end], "")]
        at = end + 1


def lane_name(stack_id: str, options: Mapping[str, str]) -> str:
    described = stack(stack_id)
    return _filled(described["name"], options) + "".join(
        _filled(part["text"], options) for part in described["name_parts"] if _taken(part, options))


def budget_features(stack_id: str, options: Mapping[str, str]) -> List[str]:
    return [_filled(part["text"], options) for part in stack(stack_id)["budget_features"] if _taken(part, options)]


def command(stack_id: str, options: Mapping[str, str]) -> List[str]:
    """The lane's argv after the interpreter: -m, the stack's module, then its arguments."""
    described = stack(stack_id)
    words = ["-m", described["module"]]
    for part in described["arguments"]:
        if _taken(part, options):
            words += [_filled(word, options) for word in part["text"].split(" ")]
    return words


def lane_key(stack_id: str, key: str) -> Dict[str, Any]:
    """What the stack's lane key `key` means (kind, values, default, range, ...); KeyError for none."""
    for described in stack(stack_id)["lane_keys"]:
        if described["key"] == key:
            return described
    raise KeyError(f"lane stack {stack_id} has no key {key}")


def takes(described: Mapping[str, Any], value: str) -> bool:
    """Whether a choice key takes `value`, where a value "NAME:N" stands for NAME:0, NAME:1, ..."""
    for choice in described["values"]:
        name, colon, index = choice.partition(":")
        suffix = value[len(name) + 1:]
        if choice == value or (colon and index == "N" and value.startswith(name + ":") and suffix
                               and all("0" <= c <= "9" for c in suffix)):
            return True
    return False


def or_list(values: List[str]) -> str:
    """"a, b or c", as the harness lists a key's values in its refusals."""
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " or " + values[-1]
