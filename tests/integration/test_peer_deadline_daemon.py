"""An interactive command and the status page against peers that do not answer, in real processes: a real daemon
SIGSTOPped (``tests/daemonproc.py``), a peer that accepts and never answers, one trickling ``/healthz`` a byte per
0.5 s, one sending 400 MiB as its ``/healthz``, one whose ``generated_at`` is 1e400 (``tests/peerstub.py``).

``dgxdoctor check --cluster`` answers within its default deadline (15 s, 5 s with ``--cached``) with each of them
UNKNOWN and named, valid JSON; the status page answers at once while they are wedged, from what the peer comparison
last fetched. On 85f803c the command ran past its 25 s default on the trickle and the page waited on every load.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import run_cli
from daemonproc import DaemonProc
from dgxdoctor.checks.registry import ALL_CHECKS
from peerstub import PeerStub, flood, results_doc, send_json, trickle

pytestmark = pytest.mark.integration

TOKEN = "peer-deadline-token-0123456789"
# The process starting and importing its checks, on a loaded two-core machine.
START_SLACK_S = 6.0


def quiet(*keep: str) -> str:
    return "".join(f"[checks.{f.name}]\nenabled = false\n" for f in ALL_CHECKS if f.name not in keep)


def infinite_state(conn: Any, stub: PeerStub) -> None:
    doc = json.dumps(results_doc(stub.node)).replace('"generated_at":', '"generated_at": 1e400, "x":')
    send_json(conn, None, doc.encode())


def strict(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def stopped_daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    body = (f'node = "dgx-stopped"\n[daemon]\nlisten = "@LISTEN@"\ntoken = "{TOKEN}"\n'
            f'[paths]\nstate_dir = "{tmp_path / "peer-state"}"\n{quiet("host")}')  # fmt: skip
    d = DaemonProc(tmp_path / "peer", body, token=TOKEN).start()
    try:
        d.wait_healthy()
        os.kill(d.pid, signal.SIGSTOP)
        yield d
    finally:
        os.kill(d.pid, signal.SIGCONT)
        d.kill()


def test_check_cluster_ends_by_its_default_deadline_with_every_wedged_peer_named(
    tmp_path: Path, stopped_daemon: DaemonProc
) -> None:
    silent = PeerStub("dgx-silent", silent=True)
    slow = PeerStub("dgx-trickle", {"/healthz": trickle})
    big = PeerStub("dgx-flood", {"/healthz": flood})
    odd = PeerStub("dgx-inf", {"/state": infinite_state, "/check/run": lambda c, s: send_json(
        c, None, b'{"node": "dgx-inf", "results": ' + json.dumps(results_doc(s.node)).replace(
            '"generated_at":', '"generated_at": 1e400, "x":').encode() + b"}")})  # fmt: skip
    stubs = [silent, slow, big, odd]
    peers = [stopped_daemon.url, *(s.url for s in stubs)]
    config = tmp_path / "config.toml"
    config.write_text(f'node = "dgx-a"\n[daemon]\ntoken = "{TOKEN}"\npeers = {json.dumps(peers)}\n'
                      f'[paths]\nstate_dir = "{tmp_path / "state"}"\n{quiet("host")}')  # fmt: skip
    try:
        for args, bound in (
            (["check", "--cluster", "--json"], 15.0),
            (["check", "--cluster", "--cached", "--json"], 5.0),
        ):
            t0 = time.monotonic()
            done = run_cli(*args, "--config", str(config), timeout=60)
            took = time.monotonic() - t0
            print(f"{' '.join(args)}: {took:.1f} s")
            assert took < bound + START_SLACK_S, (args, took)
            doc = strict(done.stdout)
            assert doc["deadline_s"] == bound and done.returncode == 3, (done.returncode, done.stderr[-2000:])
            by_url = {n["url"]: n for n in doc["nodes"]}
            for url in peers[:4]:  # the stopped daemon, the silent socket, the trickle, the flood
                node = by_url[url]
                assert node["status"] == "unknown" and node["results"] is None, node
                assert node["node"] == url.removeprefix("http://"), node  # named by its address
            assert "within the deadline" in by_url[stopped_daemon.url]["error"]
            assert "within the deadline" in by_url[silent.url]["error"]
            assert "GET /healthz" in by_url[slow.url]["error"]
            assert "/healthz" in by_url[big.url]["error"] and "larger than" in by_url[big.url]["error"]
            inf = by_url[odd.url]
            assert inf["status"] == "ok" and inf["results"]["generated_at"] is None, inf
    finally:
        for s in stubs:
            s.close()
    print(f"the flooding peer got {big.sent / 2**20:.1f} MiB into the sockets")
    assert big.sent < 64 * 2**20, big.sent  # what the kernel's buffers took, not 400 MiB


def test_the_status_page_answers_at_once_while_peers_are_wedged(tmp_path: Path) -> None:
    silent = PeerStub("dgx-silent", silent=True)
    slow = PeerStub("dgx-trickle", {"/healthz": trickle})
    peers = [silent.url, slow.url]
    body = (f'node = "dgx-a"\n[daemon]\nlisten = "@LISTEN@"\ntoken = "{TOKEN}"\npeers = {json.dumps(peers)}\n'
            f'peer_timeout_s = 4\n[paths]\nstate_dir = "{tmp_path / "state"}"\n'
            f'{quiet("peer_compare")}[checks.peer_compare]\ninterval_s = 1\n')  # fmt: skip
    d = DaemonProc(tmp_path / "d", body, token=TOKEN).start()
    try:
        d.wait_healthy()
        auth = {"Authorization": f"Bearer {TOKEN}"}

        def page() -> tuple[float, str]:
            t0 = time.monotonic()
            answer = httpx.get(f"{d.url}/", headers=auth, timeout=15)
            assert answer.status_code == 200
            return time.monotonic() - t0, answer.text

        took, html = page()
        print(f"page before the comparison: {took:.2f} s")
        assert took < 2.0, took  # 85f803c: 4 s (the silent peer's timeout), then never (the trickle)
        assert f"127.0.0.1:{silent.port}" in html and f"127.0.0.1:{slow.port}" in html
        # Once the comparison has asked them, the page says what it found, still without asking anyone.
        d.wait_for(lambda: "timed out" in page()[1], 30, "the comparison's fetch on the page")
        took, html = page()
        print(f"page after the comparison: {took:.2f} s")
        assert took < 2.0, took
        assert "timed out: no complete answer within 4 s" in html and "s ago)" in html
        assert "dgx-trickle" in html  # its /state came whole: the page shows it by the name it gave
        assert not [r for r in silent.requests + slow.requests if r.startswith("GET /healthz")]  # no clock probe
    finally:
        d.kill()
        silent.close()
        slow.close()
