"""The audit trail and the guard's state on disk, both crash-safe.

``<state_dir>/remediation.jsonl``: one JSON object per line, per decision and per action, appended and fsynced
before the call returns, so a crash at any moment loses no completed line (a torn last line is skipped on
reading). ``<state_dir>/remediation-state.json``: the guard's state, replaced atomically (write a temporary
file, fsync, rename, fsync the directory), read and written under an exclusive lock so ``dgxdoctor remediation
reset`` and the daemon never interleave.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dgxdoctor import eventlog
from dgxdoctor.remediation.state_doc import STATE_VERSION
from dgxdoctor.sources.statefile import WRITE_ERRORS, StateFile, note_file

log = eventlog.get_logger(__name__)

AUDIT_FILE = "remediation.jsonl"
STATE_FILE = "remediation-state.json"
LOCK_FILE = "remediation.lock"
# A failing disk is said at most once per this many seconds per file, with the failures since, and said again
# for as long as it fails (never a flood, never silence).
WRITE_ERROR_LOG_S = 60.0


class Throttle:
    """Says yes at most once per ``every_s`` per key, and counts the times it said no in between."""

    def __init__(self, every_s: float = WRITE_ERROR_LOG_S, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.monotonic = monotonic
        self._said: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def say(self, key: str) -> tuple[bool, int]:
        """(say it now, how many were not said since the last time)."""
        now = self.monotonic()
        if now - self._said.get(key, -self.every_s) < self.every_s:
            self._quiet[key] = self._quiet.get(key, 0) + 1
            return False, 0
        self._said[key] = now
        return True, self._quiet.pop(key, 0)


class WriteErrors:
    """Failed writes of the audit and the state: counted in ``dgxdoctor_write_errors_total{file}``, logged at a
    bounded rate for as long as they fail."""

    def __init__(self, throttle: Throttle | None = None) -> None:
        self.throttle = throttle or Throttle()
        for name in (AUDIT_FILE, STATE_FILE):
            note_file(name)

    def failed(self, name: str, path: Path, exc: OSError, consequence: str) -> None:
        WRITE_ERRORS[name] += 1
        say, quiet = self.throttle.say(name)
        if say:
            log.error("remediation_write_failed", file=name, path=str(path), error=f"{type(exc).__name__}: {exc}",
                      failures=WRITE_ERRORS[name], not_logged_since=quiet, consequence=consequence)  # fmt: skip


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


def guard_state_file(state_dir: Path) -> StateFile:
    """The guard's state: read and written strictly (``read``/``write``) under ``remediation.lock``."""
    return StateFile(state_dir / STATE_FILE, lock_path=state_dir / LOCK_FILE, mode=0o640, indent=1,
                     version=STATE_VERSION)  # fmt: skip
