"""The one shape of an expensive request a peer may make (``POST /check/run``, ``POST /bundle/part``): a small JSON
body of seconds, validated by its model (``json_body``); one run at a time (409), at most one start per interval
(429 with ``Retry-After``); the connection's deadline lifted only once the request is authenticated and admitted.

The token is checked before any of this (``app.auth_middleware``); the body is untrusted input.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
from aiohttp import web

from dgxdoctor.daemon.connections import lift_deadline
from dgxdoctor.validation import decode_json

T = TypeVar("T")
B = TypeVar("B", bound=msgspec.Struct)


def json_body(raw: bytes, model: type[B]) -> B:
    """The body as ``model`` (a record of bounded seconds that forbids other keys); an empty body is its defaults.
    ValueError with msgspec's message otherwise (``Expected `float` <= 600.0 - at `$.deadline_s```)."""
    if not raw.strip():
        return model()
    try:
        return decode_json(raw, model)
    except msgspec.DecodeError as exc:  # not JSON, or JSON of another shape (a ValidationError)
        raise ValueError(f"body: {exc}") from None


class RunGate:
    """One run at a time (409 while one runs) and at most one start per ``interval()`` seconds (429)."""

    def __init__(self, what: str, interval: Callable[[], float], monotonic: Callable[[], float] = time.monotonic):
        self.what = what
        self.interval = interval
        self.monotonic = monotonic
        self.lock = asyncio.Lock()
        self.last_start: float | None = None
        self.refused: dict[str, int] = {"busy": 0, "rate": 0}

    def refusal(self) -> web.Response | None:
        if self.lock.locked():
            self.refused["busy"] += 1
            return web.json_response({"error": f"a {self.what} is already in progress here"}, status=409,
                                     headers={"Retry-After": "1"})  # fmt: skip
        interval = self.interval()
        if self.last_start is not None and self.monotonic() - self.last_start < interval:
            self.refused["rate"] += 1
            wait = max(1, math.ceil(interval - (self.monotonic() - self.last_start)))
            return web.json_response({"error": f"at most one {self.what} per {interval:g} s"}, status=429,
                                     headers={"Retry-After": str(wait)})  # fmt: skip
        return None

    def started(self) -> None:
        self.last_start = self.monotonic()

    async def serve(
        self, request: web.Request, parse: Callable[[bytes], T], work: Callable[[T], Awaitable[web.Response]]
    ) -> web.Response:
        """``work(parse(body))`` when the body is valid (else 400) and the gate admits it (else 409/429)."""
        try:
            asked = parse(await request.read())
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        refused = self.refusal()
        if refused is not None:
            return refused
        lift_deadline(request)  # authenticated and admitted: the work has its own deadline
        async with self.lock:
            self.started()
            return await work(asked)
