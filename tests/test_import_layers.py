"""The core's modules import downwards only: no circle of imports, counting imports inside functions too
(issue 23, item 7). ``from traceparse import intervals`` is an import of ``traceparse.intervals``; importing a
package's own ``__init__`` because a child module was imported is Python's doing, not a layer."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

CORE = REPO / "traceparse"


def _modules() -> dict[str, Path]:
    out = {}
    for path in CORE.rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _graph() -> dict[str, set[str]]:
    """module -> the core modules it imports anywhere in its text."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
                targets += subs
                if len(subs) < len(node.names):
                    targets.append(node.module)
            elif isinstance(node, ast.Import):
                targets += [a.name for a in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_core_has_no_circle_of_imports():
    assert _circles(_graph()) == []


def test_the_finder_finds_a_circle():
    """The check above could fail: the session importing the CLI back (as it once did) is a circle."""
    graph = _graph()
    graph["traceparse.session"].add("traceparse.cli")
    assert any({"traceparse.cli", "traceparse.session"} <= set(c) for c in _circles(graph))


def test_the_cli_layers_import_downwards():
    graph = _graph()
    assert "traceparse.session" in graph["traceparse.cli"] and "traceparse.cli" not in graph["traceparse.session"]
    assert "traceparse.command" in graph["traceparse.cli"]
    assert "traceparse.cli" not in graph["traceparse.command"]
    assert "traceparse.run" not in graph["traceparse.distributed"]
