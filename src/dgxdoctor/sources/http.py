"""HTTP for checks: one cap on how much a peer may send, enforced below every client a check makes.

httpx bounds each read in time but not a response's size: a vLLM, Ray or peer endpoint gone wrong (or hostile)
could stream without end into the agent's memory. The cap sits in the transport, so every ``.text``, ``.json()``
and ``iter_bytes()`` above it is covered, and exceeding it is an ``httpx.ReadError`` that callers already handle as
a transport failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx

# vLLM's /metrics with many engines and buckets is a few hundred KiB; Ray's node list for a big cluster some MiB.
MAX_RESPONSE_BYTES = 32 * 2**20


class _CappedStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, limit: int, url: str) -> None:
        self._inner = inner
        self._limit = limit
        self._url = url

    def __iter__(self) -> Iterator[bytes]:
        total = 0
        for chunk in self._inner:
            total += len(chunk)
            if total > self._limit:
                raise httpx.ReadError(f"{self._url}: response larger than {self._limit} bytes")
            yield chunk

    def close(self) -> None:
        self._inner.close()


class CappedTransport(httpx.BaseTransport):
    """Wraps a transport; responses longer than ``limit`` bytes fail with ``httpx.ReadError``."""

    def __init__(self, inner: httpx.BaseTransport, limit: int = MAX_RESPONSE_BYTES) -> None:
        self._inner = inner
        self._limit = limit

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self._inner.handle_request(request)
        assert isinstance(response.stream, httpx.SyncByteStream)
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_CappedStream(response.stream, self._limit, str(request.url)),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._inner.close()


def http_url(value: str, *, path: bool = True) -> str:
    """The one check of a configured URL: http(s) with a host and a valid port, no query, fragment or user name;
    ``path=False`` also refuses a path (a peer is scheme, host and port). Returns it without a trailing ``/``;
    ValueError naming what is wrong."""
    parts = urlsplit(value)
    shape = "http(s)://HOST:PORT" + ("[/PATH]" if path else "")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when asked
    except ValueError as exc:
        raise ValueError(f"{value!r} is not an {shape} URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an {shape} URL")
    if parts.query or parts.fragment or parts.username:
        raise ValueError(f"{value!r}: give no query, fragment or user name ({shape})")
    if not path and parts.path not in ("", "/"):
        raise ValueError(f"{value!r}: give only scheme, host and port")
    return value.rstrip("/")
