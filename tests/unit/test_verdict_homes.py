"""Every WARNING and CRITICAL is decided in judge/: checks/, diagnose/ and sources/ read and remember, and may only
say "could not run" (UNKNOWN) or "nothing to see" (OK, SKIPPED) themselves.

A module there may still compare a finding's status (``f.status in (Status.WARNING, ...)`` for a summary); it may
not produce one: no ``Status.WARNING``/``Status.CRITICAL`` outside a comparison, no ``Status("warning")``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "dgxdoctor"
READERS = ("checks", "diagnose", "sources")
VERDICTS = {"WARNING", "CRITICAL"}


def _is_verdict(node: ast.AST) -> bool:
    """``Status.WARNING`` or ``Status.CRITICAL``."""
    if not isinstance(node, ast.Attribute) or node.attr not in VERDICTS:
        return False
    return isinstance(node.value, ast.Name) and node.value.id == "Status"


def _decisions(tree: ast.AST) -> list[int]:
    """Lines where a WARNING/CRITICAL status is produced rather than compared."""
    compared: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            compared.update(id(n) for n in ast.walk(node))
    lines = []
    for node in ast.walk(tree):
        if id(node) in compared:
            continue
        if _is_verdict(node):
            lines.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Status":
            lines.append(node.lineno)
    return lines


def test_no_warning_or_critical_is_decided_outside_judge() -> None:
    found = []
    for package in READERS:
        for path in sorted((PACKAGE / package).rglob("*.py")):
            for line in _decisions(ast.parse(path.read_text(encoding="utf-8"))):
                found.append(f"{path.relative_to(PACKAGE)}:{line}")
    assert found == [], "move these verdicts to judge/ (a function returning the Finding)"


def test_the_rule_sees_a_decision() -> None:
    made = ast.parse('Finding("X", Status.CRITICAL, "m")\nstatus = Status.WARNING if bad else Status.OK\n')
    read = ast.parse("bad = [f for f in fs if f.status in (Status.WARNING, Status.CRITICAL)]\n")
    assert _decisions(made) == [1, 2] and _decisions(read) == []
