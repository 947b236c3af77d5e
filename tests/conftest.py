"""Shared test helpers: run the real CLI in a subprocess, find fixtures, load a benchmark as a module."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
BENCHMARKS = REPO / "benchmarks"


@dataclass
class CliRun:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


def run_cli(*args: str, stdin: str | None = None, env: dict[str, str] | None = None, timeout: float = 120) -> CliRun:
    """Run ``python -m dgxdoctor ARGS`` from this checkout's src, as an operator would."""
    # This checkout's src first; whatever PYTHONPATH already holds (e.g. carried dependency wheels) after it.
    python_path = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p)
    full_env = {**os.environ, "PYTHONPATH": python_path, **(env or {})}
    done = subprocess.run(
        [sys.executable, "-m", "dgxdoctor", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        check=False,
    )
    return CliRun(done.returncode, done.stdout, done.stderr)


def run_clis(calls: Sequence[Sequence[str]], timeout: float = 120) -> list[CliRun]:
    """``run_cli`` for each argument list, in order, one process per core at once: the test only waits on them."""
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return list(pool.map(lambda args: run_cli(*args, timeout=timeout), calls))


def fresh_python(code: str) -> str:
    """Run ``code`` in a fresh interpreter that sees only this checkout's src; its stdout (fails on a non-zero exit).

    What a module imports is only visible in an interpreter that has loaded nothing else."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return done.stdout


def load_benchmark(name: str, module_name: str | None = None) -> ModuleType:
    """benchmarks/NAME.py, run afresh as the module ``module_name`` (default NAME), registered in sys.modules (its
    dataclasses look their module up). benchmarks/ goes on the end of sys.path: run as a script, a benchmark finds
    the modules beside it (installed.py, ...) the same way, and nothing of the suite's is shadowed."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(module_name or name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES
