"""Structured event logging: ``log = get_logger(__name__)``, then ``log.warning("check_hung", check="xid")``.

One event name and its fields per line: JSON objects on stdout for the daemon (journald keeps them), readable
lines on stderr for every other command (``daemon.logconfig`` chooses). The same lines structlog wrote here
(``{"check": "xid", "event": "check_hung", "level": "warning", "timestamp": "...Z"}``, ``[warning  ] check_hung
check=xid``), from the standard library: structlog's 27 modules were ~1.3 MiB of the idle daemon's memory and a
tenth of ``dgxdoctor check``'s imports.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
LEVEL_WIDTH = 9  # "[warning  ]": the longest name, "critical", and a space
EVENT_WIDTH = 30


def timestamp(now: float | None = None) -> str:
    """ISO 8601 in UTC with microseconds: ``2026-12-01T19:44:59.150902Z``."""
    now = time.time() if now is None else now
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1_000_000):06d}Z"


def render_json(fields: dict[str, Any]) -> str:
    return json.dumps(fields, default=repr)


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
    """Where events go: the level threshold, the renderer and the stream, set by ``configure``."""

    def __init__(self) -> None:
        self.threshold = LEVELS["debug"]
        self.render: Callable[[dict[str, Any]], str] = render_console
        self.stream: TextIO | None = None  # None: sys.stderr at the time of each line
        self.stamp = False
        self.lock = threading.Lock()
        self.capture: list[dict[str, Any]] | None = None

    def emit(self, level: str, fields: dict[str, Any]) -> None:
        if self.capture is not None:
            self.capture.append({**fields, "log_level": level})
            return
        if LEVELS[level] < self.threshold:
            return
        fields["level"] = level
        if self.stamp:
            fields["timestamp"] = timestamp()
        exc = fields.pop("exc_info", None)
        if exc:
            fields["exception"] = _format_exc(exc)
        line = self.render(fields)
        with self.lock:  # one whole line at a time from any thread, flushed: journald reads a pipe
            stream = self.stream or sys.stderr
            try:
                stream.write(line + "\n")
                stream.flush()
            except (OSError, ValueError):  # the reader went away (a closed pipe): a lost line never stops the caller
                pass


def _format_exc(exc: Any) -> str:
    if isinstance(exc, BaseException):
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    return traceback.format_exc().rstrip()


OUTPUT = _Output()


class Logger:
    __slots__ = ("name",)

    def __init__(self, name: str | None) -> None:
        self.name = name

    def _log(self, level: str, event: str, fields: dict[str, Any]) -> None:
        OUTPUT.emit(level, {**fields, "event": event})

    def debug(self, event: str, **fields: Any) -> None:
        self._log("debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log("error", event, fields)

    def critical(self, event: str, **fields: Any) -> None:
        self._log("critical", event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """An error with the exception being handled, its traceback in the ``exception`` field."""
        self._log("error", event, {**fields, "exc_info": fields.get("exc_info", True)})


def get_logger(name: str | None = None) -> Logger:
    return Logger(name)


def configure(level: str = "info", *, json_lines: bool, stream: TextIO | None = None) -> None:
    """JSON objects with a timestamp (the daemon), or readable lines (the commands), at ``level`` and above."""
    OUTPUT.threshold = LEVELS.get(level.lower(), LEVELS["info"])
    OUTPUT.render = render_json if json_lines else render_console
    OUTPUT.stamp = json_lines
    OUTPUT.stream = stream


class JsonFormatter(logging.Formatter):
    """A standard ``logging`` record (httpx, asyncio) as the same JSON object, with the logger's name."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {"event": record.getMessage(), "logger": record.name}
        fields["level"] = record.levelname.lower()
        fields["timestamp"] = timestamp(record.created)
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        return render_json(fields)


@contextmanager
def capture_logs() -> Iterator[list[dict[str, Any]]]:
    """Every event while the block runs, unrendered, each with its ``log_level`` (for tests)."""
    captured: list[dict[str, Any]] = []
    before, OUTPUT.capture = OUTPUT.capture, captured
    try:
        yield captured
    finally:
        OUTPUT.capture = before
