"""NCCL's RAS client protocol, spoken as NCCL's own ``ncclras`` client speaks it, with a hard deadline and a size cap.

Every NCCL process (2.24 and later, ``NCCL_RAS_ENABLE=1`` by default) listens for RAS clients on
``localhost:28028`` or ``NCCL_RAS_ADDR`` (src/ras/client_support.cc:163-170 at v2.28.9-1). The exchange, from
src/ras/client.cc at v2.28.9-1 and the server side in src/ras/client_support.cc:354-410:

- ``CLIENT PROTOCOL 2\\n`` -> ``SERVER PROTOCOL 2\\n`` (client.cc:201-228; the version is 2 in every release from
  2.24.3 to 2.30.7, ras_internal.h:11, and a mismatch is only warned about, "Will try to continue");
- ``TIMEOUT <s>\\n`` -> ``OK\\n`` or ``ERROR: Invalid timeout value ...`` (client.cc:231; 0 disables it);
- ``SET FORMAT json\\n`` -> ``OK\\n`` from 2.28.7 on; older servers answer ``ERROR: Unknown command SET FORMAT json``
  and keep the connection (client_support.cc:408), so the text report is read instead;
- ``STATUS\\n`` or ``VERBOSE STATUS\\n`` (client.cc:323): the report, streamed until the server closes the
  connection (client_support.cc: RAS_CLIENT_FINISHED terminates the client once its queue is sent).

The RAS collective behind STATUS waits up to the TIMEOUT per leg (5 s by default, RAS_COLLECTIVE_LEG_TIMEOUT_SEC,
ras_internal.h:14) plus as much again; ``ncclras`` first allows 1 s per reply (TIMEOUT_INCREMENT, client.cc:25) to
"quickly eliminate non-responsive processes" and retries the handshake on a timeout (client.cc:273). Several NCCL
processes of one node bind the same port with SO_REUSEPORT, so a connection can land on a stopped one: the
handshake is retried, within the one deadline of the whole query.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from msgspec import Struct, field

CLIENT_PROTOCOL = 2
DEFAULT_PORT = 28028
DEFAULT_HOST = "localhost"
HANDSHAKE_TIMEOUT_S = 1.0
DEFAULT_MAX_BYTES = 4 << 20
LINE_MAX = 4096  # client.cc reads replies into 1024/4096-byte buffers; a longer reply line is not NCCL's

Connect = Callable[[tuple[str, int], float], socket.socket]


class RasError(Exception):
    """The RAS service could not be read. ``kind``: refused, timeout, closed, protocol, too_large, address."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Exchange(Struct, frozen=True):
    """One command and its reply, byte for byte, with the seconds from sending it to the last byte read."""

    sent: bytes
    received: bytes
    seconds: float


class RasReply(Struct, frozen=True):
    host: str
    port: int
    server_protocol: int | None
    format: str  # "json" or "text"
    report: str
    exchanges: tuple[Exchange, ...] = ()
    attempts: int = 1
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)


def parse_ras_addr(value: str) -> tuple[str, int]:
    """``NCCL_RAS_ADDR`` (``host:port``, ``[v6]:port``, as ncclSocketGetAddrFromString reads it) -> (host, port)."""
    text = value.strip()
    if not text:
        raise RasError("address", "empty RAS address")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if not sep or not host:
            raise RasError("address", f"RAS address {value!r}: unterminated [IPv6] host")
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, ""
    if not port_text:
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise RasError("address", f"RAS address {value!r}: port {port_text!r} is not a TCP port")
    return host or DEFAULT_HOST, int(port_text)


def _default_connect(addr: tuple[str, int], timeout: float) -> socket.socket:
    return socket.create_connection(addr, timeout=timeout)


class _Conn:
    """One connection under the query's deadline; every read is bounded by what is left of it."""

    def __init__(self, sock: socket.socket, deadline: float, max_bytes: int) -> None:
        self.sock = sock
        self.deadline = deadline
        self.max_bytes = max_bytes
        self.total = 0
        self.exchanges: list[Exchange] = []

    def _left(self, cap: float | None = None) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RasError("timeout", "RAS gave no complete answer within the deadline")
        return min(left, cap) if cap is not None else left

    def _recv(self, cap: float | None) -> bytes:
        self.sock.settimeout(self._left(cap))
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError as exc:
            raise RasError("timeout", "RAS did not answer in time") from exc
        except OSError as exc:
            raise RasError("closed", f"RAS connection failed: {exc}") from exc
        self.total += len(chunk)
        if self.total > self.max_bytes:
            raise RasError("too_large", f"RAS sent more than {self.max_bytes} bytes")
        return chunk

    def send(self, command: str) -> float:
        self.sock.settimeout(self._left())
        try:
            self.sock.sendall(command.encode("ascii"))
        except OSError as exc:
            raise RasError("closed", f"RAS connection failed while sending {command.strip()!r}: {exc}") from exc
        return time.monotonic()

    def line(self, command: str, cap: float | None = None) -> str:
        """Send one command, read its one-line reply (until the newline, as client.cc's rasRead)."""
        started = self.send(command)
        data = b""
        while not data.endswith(b"\n"):
            chunk = self._recv(cap)
            if not chunk:
                self.exchanges.append(Exchange(command.encode(), data, time.monotonic() - started))
                raise RasError("closed", f"RAS closed the connection after {command.strip()!r}")
            data += chunk
            if len(data) > LINE_MAX:
                raise RasError("protocol", f"RAS reply to {command.strip()!r} has no newline in {LINE_MAX} bytes")
        self.exchanges.append(Exchange(command.encode(), data, time.monotonic() - started))
        return data.decode("utf-8", "replace")

    def stream(self, command: str) -> str:
        """Send one command, read until the server closes the connection (the STATUS report)."""
        started = self.send(command)
        parts: list[bytes] = []
        while chunk := self._recv(None):
            parts.append(chunk)
        data = b"".join(parts)
        self.exchanges.append(Exchange(command.encode(), data, time.monotonic() - started))
        return data.decode("utf-8", "replace")


def _handshake(conn: _Conn) -> int | None:
    reply = conn.line(f"CLIENT PROTOCOL {CLIENT_PROTOCOL}\n", HANDSHAKE_TIMEOUT_S)
    if not reply.upper().startswith("SERVER PROTOCOL "):
        raise RasError("protocol", f"not NCCL's RAS: handshake answered {reply[:80]!r}")
    version = reply[len("SERVER PROTOCOL ") :].strip()
    # NCCL writes "%d" (client_support.cc); str.isdigit() also takes "²" or "٣", which int() refuses or misreads
    if not (version.isascii() and version.isdigit()) or len(version) > 9:
        raise RasError("protocol", f"not NCCL's RAS: handshake answered {reply.strip()[:80]!r} (no version number)")
    return int(version)


def _open(addr: tuple[str, int], deadline: float, max_bytes: int, connect: Connect) -> tuple[_Conn, int | None, int]:
    """Connect and shake hands, retrying a handshake that times out (a stopped process holding the port)."""
    attempts = 0
    while True:
        attempts += 1
        left = deadline - time.monotonic()
        if left <= 0:
            raise RasError("timeout", f"RAS at {addr[0]}:{addr[1]}: no handshake in {attempts - 1} attempt(s)")
        try:
            sock = connect(addr, min(left, HANDSHAKE_TIMEOUT_S))
        except ConnectionRefusedError as exc:
            raise RasError("refused", f"nothing listens on {addr[0]}:{addr[1]} (RAS disabled or blocked)") from exc
        except TimeoutError:
            continue
        except OSError as exc:
            raise RasError("refused", f"cannot connect to {addr[0]}:{addr[1]}: {exc}") from exc
        conn = _Conn(sock, deadline, max_bytes)
        try:
            return conn, _handshake(conn), attempts
        except RasError as exc:
            sock.close()
            if exc.kind != "timeout" or deadline - time.monotonic() <= 0:
                raise


def query(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    verbose: bool = True,
    want_json: bool = True,
    collective_timeout_s: int | None = 5,
    deadline_s: float = 15.0,
    max_bytes: int = DEFAULT_MAX_BYTES,
    connect: Connect = _default_connect,
) -> RasReply:
    """One STATUS report from the RAS service at host:port; raises RasError (its ``kind`` says why)."""
    started = time.monotonic()
    deadline = started + deadline_s
    conn, version, attempts = _open((host, port), deadline, max_bytes, connect)
    notes: list[str] = []
    try:
        if collective_timeout_s is not None:  # None: NCCL's default, as ncclras without -t (no TIMEOUT sent)
            reply = conn.line(f"TIMEOUT {int(collective_timeout_s)}\n")
            if reply.strip().upper() != "OK":
                raise RasError("protocol", f"RAS refused TIMEOUT {collective_timeout_s}: {reply.strip()[:120]!r}")
        fmt = "text"
        if want_json:
            reply = conn.line("SET FORMAT json\n")
            if reply.strip().upper() == "OK":
                fmt = "json"
            else:
                notes.append(f"no JSON report (NCCL before 2.28.7): {reply.strip()[:120]}")
        report = conn.stream("VERBOSE STATUS\n" if verbose else "STATUS\n")
    finally:
        conn.sock.close()
    if not report:
        raise RasError("closed", "RAS closed the connection without a report")
    return RasReply(
        host, port, version, fmt, report, tuple(conn.exchanges), attempts, time.monotonic() - started, tuple(notes)
    )
