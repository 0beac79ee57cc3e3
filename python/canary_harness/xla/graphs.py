"""The audit held to the compiler: a training step run under torch_xla, its real recompiles
and host transfers per step, each recompile with its cause (`python3 -m
canary_harness.audit FILE.py:FUNCTION --xla`; docs/xla.md).

torch_xla writes every graph it syncs to XLA_SAVE_TENSORS_FILE (its IR as text, each node
with the Python `function@file:line` that made it when XLA_IR_DEBUG=1, the graph's hash,
and the Python frames that cut it). Both are set before torch_xla is imported (prepare()),
and the file is read after each step: the step's graphs, in order. The counts are
torch_xla's metrics (canary_harness.xla.device.XlaStepCounters); the cause of a graph compiled
after the first step is the first IR node where it differs from the graph at the same
place of the step before (or, where no graph was there, the line that cut it).
"""

from __future__ import annotations

import glob
import os
import re
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

_LOCATION = re.compile(r", location=([^,]+)")
_SCOPE = re.compile(r", scope=[^,]+")  # torch_xla's per-process op counter (aten::mul.3): no part of the graph
_NODE = re.compile(r"^\s*%\d+ = (.*)$")


@dataclass
class XlaGraph:
    """One graph torch_xla synced: its hash, the frames that cut it (innermost last, as
    torch_xla lists them), and its IR nodes as text."""

    hash: str
    frames: List[str]
    nodes: List[str]


@dataclass
class XlaStep:
    step: int
    counters: Dict[str, float]
    graphs: List[XlaGraph]
    causes: List[str] = field(default_factory=list)  # one line per graph compiled (after step 0)
    cuts: List[str] = field(default_factory=list)     # where each host transfer cut the step

    @property
    def compiles(self) -> int:
        return int(self.counters["UncachedCompile"])

    @property
    def host_syncs(self) -> int:
        return int(self.counters["HostSync"])

    def to_json(self) -> Dict[str, Any]:
        return {"step": self.step, "uncached_compiles": self.compiles, "cached_compiles": int(self.counters["CachedCompile"]),
                "host_syncs": self.host_syncs, "graphs": len(self.graphs), "causes": self.causes, "cuts": self.cuts}


def prepare(directory: str) -> str:
    """Makes torch_xla write every synced graph, with the Python lines of its nodes, into
    `directory`: call before torch_xla is imported. Returns the dump's path prefix."""
    prefix = os.path.join(directory, "graphs.txt")
    os.environ["XLA_IR_DEBUG"] = "1"
    os.environ["XLA_SAVE_TENSORS_FILE"] = prefix
    os.environ["XLA_SAVE_TENSORS_FMT"] = "text"
    return prefix


class GraphDump:
    """The graphs torch_xla appended to its dump since the last read (it adds an ordinal to
    the file name: graphs.txt.0)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._offset = 0

    def new_graphs(self) -> List[XlaGraph]:
        files = sorted(glob.glob(self.prefix + "*"))
        if not files:
            return []
        with open(files[0], encoding="utf-8", errors="replace") as f:
            f.seek(self._offset)
            text = f.read()
            self._offset = f.tell()
        return [g for g in (_parse(block) for block in text.split("[ScheduleSyncTensorsGraph]")) if g is not None]


def _parse(block: str) -> Optional[XlaGraph]:
    lines = block.splitlines()
    hashes = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Graph Hash:")]
    if not hashes:
        return None
    frames, nodes, section = [], [], ""
    for line in lines:
        if line.startswith("TensorsGraphInfo:"):
            section = "frames"
        elif line.startswith("IR {"):
            section = "ir"
        elif section == "frames" and line.startswith("  ") and line.strip():
            frames.append(line.strip())
        elif section == "frames" and not line.strip():
            section = ""
        elif section == "ir":
            node = _NODE.match(line)
            if node:
                nodes.append(node.group(1))
            elif line.startswith("}"):
                section = ""
    return XlaGraph(hashes[0], frames, nodes)


def _op(node: str) -> str:
    """`f32[7,6]{1,0} aten::expand(%0)` of an IR node, without its location and shapes' echo."""
    return _SCOPE.sub("", _LOCATION.sub("", node)).split(", xla_shape=")[0]


def _where(node: str) -> str:
    found = _LOCATION.search(node)
    return found.group(1) if found else "no Python line (made by torch's autograd or an optimizer's internals)"


def difference(before: XlaGraph, after: XlaGraph, step_before: int) -> str:
    """The first IR node where `after` differs from `before`, with the Python line that made it."""
    for index, (a, b) in enumerate(zip(before.nodes, after.nodes)):
        if _op(a) != _op(b):
            return f"node {index}: {_op(b)} where step {step_before} had {_op(a)}, at {_where(b)}"
    if len(before.nodes) != len(after.nodes):
        longer = after.nodes[len(before.nodes):] or before.nodes[len(after.nodes):]
        return (f"{len(after.nodes)} nodes where step {step_before} had {len(before.nodes)}; "
                f"the first of the difference: {_op(longer[0])} at {_where(longer[0])}")
    return (f"the same ops as step {step_before} with other constant values (a Python number baked into the "
            f"graph; torch_xla's IR text does not print them)")


def user_frame(frames: List[str]) -> str:
    """The innermost frame outside torch, torch_xla and this package (torch_xla lists the
    innermost first): the line that cut a graph."""
    outside = [f for f in frames if not any(part in f for part in ("/torch/", "/torch_xla/", "/canary_harness/"))]
    return outside[0] if outside else (frames[0] if frames else "an unknown frame")


def run_steps(step: Callable[[int], Any], steps: int, dump: GraphDump) -> List[XlaStep]:
    """Runs step(0..steps-1) on torch_xla: what the construction left lazy made device data
    first (as the runner does), then each step cut by mark_step() and the device waited for."""
    from .device import XlaStepCounters, mark_step

    mark_step()
    dump.new_graphs()  # the construction's graph is no step's
    counters = XlaStepCounters()
    seen: Dict[str, int] = {}
    result: List[XlaStep] = []
    for i in range(steps):
        counters.begin(i)
        step(i)
        mark_step()
        row = XlaStep(i, counters.end(), dump.new_graphs())
        previous = result[-1] if result else None
        for index, graph in enumerate(row.graphs):
            if not any("canary_harness/xla/device.py" in frame for frame in graph.frames):  # not the step's own mark_step
                row.cuts.append(user_frame(graph.frames))
            if graph.hash in seen or previous is None:
                seen.setdefault(graph.hash, i)
                continue
            seen[graph.hash] = i
            if index < len(previous.graphs):
                row.causes.append(f"graph {index}: " + difference(previous.graphs[index], graph, previous.step))
            else:
                row.causes.append(f"graph {index}: a graph step {previous.step} did not have, cut at "
                                  f"{user_frame(graph.frames)}")
        result.append(row)
    return result


def scratch_directory() -> tempfile.TemporaryDirectory:
    """Where torch_xla's graph dump goes for one audit (removed with it)."""
    return tempfile.TemporaryDirectory(prefix="canary-audit-xla-")


# What the static audit's findings predict of the compiler, by kind (canary_harness.audit). A
# dynamic shape is both: torch_xla reads the size to the host to give the result its shape
# (a transfer), then compiles a graph for each size (measured: python/tests/test_xla.py).
_RECOMPILE_KINDS = ("graph_change", "varying_constant", "dynamic_shape")
_HOST_READ_KINDS = ("host_read", "dynamic_shape")


@dataclass
class Agreement:
    """The static audit's verdict beside torch_xla's, for one step sequence: graph stable
    and host reads (a transfer inside a step). Stable as the static audit means it with
    warm-up W: steps 0..W may each trace a new graph (step 0 may create optimizer state,
    so step 1 is the first of the steady graph), and no step after W compiles."""

    static_stable: bool
    static_host_reads: bool
    xla_stable: bool
    xla_host_reads: bool

    @property
    def agrees(self) -> bool:
        return self.static_stable == self.xla_stable and self.static_host_reads == self.xla_host_reads

    @property
    def xla_clean(self) -> bool:
        return self.xla_stable and not self.xla_host_reads

    def to_json(self) -> Dict[str, Any]:
        return {"static": {"stable": self.static_stable, "host_reads": self.static_host_reads},
                "xla": {"stable": self.xla_stable, "host_reads": self.xla_host_reads}, "agrees": self.agrees}


def agreement(findings: List[Any], rows: List[XlaStep], warmup: int) -> Agreement:
    return Agreement(static_stable=not any(f.kind in _RECOMPILE_KINDS for f in findings),
                     static_host_reads=any(f.kind in _HOST_READ_KINDS for f in findings),
                     xla_stable=all(r.compiles == 0 for r in rows[warmup + 1:]),
                     xla_host_reads=any(r.host_syncs > 0 for r in rows))


def format_rows(rows: List[XlaStep], verdict: Agreement, client: str) -> str:
    def say(stable: bool, reads: bool) -> str:
        return f"{'graph stable' if stable else 'recompiles'}, {'host reads' if reads else 'no host read'}"

    lines = [f"xla         torch_xla on PJRT {client}: the compiler's own counts per step"]
    for r in rows:
        text = f"xla step {r.step:<2} {_count(r.compiles, 'graph')} compiled, {int(r.counters['CachedCompile'])} cached, " \
               f"{_count(r.host_syncs, 'host transfer')}"
        lines.append(text)
        lines += [f"  cause     {cause}" for cause in r.causes]
        lines += [f"  cut at    {cut}" for cut in r.cuts]
    lines.append(f"agreement   static audit: {say(verdict.static_stable, verdict.static_host_reads)}; torch_xla: "
                 f"{say(verdict.xla_stable, verdict.xla_host_reads)}: " +
                 ("they agree" if verdict.agrees else "they DISAGREE (the compiler is right; docs/xla.md)"))
    return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"
