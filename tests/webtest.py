"""The daemon's aiohttp app served on a loopback port for a test, and a client for it.

``TestServer``/``TestClient`` take the names and the few methods of aiohttp's test utilities the tests used
(``start_server``, ``port``, ``request``/``get``/``post`` with relative paths, ``status``, ``text()``, ``json()``),
over the real listening socket and connection guard the daemon serves with; the client is httpx's.
"""

from __future__ import annotations

import json as jsonlib
import ssl
from types import TracebackType
from typing import Any

import httpx
from aiohttp import web

from dgxdoctor.daemon import connections
from dgxdoctor.daemon.ratelog import RequestLog

# Plain HTTP to loopback; one TLS context for every client (httpx would load the CA bundle again for each, ~0.1 s).
_TLS = ssl.create_default_context()


class TestServer:
    __test__ = False  # not a pytest class

    def __init__(self, app: web.Application, host: str = "127.0.0.1") -> None:
        self.app = app
        self.host = host
        self.port = 0
        self.request_log = RequestLog()
        self._server: connections.GuardedServer | None = None

    async def start_server(self) -> None:
        if self._server is not None:
            return
        limits = connections.Limits()
        runner = connections.make_runner(self.app, limits, self.request_log)
        self._server = await connections.serve(runner, connections.Guard(limits), self.host, 0)
        self.port = self._server.address[1]

    def make_url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}{path}"

    async def close(self) -> None:
        if self._server is not None:
            await self._server.stop()
            self._server = None


class TestResponse:
    __test__ = False

    def __init__(self, response: httpx.Response) -> None:
        self.raw = response
        self.status = response.status_code
        self.headers = response.headers
        self.content_type = response.headers.get("Content-Type", "").split(";", 1)[0].strip()

    async def read(self) -> bytes:
        return self.raw.content

    async def text(self) -> str:
        return self.raw.text

    async def json(self) -> Any:
        return jsonlib.loads(self.raw.content)


class TestClient:
    __test__ = False

    def __init__(self, server: TestServer) -> None:
        self.server = server
        self.session = httpx.AsyncClient(timeout=30, verify=_TLS)

    @property
    def port(self) -> int:
        return self.server.port

    async def start_server(self) -> None:
        await self.server.start_server()

    async def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        data: bytes | str | None = None,
        json: Any = None,
        skip_auto_headers: Any = None,
    ) -> TestResponse:
        # Header values as UTF-8 bytes (a test sends non-ASCII tokens on purpose), without the surrounding spaces
        # that are no part of a value (RFC 9110 5.5) and that httpx refuses to send.
        sent = {k: v.strip(" \t").encode("utf-8") for k, v in (headers or {}).items()}
        content = data.encode("utf-8") if isinstance(data, str) else data
        resp = await self.session.request(method, self.server.make_url(path), headers=sent, content=content, json=json)
        return TestResponse(resp)

    async def get(self, path: str, **kwargs: Any) -> TestResponse:
        return await self.request("GET", path, **kwargs)

    async def post(self, path: str, **kwargs: Any) -> TestResponse:
        return await self.request("POST", path, **kwargs)

    async def close(self) -> None:
        await self.session.aclose()
        await self.server.close()

    async def __aenter__(self) -> TestClient:
        await self.start_server()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
