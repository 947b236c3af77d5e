"""The daemon's HTTP/1.1 server: asyncio and h11, with the routing, middlewares and body cap the app needs.

Why not aiohttp: its package imports its whole client (cookie jar, multipart, websockets, happy eyeballs, DNS
resolver) along with the server, 9.6 MiB of the idle daemon's resident memory (``benchmarks/daemon_memory.py``)
for a handful of routes. h11 (the protocol library under httpx, which the checks load anyway) parses request lines,
headers and bodies (Content-Length and chunked) and keeps the keep-alive state; this module adds what h11 leaves to
the server: the HTTP version, control characters in header values, the number of headers, the body cap (413),
404/405, HEAD for every GET route, and one bounded log line per malformed request (``ratelog.RequestLog``).

The names follow aiohttp's (``Application``, ``Request``, ``Response``, ``json_response``, ``AppKey``), so a
handler reads as it did. Deadlines and the connection cap are ``connections.Guard``'s.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Generic, Protocol, TypeVar

import h11
from msgspec import Struct, field

T = TypeVar("T")

# A request head (request line and headers) longer than this, or one line longer than MAX_LINE_BYTES (aiohttp's
# limit), is refused: a bearer token and a browser's headers fit many times over. h11 bounds only a head that has
# not yet arrived whole.
MAX_HEAD_BYTES = 16 * 1024
MAX_LINE_BYTES = 8190
MAX_HEADERS = 100
# After the last answer on a connection, input is read and dropped this long before the socket closes.
LINGER_S = 2.0
# RFC 9110 5.5: a field value is visible characters, spaces and tabs; h11 lets other control characters through.
BAD_VALUE_RE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
# "/nccl/join/{run_id:[0-9a-f]{32}}" -> the segment's name and its pattern (aiohttp's route syntax).
ROUTE_PARAM_RE = re.compile(r"\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::(?P<pattern>[^{}]*(?:\{[^{}]*\}[^{}]*)*))?\}")
REASONS = {
    200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict", 413: "Payload Too Large",
    422: "Unprocessable Content", 429: "Too Many Requests", 500: "Internal Server Error", 501: "Not Implemented",
    503: "Service Unavailable",
}  # fmt: skip


class AppKey(Generic[T]):
    """A typed key of ``Application`` (what aiohttp's ``web.AppKey`` is)."""

    def __init__(self, name: str, kind: type[T]) -> None:
        self.name = name
        self.kind = kind


class Response(Struct):
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


StreamResponse = Response
Handler = Callable[["Request"], Awaitable[Response]]
Middleware = Callable[["Request", Handler], Awaitable[Response]]


def text_response(
    text: str, status: int = 200, content_type: str = "text/plain", headers: Mapping[str, str] | None = None
) -> Response:
    return Response(status, text.encode("utf-8"), {"Content-Type": f"{content_type}; charset=utf-8", **(headers or {})})


def json_response(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    body = json.dumps(data).encode("utf-8")
    return Response(status, body, {"Content-Type": "application/json; charset=utf-8", **(headers or {})})


def error_response(status: int) -> Response:
    return text_response(f"{status}: {REASONS.get(status, 'Error')}", status)


class HTTPError(Exception):
    """Raised by a handler (or ``Request.read``) to answer with this status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    def response(self) -> Response:
        return text_response(f"{self.status}: {self}", self.status)


class BadRequest(Exception):
    """A malformed request: what was wrong, in words of ours (never the bytes the client sent)."""

    def __init__(self, reason: str, header: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.header = header


class Headers(dict[str, str]):
    """A request's headers by case-insensitive name (the last one of a repeated name)."""

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__((k.lower(), v) for k, v in items)

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(name.lower(), default)


class Request:
    def __init__(
        self,
        app: Application,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]] = (),
        remote: str | None = None,
        protocol: object = None,
    ) -> None:
        self.app = app
        self.method = method
        self.path, _, self.query_string = target.partition("?")
        self.headers = Headers(headers)
        self.remote = remote
        self.protocol = protocol
        self.match_info: dict[str, str] = {}
        self._store: dict[str, Any] = {}
        self._body = bytearray()
        self._complete = asyncio.Event()
        self._too_large = False
        self._broken = False

    # A request carries values for the middlewares, as aiohttp's does.
    def __getitem__(self, key: str) -> Any:
        return self._store[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._store[key] = value

    def get(self, key: str, default: Any = None) -> Any:
        return self._store.get(key, default)

    def feed(self, data: bytes) -> None:
        if len(self._body) + len(data) > self.app.client_max_size:
            self._too_large = True
            self._complete.set()
        elif not self._too_large:
            self._body += data

    def finish(self, too_large: bool = False, broken: bool = False) -> None:
        self._too_large = self._too_large or too_large
        self._broken = self._broken or broken
        self._complete.set()

    async def read(self) -> bytes:
        """The whole body; 413 when it is over the app's ``client_max_size``."""
        await self._complete.wait()
        if self._broken:
            raise HTTPError(400, "malformed request body")
        if self._too_large:
            raise HTTPError(413, f"request body over {self.app.client_max_size} bytes")
        return bytes(self._body)


class Router:
    def __init__(self) -> None:
        self.exact: dict[str, dict[str, Handler]] = {}
        self.patterns: list[tuple[re.Pattern[str], dict[str, Handler]]] = []

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        if "{" not in path:
            self.exact.setdefault(path, {})[method] = handler
            if method == "GET":
                self.exact[path]["HEAD"] = handler
            return
        regex = re.compile(
            ROUTE_PARAM_RE.sub(lambda m: f"(?P<{m['name']}>{m['pattern'] or '[^/]+'})", path.replace(".", r"\."))
        )
        methods = next((m for p, m in self.patterns if p.pattern == regex.pattern), None)
        if methods is None:
            methods = {}
            self.patterns.append((regex, methods))
        methods[method] = handler
        if method == "GET":
            methods["HEAD"] = handler

    def add_get(self, path: str, handler: Handler) -> None:
        self.add_route("GET", path, handler)

    def add_post(self, path: str, handler: Handler) -> None:
        self.add_route("POST", path, handler)

    def resolve(self, request: Request) -> Handler:
        methods = self.exact.get(request.path)
        if methods is None:
            for regex, candidates in self.patterns:
                m = regex.fullmatch(request.path)
                if m:
                    request.match_info = m.groupdict()
                    methods = candidates
                    break
        if methods is None:
            return _refuse(error_response(404))
        handler = methods.get(request.method)
        if handler is None:
            allow = ", ".join(sorted(methods))
            return _refuse(text_response("405: Method Not Allowed", 405, headers={"Allow": allow}))
        return handler


def _refuse(response: Response) -> Handler:
    async def refuse(request: Request) -> Response:
        return response

    return refuse


class Application:
    def __init__(self, middlewares: Iterable[Middleware] = (), client_max_size: int = 1024**2) -> None:
        self.middlewares = tuple(middlewares)
        self.client_max_size = client_max_size
        self.router = Router()
        self._state: dict[str, Any] = {}

    def __setitem__(self, key: AppKey[T], value: T) -> None:
        self._state[key.name] = value

    def __getitem__(self, key: AppKey[T]) -> T:
        value: T = self._state[key.name]
        return value

    async def handle(self, request: Request) -> Response:
        """The resolved handler (or the 404/405 refusal) inside the middlewares, first one outermost."""
        handler = self.router.resolve(request)
        for outer in reversed(self.middlewares):
            handler = _wrap(outer, handler)
        try:
            return await handler(request)
        except HTTPError as exc:
            return exc.response()


def _wrap(middleware: Middleware, inner: Handler) -> Handler:
    async def wrapped(request: Request) -> Response:
        try:
            return await middleware(request, inner)
        except HTTPError as exc:
            return exc.response()

    return wrapped


class RequestLogger(Protocol):
    def bad_request(self, remote: str | None, exc: BadRequest) -> None: ...

    def handler_error(self, remote: str | None, exc: BaseException) -> None: ...


def check_head(event: h11.Request) -> None:
    """What h11 lets through and a server must refuse (raises ``BadRequest``)."""
    if event.http_version not in (b"1.0", b"1.1"):
        raise BadRequest("unsupported HTTP version")
    if len(event.headers) > MAX_HEADERS:
        raise BadRequest(f"more than {MAX_HEADERS} headers")
    if len(event.target) > MAX_LINE_BYTES:
        raise BadRequest(f"request target over {MAX_LINE_BYTES} bytes")
    size = len(event.target)
    for name, value in event.headers.raw_items():
        size += len(name) + len(value) + 4
        if len(name) + len(value) + 2 > MAX_LINE_BYTES or size > MAX_HEAD_BYTES:
            raise BadRequest(f"request head over {MAX_LINE_BYTES} bytes a line or {MAX_HEAD_BYTES} in all")
        if BAD_VALUE_RE.search(value):
            raise BadRequest("control character in a header value", header=name.decode("ascii", "replace"))


def http_date(now: float | None = None) -> str:
    return time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(now))


class HttpProtocol(asyncio.Protocol):
    """One client connection: h11 events in, one request handled at a time, responses out (keep-alive)."""

    def __init__(self, app: Application, log: RequestLogger, server_name: str = "dgxdoctor") -> None:
        self.app = app
        self.log = log
        self.server_name = server_name
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.transport: asyncio.Transport | None = None
        self.remote: str | None = None
        self.request: Request | None = None
        self.task: asyncio.Task[None] | None = None
        # Told when a request head arrives and when its response is written (the guard's deadlines).
        self.on_request: Callable[[HttpProtocol], object] | None = None
        self.on_done: Callable[[object], None] | None = None
        self.lingering = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.remote = str(peer[0]) if isinstance(peer, tuple) and peer else None

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return  # what a refused client still sends is read and dropped (see _linger)
        self.h11.receive_data(data)
        self._process()

    def eof_received(self) -> bool | None:
        if self.lingering:
            return None  # the transport closes itself
        self.h11.receive_data(b"")
        self._process()
        return True  # keep our side open for an answer in progress

    def connection_lost(self, exc: Exception | None) -> None:
        if self.request is not None:
            self.request.finish()
        self.transport = None

    def _process(self) -> None:
        while self.transport is not None and not self.transport.is_closing() and not self.lingering:
            try:
                event = self.h11.next_event()
                if isinstance(event, h11.Request):
                    check_head(event)
            except h11.RemoteProtocolError as exc:
                self._bad(BadRequest(str(exc).split(":", 1)[0] or "malformed request"))
                return
            except BadRequest as exc:
                self._bad(exc)
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.ConnectionClosed):
                if self.request is None:
                    self.transport.close()
                return
            self._on_event(event)

    def _on_event(self, event: object) -> None:
        if isinstance(event, h11.Request):
            self._start(event)
        elif isinstance(event, h11.Data) and self.request is not None:
            self.request.feed(event.data)
        elif isinstance(event, h11.EndOfMessage) and self.request is not None:
            self.request.finish()

    def _start(self, event: h11.Request) -> None:
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers.raw_items()]
        target = event.target.decode("latin-1")
        request = Request(self.app, event.method.decode("ascii", "replace"), target, headers, self.remote, self)
        self.request = request
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.app.client_max_size:
            request.finish(too_large=True)  # refused without reading it: the connection closes after the answer
        held = self.on_request(self) if self.on_request is not None else None
        self.task = asyncio.get_running_loop().create_task(self._respond(request, held))

    async def _respond(self, request: Request, held: object) -> None:
        try:
            response = await self.app.handle(request)
        except Exception as exc:  # a bug of ours: one bounded log line, a 500, and the daemon goes on
            self.log.handler_error(self.remote, exc)
            response = error_response(500)
        finally:
            if self.on_done is not None:
                self.on_done(held)
        self.task = None
        self._send(request, response)

    def _send(self, request: Request, response: Response) -> None:
        transport = self.transport
        self.request = None
        if transport is None or transport.is_closing():
            return
        headers = {"Date": http_date(), "Server": self.server_name, **response.headers}
        headers["Content-Length"] = str(len(response.body))
        unread = self.h11.their_state is not h11.DONE
        if unread:  # a body we did not read (over the cap, malformed, never asked for): no next request here
            headers["Connection"] = "close"
        reason = REASONS.get(response.status, "").encode()
        try:
            out = self.h11.send(h11.Response(status_code=response.status, headers=list(headers.items()), reason=reason))
            if response.body and request.method != "HEAD":
                out = (out or b"") + (self.h11.send(h11.Data(data=response.body)) or b"")
            out = (out or b"") + (self.h11.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError as exc:
            self.log.handler_error(self.remote, exc)
            transport.abort()
            return
        if unread or self.h11.our_state is h11.MUST_CLOSE:
            self._linger(out)
            return
        transport.write(out)
        self.h11.start_next_cycle()
        self._process()  # a pipelined request already read

    def _bad(self, exc: BadRequest) -> None:
        """A malformed request: 400 with what was wrong, then close; it never reaches a handler. Mid-body (a
        broken chunk), the handler already running answers instead: its read() fails."""
        self.log.bad_request(self.remote, exc)
        if self.request is not None:
            self.request.finish(broken=True)
            return
        body = f"400: Bad Request ({exc.reason})".encode()
        self._linger(
            b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
            + f"Date: {http_date()}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )

    def _linger(self, answer: bytes) -> None:
        """Write the last answer, end our side, and drop what the client still sends for a moment before closing:
        closing a socket with unread input resets it, and the client would lose the answer (a 413 to a big upload)."""
        transport = self.transport
        if transport is None:
            return
        self.lingering = True
        transport.write(answer)
        if transport.can_write_eof():
            transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_S, transport.close)
