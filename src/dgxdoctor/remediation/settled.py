"""When the remediation loop's next evaluation can be skipped: nothing it reads has changed and no deadline passed.

The loop wakes once a second. An evaluation reads the checks' latest results, the queued alerts, the guard's state
file (under its lock, validated) and the time; with the same inputs it decides the same, until a hold, a cooldown,
the budget's or the ladder's window runs out (``Guard.next_change``). So after an evaluation that changed nothing
(no write, no action, no page) the loop keeps what it saw and skips the next ones while all of it holds: the same
result objects, or new ones that say the same to remediation (the same problems, hardware causes, vLLM start-up
grace and alerts their evidence corroborates), the same alerts, the same state file (inode, size, mtime and
ctime: any writer, ``dgxdoctor remediation reset`` included, replaces it), the same settings. An idle daemon then
costs a ``stat`` a second, not a locked read, a validation and two deep copies.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from msgspec import Struct

from dgxdoctor.remediation.hardware_gate import HardwareCause
from dgxdoctor.remediation.policy import Problem
from dgxdoctor.result import CheckResult

# (inode, size, mtime ns, ctime ns) of the state file; None: there is none.
FileStamp = tuple[int, int, int, int] | None


def file_stamp(path: Path) -> FileStamp | object:
    """What identifies this version of the file; a fresh object (equal to nothing) when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError:
        return object()
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class View(Struct, frozen=True):
    """What remediation takes from the checks' latest results."""

    checks: tuple[Problem, ...]
    causes: tuple[HardwareCause, ...]
    in_grace: bool | None  # vLLM within its start-up grace; None: no uptime known
    alerts: tuple[Problem, ...] = ()  # the queued alerts whose evidence the results corroborate (policy.fresh_alert)


class Moment(Struct, frozen=True):
    """Everything else an evaluation reads, compared as a whole."""

    firing: dict[str, Problem]
    stamp: Any  # FileStamp, or an object equal to nothing
    finished_at: float | None
    pending_finish: tuple[str, float] | None
    idle: bool
    breaker_open: bool
    busy: bool
    settings: Any  # compared by value: the same object, or an equal one after a reload
    node: str
    fleet: str = ""  # why the fleet breaker is tripped ("" when it is not): a change is judged again


class Settled:
    """What the last evaluation that changed nothing saw, and until when that holds."""

    def __init__(self, results: Mapping[str, CheckResult], view: View, moment: Moment, until: float) -> None:
        self.results = dict(results)
        self.view = view
        self.moment = moment
        self.until = until

    def same_results(self, latest: Mapping[str, CheckResult]) -> bool:
        """The very same result objects (the store replaces a check's result at each run)."""
        kept = self.results
        return len(kept) == len(latest) and all(kept.get(name) is result for name, result in latest.items())

    def holds(self, now: float, moment: Moment) -> bool:
        return now < self.until and moment == self.moment
