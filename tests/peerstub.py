"""A misbehaving peer on a real loopback socket: what a wedged, trickling or flooding agent looks like on the wire.

``PeerStub`` speaks just enough HTTP/1.1 (keep-alive, Content-Length) to answer ``GET /state``, ``POST /check/run``
and ``GET /healthz`` the way the daemon does, each of them the way a broken or hostile peer may: never (the socket
accepted and left alone, as the kernel does for a SIGSTOPped process), a byte at a time, or without end. It counts
the bytes it managed to send, and it stops on ``close()``: its threads end, its sockets close.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from dgxdoctor.documents import ResultsDocument
from dgxdoctor.result import CheckResult, Status

Answer = Callable[[socket.socket, "PeerStub"], None]


def results_doc(node: str) -> dict[str, Any]:
    """A valid results document, as a healthy peer's daemon writes it."""
    return ResultsDocument.of(node, [CheckResult("gpu", Status.OK, "8 GPUs")], time.time()).state()


def send_json(conn: socket.socket, doc: Any, raw: bytes | None = None) -> None:
    body = raw if raw is not None else json.dumps(doc).encode()
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


class PeerStub:
    """``answers`` maps a path to how it is answered; a path not in it gets the healthy answer."""

    def __init__(self, node: str = "dgx-stub", answers: dict[str, Answer] | None = None, silent: bool = False) -> None:
        self.node = node
        self.answers = answers or {}
        self.silent = silent  # accept, then never read nor answer
        self.stop = threading.Event()
        self.sent = 0  # body bytes handed to the kernel by the flooding answers
        self.requests: list[str] = []
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.port: int = self._sock.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(5)
        for conn in [self._sock, *self._conns]:
            with contextlib.suppress(OSError):
                conn.close()

    def __enter__(self) -> PeerStub:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._conns.append(conn)
            if self.silent:
                continue
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.2)
        buffer = b""
        while not self.stop.is_set():
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not chunk:
                return
            buffer += chunk
            while b"\r\n\r\n" in buffer:
                head, _, rest = buffer.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                length = next((int(v) for k, _, v in (x.partition(":") for x in lines[1:])
                               if k.strip().lower() == "content-length"), 0)  # fmt: skip
                if len(rest) < length:
                    break
                buffer = rest[length:]
                path = lines[0].split()[1]
                self.requests.append(f"{lines[0].split()[0]} {path}")
                try:
                    self._answer(conn, path)
                except OSError:
                    return

    def _answer(self, conn: socket.socket, path: str) -> None:
        if path in self.answers:
            self.answers[path](conn, self)
        elif path == "/state":
            send_json(conn, results_doc(self.node))
        elif path == "/check/run":
            send_json(conn, {"node": self.node, "results": results_doc(self.node)})
        elif path == "/healthz":
            send_json(conn, {"healthy": True, "clock": time.time()})
        else:
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")


def trickle(conn: socket.socket, stub: PeerStub, every_s: float = 0.5) -> None:
    """A valid answer's head, then its body one byte per ``every_s``, for as long as the asker waits."""
    body = json.dumps({"healthy": True, "clock": time.time(), "pad": "x" * 10_000}).encode()
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
    for byte in body:
        if stub.stop.wait(every_s):
            return
        conn.sendall(bytes([byte]))


def flood(conn: socket.socket, stub: PeerStub, size: int = 400 * 2**20) -> None:
    """A ``size``-byte answer (400 MiB), sent as fast as the asker reads it."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % size)
    chunk = b" " * 65536
    conn.settimeout(5)
    left = size
    while left > 0 and not stub.stop.is_set():
        piece = chunk[: min(left, len(chunk))]
        conn.sendall(piece)
        stub.sent += len(piece)
        left -= len(piece)
