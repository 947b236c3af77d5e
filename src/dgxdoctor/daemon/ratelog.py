"""Bounded logging of what strangers send: malformed HTTP requests and event-loop socket errors.

Anyone who reaches the port can send garbage as fast as the network allows. Logged as an ERROR with its traceback
(as aiohttp did for each malformed request, and asyncio does for each failed ``accept()``), a client can write
tens of megabytes of log a minute, and under journald's rate limit that pushes out the lines an operator needs (check
transitions). Here each such event is counted (the counters are exported) and logged as one line without a
traceback, at most ``burst`` lines per ``window_s``; the next line that gets through says how many were left out.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from dgxdoctor import eventlog
from dgxdoctor.daemon.web import BadRequest

log = eventlog.get_logger(__name__)

# At most this many lines per window per kind of event: enough to see what is going on, never a flood.
BURST = 5
WINDOW_S = 60.0
MAX_TEXT = 200


class RateLimit:
    """Up to ``burst`` events per ``window_s`` (fixed window); counts what it refused since the last allowed one."""

    def __init__(
        self, burst: int = BURST, window_s: float = WINDOW_S, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst = burst
        self.window_s = window_s
        self.monotonic = monotonic
        self._window_start = -float("inf")
        self._in_window = 0
        self.suppressed = 0

    def allow(self) -> tuple[bool, int]:
        """(allowed, how many were suppressed before this one); the suppressed count resets when allowed."""
        now = self.monotonic()
        if now - self._window_start >= self.window_s:
            self._window_start, self._in_window = now, 0
        if self._in_window >= self.burst:
            self.suppressed += 1
            return False, 0
        self._in_window += 1
        left_out, self.suppressed = self.suppressed, 0
        return True, left_out


def _text(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    if isinstance(exc, BadRequest):
        return _bad_request_text(exc)
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")[:MAX_TEXT]


def _bad_request_text(exc: BadRequest) -> str:
    """What was wrong and in which header, never what the client sent (a bearer token with a stray control
    character would go to the log whole): the server's own reason and the header's name."""
    where = f" (header {exc.header[:64]}, value not logged)" if exc.header else ""
    return f"BadRequest: 400, {exc.reason[:MAX_TEXT]}{where}"


class RequestLog:
    """Where the HTTP server reports what went wrong with a request (``web.RequestLogger``).

    A malformed request (bad request line, bad header, too long) is counted in ``bad_requests`` and logged as one
    ``http_bad_request`` line at a bounded rate. Any other error in a handler is a bug of ours: one
    ``http_handler_error`` line, bounded too, with the exception type and text.
    """

    def __init__(self) -> None:
        self.bad_requests = 0
        self.handler_errors = 0
        self._bad = RateLimit()
        self._errors = RateLimit()

    def bad_request(self, remote: str | None, exc: BadRequest) -> None:
        self.bad_requests += 1
        ok, left_out = self._bad.allow()
        if ok:
            log.warning("http_bad_request", remote=remote, error=_text(exc), not_logged_before=left_out)

    def handler_error(self, remote: str | None, exc: BaseException) -> None:
        self.handler_errors += 1
        ok, left_out = self._errors.allow()
        if ok:
            log.error("http_handler_error", remote=remote, error=_text(exc), not_logged_before=left_out)


class LoopErrors:
    """An event-loop exception handler: one bounded line per error (``accept()`` out of descriptors and such)."""

    def __init__(self) -> None:
        self.total: Counter[str] = Counter()
        self._limit = RateLimit()

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        kind = type(exc).__name__ if exc is not None else "error"
        self.total[kind] += 1
        ok, left_out = self._limit.allow()
        if ok:
            log.error(
                "event_loop_error",
                message=str(context.get("message", ""))[:MAX_TEXT],
                error=_text(exc),
                not_logged_before=left_out,
            )
