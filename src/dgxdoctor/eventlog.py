"""Structured event logging: ``log = get_logger(__name__)``, then ``log.warning("check_hung", check="xid")``.

One event name and its fields per line. The daemon's lines are structlog's: ``daemon.logconfig.configure`` imports
it and hands this module its logger (``use``): a JSON object per line for journald
(``{"check": "xid", "event": "check_hung", "level": "warning", "timestamp": "...Z"}``), structlog's console
rendering on a terminal. Every other command writes readable lines on stderr (``[warning  ] check_hung
check=xid``) from the few lines of the standard library below: ``dgxdoctor check`` and ``--help`` import no
structlog (start-up time, ``tests/unit/test_startup_imports.py``), and a module that logs imports only this one.
"""

from __future__ import annotations

import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
LEVEL_WIDTH = 9  # "[warning  ]": the longest name, "critical", and a space
EVENT_WIDTH = 30

# Where the daemon's events go: (level, event, fields) to structlog; "exception" as the level logs the exception
# being handled (at error).
Sink = Callable[[str, str, dict[str, Any]], None]


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if isinstance(value, str) and text and not any(c.isspace() for c in text) else repr(value)


def render_console(fields: dict[str, Any]) -> str:
    """``[warning  ] check_hung                     check=xid timeout_s=10.0`` (fields sorted by name)."""
    fields = dict(fields)
    event, level = str(fields.pop("event", "")), str(fields.pop("level", ""))
    stack = fields.pop("exception", None)
    line = f"[{level:<{LEVEL_WIDTH}}] {event:<{EVENT_WIDTH}} " + " ".join(
        f"{k}={_value(v)}" for k, v in sorted(fields.items())
    )
    return line.rstrip() + (f"\n{stack}" if stack else "")


class _Output:
    """Where events go: the daemon's structlog logger once ``use``d, else readable lines on a stream."""

    def __init__(self) -> None:
        self.threshold = LEVELS["debug"]
        self.stream: TextIO | None = None  # None: sys.stderr at the time of each line
        self.sink: Sink | None = None
        self.lock = threading.Lock()
        self.capture: list[dict[str, Any]] | None = None

    def emit(self, level: str, event: str, fields: dict[str, Any]) -> None:
        if self.capture is not None:
            if level == "exception":
                level, fields = "error", {**fields, "exc_info": fields.get("exc_info", True)}
            self.capture.append({**fields, "event": event, "log_level": level})
            return
        try:
            if self.sink is not None:
                self.sink(level, event, fields)
            else:
                self._write(level, event, fields)
        except (OSError, ValueError):  # the reader went away (a closed pipe): a lost line never stops the caller
            pass

    def _write(self, level: str, event: str, fields: dict[str, Any]) -> None:
        exc = fields.pop("exc_info", True if level == "exception" else None)
        level = "error" if level == "exception" else level
        if LEVELS[level] < self.threshold:
            return
        line = render_console({**fields, "event": event, "level": level})
        if exc:
            line += "\n" + _format_exc(exc)
        with self.lock:  # one whole line at a time from any thread, flushed
            stream = self.stream or sys.stderr
            stream.write(line + "\n")
            stream.flush()


def _format_exc(exc: Any) -> str:
    if isinstance(exc, BaseException):
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    return traceback.format_exc().rstrip()


OUTPUT = _Output()


class Logger:
    __slots__ = ("name",)

    def __init__(self, name: str | None) -> None:
        self.name = name

    def debug(self, event: str, **fields: Any) -> None:
        OUTPUT.emit("debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        OUTPUT.emit("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        OUTPUT.emit("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        OUTPUT.emit("error", event, fields)

    def critical(self, event: str, **fields: Any) -> None:
        OUTPUT.emit("critical", event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """An error with the exception being handled, its traceback in the ``exception`` field."""
        OUTPUT.emit("exception", event, fields)


def get_logger(name: str | None = None) -> Logger:
    return Logger(name)


def configure(level: str = "info", *, stream: TextIO | None = None) -> None:
    """Readable lines at ``level`` and above on ``stream`` (stderr when None): every command but the daemon."""
    OUTPUT.threshold = LEVELS.get(level.lower(), LEVELS["info"])
    OUTPUT.stream = stream
    OUTPUT.sink = None


def use(sink: Sink) -> None:
    """Every event to ``sink`` from now on (the daemon's structlog logger, ``daemon.logconfig``)."""
    OUTPUT.sink = sink


@contextmanager
def capture_logs() -> Iterator[list[dict[str, Any]]]:
    """Every event while the block runs, unrendered, each with its ``log_level`` (for tests)."""
    captured: list[dict[str, Any]] = []
    before, OUTPUT.capture = OUTPUT.capture, captured
    try:
        yield captured
    finally:
        OUTPUT.capture = before
