"""No two dgxdoctor modules import each other, however far round: every import counts, also one inside a function
or under ``TYPE_CHECKING``. A deferred import hides a cycle from Python at start-up, not from a reader: the two
modules still cannot be understood, tested or moved one without the other.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "dgxdoctor"


def _name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def _targets(node: ast.AST, modules: set[str]) -> list[str]:
    """The dgxdoctor modules one import statement loads: ``from a.b import c`` is module ``a.b.c`` when there is
    one, else a name of ``a.b``."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in modules]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module in modules:
        return [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names]
    return []


@functools.cache
def graph() -> dict[str, frozenset[str]]:
    """module -> the dgxdoctor modules it imports anywhere in its text."""
    paths = {_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    out: dict[str, frozenset[str]] = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        out[module] = frozenset(t for node in ast.walk(tree) for t in _targets(node, modules) if t != module)
    return out


def cycles(edges: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_among_dgxdoctor_modules() -> None:
    assert cycles(graph()) == []


def test_deferred_and_type_checking_imports_count() -> None:
    """The graph sees an import inside a function and one under TYPE_CHECKING (the two ways a cycle hides)."""
    edges = graph()
    assert "dgxdoctor.judge.signatures" in edges["dgxdoctor.checks.nccl"]  # imported inside _judge_one
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dgxdoctor.result import Status\n")
    assert [t for n in ast.walk(tree) for t in _targets(n, set(edges))] == ["dgxdoctor.result"]


def test_a_cycle_would_fail() -> None:
    edges = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset({"a"})}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": frozenset({"b"}), "b": frozenset()}) == []
