"""The package's imports (issue 48, "the Python package in rooms"): no import circle among its
modules, counting the imports inside functions too (a circle hidden in a function is still a
circle: each module needs the other to be whole), and no private name (`_x`) imported from
another module: what a module lends is public, or it stays in the module."""
import ast
import os
import pathlib
from typing import Dict, List, Set, Tuple

import pytest

import canary_harness

pytestmark = pytest.mark.torch_agnostic  # read from the sources: no torch runs

PACKAGE = pathlib.Path(canary_harness.__file__).parent


def modules(package: pathlib.Path) -> Dict[str, pathlib.Path]:
    """Every module of the package by its dotted name (a folder's __init__ by the folder's)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(package: pathlib.Path) -> Tuple[Dict[str, Set[str]], List[Tuple[str, str, str]]]:
    """The package's import graph (module -> the package's modules it imports, anywhere in
    it) and its private imports (importer, module, name)."""
    known = modules(package)
    graph: Dict[str, Set[str]] = {name: set() for name in known}
    private = []
    for name, path in known.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                graph[name].update(a.name for a in node.names if a.name in known)
            elif isinstance(node, ast.ImportFrom):
                parts = here.split(".")[:len(here.split(".")) - max(node.level - 1, 0)] if node.level else []
                source = ".".join(parts + ([node.module] if node.module else []))
                if source.split(".")[0] != package.name:
                    continue
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    if submodule in known:
                        graph[name].add(submodule)
                        continue
                    graph[name].add(source)
                    if alias.name.startswith("_"):
                        private.append((name, source, alias.name))
        graph[name].discard(name)
    return graph, private


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_circle():
    graph, _ = imports(PACKAGE)
    assert len(graph) > 30, "the package's modules were not found"
    assert circles(graph) == []


def test_no_private_name_is_imported_from_another_module():
    _, private = imports(PACKAGE)
    assert private == []


def test_the_checks_see_a_circle_inside_a_function_and_a_private_import(tmp_path):
    package = tmp_path / "canary_harness"
    (package / "models").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models" / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import helper\n")
    (package / "b.py").write_text("def helper():\n    from . import c\n")
    (package / "c.py").write_text("import canary_harness.a\n")
    (package / "models" / "m.py").write_text("from ..a import _secret\nfrom .. import b\n")
    graph, private = imports(package)
    assert circles(graph) == [["canary_harness.a", "canary_harness.b", "canary_harness.c"]]
    assert graph["canary_harness.models.m"] == {"canary_harness.a", "canary_harness.b"}
    assert private == [("canary_harness.models.m", "canary_harness.a", "_secret")]


# ---- imports at the top, except what brings an optional dependency -----------------------------

# The dependencies a module of the package may use without every user having them: a module
# that imports one lazily keeps `import canary_harness.<module>` working without it.
OPTIONAL = {"torch", "jax", "jaxlib", "torch_xla", "transformers", "accelerate"}


def _resolved(name: str, path: pathlib.Path, node: ast.ImportFrom) -> str:
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    if not node.level:
        return node.module or ""
    parts = here.split(".")[:len(here.split(".")) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _top_level(known: Dict[str, pathlib.Path], name: str) -> Tuple[Set[str], Set[str]]:
    """(the package's modules, the other top-level packages) that `name` imports as it loads:
    its module body's imports, those under `try`/`if` included."""
    internal: Set[str] = set()
    external: Set[str] = set()
    statements = list(ast.parse(known[name].read_text()).body)
    while statements:
        node = statements.pop()
        if isinstance(node, (ast.Try, ast.If)):
            statements.extend(node.body + node.orelse + [s for h in getattr(node, "handlers", []) for s in h.body])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                (internal if alias.name in known else external).add(
                    alias.name if alias.name in known else alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            source = _resolved(name, known[name], node)
            if source in known:
                internal.add(source)
                internal.update(f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in known)
            elif source.split(".")[0] != "canary_harness":
                external.add(source.split(".")[0])
    return internal, external


def optional_needs(known: Dict[str, pathlib.Path]) -> Dict[str, Set[str]]:
    """Per module, the optional dependencies that loading it loads (its top-level imports,
    followed through the package's modules)."""
    direct = {name: _top_level(known, name) for name in known}
    needs: Dict[str, Set[str]] = {}
    for name in known:
        seen, todo, found = {name}, [name], set()
        while todo:
            internal, external = direct[todo.pop()]
            found |= external & OPTIONAL
            for other in internal - seen:
                seen.add(other)
                todo.append(other)
        needs[name] = found
    return needs


def needless_local_imports(package: pathlib.Path) -> List[Tuple[str, int, str]]:
    """Imports of the package's own modules inside functions that bring no optional dependency
    their module does not load already: (module, line, imported module)."""
    known = modules(package)
    needs = optional_needs(known)
    found = []
    for name, path in known.items():
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                sources: List[str] = []
                if isinstance(node, ast.ImportFrom):
                    sources = [_resolved(name, path, node)]
                elif isinstance(node, ast.Import):
                    sources = [alias.name for alias in node.names]
                for source in sources:
                    if source in known and not needs[source] - needs[name]:
                        found.append((name, node.lineno, source))
    return sorted(set(found))


def test_the_package_imports_its_own_modules_at_the_top_unless_one_brings_an_optional_dependency():
    assert needless_local_imports(PACKAGE) == []


def test_the_check_finds_a_needless_local_import_and_allows_a_lazy_optional_one(tmp_path):
    package = tmp_path / "canary_harness"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "plain.py").write_text("import json\n")
    (package / "heavy.py").write_text("import torch\n")
    (package / "user.py").write_text("def f():\n    from .plain import x\n    from .heavy import y\n"
                                     "    import canary_harness.plain\n")
    (package / "torchy.py").write_text("import torch\n\ndef g():\n    from .heavy import y\n")
    assert needless_local_imports(package) == [("canary_harness.torchy", 4, "canary_harness.heavy"),
                                              ("canary_harness.user", 2, "canary_harness.plain"),
                                              ("canary_harness.user", 4, "canary_harness.plain")]


# ---- the rooms: docs/python.md's table is the package's layout ----------------------------------

def documented_layout(page: pathlib.Path) -> Dict[str, Set[str]]:
    """docs/python.md's "The package's modules, by concern" table: where ("" for the top level,
    else the room's dotted name) -> the modules it lists there (each item's first `name`)."""
    layout: Dict[str, Set[str]] = {}
    for line in page.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not (cells[0] == "top level" or cells[0].startswith("`canary_harness.")):
            continue
        where = "" if cells[0] == "top level" else cells[0].strip("`")
        for item in _items(cells[2]):
            layout.setdefault(where, set()).add(item)
    return layout


def _items(cell: str) -> List[str]:
    """The first `name` of each comma-separated item, commas inside parentheses not counted."""
    items, depth, current = [], 0, ""
    for ch in cell + ",":
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            names = current.split("`")
            if len(names) > 1:
                items.append(names[1])
            current = ""
        else:
            current += ch
    return items


def actual_layout(package: pathlib.Path) -> Dict[str, Set[str]]:
    """Where each module of the package lies: "" (the top level) or its room's dotted name."""
    layout: Dict[str, Set[str]] = {}
    for path in package.iterdir():
        if path.suffix == ".py":
            layout.setdefault("", set()).add(path.stem)
        elif (path / "__init__.py").is_file():
            room = f"{package.name}.{path.name}"
            layout.setdefault(room, set()).update(p.stem for p in path.glob("*.py") if p.stem != "__init__")
    return layout


def test_the_package_is_laid_out_as_docs_python_md_says():
    # The checkout's docs/ (CANARY_HARNESS_DOCS where the tests run away from it: the wheel's check).
    docs = os.environ.get("CANARY_HARNESS_DOCS", pathlib.Path(__file__).resolve().parents[2] / "docs")
    page = pathlib.Path(docs) / "python.md"
    documented = documented_layout(page)
    assert len(documented) >= 6, documented
    assert actual_layout(PACKAGE) == documented


def test_every_room_says_what_it_holds():
    for init in PACKAGE.glob("*/__init__.py"):
        docstring = ast.get_docstring(ast.parse(init.read_text()))
        assert docstring and len(docstring) > 40, f"{init} has no docstring saying what the room holds"


def test_the_layout_check_reads_items_with_parentheses_and_sees_a_module_out_of_place(tmp_path):
    assert _items("`a` (`-m x`, `y`), `b`, `c` (d, e)") == ["a", "b", "c"]
    page = tmp_path / "python.md"
    page.write_text("| where | concern | modules |\n|---|---|---|\n| top level | entry | `__init__`, `__main__`, `lane` (`-m x`) |\n"
                    "| `canary_harness.runs` | runs | `runner` |\n")
    package = tmp_path / "canary_harness"
    (package / "runs").mkdir(parents=True)
    for name in ("__init__.py", "__main__.py", "lane.py", "runs/__init__.py", "runs/runner.py"):
        (package / name).write_text("")
    assert actual_layout(package) == documented_layout(page)
    (package / "stray.py").write_text("")
    assert actual_layout(package) != documented_layout(page)
