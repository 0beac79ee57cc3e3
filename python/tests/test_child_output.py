"""A Python canary's children print what they like (docs/bisect.md, the child's output):
the harness reads their results from a file (`--json-out PATH`), never from their stdout.
The canary here prints while its model is built and during every step, through Python's
print and below it (os.write on descriptor 1, as C extensions and subprocesses do), lines
that look like the results, as many training repositories' models print their parameter
counts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_harness
from test_python_canary import PACKAGE_ROOT, SMALL, run

PRINTS = '''
import os as _os

print("loading the printing canary's file")
_os.write(1, b'{"name": "not-the-canary", "steps": 1, "seed": 0}\\n')


def _printing(made):
    count = sum(p.numel() for p in made.model.parameters())
    print(f"number of parameters: {count / 1e6:.2f}M")
    print('{"version": 1, "verdict": "reproduced", "traces": []}')
    _os.write(1, b"[]\\n")
    train = made.step

    def step(model, optimizer, batch, i):
        print(f"step {i}: training")
        _os.write(1, b"{}\\n")
        return train(model, optimizer, batch, i)

    made.step = step
    return made


def printing() -> ch.Canary:
    return _printing(make())
'''

# The same canary (file name and function), its hidden layer's output scaled by (1 + 1e-6)
# from step 3 on.
REGRESSED = '''

def printing() -> ch.Canary:
    made = _printing(make())
    at = {"step": 0}
    train = made.step

    def step(model, optimizer, batch, i):
        at["step"] = i
        return train(model, optimizer, batch, i)

    made.model.hidden.register_forward_hook(lambda m, args, out: out * (1 + 1e-6) if at["step"] >= 3 else out)
    made.step = step
    return made
'''


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "canary_harness", *args], capture_output=True, text=True,
                          timeout=600, env=env)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("printing")
    (root / "clean").mkdir()
    (root / "regressed").mkdir()
    clean_file = root / "clean" / "printing.py"
    clean_file.write_text(Path(SMALL).read_text() + PRINTS)
    (root / "regressed" / "printing.py").write_text(clean_file.read_text() + REGRESSED)
    receipts = {}
    for name in ("clean", "regressed"):
        receipts[name] = root / f"{name}.h5"
        run(f"{root / name / 'printing.py'}:printing", "--out", str(receipts[name]), "--checkpoint-every", "2")
    return {"root": root, "spec": f"{clean_file}:printing", **receipts}


def test_untraced_bisect_of_a_printing_canary_names_the_step_module_and_aten_op(runs: dict, harness_bin) -> None:
    result = run_harness(harness_bin, "bisect", str(runs["regressed"]), str(runs["clean"]), "--json", check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    found = json.loads(result.stdout)  # bisect's own JSON: none of the canary's lines in it
    assert found["first_divergent_step"] == 3 and found["op_trace"] == "replay of A and B", found
    op = found["first_divergent_op"]
    assert (op["name"], op["phase"], op["tensor"]) == ("hidden", "forward", "aten.mul.Tensor"), op


def test_harness_replay_json_of_a_printing_canary_is_json(runs: dict, harness_bin) -> None:
    result = run_harness(harness_bin, "replay", str(runs["clean"]), "--from", "3", "--json")
    reply = json.loads(result.stdout)
    assert reply["verdict"] == "reproduced" and reply["resumed_from"] == 2, reply
    assert "number of parameters" in result.stderr  # the canary's prints go to stderr, not into the JSON


def test_a_matrix_reads_a_printing_canary(runs: dict, harness_bin, tmp_path: Path) -> None:
    matrix = tmp_path / "nightly.toml"
    matrix.write_text(f'schema_version = 1\ncanary = "{runs["spec"]}"\nreference = "fp32"\n'
                      '[[lanes]]\nid = "fp32"\nengine = "torch"\n')
    (tmp_path / "g").mkdir()
    result = run_harness(harness_bin, "golden", "status", "--matrix", str(matrix), "--goldens", str(tmp_path / "g"),
                         check=False)
    assert result.returncode != 2 and "small/torch" in result.stdout, result.stdout + result.stderr


def test_triage_of_a_printing_canary_lists_its_units(runs: dict, harness_bin, tmp_path: Path) -> None:
    bf16 = tmp_path / "bf16.h5"
    run(f"{runs['spec']}", "--out", str(bf16), "--precision", "bf16")
    budgets = tmp_path / "budgets.toml"  # calibrated on the run, then made too tight for it: triage has work
    run_harness(harness_bin, "calibrate", "--receipts", str(bf16), "--reference", str(runs["clean"]),
                "--out", str(budgets), "--provisional")
    budgets.write_text(re.sub(r"atol = [0-9.e-]+", "atol = 1e-12", budgets.read_text()))
    result = run_harness(harness_bin, "triage", str(bf16), str(runs["clean"]), "--budgets", str(budgets), "--json",
                         check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    t = json.loads(result.stdout)
    assert t["flag"] == "autocast-off" and t["units_of_format"] > 0, t


@pytest.mark.parametrize("command", ["describe", "units", "replay"])
def test_json_out_holds_the_result_and_stdout_is_the_canarys(runs: dict, tmp_path: Path, command: str) -> None:
    out = tmp_path / "result.json"
    args = {"describe": [runs["spec"]], "units": [str(runs["clean"])],
            "replay": [str(runs["clean"]), "--from", "3", "--trace", "aten"]}[command]
    result = _cli(command, *args, "--json-out", str(out))
    assert result.returncode == 0, result.stderr
    assert "number of parameters" in result.stdout  # the canary's own, where it printed it
    found = json.loads(out.read_text())
    if command == "describe":
        assert (found["name"], found["steps"], found["seed"]) == ("small", 6, 7) and found["torch"], found
    elif command == "units":
        assert isinstance(found, list), found
    else:
        assert found["verdict"] == "reproduced" and [t["step"] for t in found["traces"]] == [3, 4, 5], found
    assert os.listdir(tmp_path) == ["result.json"]  # written whole, no temporary left beside it


@pytest.mark.torch_agnostic
def test_json_out_into_no_directory_is_refused_first(runs: dict, tmp_path: Path) -> None:
    result = _cli("describe", runs["spec"], "--json-out", str(tmp_path / "nowhere" / "r.json"))
    assert result.returncode == 2 and "--json-out: no directory" in result.stderr, result.stderr


@pytest.mark.parametrize("where", ["file", "function"])
def test_describe_says_in_its_result_which_module_the_interpreter_lacks(tmp_path: Path, where: str) -> None:
    """The matrix tells "name another interpreter" from this result, not from stderr's words:
    an import of a module this interpreter lacks, in the file or in NAME(), is said as data;
    an error that merely quotes one is not."""
    lacking = "import zoomod_nowhere\n\n\ndef canary():\n    pass\n" if where == "file" else \
        "def canary():\n    import zoomod_nowhere\n"
    (tmp_path / "lacking.py").write_text(lacking)
    (tmp_path / "quoting.py").write_text("def canary():\n    raise ValueError(\"No module named 'zoomod_nowhere'\")\n")
    out = tmp_path / "result.json"
    result = _cli("describe", f"{tmp_path / 'lacking.py'}:canary", "--json-out", str(out))
    assert result.returncode == 2 and "zoomod_nowhere" in result.stderr, result.stderr
    error = json.loads(out.read_text())["error"]
    assert (error["kind"], error["module"]) == ("missing_module", "zoomod_nowhere"), error
    out.unlink()
    result = _cli("describe", f"{tmp_path / 'quoting.py'}:canary", "--json-out", str(out))
    assert result.returncode == 2 and "ValueError" in result.stderr and not out.exists(), result.stderr
