"""Small JSON state files (counter baselines, log offsets) that survive restarts and crashes.

Written atomically (temp file, fsync, rename) so a crash leaves the old or the new file, never half of one.
An unreadable or corrupt file is reported and treated as empty: losing a baseline costs one interval of
rates, while refusing to start would cost all monitoring.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)


def boot_id(proc_root: Path = Path("/proc")) -> str | None:
    """The kernel's boot id: a counter baseline from another boot is meaningless."""
    try:
        return (proc_root / "sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


class StateFile:
    def __init__(self, path: Path) -> None:
        self.path = path

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

    def save(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh, separators=(",", ":"), sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
