"""GET /: the status page's token rules (those of /state, the token also as HTTP Basic's password for a browser),
its content in the three states, and that it loads nothing from anywhere and escapes what peers send."""

from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path
from typing import Any

from dgxdoctor.config import load_config
from dgxdoctor.daemon.app import AppState, make_app
from dgxdoctor.daemon.page import NOT_ASKED_YET, StatusPage, render_page
from dgxdoctor.documents import ResultsDocument
from dgxdoctor.exporters.collector import make_registry
from dgxdoctor.fleet.cluster import NodeRun, assemble
from dgxdoctor.fleet.peer_states import PeerStates
from dgxdoctor.fleet.peers import PeerFetch, validated_document
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.result import Action, CheckResult, Finding, Status
from webtest import TestClient, TestServer

TOKEN = "page-test-token-0123456789"
REMEDIATION = {
    "mode": "act",
    "role": "head",
    "breaker": {"open": False, "reason": None},
    "budget": {"limit": 3, "left": 2},
    "in_flight": None,
    "last_actions": [
        {"ts": 1_796_000_000.0, "action": "restart_vllm", "outcome": "success", "problem": "VLLM_DEAD",
         "bundle": "/var/lib/dgxdoctor/bundles/dgxdoctor-bundle-dgx-a-20261201T100000Z-restart_vllm-ab12.tar.gz"}
    ],
}  # fmt: skip


def node(name: str, url: str | None, *results: CheckResult) -> NodeRun:
    return NodeRun(name, url, ResultsDocument.of(name, list(results), time.time()).state())


def served(page: bool = True, token: str | None = TOKEN) -> TestClient[Any, Any]:
    store = ResultStore("dgx-a")
    state = AppState(store, make_registry(store), lambda: {"healthy": True}, token)

    async def render() -> str:
        return render_page(assemble(node("dgx-a", None, CheckResult("gpu", Status.OK, "8 GPUs")), []), REMEDIATION)

    state.page = render if page else None
    return TestClient(TestServer(make_app(state), host="127.0.0.1"))


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


async def test_the_page_takes_the_token_as_bearer_or_as_basic_password() -> None:
    async with served() as client:
        refused = await client.get("/")
        assert refused.status == 401 and refused.headers["WWW-Authenticate"] == 'Basic realm="dgxdoctor"'
        for headers in (basic("operator", TOKEN), basic("", TOKEN), {"Authorization": f"Bearer {TOKEN}"}):
            ok = await client.get("/", headers=headers)
            assert ok.status == 200 and ok.content_type == "text/html", headers
            assert "default-src 'none'" in ok.headers["Content-Security-Policy"]
        for headers in (basic("operator", TOKEN + "x"), basic(TOKEN, ""), {"Authorization": "Basic !!!"}):
            assert (await client.get("/", headers=headers)).status == 401, headers
        # Basic is for the page only: /state keeps to the bearer token.
        assert (await client.get("/state", headers=basic("operator", TOKEN))).status == 401
        assert (await client.get("/state", headers={"Authorization": f"Bearer {TOKEN}"})).status == 200


async def test_without_a_token_the_page_answers_loopback_and_json_still_lists_endpoints() -> None:
    async with served(token=None) as client:
        assert (await client.get("/")).status == 200  # the test client is on loopback
        index = await client.get("/", headers={"Accept": "application/json"})
        assert "/check/run" in (await index.json())["endpoints"]


def test_all_ok() -> None:
    view = assemble(node("dgx-a", None, CheckResult("gpu", Status.OK, "8 GPUs")),
                    [node("dgx-b", "http://dgx-b:9835", CheckResult("gpu", Status.OK, "8 GPUs"))])  # fmt: skip
    html = render_page(view, REMEDIATION)
    assert "cluster OK" in html and "nothing is wrong on any node that answered" in html
    assert 'href="/metrics"' in html and 'href="/state"' in html
    assert "mode <b>act</b>" in html and "breaker closed" in html and "restart_vllm" in html
    assert "dgxdoctor-bundle-dgx-a-20261201T100000Z-restart_vllm-ab12.tar.gz" in html  # the evidence is named
    assert 'name="viewport"' in html


def test_a_critical_node_shows_its_findings_and_remedies() -> None:
    xid = Finding("XID_79", Status.CRITICAL, "GPU fell off the bus", "0000:18:00.0", remedy="drain and reboot")
    bad = CheckResult("xid", Status.CRITICAL, "XID 79", (xid,), action=Action("reset_gpu", "drain the node"))
    view = assemble(node("dgx-a", None, bad), [node("dgx-b", "http://dgx-b:9835", CheckResult("xid", Status.OK, "-"))])
    html = render_page(view, REMEDIATION, {("xid", "XID_79"): "drain and reboot"})
    assert "cluster CRITICAL" in html and "XID_79" in html and "GPU fell off the bus" in html
    assert "drain and reboot" in html and "drain the node" in html


def test_an_unreachable_peer_is_named_unknown() -> None:
    down = NodeRun("dgx-b:9835", "http://dgx-b:9835", None, "ConnectError: connection refused")
    html = render_page(assemble(node("dgx-a", None, CheckResult("gpu", Status.OK, "8 GPUs")), [down]), None)
    assert "unreachable" in html and "ConnectError: connection refused" in html and ">UNKNOWN<" in html
    assert "remediation state unreadable" in html


def test_nothing_external_and_what_a_peer_sends_is_escaped() -> None:
    evil = CheckResult("gpu", Status.CRITICAL, '<script>alert(1)</script><img src="http://x/y">',
                       (Finding("<b>X</b>", Status.CRITICAL, "<iframe src=//evil>"),))  # fmt: skip
    html = render_page(assemble(node("dgx-a", None), [node("<dgx-b>", "http://dgx-b:9835", evil)]), REMEDIATION)
    assert "<script" not in html and "<iframe" not in html and "<img" not in html
    assert "&lt;script&gt;" in html
    # No URL to anywhere: every link is one of the daemon's own paths.
    assert re.findall(r'(?:href|src)="([^"]*)"', html) == ["/metrics", "/state", "/healthz"]


async def test_the_page_shows_the_peers_as_the_comparison_last_fetched_them(tmp_path: Path) -> None:
    """From the store of the comparison's fetches (``fleet.peer_states``), with the fetch's age; a peer not
    fetched yet is said to be not asked, not down."""
    peers = ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"]
    path = tmp_path / "config.toml"
    path.write_text(f'[daemon]\npeers = {json.dumps(peers)}\n[paths]\nstate_dir = "{tmp_path}"\n')
    config = load_config(path)
    states = PeerStates()
    doc = validated_document(node("dgx-b", peers[0], CheckResult("gpu", Status.WARNING, "7 of 8 GPUs")).doc)
    now = time.time()
    states.record([PeerFetch(peers[0], "127.0.0.1:1", doc.compared(), None, 0.1, document=doc, fetched_at=now - 12),
                   PeerFetch(peers[1], "127.0.0.1:2", None, "timed out: no complete answer within 3 s", 3.0, True,
                             fetched_at=now - 3)])  # fmt: skip
    html = await StatusPage(ResultStore("dgx-a"), lambda: config, states)()
    assert "dgx-b" in html and "7 of 8 GPUs" in html and "(12 s ago)" in html
    assert "<b>unreachable</b>" in html and "timed out: no complete answer within 3 s" in html and "(3 s ago)" in html
    assert "<b>not asked</b> at http://127.0.0.1:3" in html and NOT_ASKED_YET in html
