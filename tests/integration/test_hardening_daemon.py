"""The real daemon against what an attack and fault campaign found (issue: hardening), each held and measured:
idle and trickling clients, malformed requests, a peer that trickles its answer, and SIGTERM while all of that
and a hung check are going on. Loopback only; the daemon runs under the unit's LimitNOFILE."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemonproc import DaemonProc, raise_own_nofile, unit_nofile, unit_stop_timeout_s
from dgxdoctor.daemon.connections import Limits
from dgxdoctor.daemon.ratelog import BURST

pytestmark = pytest.mark.integration

TOKEN = "hardening-token-0123456789"
IDLE_CONNECTIONS = 5_000
BASE = f'node = "it-node"\n[daemon]\nlisten = "@LISTEN@"\ntoken = "{TOKEN}"\n'


def config(tmp_path: Path, extra: str = "") -> str:
    return BASE + extra + f'\n[paths]\nstate_dir = "{tmp_path / "state"}"\n'


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    d = DaemonProc(tmp_path / "d", config(tmp_path), nofile=unit_nofile(), token=TOKEN).start()
    try:
        d.wait_healthy()
        yield d
    finally:
        d.kill()


def open_idle(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
    return socks


class Trickler(threading.Thread):
    """A client sending its request head one byte every ``every_s``; records when the server closed on it."""

    def __init__(self, port: int, every_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.every_s = every_s
        self.closed_after: float | None = None

    def run(self) -> None:
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
            try:
                for _ in range(120):
                    s.sendall(b"X")
                    time.sleep(self.every_s)
            except OSError:
                self.closed_after = time.monotonic() - t0


def test_idle_and_trickling_clients_cannot_silence_the_daemon(daemon: DaemonProc) -> None:
    """Before: 4,200 idle connections under LimitNOFILE=4096 made /healthz and /metrics time out as long as they
    were held, and asyncio logged a traceback per failed accept()."""
    raise_own_nofile(IDLE_CONNECTIONS + 512)
    trickler = Trickler(daemon.port)
    trickler.start()
    socks = open_idle(daemon.port, IDLE_CONNECTIONS)
    try:
        t0 = time.monotonic()
        health = daemon.get("/healthz", timeout=5)
        latency = time.monotonic() - t0
        assert health.status_code == 200 and latency < 2.0, (health.status_code, latency)
        assert daemon.get("/metrics", timeout=5).status_code == 200
        assert daemon.open_fds() < Limits().max_connections + 128
        assert (daemon.metric("dgxdoctor_http_connections_closed_total", reason="evicted") or 0) > 0
        trickler.join(Limits().header_timeout_s + 10)
        assert trickler.closed_after is not None and trickler.closed_after < Limits().header_timeout_s + 3
    finally:
        for s in socks:
            s.close()
    # The idle ones that were left open were closed at the header deadline.
    daemon.wait_for(lambda: (daemon.metric("dgxdoctor_http_connections") or 0) <= 2, 20, "idle connections closed")
    log = daemon.log_text()
    assert "Traceback" not in log and len(log.splitlines()) < 100, daemon.log_tail()


def test_malformed_requests_are_counted_and_logged_in_bounded_lines(daemon: DaemonProc) -> None:
    """Before: each malformed request was an aiohttp ERROR with a traceback, ~37 times its own size in log."""
    before = len(daemon.log_text())
    sent = 2_000
    for i in range(sent):
        with socket.create_connection(("127.0.0.1", daemon.port), timeout=5) as s:
            s.sendall(b"GARBAGE\x00 /x HTTP/1.1\r\nHost: a\r\n\r\n" if i % 2 else b"GET /\x7f HTTP/9\r\n\r\n")
            s.recv(4096)
    assert daemon.metric("dgxdoctor_http_bad_requests_total") == sent
    added = daemon.log_text()[before:]
    lines = [json.loads(line) for line in added.splitlines()]
    bad = [e for e in lines if e["event"] == "http_bad_request"]
    assert 1 <= len(bad) <= BURST and "Traceback" not in added and len(added) < 5_000, added[-2000:]


class TricklingPeer(threading.Thread):
    """A peer that answers ``HTTP/1.1 200 OK`` and then one header byte every 0.5 s, for ever."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.stopped = False

    def run(self) -> None:
        while not self.stopped:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                while not self.stopped:
                    conn.sendall(b"X")
                    time.sleep(0.5)
            except OSError:
                return

    def stop(self) -> None:
        self.stopped = True
        self.server.close()


def hanging_tool(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / name
    tool.write_text("#!/bin/sh\nexec sleep 600\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return tool


def test_trickling_peer_and_sigterm_while_everything_is_held(tmp_path: Path) -> None:
    """Before: a trickling peer held the fetch for ever (peer_compare "is hung" on every later run, peer_up gone),
    and after SIGTERM the process logged "stopped" but did not exit while the peer trickled."""
    peer = TricklingPeer()
    peer.start()
    bin_dir = tmp_path / "bin"
    hanging_tool(bin_dir, "nvidia-smi")
    extra = (
        f'peers = ["http://127.0.0.1:{peer.port}"]\npeer_timeout_s = 1\n'
        "[checks.peer_compare]\ninterval_s = 2\n"
        "[checks.topology]\ninterval_s = 2\ntimeout_s = 2\ncommand_timeout_s = 300\n"
    )
    d = DaemonProc(
        tmp_path / "d",
        config(tmp_path, extra),
        nofile=unit_nofile(),
        token=TOKEN,
        env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
    ).start()
    try:
        d.wait_healthy()
        label = f"127.0.0.1:{peer.port}"
        # Two comparisons in a row judged the peer (not "is hung"), each within its deadline.
        d.wait_for(
            lambda: (
                (d.metric("dgxdoctor_check_runs_total", check="peer_compare") or 0) >= 2
                and d.metric("dgxdoctor_peer_up", peer=label) == 0.0
                and d.metric("dgxdoctor_check_status", check="peer_compare") == 1.0
            ),
            20,
            "peer judged unreachable twice",
        )
        assert (d.metric("dgxdoctor_peer_fetch_duration_seconds", peer=label) or 99) < 2.0
        d.wait_for(lambda: (d.metric("dgxdoctor_check_timeouts_total", check="topology") or 0) >= 1, 20, "hung")
        # Clients in every state: mid-request-head, a full request never read, idle.
        held = [socket.create_connection(("127.0.0.1", d.port)) for _ in range(3)]
        held[0].sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        held[1].sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        # A reload while all of that is held completes, and the daemon still answers.
        assert d.proc is not None
        d.proc.send_signal(signal.SIGHUP)
        d.wait_for(lambda: '"event": "config_reloaded"' in d.log_text(), 20, "reloaded")
        assert d.get("/healthz").status_code == 200
        code, seconds = d.stop(limit_s=unit_stop_timeout_s() + 10)
        for s in held:
            s.close()
        assert code == 0 and seconds < unit_stop_timeout_s() / 3, (code, seconds, d.log_tail())
        assert '"event": "stopped"' in d.log_text()
        assert '"logger": "httpx"' not in d.log_text()  # no line per outbound request
    finally:
        peer.stop()
        d.kill()


def test_textfile_write_failures_are_exported_and_the_textfile_carries_its_age(tmp_path: Path) -> None:
    """Before: a failing textfile write logged a line every interval and exported nothing; a site scraping
    node_exporter silently read stale data."""
    prom_dir = tmp_path / "textfile"
    prom_dir.mkdir()
    textfile = prom_dir / "dgxdoctor.prom"
    extra = f'textfile_path = "{textfile}"\ntextfile_interval_s = 0.5\n'
    d = DaemonProc(tmp_path / "d", config(tmp_path, extra), token=TOKEN).start()
    try:
        d.wait_healthy()
        d.wait_for(lambda: "dgxdoctor_textfile_write_timestamp_seconds" in textfile.read_text(), 20, "textfile")
        written = next(
            float(line.split()[-1])
            for line in textfile.read_text().splitlines()
            if line.startswith("dgxdoctor_textfile_write_timestamp_seconds")
        )
        assert abs(time.time() - written) < 10
        assert d.metric("dgxdoctor_write_errors_total", file="textfile") == 0.0
        # The directory goes away (as good as read-only or full for this writer): every write fails from now on.
        prom_dir.rename(tmp_path / "gone")
        prom_dir.write_text("not a directory")
        d.wait_for(lambda: (d.metric("dgxdoctor_write_errors_total", file="textfile") or 0) >= 2, 20, "counted")
        stale = d.metric("dgxdoctor_textfile_write_timestamp_seconds")
        time.sleep(1.5)
        assert d.metric("dgxdoctor_textfile_write_timestamp_seconds") == stale  # the age grows
        assert d.get("/healthz").status_code == 200
    finally:
        d.kill()
