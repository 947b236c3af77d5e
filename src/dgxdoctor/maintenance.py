"""Maintenance windows: when the daemon may run a check that loads the serving path (benchmark, bandwidth probe).

A window is ``[Day[-Day] ]HH:MM-HH:MM`` in UTC: ``"Sat 02:00-04:00"``, ``"02:00-04:00"`` (every day),
``"Mon-Fri 23:00-01:00"`` (over midnight: it belongs to the day it starts). A check's settings carry a list of them
(``maintenance_windows``), validated when the config loads; ``in_window`` answers for a moment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

WINDOW_RE = re.compile(
    r"^(?:(?P<d1>Mon|Tue|Wed|Thu|Fri|Sat|Sun)(?:-(?P<d2>Mon|Tue|Wed|Thu|Fri|Sat|Sun))? )?"
    r"(?P<h1>[01]\d|2[0-3]):(?P<m1>[0-5]\d)-(?P<h2>[01]\d|2[0-4]):(?P<m2>[0-5]\d)$"
)
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


@dataclass(frozen=True)
class Window:
    days: frozenset[int]  # 0 = Monday: the days the window starts on
    start_min: int
    end_min: int

    def contains(self, when: datetime) -> bool:
        minute = when.hour * 60 + when.minute
        today, yesterday = when.weekday(), (when.weekday() - 1) % 7
        if self.start_min < self.end_min:
            return today in self.days and self.start_min <= minute < self.end_min
        return (today in self.days and minute >= self.start_min) or (yesterday in self.days and minute < self.end_min)


def parse_window(text: str) -> Window:
    """``[Day[-Day] ]HH:MM-HH:MM`` (UTC) -> Window; ValueError naming what is wrong."""
    m = WINDOW_RE.match(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not '[Mon[-Fri] ]HH:MM-HH:MM' (UTC)")
    d1, d2 = m.group("d1"), m.group("d2")
    if d1 is None:
        days = frozenset(range(7))
    else:
        a, b = DAYS.index(d1), DAYS.index(d2 or d1)
        days = frozenset((a + i) % 7 for i in range((b - a) % 7 + 1))
    start = int(m.group("h1")) * 60 + int(m.group("m1"))
    end = int(m.group("h2")) * 60 + int(m.group("m2"))
    if start == end or end > 24 * 60:
        raise ValueError(f"{text!r}: the window is empty or ends after 24:00")
    return Window(days, start, end)


def validate_windows(windows: list[str]) -> list[str]:
    """For a pydantic ``field_validator``: every window parses (the first bad one is named)."""
    for window in windows:
        parse_window(window)
    return windows


def in_window(windows: list[str], now: float) -> bool:
    """Whether the Unix time ``now`` falls inside any of ``windows``."""
    when = datetime.fromtimestamp(now, tz=UTC)
    return any(parse_window(w).contains(when) for w in windows)
