"""Imports point down the layers of DESIGN.md's picture, and no two packages import each other.

Every ``import dgxdoctor...`` in ``src/`` counts, also those inside functions and under ``TYPE_CHECKING``: a lazy
import is still a dependency. A new top-level module or package needs a line in ``LAYERS``.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "dgxdoctor"

# Higher imports lower. Equal layers may not import each other, except the pairs in SIBLINGS.
LAYERS = {
    "dgxdoctor": 0,  # the package itself: __version__
    "result": 0,
    "codes": 0,  # the finding codes other layers key on (one name per contract)
    "records": 0,  # asdict for the msgspec Struct records every layer defines
    "lazy_re": 0,  # a pattern compiled at its first use (module-level patterns of sources, judge, checks)
    "relaxed_re": 0,  # a regex's RE2 form that matches wherever it does (the automaton passes of judge, sources)
    "eventlog": 0,  # structured event lines (JSON for the daemon), from every layer
    "compat": 0,  # Python 3.10 stand-ins for 3.11's tomllib and asyncio.timeout, one module each
    "validation": 0,  # untrusted data into msgspec Structs: config tables, a peer's documents, request bodies
    "documents": 1,  # the results document, built only when JSON is rendered or validated
    "sources": 1,  # read the world: thin readers and pure parse_*(); no verdicts
    "probes": 1,  # run in the serving Python: stdlib only at import
    "environment": 2,
    "settings": 2,  # the daemon, remediation, alerts and bundle tables: what those layers import, not every check
    "judge": 3,  # verdicts per failure domain, shared by checks and diagnose
    "fleet": 3,  # the results store, peer snapshots, the node comparison
    "checks": 4,
    "diagnose": 4,
    "config": 5,  # assembles the [checks.*] tables from the registry
    "bundle": 6,  # `dgxdoctor bundle` and the capture before a restart: collect, redact, archive
    "exporters": 7,
    "alerts": 7,
    "remediation": 7,
    "dashboards": 7,
    "daemon": 8,
    "commands": 8,  # what each command does beyond parsing: run, render, write files
    "cli": 9,
    "__main__": 10,
}
# Both read what follows from a finding from judge/ (judge.consequence), not from each other.
SIBLINGS: set[tuple[str, str]] = set()


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


@functools.cache
def imports() -> dict[tuple[str, str], set[str]]:
    """(importing unit, imported unit) -> the importing modules (parsed once for the module's tests; read only)."""
    edges: dict[tuple[str, str], set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module == "dgxdoctor":
                    targets = [f"dgxdoctor.{alias.name}" for alias in node.names]
                elif node.module.startswith("dgxdoctor."):
                    targets = [node.module]
            elif isinstance(node, ast.ImportFrom) and node.level > 0:
                raise AssertionError(f"{module}: relative import; use the absolute dgxdoctor.* name")
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names if alias.name.startswith("dgxdoctor.")]
            for target in targets:
                src, dst = _unit(module), _unit(target)
                if target == "dgxdoctor.__version__":
                    dst = "dgxdoctor"
                if src != dst:
                    edges.setdefault((src, dst), set()).add(module)
    return edges


def test_every_module_has_a_layer() -> None:
    units = {_unit(_module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert sorted(units - set(LAYERS)) == [], "add the new module or package to LAYERS (see DESIGN.md's picture)"


def test_imports_point_down_the_layers() -> None:
    upward = [
        f"{src} -> {dst} ({', '.join(sorted(modules))})"
        for (src, dst), modules in sorted(imports().items())
        if src in LAYERS and dst in LAYERS and LAYERS[dst] >= LAYERS[src] and (src, dst) not in SIBLINGS
    ]
    assert upward == []


def test_no_package_cycles() -> None:
    edges = set(imports())
    cycles = sorted(f"{a} <-> {b}" for a, b in edges if (b, a) in edges and a < b)
    assert cycles == []


def test_sources_hold_no_verdicts() -> None:
    """Readers and parsers return values; Status and Finding are decided in judge/ (and the checks)."""
    deciding = sorted(
        mod for (src, dst), mods in imports().items() if src == "sources" and dst == "result" for mod in mods
    )
    assert deciding == []


def test_checks_and_diagnose_share_verdicts_through_judge() -> None:
    edges = imports()
    assert ("checks", "diagnose") not in edges
    assert ("diagnose", "checks") not in edges
    assert ("checks", "daemon") not in edges and ("exporters", "daemon") not in edges
