"""The daemon's HTTP server as configured (daemon/connections.py: aiohttp's web behind the connection guard) on a
real loopback socket: keep-alive and pipelining, HEAD, the body cap, the parser's limits, and the guard's cap and
deadlines. Every deadline is short here; each test waits for the close that proves it, never for a fixed time."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web

from dgxdoctor import eventlog
from dgxdoctor.daemon import connections
from dgxdoctor.daemon.ratelog import RequestLog

LIMITS = connections.Limits(
    max_connections=8, header_timeout_s=0.5, idle_timeout_s=0.5, request_timeout_s=1.0, lingering_s=0.2
)
CLOSE = b"Host: x\r\nConnection: close\r\n\r\n"


class Served:
    def __init__(self, server: connections.GuardedServer, log: RequestLog, release: asyncio.Event) -> None:
        self.server = server
        self.address = server.address
        self.log = log
        self.guard = server.guard
        self.release = release


async def echo(request: web.Request) -> web.Response:
    return web.json_response({"method": request.method, "body": (await request.read()).decode(), **request.match_info})


async def hello(request: web.Request) -> web.Response:
    return web.Response(text="hello")


async def broken(request: web.Request) -> web.Response:
    raise RuntimeError("a bug")


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    release = asyncio.Event()

    async def held(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="released")

    async def lifted(request: web.Request) -> web.Response:
        connections.lift_deadline(request)
        await asyncio.sleep(LIMITS.request_timeout_s * 1.5)
        return web.Response(text="done")

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(LIMITS.request_timeout_s * 1.5)
        return web.Response(text="done")

    guard = connections.Guard(LIMITS)
    app = web.Application(middlewares=[guard.middleware, connections.refuse_declared_oversize], client_max_size=1024)
    app.router.add_get("/hello", hello)
    app.router.add_post("/echo", echo)
    app.router.add_get(r"/run/{run_id:[0-9a-f]{4}}", echo)
    app.router.add_get("/broken", broken)
    app.router.add_get("/held", held)
    app.router.add_get("/lifted", lifted)
    app.router.add_get("/slow", slow)
    log = RequestLog()
    server = await connections.serve(connections.make_runner(app, LIMITS, log), guard, "127.0.0.1", 0)
    yield Served(server, log, release)
    release.set()
    await server.stop()


async def read_until(reader: asyncio.StreamReader, until: bytes = b"", timeout: float = 5) -> bytes:
    """What arrives until the answer ends with ``until`` or the server closes (raises if neither in time)."""
    got = b""
    while chunk := await asyncio.wait_for(reader.read(65536), timeout):
        got += chunk
        if until and got.endswith(until):
            break
    return got


async def until(condition: Callable[[], bool], timeout: float = 5) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


async def exchange(address: tuple[str, int], raw: bytes, until: bytes = b"") -> bytes:
    reader, writer = await asyncio.open_connection(*address)
    writer.write(raw)
    await writer.drain()
    try:
        return await read_until(reader, until)
    finally:
        writer.close()


async def test_keep_alive_and_pipelined_requests_are_answered_in_order(served: Served) -> None:
    raw = (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\none"
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\ntwo\r\n0\r\n\r\n"
        b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    got = await exchange(served.address, raw, until=b"hello")
    assert got.count(b"HTTP/1.1 200 OK") == 3, got
    assert got.index(b'"body": "one"') < got.index(b'"body": "two"') < got.index(b"hello")


async def test_head_has_the_get_headers_and_no_body(served: Served) -> None:
    got = await exchange(served.address, b"HEAD /hello HTTP/1.1\r\n" + CLOSE)
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"content-length: 5" in head.lower() and body == b""


async def test_route_parameters_and_method_refusals(served: Served) -> None:
    assert b'"run_id": "beef"' in await exchange(served.address, b"GET /run/beef HTTP/1.1\r\n" + CLOSE)
    assert (await exchange(served.address, b"GET /run/nope HTTP/1.1\r\n" + CLOSE)).startswith(b"HTTP/1.1 404")
    refused = await exchange(served.address, b"DELETE /hello HTTP/1.1\r\n" + CLOSE)
    assert refused.startswith(b"HTTP/1.1 405") and b"allow: get,head" in refused.lower()


async def test_a_body_over_the_cap_is_413_whether_declared_or_chunked(served: Served) -> None:
    address = served.address
    sent = await exchange(address, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" + b"a" * 5000)
    assert sent.startswith(b"HTTP/1.1 413")
    chunk = b"400\r\n" + b"a" * 1024 + b"\r\n"
    chunked_head = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunked = await exchange(address, chunked_head + chunk * 3)
    assert chunked.startswith(b"HTTP/1.1 413")
    # Declared and never sent: answered without waiting for it, and the connection closes (no next request
    # behind an unread body) instead of waiting for the request deadline.
    reader, writer = await asyncio.open_connection(*address)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(4096), LIMITS.request_timeout_s / 2)
    assert answer.startswith(b"HTTP/1.1 413") and b"connection: close" in answer.lower(), answer
    assert await read_until(reader) == b""  # closed by the server
    writer.close()
    assert served.guard.closed["request_timeout"] == 0


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Token: a\x01b\r\n\r\n", b"Invalid header value char"),
        (b"GET /hello HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", b"Too many headers"),
        (b"GET /hello HTTP/1.1\r\nHost: x\r\nX-A: " + b"s3cret" * 1500 + b"\r\n\r\n", b"Got more than 8190 bytes"),
        (b"GET /" + b"s3cret" * 1500 + b" HTTP/1.1\r\nHost: x\r\n\r\n", b"Got more than 8190 bytes"),
        (b"GARBAGE s3cret\r\n\r\n", b""),
    ],
)
async def test_the_parser_limits_are_a_400_and_one_counted_line_that_quotes_nothing(
    served: Served, raw: bytes, reason: bytes
) -> None:
    with eventlog.capture_logs() as logs:
        got = await exchange(served.address, raw)
    assert got.startswith((b"HTTP/1.0 400", b"HTTP/1.1 400")) and reason in got, got[:300]
    assert served.log.bad_requests == 1
    lines = [e for e in logs if e["event"] == "http_bad_request"]
    assert len(lines) == 1 and "s3cret" not in json.dumps(logs, default=str), lines


async def test_a_handler_bug_is_a_500_and_one_counted_error(served: Served) -> None:
    with eventlog.capture_logs() as logs:
        got = await exchange(served.address, b"GET /broken HTTP/1.1\r\nHost: x\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 500") and served.log.handler_errors == 1
    assert [e["error"] for e in logs if e["event"] == "http_handler_error"] == ["RuntimeError: a bug"]
    assert (await exchange(served.address, b"GET /hello HTTP/1.1\r\n" + CLOSE)).endswith(b"hello")


async def test_silent_and_trickling_clients_are_closed_at_the_header_deadline(served: Served) -> None:
    silent_reader, silent = await asyncio.open_connection(*served.address)
    trickle_reader, trickle = await asyncio.open_connection(*served.address)
    trickle.write(b"GET /hello HTTP/1.1\r\n")

    async def keep_trickling() -> None:
        while not trickle.is_closing():
            trickle.write(b"X")
            await asyncio.sleep(LIMITS.header_timeout_s / 10)

    trickling = asyncio.create_task(keep_trickling())
    try:
        assert await read_until(silent_reader) == b""
        assert await read_until(trickle_reader) == b""
    finally:
        trickling.cancel()
        silent.close()
        trickle.close()
    assert served.guard.closed["header_timeout"] == 2


async def test_an_idle_keep_alive_connection_is_closed_after_its_answer(served: Served) -> None:
    reader, writer = await asyncio.open_connection(*served.address)
    writer.write(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await read_until(reader, b"hello")).startswith(b"HTTP/1.1 200")
    assert await read_until(reader) == b""
    writer.close()
    assert served.guard.closed["idle_timeout"] + served.guard.closed["header_timeout"] == 1
    assert served.guard.closed["idle_timeout"] == 1


async def test_a_trickled_body_is_cut_at_the_request_deadline(served: Served) -> None:
    reader, writer = await asyncio.open_connection(*served.address)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")

    async def keep_trickling() -> None:
        while not writer.is_closing():
            writer.write(b"a")
            await asyncio.sleep(LIMITS.request_timeout_s / 10)

    trickling = asyncio.create_task(keep_trickling())
    try:
        assert await read_until(reader) == b""
    finally:
        trickling.cancel()
        writer.close()
    assert served.guard.closed["request_timeout"] == 1


async def test_a_slow_handler_is_cut_at_the_request_deadline_unless_lifted(served: Served) -> None:
    """A remediation step runs to its own timeout once authenticated (``lift_deadline``); any other exchange ends
    at ``request_timeout_s``, on every Python."""
    assert await exchange(served.address, b"GET /slow HTTP/1.1\r\n" + CLOSE) == b""
    assert served.guard.closed["request_timeout"] == 1
    got = await exchange(served.address, b"GET /lifted HTTP/1.1\r\n" + CLOSE)
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"done")
    assert served.guard.closed["request_timeout"] == 1


async def test_over_the_cap_the_longest_idle_connection_makes_room(served: Served) -> None:
    idle = [await asyncio.open_connection(*served.address) for _ in range(served.guard.cap)]
    await asyncio.sleep(0)
    got = await exchange(served.address, b"GET /hello HTTP/1.1\r\n" + CLOSE)
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"hello")
    assert served.guard.closed["evicted"] >= 1
    first_reader, _ = idle[0]
    assert await read_until(first_reader) == b""  # the oldest one was closed for it
    for _, writer in idle:
        writer.close()


async def test_when_every_connection_is_mid_request_a_new_one_is_refused(served: Served) -> None:
    held = [await asyncio.open_connection(*served.address) for _ in range(served.guard.cap)]
    for _, writer in held:
        writer.write(b"GET /held HTTP/1.1\r\n" + CLOSE)
    await until(lambda: sum(c.busy for c in served.guard.conns) == served.guard.cap)
    assert await exchange(served.address, b"GET /hello HTTP/1.1\r\n" + CLOSE) == b""
    assert served.guard.closed["over_capacity"] == 1
    served.release.set()
    for reader, writer in held:
        assert (await read_until(reader)).endswith(b"released")
        writer.close()


async def test_stop_closes_clients_in_every_state_without_waiting_on_them(served: Served) -> None:
    mid_head = await asyncio.open_connection(*served.address)
    mid_head[1].write(b"GET /hello HTTP/1.1\r\n")
    mid_request = await asyncio.open_connection(*served.address)
    mid_request[1].write(b"GET /held HTTP/1.1\r\n" + CLOSE)
    await until(lambda: any(c.busy for c in served.guard.conns))
    t0 = asyncio.get_running_loop().time()
    await served.server.stop(timeout_s=2.0)
    assert asyncio.get_running_loop().time() - t0 < 3.0
    assert served.guard.closed["shutdown"] == 2 and not served.guard.conns
    for reader, writer in (mid_head, mid_request):
        assert await read_until(reader) == b""
        writer.close()


async def test_the_listener_takes_a_tls_context_and_the_guard_still_sees_each_request(tmp_path: Path) -> None:
    """TLS is the listener's (issue 34 adds its configuration): over it the guard finds each request's connection
    through the TLS transport, so an authenticated action still lifts its deadline."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))

    async def lifted(request: web.Request) -> web.Response:
        connections.lift_deadline(request)
        await asyncio.sleep(LIMITS.request_timeout_s * 1.5)
        return web.Response(text="done")

    guard = connections.Guard(LIMITS)
    app = web.Application(middlewares=[guard.middleware])
    app.router.add_get("/lifted", lifted)
    app.router.add_post("/echo", echo)
    server = await connections.serve(
        connections.make_runner(app, LIMITS, RequestLog()), guard, "127.0.0.1", 0, ssl_context=server_ctx
    )
    try:
        reader, writer = await asyncio.open_connection(*server.address, ssl=client_ctx)
        writer.write(b"GET /lifted HTTP/1.1\r\n" + CLOSE)
        got = await read_until(reader)
        writer.close()
        assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"done"), got
        assert guard.closed["request_timeout"] == 0
        # ... and a body that never completes is still cut at the request deadline.
        reader, writer = await asyncio.open_connection(*server.address, ssl=client_ctx)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\na")
        assert await read_until(reader) == b""
        writer.close()
        assert guard.closed["request_timeout"] == 1
    finally:
        await server.stop()
