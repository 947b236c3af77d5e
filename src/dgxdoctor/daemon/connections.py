"""The daemon's listening socket: aiohttp's server, configured, behind a cap on connections and deadlines.

aiohttp parses the requests (``max_line_size``, ``max_field_size``, ``max_headers``: 400 past them), caps bodies
(the app's ``client_max_size``: 413), closes an idle keep-alive connection (``keepalive_timeout``) and drops what a
refused client still sends for ``lingering_time``. It has no cap on connections, and before 3.14 its keep-alive
timer started only after a first response: a client that connects and sends nothing, or trickles its request head
a byte at a time, held a descriptor for as long as it liked. A few thousand such connections used up the unit's
``LimitNOFILE=4096``: ``/metrics`` stopped answering, the textfile write failed with EMFILE and the vllm check,
unable to open a socket, blamed vLLM.

So ``Guard.protocol`` is the protocol factory the site listens with: it wraps each of aiohttp's request handlers in
a pass-through protocol that sees the connection open and close, and ``Guard.middleware`` (the app's outermost)
sees each request start and end. The guard enforces, per connection:

- ``header_timeout_s`` from the moment it opens, and ``idle_timeout_s`` after each response, for a complete request
  head to arrive (a silent or trickling client is closed: ``reason="header_timeout"`` / ``"idle_timeout"``);
- ``request_timeout_s`` for a whole exchange from the request head to the end of the response (a client that
  trickles its body or does not read the answer is aborted: ``"request_timeout"``);
- at most ``max_connections`` open at once, never more than the file-descriptor limit minus ``RESERVED_FDS`` (the
  agent's own outbound calls, files and subprocesses): a connection over the cap evicts the longest-idle one that
  has no request in progress (``"evicted"``), or is refused if every connection is mid-request
  (``"over_capacity"``). A scrape that arrives under a flood of idle connections is therefore answered.

Every close is counted by reason and exported (``dgxdoctor_http_connections_closed_total``). The numbers are in
docs/daemon.md ("Hostile clients").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import ssl
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from msgspec import Struct

from dgxdoctor.compat import aio

# Descriptors kept free for what the agent opens itself: HTTP clients of the vllm/ray/peer checks, state files, the
# textfile, subprocess pipes, NVML, /dev/kmsg. A check run holds a handful at most; 256 leaves room for every check
# at once many times over.
RESERVED_FDS = 256
MIN_BACKLOG = 128  # asyncio's default

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Limits(Struct, frozen=True):
    """The guard's deadlines and cap, and the limits aiohttp's parser is given."""

    max_connections: int = 256
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 15.0  # also aiohttp's keepalive_timeout
    request_timeout_s: float = 30.0
    # A request line or one header line longer than this is 400 (aiohttp's defaults; a bearer token and a
    # browser's headers fit many times over); more headers than max_headers likewise.
    max_line_size: int = 8190
    max_field_size: int = 8190
    max_headers: int = 100
    # After an answer that left a body unread (a 413), what the client still sends is read and dropped this long
    # before the socket closes: closing with unread input resets it, and the client would lose the answer.
    lingering_s: float = 2.0
    # How long a stop waits for a request in progress before the connection is cut.
    shutdown_timeout_s: float = 1.0


def fd_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def effective_cap(wanted: int, nofile: int | None = None) -> int:
    """``wanted``, but never more than the descriptor limit leaves after ``RESERVED_FDS`` (at least 8)."""
    nofile = fd_limit() if nofile is None else nofile
    return max(8, min(wanted, nofile - RESERVED_FDS))


def listen_backlog(limits: Limits) -> int:
    """The listen(2) backlog: never below ``max_connections``."""
    return max(MIN_BACKLOG, limits.max_connections)


class _Conn(asyncio.Protocol):
    """Passes everything through to aiohttp's request handler; tells the guard when the connection opens and
    closes."""

    def __init__(self, guard: Guard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.busy = 0  # requests in progress
        self.timer: asyncio.TimerHandle | None = None
        self.forwarded = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.guard.admit(self):
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
        self.disarm()
        self.timer = asyncio.get_running_loop().call_later(seconds, self.guard.expire, self, reason)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

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
        self.limits = limits
        self.cap = effective_cap(limits.max_connections)
        self.server: web.Server | None = None  # aiohttp's, once the runner is set up
        # Least recently active first: the eviction candidate is the first entry with no request in progress.
        self.conns: OrderedDict[_Conn, None] = OrderedDict()
        self.closed: Counter[str] = Counter()

    def protocol(self) -> asyncio.Protocol:
        assert self.server is not None, "serve() sets up the runner first"
        return _Conn(self, self.server())

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

    def _forget(self, conn: _Conn) -> None:
        self.conns.pop(conn, None)
        conn.disarm()

    def expire(self, conn: _Conn, reason: str) -> None:
        conn.timer = None
        conn.close(reason)
        self._forget(conn)

    def request_started(self, conn: _Conn | None) -> _Conn | None:
        if conn is None or conn not in self.conns:
            return None
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

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The request's deadline: its connection's timer runs ``request_timeout_s`` from here."""
        conn = self.request_started(_conn_of(request))
        try:
            return await handler(request)
        finally:
            if conn is not None:
                self.request_done(conn)

    def samples(self) -> dict[str, Any]:
        return {"open": len(self.conns), "cap": self.cap, "closed": dict(self.closed)}


def _conn_of(request: web.Request) -> _Conn | None:
    """The guard's protocol of the request's connection: the one its transport serves (TLS included)."""
    transport = request.transport
    conn = transport.get_protocol() if transport is not None else None
    return conn if isinstance(conn, _Conn) else None


def lift_deadline(request: web.Request) -> None:
    """For an authenticated action that runs to its own timeout (a remediation step the head asked for): the
    exchange is no longer cut at ``request_timeout_s``. Call it only after the request was authenticated."""
    conn = _conn_of(request)
    if conn is not None and conn.busy:
        conn.disarm()


@web.middleware
async def refuse_declared_oversize(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A body declared over ``client_max_size`` is 413 at once, not after waiting for bytes that may never come;
    the connection closes after the answer (aiohttp lingers, dropping what the client still sends)."""
    length = request.content_length
    if length is not None and length > request.client_max_size:
        refused = web.HTTPRequestEntityTooLarge(request.client_max_size, length)
        refused.force_close()
        raise refused
    return await handler(request)


class GuardedSite(web.BaseSite):
    """aiohttp's TCP site with the guard's protocol factory in place of the bare request handler."""

    def __init__(
        self, runner: web.AppRunner, guard: Guard, host: str, port: int, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=listen_backlog(guard.limits))
        self._guard = guard
        self._host = host
        self._port = port
        self.listening: asyncio.Server | None = None

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        # The accept queue holds at least a whole cap of clients: with 128 below max_connections (256), a burst of
        # connections (every Prometheus and peer at once after a restart) was reset. The kernel cuts it to somaxconn.
        self.listening = await asyncio.get_running_loop().create_server(
            self._guard.protocol,
            self._host,
            self._port,
            ssl=self._ssl_context,
            # The guard sees a TLS connection only once its handshake is done: a client that opens one and stalls
            # is held to the request head's deadline here, not asyncio's 60 s.
            ssl_handshake_timeout=self._guard.limits.header_timeout_s if self._ssl_context else None,
            backlog=self._backlog,
            reuse_address=True,
            family=socket.AF_UNSPEC,
        )
        self._server = self.listening  # what BaseSite.stop() closes


class GuardedServer:
    """The app on ``host:port`` behind a ``Guard``; ``stop()`` never waits on a client for long."""

    def __init__(self, runner: web.AppRunner, guard: Guard, site: GuardedSite) -> None:
        self.runner = runner
        self.guard = guard
        self.site = site

    @property
    def address(self) -> tuple[str, int]:
        assert self.site.listening is not None
        sockname = self.site.listening.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    async def stop(self, timeout_s: float = 2.0) -> None:
        """No new connections, every open one closed (mid-request ones aborted), then aiohttp's own shutdown, which
        gives a handler still running ``shutdown_timeout_s``; all of it within ``timeout_s``."""
        if self.site.listening is not None:
            self.site.listening.close()
        self.guard.close_all()
        with contextlib.suppress(TimeoutError):
            await aio.wait_for(self.runner.cleanup(), timeout_s)


def make_runner(app: web.Application, limits: Limits, logger: logging.Logger) -> web.AppRunner:
    """aiohttp's runner with the parser limits, keep-alive and lingering of ``limits``; ``logger`` is where aiohttp
    reports malformed requests and handler errors (``ratelog.RequestLog``). No access log, no signal handling
    (the daemon has its own)."""
    return web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        logger=logger,
        keepalive_timeout=limits.idle_timeout_s,
        lingering_time=limits.lingering_s,
        max_line_size=limits.max_line_size,
        max_field_size=limits.max_field_size,
        max_headers=limits.max_headers,
        shutdown_timeout=limits.shutdown_timeout_s,
    )


async def serve(
    runner: web.AppRunner, guard: Guard, host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> GuardedServer:
    """Listen on ``host:port`` (port 0: any free one), over TLS when given a context. Raises OSError when the
    address cannot be bound."""
    if runner.server is None:
        await runner.setup()
    guard.server = runner.server
    site = GuardedSite(runner, guard, host, port, ssl_context)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    return GuardedServer(runner, guard, site)
