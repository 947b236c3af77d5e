"""The daemon's listening socket: a cap on connections and deadlines for every stage of an exchange.

An HTTP server bounds the size of a request but not, by itself, its time: a client that connects and sends nothing,
or trickles its request head a byte at a time, holds a descriptor for as long as it likes. A few thousand such
connections used up the unit's ``LimitNOFILE=4096`` (with aiohttp, whose keep-alive timer started only after a
first response): ``/metrics`` stopped answering, the textfile write failed with EMFILE and the vllm check, unable
to open a socket, blamed vLLM.

``Guard.protocol`` is the protocol factory ``loop.create_server`` takes: it wraps each connection's
``web.HttpProtocol`` in a pass-through protocol that sees the connection open and close; the HTTP protocol tells it
when a request head arrives and when its answer is written, and the outermost middleware holds the request's
deadline. The guard then enforces, per connection:

- ``header_timeout_s`` from the moment it opens, and ``idle_timeout_s`` after each response, for a complete request
  head to arrive (a silent or trickling client is closed: ``reason="header_timeout"`` / ``"idle_timeout"``);
- ``request_timeout_s`` for a whole exchange from the request head to the end of the response (a client that
  trickles its body or does not read the answer is aborted: ``"request_timeout"``);
- at most ``max_connections`` open at once, never more than the file-descriptor limit minus ``RESERVED_FDS`` (the
  agent's own outbound calls, files and subprocesses): a connection over the cap evicts the longest-idle one that
  has no request in progress (``"evicted"``), or is refused if every connection is mid-request
  (``"over_capacity"``). A scrape that arrives under a flood of idle connections is therefore answered.

Every close is counted by reason and exported (``dgxdoctor_http_connections_closed_total``).
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from msgspec import Struct

from dgxdoctor.compat import aio
from dgxdoctor.daemon import web

# Descriptors kept free for what the agent opens itself: HTTP clients of the vllm/ray/peer checks, state files, the
# textfile, subprocess pipes, NVML, /dev/kmsg. A check run holds a handful at most; 256 leaves room for every check
# at once many times over.
RESERVED_FDS = 256

Handler = Callable[[web.Request], Awaitable[web.Response]]


class Limits(Struct, frozen=True):
    max_connections: int = 256
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 15.0
    request_timeout_s: float = 30.0


def fd_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def effective_cap(wanted: int, nofile: int | None = None) -> int:
    """``wanted``, but never more than the descriptor limit leaves after ``RESERVED_FDS`` (at least 8)."""
    nofile = fd_limit() if nofile is None else nofile
    return max(8, min(wanted, nofile - RESERVED_FDS))


class _Conn(asyncio.Protocol):
    """Passes everything through to the HTTP protocol; tells the guard when the connection opens and closes."""

    def __init__(self, guard: Guard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.requests = 0  # requests started on this connection
        self.busy = 0  # requests in progress
        self.timer: asyncio.TimerHandle | None = None
        self.forwarded = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self.guard.admit(self):
            return
        self.forwarded = True
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.forwarded:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.forwarded else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.release(self)
        if self.forwarded:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.forwarded:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.forwarded:
            self.inner.resume_writing()

    def arm(self, seconds: float, reason: str) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = asyncio.get_running_loop().call_later(seconds, self.guard.expire, self, reason)

    def close(self, reason: str) -> None:
        self.guard.closed[reason] += 1
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.busy or transport.get_write_buffer_size():
            transport.abort()  # mid-exchange or unread output: no polite close that could wait on the peer
        else:
            transport.close()


class Guard:
    """Tracks the open connections of one listening socket; see the module docstring."""

    def __init__(self, limits: Limits) -> None:
        self.runner: Runner | None = None  # the app and its request log, once serve() has them
        self.limits = limits
        self.cap = effective_cap(limits.max_connections)
        # Least recently active first: the eviction candidate is the first entry with no request in progress.
        self.conns: OrderedDict[_Conn, None] = OrderedDict()
        self.by_handler: dict[int, _Conn] = {}
        self.closed: Counter[str] = Counter()

    def protocol(self) -> asyncio.Protocol:
        assert self.runner is not None, "serve() sets the runner first"
        inner = web.HttpProtocol(self.runner.app, self.runner.log)
        inner.on_request = self.request_started
        inner.on_done = self._done
        conn = _Conn(self, inner)
        self.by_handler[id(inner)] = conn
        return conn

    def _done(self, held: object) -> None:
        if isinstance(held, _Conn):
            self.request_done(held)

    def admit(self, conn: _Conn) -> bool:
        if len(self.conns) >= self.cap:
            victim = next((c for c in self.conns if not c.busy), None)
            if victim is None:
                conn.close("over_capacity")
                return False
            victim.close("evicted")
            self._forget(victim)
        self.conns[conn] = None
        conn.arm(self.limits.header_timeout_s, "header_timeout")
        return True

    def release(self, conn: _Conn) -> None:
        self._forget(conn)
        self.by_handler.pop(id(conn.inner), None)

    def _forget(self, conn: _Conn) -> None:
        self.conns.pop(conn, None)
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None

    def expire(self, conn: _Conn, reason: str) -> None:
        conn.timer = None
        conn.close(reason)
        self._forget(conn)

    def request_started(self, handler: object) -> _Conn | None:
        conn = self.by_handler.get(id(handler))
        if conn is None or conn not in self.conns:
            return None
        conn.requests += 1
        conn.busy += 1
        self.conns.move_to_end(conn)
        conn.arm(self.limits.request_timeout_s, "request_timeout")
        return conn

    def request_done(self, conn: _Conn) -> None:
        conn.busy -= 1
        if conn in self.conns and not conn.busy:
            self.conns.move_to_end(conn)
            conn.arm(self.limits.idle_timeout_s, "idle_timeout")

    def close_all(self) -> None:
        for conn in list(self.conns):
            conn.close("shutdown")
            self._forget(conn)

    async def middleware(self, request: web.Request, handler: Handler) -> web.Response:
        """The request's deadline (its connection's timer was armed when the head arrived, ``request_started``)."""
        conn = self.by_handler.get(id(request.protocol))
        try:
            async with aio.timeout(self.limits.request_timeout_s) as deadline:
                request[DEADLINE_KEY] = (deadline, conn)
                return await handler(request)
        except TimeoutError:
            return web.json_response({"error": "request not complete in time"}, status=408)

    def samples(self) -> dict[str, Any]:
        return {"open": len(self.conns), "cap": self.cap, "closed": dict(self.closed)}


DEADLINE_KEY = "dgxdoctor_deadline"


def lift_deadline(request: web.Request) -> None:
    """For an authenticated action that runs to its own timeout (a remediation step the head asked for): the
    exchange is no longer cut at ``request_timeout_s``. Call it only after the request was authenticated."""
    held = request.get(DEADLINE_KEY)
    if held is None:
        return
    deadline, conn = held
    deadline.reschedule(None)
    if conn is not None and conn.timer is not None:
        conn.timer.cancel()
        conn.timer = None


class GuardedServer:
    """The app on ``host:port`` behind a ``Guard``; ``stop()`` never waits on a client."""

    def __init__(self, runner: Runner, guard: Guard, server: asyncio.Server) -> None:
        self.runner = runner
        self.guard = guard
        self.server = server

    @property
    def address(self) -> tuple[str, int]:
        sockname = self.server.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    async def stop(self, timeout_s: float = 2.0) -> None:
        self.server.close()
        self.guard.close_all()
        with contextlib.suppress(TimeoutError):
            async with aio.timeout(timeout_s):
                await self.server.wait_closed()


MIN_BACKLOG = 128  # asyncio's default


def listen_backlog(limits: Limits) -> int:
    """The listen(2) backlog: never below ``max_connections``."""
    return max(MIN_BACKLOG, limits.max_connections)


class Runner(Struct, frozen=True):
    """What each connection serves: the app, and where malformed requests and handler errors are counted."""

    app: web.Application
    log: web.RequestLogger


def make_runner(app: web.Application, limits: Limits, logger: web.RequestLogger) -> Runner:
    """``limits`` are the guard's (the keep-alive deadline is its ``idle_timeout_s``); kept for the call sites."""
    return Runner(app, logger)


async def serve(runner: Runner, guard: Guard, host: str, port: int) -> GuardedServer:
    """Listen on ``host:port`` (port 0: any free one). Raises OSError when the address cannot be bound."""
    loop = asyncio.get_running_loop()
    guard.runner = runner
    # The accept queue holds at least a whole cap of clients: with 128 below max_connections (256), a burst of
    # connections (every Prometheus and peer at once after a restart) was reset. The kernel cuts it to somaxconn.
    server = await loop.create_server(
        guard.protocol, host, port, reuse_address=True, backlog=listen_backlog(guard.limits), family=socket.AF_UNSPEC
    )
    return GuardedServer(runner, guard, server)
