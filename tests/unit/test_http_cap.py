"""Every check's HTTP client refuses an endless answer: a real server on loopback streams past the cap."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from dgxdoctor.environment import Environment
from dgxdoctor.sources.http import CappedTransport


class _Endless(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        chunk = b"x" * 65536
        try:
            for _ in range(2000):  # 128 MiB unless the client hangs up first
                self.wfile.write(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endless_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Endless)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_environment_clients_cap_the_response(endless_url: str) -> None:
    with Environment().http_client(endless_url, timeout_s=10) as client, pytest.raises(httpx.ReadError, match="larger"):
        client.get("/metrics")


def test_a_small_answer_passes_untouched() -> None:
    transport = CappedTransport(httpx.MockTransport(lambda r: httpx.Response(200, text="ok")), limit=10)
    with httpx.Client(transport=transport) as client:
        assert client.get("http://x/health").text == "ok"


def test_the_limit_is_exact() -> None:
    transport = CappedTransport(httpx.MockTransport(lambda r: httpx.Response(200, content=b"x" * 11)), limit=10)
    with httpx.Client(transport=transport) as client, pytest.raises(httpx.ReadError):
        client.get("http://x/metrics")


def test_plain_http_never_loads_the_ca_bundle_and_https_still_verifies() -> None:
    import socket
    import ssl

    import httpx

    from dgxdoctor.environment import ByScheme, plain_context, tls_context

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    transport = ByScheme()
    with httpx.Client(transport=transport, timeout=2) as client:
        with pytest.raises(httpx.ConnectError):
            client.get(f"http://127.0.0.1:{port}/health")
        assert transport._tls is None
        # The plain side could not accept a TLS peer: it requires a verified certificate and trusts no CA.
        ctx = plain_context()
        assert ctx.verify_mode is ssl.CERT_REQUIRED and ctx.check_hostname and not ctx.get_ca_certs()
        with pytest.raises(httpx.ConnectError):
            client.get(f"https://127.0.0.1:{port}/health")
        assert transport._tls is not None and tls_context().verify_mode is ssl.CERT_REQUIRED
