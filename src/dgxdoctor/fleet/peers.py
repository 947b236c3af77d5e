"""Fetch and validate peers' ``/state`` documents. Everything a peer sends is untrusted input."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

MAX_STATE_BYTES = 4 * 2**20
MAX_CHECKS = 200
MAX_SAMPLES = 20_000
MAX_FACTS = 2_000
MAX_TEXT = 4_096
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
    """Keep only the well-formed parts a comparison reads; raise InvalidState naming the first bad part."""
    if not isinstance(doc, dict):
        raise InvalidState("top level is not an object")
    node = doc.get("node")
    if not isinstance(node, str) or not node or len(node) > 253:
        raise InvalidState("'node' must be a non-empty string")
    checks = doc.get("checks")
    if not isinstance(checks, list) or len(checks) > MAX_CHECKS:
        raise InvalidState(f"'checks' must be a list of at most {MAX_CHECKS}")
    facts = doc.get("facts", {})
    if not isinstance(facts, dict) or len(facts) > MAX_FACTS:
        raise InvalidState(f"'facts' must be an object of at most {MAX_FACTS} keys")
    clean_checks: list[dict[str, Any]] = []
    total = 0
    for i, check in enumerate(checks):
        if not isinstance(check, dict) or not isinstance(check.get("name"), str):
            raise InvalidState(f"checks[{i}] is not an object with a 'name'")
        samples = check.get("samples", [])
        if not isinstance(samples, list):
            raise InvalidState(f"checks[{i}].samples is not a list")
        total += len(samples)
        if total > MAX_SAMPLES:
            raise InvalidState(f"more than {MAX_SAMPLES} samples")
        clean: list[dict[str, Any]] = []
        for j, sample in enumerate(samples):
            if not isinstance(sample, dict) or not isinstance(sample.get("name"), str):
                raise InvalidState(f"checks[{i}].samples[{j}] has no 'name'")
            labels = sample.get("labels", {})
            if not isinstance(labels, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and len(v) <= MAX_TEXT for k, v in labels.items()
            ):
                raise InvalidState(f"checks[{i}].samples[{j}].labels must map strings to strings")
            value = sample.get("value")
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise InvalidState(f"checks[{i}].samples[{j}].value is not a number")
            if isinstance(value, float) and not math.isfinite(value):
                value = None
            clean.append({"name": sample["name"], "labels": labels, "value": value})
        clean_checks.append(
            {"name": check["name"], "status": str(check.get("status", "unknown"))[:32], "samples": clean}
        )
    clean_facts: dict[str, str] = {}
    for key, value in facts.items():
        if not isinstance(value, str) or len(key) > 256 or len(value) > MAX_TEXT:
            raise InvalidState(f"facts[{key[:64]!r}] must be a string of at most {MAX_TEXT} characters")
        clean_facts[key] = value
    return {
        "node": node,
        "status": str(doc.get("status", "unknown"))[:32],
        "checks": clean_checks,
        "facts": clean_facts,
    }
