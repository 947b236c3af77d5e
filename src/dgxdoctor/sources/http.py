"""HTTP for checks: one cap on how much a peer may send, enforced below every client a check makes; and the agent's
own descriptor exhaustion told apart from a failure of the service it calls.

httpx bounds each read in time but not a response's size: a vLLM, Ray or peer endpoint gone wrong (or hostile)
could stream without end into the agent's memory. The cap sits in the transport, so every ``.text``, ``.json()``
and ``iter_bytes()`` above it is covered, and exceeding it is an ``httpx.ReadError`` that callers already handle as
a transport failure.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx

from dgxdoctor.sources.exhaustion import AgentExhausted as AgentExhausted
from dgxdoctor.sources.exhaustion import own_exhaustion

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


def _exhausted(exc: BaseException, request: httpx.Request) -> AgentExhausted | None:
    what = own_exhaustion(exc)
    if what is None:
        return None
    return AgentExhausted(
        f"dgxdoctor itself is out of {what}: could not open a connection to {request.url.host}; "
        "nothing is known about that service"
    )


class _AsyncCappedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, limit: int, url: str) -> None:
        self._inner = inner
        self._limit = limit
        self._url = url

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total = 0
        async for chunk in self._inner:
            total += len(chunk)
            if total > self._limit:
                raise httpx.ReadError(f"{self._url}: response larger than {self._limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class AsyncCappedTransport(httpx.AsyncBaseTransport):
    """``CappedTransport`` for an ``httpx.AsyncClient`` (the peer fetch, which needs a hard total deadline)."""

    def __init__(self, inner: httpx.AsyncBaseTransport, limit: int = MAX_RESPONSE_BYTES) -> None:
        self._inner = inner
        self._limit = limit

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await self._inner.handle_async_request(request)
        except (httpx.TransportError, OSError) as exc:
            mine = _exhausted(exc, request)
            if mine is not None:
                raise mine from exc
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_AsyncCappedStream(response.stream, self._limit, str(request.url)),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class CappedTransport(httpx.BaseTransport):
    """Wraps a transport; responses longer than ``limit`` bytes fail with ``httpx.ReadError``."""

    def __init__(self, inner: httpx.BaseTransport, limit: int = MAX_RESPONSE_BYTES) -> None:
        self._inner = inner
        self._limit = limit

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = self._inner.handle_request(request)
        except (httpx.TransportError, OSError) as exc:
            mine = _exhausted(exc, request)
            if mine is not None:
                raise mine from exc
            raise
        assert isinstance(response.stream, httpx.SyncByteStream)
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_CappedStream(response.stream, self._limit, str(request.url)),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._inner.close()
