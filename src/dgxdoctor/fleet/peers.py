"""Fetch and validate peers' ``/state`` documents. Everything a peer sends is untrusted input."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import ValidationError

from dgxdoctor.result import ResultsDocument

MAX_STATE_BYTES = 4 * 2**20
MAX_PARALLEL_FETCHES = 8


class InvalidState(ValueError):
    """A peer answered, but not with a usable /state document."""


@dataclass(frozen=True)
class PeerFetch:
    url: str
    label: str
    state: dict[str, Any] | None
    error: str | None
    seconds: float
    timed_out: bool = False  # no (complete) answer within the deadline: counted as a probe timeout

    @property
    def up(self) -> bool:
        return self.state is not None


def peer_label(url: str) -> str:
    """The ``peer`` label: host:port of the configured URL (stable even when the peer is down)."""
    parts = urlsplit(url)
    return parts.netloc or url


async def fetch_state(client: httpx.AsyncClient, url: str, token: str | None, timeout_s: float) -> PeerFetch:
    """GET ``url/state`` with the token; never raises: a failure is an error text on the result.

    ``timeout_s`` bounds the whole exchange, connect to last byte: httpx's timeouts bound each read only, so a peer
    trickling its status line, headers or body a byte at a time would otherwise hold the fetch for ever. Cancelling
    the request at the deadline closes its connection.
    """
    t0 = time.monotonic()
    label = peer_label(url)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with asyncio.timeout(timeout_s):
            body = await _get(client, f"{url}/state", headers)
        state = validate_state(response_json(body))
    except TimeoutError:
        return PeerFetch(url, label, None, f"timed out: no complete answer within {timeout_s:g} s", _since(t0), True)
    except httpx.TimeoutException:
        return PeerFetch(url, label, None, f"timed out: no answer within {timeout_s:g} s", _since(t0), True)
    except httpx.HTTPError as exc:
        return PeerFetch(url, label, None, f"{type(exc).__name__}: {exc}", time.monotonic() - t0)
    except InvalidState as exc:
        return PeerFetch(url, label, None, f"invalid /state: {exc}", time.monotonic() - t0)
    return PeerFetch(url, label, state, None, time.monotonic() - t0)


async def _get(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> bytes:
    async with client.stream("GET", url, headers=headers) as response:
        if response.status_code != 200:
            rejected = response.status_code in (401, 403)
            hint = " (token rejected: set the same daemon.token on both nodes)" if rejected else ""
            raise InvalidState(f"HTTP {response.status_code}{hint}")
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_STATE_BYTES:
                raise InvalidState(f"answer larger than {MAX_STATE_BYTES} bytes")
        return bytes(body)


def _since(t0: float) -> float:
    return time.monotonic() - t0


def fetch_all(
    client_factory: Callable[[], httpx.AsyncClient],
    urls: Sequence[str],
    token: str | None,
    timeout_s: float,
    parallel: int = MAX_PARALLEL_FETCHES,
) -> list[PeerFetch]:
    """Fetch every peer, ``parallel`` at a time, on an event loop of the calling thread (a check's thread).

    The loop is closed without waiting for helper threads (a hung DNS lookup), so nothing here can hold up the
    check beyond the deadlines or the process at exit.
    """

    async def run() -> list[PeerFetch]:
        gate = asyncio.Semaphore(parallel)

        async def one(url: str) -> PeerFetch:
            async with gate:
                return await fetch_state(client, url, token, timeout_s)

        async with client_factory() as client:
            return list(await asyncio.gather(*(one(url) for url in urls)))

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()


def response_json(body: bytes) -> Any:
    import json

    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser's stack
        raise InvalidState(f"not JSON ({exc})") from None


def validate_state(doc: Any) -> dict[str, Any]:
    """The parts a comparison reads of a peer's /state, validated by the results document's model
    (``result.ResultsDocument``); InvalidState naming the first bad part."""
    try:
        return ResultsDocument.model_validate(doc).compared()
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidState(f"{_where(first['loc'])}: {first['msg']}") from None
    except RecursionError:  # nesting deeper than the validator's stack
        raise InvalidState("nested too deeply") from None


def _where(loc: tuple[int | str, ...]) -> str:
    """("checks", 0, "samples", 2, "value") -> "checks[0].samples[2].value"; a top-level key quoted."""
    if not loc:
        return "top level"
    if len(loc) == 1:
        return f"'{loc[0]}'"
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text
