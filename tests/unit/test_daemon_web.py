"""The daemon's own HTTP/1.1 server (daemon/web.py) on a real loopback socket: framing, keep-alive, pipelining, HEAD,
the body cap and the refusals h11 leaves to the server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from dgxdoctor.compat import aio
from dgxdoctor.daemon import connections, web
from dgxdoctor.daemon.ratelog import RequestLog


async def echo(request: web.Request) -> web.Response:
    return web.json_response({"method": request.method, "body": (await request.read()).decode(), **request.match_info})


async def hello(request: web.Request) -> web.Response:
    return web.text_response("hello")


async def broken(request: web.Request) -> web.Response:
    raise RuntimeError("a bug")


@pytest.fixture
async def served() -> AsyncIterator[tuple[tuple[str, int], RequestLog]]:
    app = web.Application(client_max_size=1024)
    app.router.add_get("/hello", hello)
    app.router.add_post("/echo", echo)
    app.router.add_get(r"/run/{run_id:[0-9a-f]{4}}", echo)
    app.router.add_get("/broken", broken)
    log = RequestLog()
    limits = connections.Limits()
    server = await connections.serve(
        connections.make_runner(app, limits, log), connections.Guard(limits), "127.0.0.1", 0
    )
    yield server.address, log
    await server.stop()


async def exchange(address: tuple[str, int], raw: bytes, until: bytes = b"", timeout: float = 5) -> bytes:
    """Send ``raw``; read until the answer ends with ``until`` or the server closes."""
    reader, writer = await asyncio.open_connection(*address)
    writer.write(raw)
    await writer.drain()
    got = b""
    with contextlib.suppress(TimeoutError):
        async with aio.timeout(timeout):
            while chunk := await reader.read(65536):
                got += chunk
                if until and got.endswith(until):
                    break
    writer.close()
    return got


async def test_keep_alive_and_pipelined_requests_are_answered_in_order(
    served: tuple[tuple[str, int], RequestLog],
) -> None:
    address, _ = served
    raw = (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\none"
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\ntwo\r\n0\r\n\r\n"
        b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    got = await exchange(address, raw, until=b"hello")
    assert got.count(b"HTTP/1.1 200 OK") == 3, got
    assert got.index(b'"body": "one"') < got.index(b'"body": "two"') < got.index(b"hello")


async def test_head_has_the_get_headers_and_no_body(served: tuple[tuple[str, int], RequestLog]) -> None:
    address, _ = served
    got = await exchange(address, b"HEAD /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"content-length: 5" in head.lower() and body == b""


async def test_route_parameters_and_method_refusals(served: tuple[tuple[str, int], RequestLog]) -> None:
    address, _ = served
    got = await exchange(address, b"GET /run/beef HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert b'"run_id": "beef"' in got
    close = b"Host: x\r\nConnection: close\r\n\r\n"
    assert (await exchange(address, b"GET /run/nope HTTP/1.1\r\n" + close)).startswith(b"HTTP/1.1 404")
    refused = await exchange(address, b"DELETE /hello HTTP/1.1\r\n" + close)
    assert refused.startswith(b"HTTP/1.1 405") and b"allow: get, head" in refused.lower()


async def test_a_body_over_the_cap_is_413_whether_declared_or_chunked(
    served: tuple[tuple[str, int], RequestLog],
) -> None:
    address, _ = served
    declared = await exchange(
        address, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" + b"a" * 5000, b"bytes"
    )
    assert declared.startswith(b"HTTP/1.1 413")
    # Declared and not sent: answered at once, and the connection closes (no next request behind an unread body).
    unsent = await exchange(address, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n")
    assert unsent.startswith(b"HTTP/1.1 413") and b"connection: close" in unsent.lower()
    chunk = b"400\r\n" + b"a" * 1024 + b"\r\n"
    chunked = await exchange(
        address, b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 3
    )
    assert chunked.startswith(b"HTTP/1.1 413")


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"GET /hello HTTP/2.0\r\nHost: x\r\n\r\n", "unsupported HTTP version"),
        (b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Token: a\x01b\r\n\r\n", "control character"),
        (b"GET /hello HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", "more than 100 headers"),
        (b"GET /hello HTTP/1.1\r\nHost: x\r\nX-A: " + b"b" * 9000 + b"\r\n\r\n", "request head over"),
    ],
)
async def test_what_h11_lets_through_is_refused_with_400(
    served: tuple[tuple[str, int], RequestLog], raw: bytes, reason: str
) -> None:
    address, log = served
    got = await exchange(address, raw)
    assert got.startswith(b"HTTP/1.1 400") and reason.encode() in got, got[:300]
    assert log.bad_requests == 1


async def test_a_handler_bug_is_a_500_and_one_counted_error(served: tuple[tuple[str, int], RequestLog]) -> None:
    address, log = served
    got = await exchange(
        address, b"GET /broken HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\n\r\n", b"hello"
    )
    assert got.startswith(b"HTTP/1.1 500") and got.endswith(b"hello") and log.handler_errors == 1


async def test_the_request_deadline_cuts_a_slow_handler_unless_lifted() -> None:
    """A remediation step runs to its own timeout: ``lift_deadline`` (on every Python, 3.10's backport too)."""

    async def slow(request: web.Request) -> web.Response:
        if request.match_info["how"] == "lifted":
            connections.lift_deadline(request)
        await asyncio.sleep(0.6)
        return web.text_response("finished")

    limits = connections.Limits(request_timeout_s=0.2)
    guard = connections.Guard(limits)
    app = web.Application(middlewares=[guard.middleware], client_max_size=1024)  # as the daemon's service does
    app.router.add_get("/slow/{how}", slow)
    server = await connections.serve(connections.make_runner(app, limits, RequestLog()), guard, "127.0.0.1", 0)
    try:
        cut = await exchange(server.address, b"GET /slow/held HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        lifted = await exchange(server.address, b"GET /slow/lifted HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    finally:
        await server.stop()
    assert b"finished" not in cut and (cut == b"" or cut.startswith(b"HTTP/1.1 408")), cut[:200]  # 408 or closed
    assert lifted.startswith(b"HTTP/1.1 200") and lifted.endswith(b"finished"), lifted[:200]
