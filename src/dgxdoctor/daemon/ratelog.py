"""Bounded logging of what strangers send: malformed HTTP requests and event-loop socket errors.

Anyone who reaches the port can send garbage as fast as the network allows. aiohttp logs each malformed request as
an ERROR with its traceback and asyncio logs each failed ``accept()`` the same way: a client can then write tens of
megabytes of log a minute, and under journald's rate limit that pushes out the lines an operator needs (check
transitions). Here each such event is counted (the counters are exported) and logged as one line without a
traceback, at most ``burst`` lines per ``window_s``; the next line that gets through says how many were left out.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

from dgxdoctor import eventlog

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


# aiohttp quotes the offending line in a bad request's message, header value and all (a bearer token with a stray
# control character would go to the log whole):
#   400, message:\n  Invalid header value char:\n\n  b'Authorization: Bearer s3cret\x01'\n   ^
# Only the message's first line up to the first quote, and the quoted header's name, are kept.
QUOTED_HEADER_RE = re.compile(r"b(['\"])(?P<name>[A-Za-z0-9!#$%&+*.^_`|~-]{1,64}):")
QUOTE_RE = re.compile(r"[\s:]*(?:\bb)?['\"]")


def _text(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    if isinstance(exc, HttpProcessingError):
        return _bad_request_text(exc)
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")[:MAX_TEXT]


def _bad_request_text(exc: HttpProcessingError) -> str:
    """What was wrong and in which header, never what the client sent: the first line and the header's name."""
    message = str(exc.message or "")
    first = QUOTE_RE.split(message.strip().split("\n", 1)[0], maxsplit=1)[0].rstrip(":").strip()
    quoted = QUOTED_HEADER_RE.search(message)
    where = f" (header {quoted.group('name')}, value not logged)" if quoted else ""
    return f"{type(exc).__name__}: {exc.code}, {first[:MAX_TEXT]}{where}"


class RequestLog(logging.Logger):
    """The ``logger`` aiohttp's request handler writes to (``connections.make_runner``).

    A malformed request (an ``HttpProcessingError``: bad request line, bad header, too long) is counted in
    ``bad_requests`` and logged as one ``http_bad_request`` line at a bounded rate. Any other error in a handler
    is a bug of ours: one ``http_handler_error`` line, bounded too, with the exception type and text.
    """

    def __init__(self) -> None:
        super().__init__("dgxdoctor.http")
        # Anything else aiohttp logs here (warnings) goes on to the root handler, as aiohttp.server's would.
        self.parent = logging.getLogger("aiohttp.server")
        self.bad_requests = 0
        self.handler_errors = 0
        self._bad = RateLimit()
        self._errors = RateLimit()

    def _event(self, args: tuple[Any, ...], exc: BaseException | None) -> None:
        remote = str(args[0]) if args else None
        if isinstance(exc, HttpProcessingError):
            self.bad_requests += 1
            ok, left_out = self._bad.allow()
            if ok:
                log.warning("http_bad_request", remote=remote, error=_text(exc), not_logged_before=left_out)
            return
        self.handler_errors += 1
        ok, left_out = self._errors.allow()
        if ok:
            log.error("http_handler_error", remote=remote, error=_text(exc), not_logged_before=left_out)

    def exception(self, msg: object, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        self._event(args, exc_info if isinstance(exc_info, BaseException) else None)

    def error(self, msg: object, *args: Any, exc_info: Any = None, **kwargs: Any) -> None:
        self._event(args, exc_info if isinstance(exc_info, BaseException) else None)

    def debug(self, msg: object, *args: Any, exc_info: Any = None, **kwargs: Any) -> None:
        # aiohttp logs a first request with a bad method (TLS or another protocol on the HTTP port) at debug level.
        if isinstance(exc_info, HttpProcessingError):
            self._event(args, exc_info)


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
