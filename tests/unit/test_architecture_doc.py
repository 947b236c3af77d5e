"""docs/architecture.md stays true of the code: its layer table is test_layers.py's table and the units on disk, the
module paths it names exist, and what it says of the checks' findings holds."""

from __future__ import annotations

import ast
import re

from test_layers import LAYERS, PACKAGE, _module_name, _unit

REPO = PACKAGE.parents[1]
PAGE = REPO / "docs" / "architecture.md"
# | 3 | `judge` | what it holds |
ROW_RE = re.compile(r"^\|\s*(?P<layer>\d+)\s*\|\s*`(?P<unit>[\w.]+)`\s*\|")
# `judge/consequence.py`, `daemon/app.py`, `tests/unit/test_layers.py`, `documents.py`
PATH_RE = re.compile(r"`(?P<path>(?:[\w.]+/)*[\w.]+\.py)`")


def layer_table(text: str) -> dict[str, int]:
    """The rows of the table under "## Layers": unit -> layer (a unit named twice fails)."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, int] = {}
    for line in section.splitlines():
        m = ROW_RE.match(line)
        if m:
            assert m["unit"] not in rows, f"{m['unit']} is in the layer table twice"
            rows[m["unit"]] = int(m["layer"])
    return rows


def units_on_disk() -> set[str]:
    return {_unit(_module_name(p)) for p in PACKAGE.rglob("*.py")}


def test_the_layer_table_is_test_layers_table() -> None:
    page = layer_table(PAGE.read_text(encoding="utf-8"))
    assert sorted(set(LAYERS) - set(page)) == [], "units missing from docs/architecture.md's layer table"
    assert sorted(set(page) - set(LAYERS)) == [], "units on the page that test_layers.py's LAYERS does not know"
    moved = {unit: (page[unit], LAYERS[unit]) for unit in page if page[unit] != LAYERS[unit]}
    assert moved == {}, "(page, LAYERS) layers differ"


def test_the_layer_table_names_the_units_on_disk() -> None:
    page = set(layer_table(PAGE.read_text(encoding="utf-8")))
    disk = units_on_disk()
    assert sorted(disk - page) == [], "a module or package of src/dgxdoctor has no row on the page"
    assert sorted(page - disk) == [], "the page names a unit that does not exist"


def test_the_layer_table_parser_sees_a_missing_and_an_invented_unit() -> None:
    text = PAGE.read_text(encoding="utf-8")
    rows = layer_table(text)
    assert rows["judge"] == 3 and rows["cli"] == 9
    without = "\n".join(line for line in text.splitlines() if not line.startswith("| 3 | `judge` |"))
    assert "judge" not in layer_table(without)
    invented = text.replace("| 0 | `result` |", "| 0 | `oracle` |\n| 0 | `result` |")
    assert layer_table(invented)["oracle"] == 0


def test_every_module_path_the_page_names_exists() -> None:
    text = PAGE.read_text(encoding="utf-8")
    named = {m["path"] for m in PATH_RE.finditer(text)}
    assert len(named) > 20
    missing = sorted(p for p in named if not (PACKAGE / p).is_file() and not (REPO / p).is_file())
    assert missing == []


def _status_of(call: ast.Call) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == "status":
            return kw.value
    return call.args[1] if len(call.args) > 1 else None


def test_checks_write_no_warning_or_critical_finding_themselves() -> None:
    """The page: a check itself writes only UNKNOWN and OK findings; WARNING and CRITICAL come from judge/ and
    fleet/. A finding built in checks/ with another status, or a status that is not written out, fails here."""
    allowed = {"Status.OK", "Status.UNKNOWN"}
    found = []
    for path in sorted((PACKAGE / "checks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Finding":
                status = _status_of(node)
                if status is None or ast.unparse(status) not in allowed:
                    shown = ast.unparse(status) if status is not None else "?"
                    found.append(f"{path.name}:{node.lineno} {shown}")
    assert found == []


def test_readme_links_the_page() -> None:
    assert "docs/architecture.md" in (REPO / "README.md").read_text(encoding="utf-8")
