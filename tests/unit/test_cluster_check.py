"""``check --cluster``'s parts: the peer's POST /check/run (authenticated, bounded) and the asking side (one
deadline, the unreachable peer UNKNOWN and named, N peers, side by side, the clock offset), over real HTTP on
loopback between the daemon's real HTTP servers."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from dgxdoctor.checks.base import Check, capped
from dgxdoctor.daemon import checknow
from dgxdoctor.daemon.app import AppState, make_app
from dgxdoctor.daemon.checknow import CheckNow, parse_deadline
from dgxdoctor.documents import ResultsDocument
from dgxdoctor.environment import Environment
from dgxdoctor.exporters.collector import make_registry
from dgxdoctor.fleet.cluster import NodeRun, ask_peers, assemble, clock_offset, cluster_document
from dgxdoctor.fleet.cluster_table import cluster_table
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.result import CheckResult, Finding, Status
from fakechecks import FakeSettings, StaticCheck
from tokens import one_token
from webtest import TestServer

TOKEN = "cluster-test-token-0123456789"


class Sleepy(StaticCheck):
    """Holds its run until ``release`` is set (or its timeout ends it)."""

    def __init__(self, settings: Any, env: Environment, release: threading.Event) -> None:
        super().__init__(settings, env, name="sleepy")
        self.release = release

    def run(self) -> CheckResult:
        self.release.wait(30)
        return CheckResult("sleepy", Status.OK, "woke")


def peer_app(node: str, status: Status, interval: float = 0.0, build: Callable[[float], list[Check]] | None = None):
    env = Environment(node=node)
    finding = Finding("XID_79", Status.CRITICAL, "GPU fell off the bus", subject="0000:18:00.0")
    outcome = CheckResult(
        "gpu", status, f"gpu {status.value}", findings=(finding,) if status is Status.CRITICAL else ()
    )

    def default_build(limit: float) -> list[Check]:
        return [StaticCheck(capped(FakeSettings(), limit), env, outcome, name="gpu")]

    service = CheckNow(build or default_build, lambda: env, lambda: interval)
    store = ResultStore(node)
    state = AppState(store, make_registry(store), lambda: {"healthy": True, "clock": time.time()}, one_token(TOKEN))
    state.extra_routes = lambda app: checknow.add_routes(app, service)
    return make_app(state), service


@pytest.fixture
async def peers() -> AsyncIterator[list[tuple[str, CheckNow]]]:
    servers = []
    out = []
    for node, status in (("dgx-b", Status.OK), ("dgx-c", Status.CRITICAL), ("dgx-d", Status.OK)):
        app, service = peer_app(node, status)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        out.append((f"http://127.0.0.1:{server.port}", service))
    yield out
    for server in servers:
        await server.close()


def local(status: Status = Status.OK) -> NodeRun:
    doc = ResultsDocument.of("dgx-a", [CheckResult("gpu", status, "local gpu")], time.time()).state()
    return NodeRun("dgx-a", None, doc, seconds=0.1, clock_offset_s=0.0, rtt_s=0.0)


async def test_four_nodes_side_by_side_with_the_worst_status(peers: list[tuple[str, CheckNow]]) -> None:
    async with httpx.AsyncClient() as client:
        runs = await ask_peers(client, [u for u, _ in peers], TOKEN, 10.0, cached=False)
    view = assemble(local(), runs)
    assert [n.node for n in view.nodes] == ["dgx-a", "dgx-b", "dgx-c", "dgx-d"]
    assert [n.status for n in view.nodes] == [Status.OK, Status.OK, Status.CRITICAL, Status.OK]
    assert view.status is Status.CRITICAL
    # The peer measured with its own healthz clock: on one machine the offset is within the round trip.
    assert all(n.clock_offset_s is not None and abs(n.clock_offset_s) <= (n.rtt_s or 0) + 0.05 for n in view.nodes)
    table = cluster_table(view)
    assert "dgx-a  dgx-b  dgx-c  dgx-d" in table.replace("   ", "  ")
    assert "dgx-c gpu [critical]" in table and "XID_79 0000:18:00.0: GPU fell off the bus" in table
    doc = cluster_document(view)
    assert doc["status"] == "critical" and len(doc["nodes"]) == 4
    assert doc["nodes"][2]["results"]["checks"][0]["findings"][0]["code"] == "XID_79"
    json.dumps(doc)


async def test_an_unreachable_peer_is_that_node_unknown_within_the_deadline(peers: list[tuple[str, CheckNow]]) -> None:
    release = threading.Event()
    app, _ = peer_app(
        "dgx-slow", Status.OK, build=lambda limit: [Sleepy(FakeSettings(timeout_s=30), Environment(), release)]
    )
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    # A port nobody listens on, and a peer whose checks do not finish in time.
    dead = "http://127.0.0.1:9"
    slow = f"http://127.0.0.1:{server.port}"
    t0 = time.monotonic()
    try:
        async with httpx.AsyncClient() as client:
            runs = await ask_peers(client, [peers[0][0], dead, slow], TOKEN, 2.0, cached=False)
    finally:
        release.set()
        await server.close()
    took = time.monotonic() - t0
    assert took < 4.0, took  # the deadline holds for the whole run (the limit here is generous for a loaded CI)
    view = assemble(local(), runs)
    by_url = {n.url: n for n in view.nodes}
    assert by_url[dead].status is Status.UNKNOWN and "ConnectError" in (by_url[dead].error or "")
    assert by_url[dead].node == "127.0.0.1:9"  # named by its address when it gave no name
    assert by_url[slow].status is Status.UNKNOWN and "deadline" in (by_url[slow].error or "")
    assert view.status is Status.UNKNOWN
    assert "UNREACHABLE" in cluster_table(view)


async def test_a_wrong_token_is_named(peers: list[tuple[str, CheckNow]]) -> None:
    async with httpx.AsyncClient() as client:
        runs = await ask_peers(client, [peers[0][0]], "not-the-token-000000", 5.0, cached=False)
    assert runs[0].status is Status.UNKNOWN
    assert "HTTP 401" in (runs[0].error or "") and "same [daemon] peer_token_file" in (runs[0].error or "")


async def test_cached_reads_the_peers_state(peers: list[tuple[str, CheckNow]]) -> None:
    async with httpx.AsyncClient() as client:
        runs = await ask_peers(client, [peers[0][0]], TOKEN, 5.0, cached=True)
    assert runs[0].cached and runs[0].doc is not None and runs[0].doc["checks"] == []  # its store is empty
    assert peers[0][1].runner is None  # nothing ran on the peer


async def test_the_peer_runs_one_at_a_time_and_rate_limits() -> None:
    release = threading.Event()
    sleepy = Sleepy(FakeSettings(timeout_s=10), Environment(), release)
    app, service = peer_app("dgx-b", Status.OK, interval=60.0, build=lambda limit: [sleepy])
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    url = f"http://127.0.0.1:{server.port}/check/run"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with httpx.AsyncClient(timeout=15) as client:
            first = asyncio.create_task(client.post(url, json={"deadline_s": 10}, headers=auth))
            while not service.gate.lock.locked():
                await asyncio.sleep(0.01)
            busy = await client.post(url, json={"deadline_s": 10}, headers=auth)
            release.set()
            done = await first
            limited = await client.post(url, json={"deadline_s": 10}, headers=auth)
            unauthenticated = await client.post(url, json={"deadline_s": 10})
    finally:
        release.set()
        await server.close()
    assert done.status_code == 200 and done.json()["results"]["checks"][0]["summary"] == "woke"
    assert busy.status_code == 409 and "already in progress" in busy.json()["error"]
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
    assert unauthenticated.status_code == 401
    assert service.gate.refused == {"busy": 1, "rate": 1}


async def test_the_askers_deadline_caps_the_peers_check_timeouts() -> None:
    seen: list[float] = []

    def build(limit: float) -> list[Check]:
        settings = capped(FakeSettings(timeout_s=90), limit)
        seen.append(settings.timeout_s)
        return [StaticCheck(settings, Environment(), name="gpu")]

    app, _ = peer_app("dgx-b", Status.OK, build=build)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with httpx.AsyncClient() as client:
            await ask_peers(client, [f"http://127.0.0.1:{server.port}"], TOKEN, 6.0, cached=False)
    finally:
        await server.close()
    assert seen == [5.0]  # the asker's 6 s less the margin for the answer


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"[]", "Expected `object`, got `array`"),
        (b'{"deadline_s": "9"}', "Expected `float`, got `str` - at `$.deadline_s`"),
        (b'{"deadline_s": 0}', "Expected `float` > 0.0 - at `$.deadline_s`"),
        (b'{"deadline_s": 1e9}', "Expected `float` <= 600.0 - at `$.deadline_s`"),
        (b'{"deadline_s": true}', "Expected `float`, got `bool` - at `$.deadline_s`"),
        (b'{"deadline_s": 5, "checks": ["gpu"]}', "unknown field `checks`"),
        (b'{"deadline_s": NaN}', "JSON is malformed"),
        (b"{", "truncated"),
    ],
)
def test_the_peer_refuses_a_bad_body(body: bytes, error: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_deadline(body)
    assert error in str(caught.value)


def test_clock_offset_is_ntps_estimate() -> None:
    # The peer's clock runs 10 s ahead; 40 ms each way, 20 ms spent on the peer.
    offset, delay = clock_offset(100.0, 110.04, 110.06, 100.1)
    assert offset == pytest.approx(10.0) and delay == pytest.approx(0.08)
    assert clock_offset(100.0, None, None, 100.1) == (None, pytest.approx(0.1))


def test_two_peers_with_one_name_are_both_kept() -> None:
    doc = ResultsDocument.of("dgx-b", [CheckResult("gpu", Status.OK, "ok")]).state()
    runs = [NodeRun("dgx-b", "http://10.0.0.2:9835", doc), NodeRun("dgx-b", "http://10.0.0.3:9835", doc)]
    view = assemble(local(), runs)
    assert [n.node for n in view.nodes] == ["dgx-a", "dgx-b", "dgx-b@10.0.0.3:9835"]
