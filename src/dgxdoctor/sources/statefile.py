"""Small JSON state files (counter baselines, log offsets) that survive restarts and crashes.

Written atomically (temp file, fsync, rename) so a crash leaves the old or the new file, never half of one.
An unreadable or corrupt file is reported and treated as empty: losing a baseline costs one interval of
rates, while refusing to start would cost all monitoring. A failed write (disk full, read-only) is logged, counted
per file in ``WRITE_ERRORS`` (exported as ``dgxdoctor_write_errors_total{file}``) and does not fail the check.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

# Failed writes per file name since the process started; every file written once has its series, at 0 at first.
WRITE_ERRORS: Counter[str] = Counter()


def note_file(name: str) -> None:
    """Make ``name``'s write-error series exist (at 0) before its first write."""
    WRITE_ERRORS.setdefault(name, 0)


def write_failed(name: str, path: Path, exc: OSError) -> None:
    WRITE_ERRORS[name] += 1
    log.warning("write_failed", file=name, path=str(path), error=str(exc), failures=WRITE_ERRORS[name])


def boot_id(proc_root: Path = Path("/proc")) -> str | None:
    """The kernel's boot id: a counter baseline from another boot is meaningless."""
    try:
        return (proc_root / "sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """The one atomic file writer: a temporary file in the same directory, fsync, ``mode``, rename over ``path``,
    fsync the directory. A reader (a scrape, a restart after a crash) sees the old file or the new one, never half.
    ``mode`` is set explicitly: the daemon's umask (0027) must not decide who may read a shared file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class StateFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        note_file(path.name)

    def load(self) -> dict[str, Any]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.warning("state_unreadable", path=str(self.path), error=str(exc))
            return {}
        try:
            data = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # not UTF-8 or not JSON; RecursionError: absurdly deep nesting
            log.warning("state_corrupt", path=str(self.path), error=str(exc))
            return {}
        if not isinstance(data, dict):
            log.warning("state_corrupt", path=str(self.path), error="top level is not an object")
            return {}
        return data

    def save(self, data: dict[str, Any]) -> bool:
        """Write atomically; False (logged and counted) when the write failed."""
        try:
            self._save(data)
        except OSError as exc:
            write_failed(self.path.name, self.path, exc)
            return False
        return True

    def _save(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps(data, separators=(",", ":"), sort_keys=True).encode("utf-8"))
