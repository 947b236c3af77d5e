"""No function in src/ is longer than MAX_LINES (its def line to its last line, docstring included): a longer one
does several jobs, and its remedy texts belong in a table of remedies (see judge/)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "dgxdoctor"
MAX_LINES = 60


def test_no_function_is_longer_than_sixty_lines() -> None:
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}() is {lines} lines")
    assert long == []
