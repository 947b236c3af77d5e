"""The audit trail and the guard's state on disk, both crash-safe.

``<state_dir>/remediation.jsonl``: one JSON object per line, per decision and per action, appended and fsynced
before the call returns, so a crash at any moment loses no completed line (a torn last line is skipped on
reading). ``<state_dir>/remediation-state.json``: the guard's state, replaced atomically (write a temporary
file, fsync, rename, fsync the directory), read and written under an exclusive lock so ``dgxdoctor remediation
reset`` and the daemon never interleave.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dgxdoctor.sources.statefile import atomic_write

AUDIT_FILE = "remediation.jsonl"
STATE_FILE = "remediation-state.json"
LOCK_FILE = "remediation.lock"


class AuditLog:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / AUDIT_FILE

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True, default=str) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            os.write(fd, line.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)

    def tail(self, count: int) -> list[dict[str, Any]]:
        """The last ``count`` complete records (a line torn by a crash is skipped)."""
        kept: deque[dict[str, Any]] = deque(maxlen=count)
        try:
            with self.path.open(encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(record, dict):
                        kept.append(record)
        except FileNotFoundError:
            return []
        return list(kept)


class StateFile:
    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        self.path = state_dir / STATE_FILE
        self.lock_path = state_dir / LOCK_FILE

    @contextmanager
    def locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def read(self) -> dict[str, Any]:
        """The saved state; {} when there is none. A corrupt file raises ValueError (never silently reset)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError(f"{self.path}: not a JSON object")
        return doc

    def write(self, doc: dict[str, Any]) -> None:
        atomic_write(self.path, json.dumps(doc, sort_keys=True, indent=1).encode("utf-8"), 0o640)
