"""A stand-in for NCCL's RAS client socket on loopback, for the reader's tests.

Two modes:
- ``Replay(session)``: plays back a recorded session (scripts/h200_ras/record.py's JSON: every chunk NCCL sent, in
  order), answering each command the client sends with the chunks that followed it in the recording, byte for byte;
- ``Scripted(replies)``: answers the n-th command line with ``replies[n]`` (bytes, or a callable for misbehaviour:
  silence, a short read, garbage), for the error cases, with replies taken from NCCL's format strings.
A reply of ``CLOSE`` closes the connection after it (as NCCL does after a STATUS report).
"""

from __future__ import annotations

import base64
import contextlib
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

CLOSE = b"\x00close\x00"
Reply = bytes | Callable[[socket.socket], None]


def replay_steps(session: dict[str, Any]) -> list[tuple[bytes, list[bytes], bool]]:
    """A recorded session -> [(command sent, chunks received after it, closed after them)]."""
    steps: list[tuple[bytes, list[bytes], bool]] = []
    for ev in session["events"]:
        if ev.get("dir") == "sent":
            steps.append((base64.b64decode(ev["data"]), [], False))
        elif ev.get("dir") == "recv" and steps:
            steps[-1][1].append(base64.b64decode(ev["data"]))
        elif ev.get("event") == "eof" and steps:
            command, chunks, _ = steps[-1]
            steps[-1] = (command, chunks, True)
    return steps


class StandIn:
    """A listening socket on 127.0.0.1 with one handler thread per connection; use as a context manager."""

    def __init__(self, handler: Callable[[socket.socket], None]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.handler = handler
        self.received: list[bytes] = []
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> StandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(5)

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            self.handler(conn)

    def read_line(self, conn: socket.socket) -> bytes:
        data = b""
        conn.settimeout(10)
        while not data.endswith(b"\n"):
            chunk = conn.recv(1)
            if not chunk:
                return data
            data += chunk
        self.received.append(data)
        return data


def replay(session: dict[str, Any]) -> StandIn:
    steps = replay_steps(session)

    def handler(conn: socket.socket) -> None:
        for expected, chunks, closed in steps:
            got = server.read_line(conn)
            if got != expected:
                conn.sendall(b"ERROR: Unknown command " + got.rstrip(b"\n") + b"\n")
                return
            for chunk in chunks:
                conn.sendall(chunk)
            if closed:
                return

    server = StandIn(handler)
    return server


def scripted(replies: Sequence[Reply]) -> StandIn:
    def handler(conn: socket.socket) -> None:
        for reply in replies:
            if not server.read_line(conn):
                return
            if callable(reply):
                reply(conn)
                continue
            if reply.endswith(CLOSE):
                conn.sendall(reply[: -len(CLOSE)])
                return
            conn.sendall(reply)

    server = StandIn(handler)
    return server
