"""Running external tools: argv lists only (never a shell), always with a timeout."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class CommandNotFound(Exception):
    """The tool is not installed here (a check turns this into SKIPPED)."""


class CommandTimeout(Exception):
    pass


class CommandRunner(Protocol):
    def __call__(self, argv: Sequence[str], timeout_s: float = ...) -> CommandResult: ...


def run_command(argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
    """Run ``argv`` without a shell. Raises CommandNotFound when the program is absent."""
    if not argv:
        raise ValueError("empty argv")
    if shutil.which(argv[0]) is None:
        raise CommandNotFound(f"{argv[0]} not found in PATH")
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
            errors="replace",
        )
    except subprocess.TimeoutExpired as exc:
        raise CommandTimeout(f"{' '.join(argv)} did not finish in {timeout_s:g} s") from exc
    return CommandResult(tuple(argv), done.returncode, done.stdout, done.stderr)
