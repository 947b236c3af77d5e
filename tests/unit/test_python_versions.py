"""The supported Pythons, 3.10 to 3.12 (DGX OS 6 is Ubuntu 22.04, whose ``python3`` is 3.10), said alike by
pyproject, the linters and the README; and no code of the repository uses what Python 3.11 added to the language or
the standard library (``dgxdoctor.compat`` holds the stand-ins), so a 3.11 machine cannot land a 3.10 break.

scripts/test-all also runs the unit suite on a real 3.10; this test is the guard on every other run.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO
from dgxdoctor.compat import tomllib

SUPPORTED = ("3.10", "3.11", "3.12")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))

# What 3.11 added (module -> names; None: the whole module). Their stand-ins: dgxdoctor.compat.tomllib,
# dgxdoctor.compat.aio (timeout, wait_for), datetime.timezone.utc, typing_extensions.
NEW_IN_311: dict[str, set[str] | None] = {
    "tomllib": None,
    "wsgiref.types": None,
    "asyncio": {"timeout", "timeout_at", "Timeout", "TaskGroup", "Runner", "Barrier", "BrokenBarrierError"},
    "datetime": {"UTC"},
    "typing": {"Self", "LiteralString", "Never", "assert_never", "assert_type", "reveal_type", "TypeVarTuple",
               "Unpack", "Required", "NotRequired", "dataclass_transform", "override", "get_overloads",
               "clear_overloads", "TypeAliasType", "ReadOnly", "TypeIs"},
    "enum": {"StrEnum", "ReprEnum", "EnumCheck", "EnumType", "FlagBoundary", "verify", "member", "nonmember",
             "global_enum", "property", "show_flag_values"},
    "contextlib": {"chdir"},
    "hashlib": {"file_digest"},
    "re": {"NOFLAG"},
    "sys": {"exception"},
    "itertools": {"batched"},
    "logging": {"getLevelNamesMapping"},
    "operator": {"call"},
    "math": {"exp2", "cbrt"},
    "inspect": {"markcoroutinefunction", "getmembers_static"},
}  # fmt: skip
NEW_BUILTINS = {"ExceptionGroup", "BaseExceptionGroup"}
# Possessive quantifiers (a*+, a++, a?+, a{2}+) and atomic groups (?>...): Python 3.11's re, "multiple repeat" on 3.10.
POSSESSIVE_OR_ATOMIC = r"(?<!\\)[*+?}]\+|\(\?>"
RE_311 = re.compile(POSSESSIVE_OR_ATOMIC)
RE_CALLS = {"compile", "lazy_compile", "match", "search", "fullmatch", "sub", "subn", "split", "findall", "finditer"}
SHIMS = REPO / "src" / "dgxdoctor" / "compat"


def python_files() -> Iterator[Path]:
    for top in ("src", "tests", "benchmarks", "scripts"):
        for path in sorted((REPO / top).rglob("*.py")):
            if SHIMS not in path.parents and "fixtures" not in path.relative_to(REPO).parts:
                yield path


def uses_of_311(tree: ast.AST) -> Iterator[tuple[int, str]]:
    modules: dict[str, str] = {}  # local name -> module, from `import x` / `import x as y`
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                modules[alias.asname or alias.name.split(".")[0]] = alias.name
    for node in ast.walk(tree):
        if type(node).__name__ == "TryStar":
            yield node.lineno, "except*"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in NEW_IN_311 and NEW_IN_311[alias.name] is None:
                    yield node.lineno, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.module in NEW_IN_311:
            new = NEW_IN_311[node.module]
            for alias in node.names:
                if new is None or alias.name in new:
                    yield node.lineno, f"from {node.module} import {alias.name}"
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = modules.get(node.value.id)
            new = NEW_IN_311.get(module) if module else None
            if new is not None and node.attr in new:
                yield node.lineno, f"{module}.{node.attr}"
        elif isinstance(node, ast.Name) and node.id in NEW_BUILTINS:
            yield node.lineno, node.id
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            pattern = node.args[0].value
            if name in RE_CALLS and isinstance(pattern, str) and RE_311.search(pattern):
                yield node.lineno, f"a possessive quantifier or atomic group in {pattern!r}"


def test_no_code_uses_what_python_311_added() -> None:
    found = []
    for path in python_files():
        rel = path.relative_to(REPO)
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(rel), feature_version=(3, 10))
        except SyntaxError as exc:
            found.append(f"{rel}:{exc.lineno}: not Python 3.10 syntax: {exc.msg}")
            continue
        found += [f"{rel}:{line}: {what}" for line, what in uses_of_311(tree)]
    assert found == [], "Python 3.11+ only (see dgxdoctor.compat):\n" + "\n".join(found)


def _waits_with_asyncio(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "wait_for" and isinstance(node.value, ast.Name) and node.value.id == "asyncio"
    if isinstance(node, ast.ImportFrom):
        return node.module == "asyncio" and any(alias.name == "wait_for" for alias in node.names)
    return False


def test_the_agent_waits_through_compat() -> None:
    """On 3.10 ``asyncio.wait_for`` raises ``asyncio.TimeoutError``, which the agent's ``except TimeoutError`` (the
    check runner's, the remediation loop's) misses: src waits with ``dgxdoctor.compat.aio.wait_for``."""
    found = [
        f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
        for path in (REPO / "src").rglob("*.py")
        if SHIMS not in path.parents
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if _waits_with_asyncio(node)
    ]
    assert found == [], "asyncio.wait_for (use dgxdoctor.compat.aio.wait_for): " + ", ".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import tomllib",
        "from datetime import UTC",
        "import asyncio\nasync def f():\n    async with asyncio.timeout(1):\n        pass",
        "import typing\nx: typing.Self",
        "from enum import StrEnum",
        "raise ExceptionGroup('x', [])",
        "import re\nre.compile(r'a:\\.*+b')",
    ],
)
def test_the_scan_sees_each_kind(source: str) -> None:
    assert list(uses_of_311(ast.parse(source)))


def test_pyproject_linters_and_readme_name_the_same_pythons() -> None:
    project = PYPROJECT["project"]
    assert project["requires-python"] == f">={SUPPORTED[0]}"
    listed = [c.rsplit(" :: ", 1)[1] for c in project["classifiers"] if re.fullmatch(r".* :: 3\.\d+", c)]
    assert listed == list(SUPPORTED)
    assert PYPROJECT["tool"]["ruff"]["target-version"] == "py" + SUPPORTED[0].replace(".", "")
    assert PYPROJECT["tool"]["mypy"]["python_version"] == SUPPORTED[0]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert f"Python {', '.join(SUPPORTED[:-1])} and {SUPPORTED[-1]}" in readme


def test_the_backports_are_installed_only_where_the_standard_library_lacks_them() -> None:
    deps = {re.split(r"[<>=;\s]", d, maxsplit=1)[0]: d for d in PYPROJECT["project"]["dependencies"]}
    for backport in ("tomli", "async-timeout"):
        assert deps[backport].replace('"', "'").endswith("; python_version < '3.11'"), deps[backport]


def find_python310(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / "scripts" / "find-python310")], capture_output=True, text=True, timeout=60,
        env={k: v for k, v in {**os.environ, **env}.items() if v},
    )  # fmt: skip


def test_ci_finds_a_python_310_on_the_machine() -> None:
    """scripts/test-all runs the unit suite with what this finds (this machine's pyenv 3.10, here)."""
    found = find_python310(PYTHON310="")
    if found.returncode != 0:
        pytest.skip(f"no Python 3.10 on this machine; scripts/test-all fails here: {found.stderr.strip()}")
    path = found.stdout.strip()
    version = subprocess.run([path, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
    assert version.stdout.strip() == "(3, 10)"


def test_ci_refuses_an_interpreter_that_is_not_310() -> None:
    for impostor in ("/bin/true", "/bin/false", str(REPO / "nonexistent")):
        refused = find_python310(PYTHON310=impostor)
        assert refused.returncode == 1 and refused.stdout == ""
        assert f"PYTHON310={impostor} is not a Python 3.10" in refused.stderr
