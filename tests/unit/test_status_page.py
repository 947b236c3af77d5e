"""GET /: the status page's token rules (those of /state, the token also as HTTP Basic's password for a browser),
its content in the three states, and that it loads nothing from anywhere and escapes what peers send."""

from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from test_ray_check import LOCAL, REFUSED, run_check

from dgxdoctor.commands.report import report_table
from dgxdoctor.config import ConfigError, load_config
from dgxdoctor.daemon.app import AppState, make_app
from dgxdoctor.daemon.page import NOT_ASKED_YET, StatusPage, remedy_html, render_page
from dgxdoctor.documents import ResultsDocument
from dgxdoctor.exporters.collector import make_registry
from dgxdoctor.fleet.cluster import NodeRun, assemble
from dgxdoctor.fleet.peer_states import PeerStates
from dgxdoctor.fleet.peers import PeerFetch, response_json, validated_document
from dgxdoctor.fleet.store import ResultStore
from dgxdoctor.result import Action, CheckResult, Finding, ResultBuilder, Status
from dgxdoctor.settings.daemon import Credentials
from webtest import TestClient, TestServer

TOKEN = "page-test-token-0123456789"
ALERT = "alert-test-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
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
    # The page's password is the read token; Alertmanager holds another.
    state = AppState(store, make_registry(store), lambda: {"healthy": True}, Credentials(read=token, alert=ALERT))

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
        # Whoever may look at the page may not restart the cluster (issue 34: one token for everything).
        for path in ("/alertmanager", "/reload", "/bundle/part", "/check/run", "/remediation/step"):
            assert (await client.post(path, headers=BEARER, data=b"{}")).status == 403, path


async def test_without_a_token_the_page_refuses_loopback_too() -> None:
    async with served(token=None) as client:
        answer = await client.get("/")  # the test client is on loopback, where any local user is
        assert answer.status == 403 and "read_token_file" in (await answer.json())["error"]


async def test_the_page_takes_the_read_token_as_its_password() -> None:
    async with served(token=TOKEN) as client:
        index = await client.get("/", headers={"Accept": "application/json", **BEARER})
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
    html = render_page(view, REMEDIATION)
    assert "cluster CRITICAL" in html and "XID_79" in html and "GPU fell off the bus" in html
    assert "drain and reboot" in html and "drain the node" in html


def ray_down_on_the_head(tmp_path: Path) -> CheckResult:
    """The real ray check on a head whose Ray is down: dashboard refused, neither 6379 nor 8265 listening."""
    result = run_check(tmp_path, REFUSED, dashboard_url=LOCAL, role="head", listening=False)
    ports = [f for f in result.findings if f.code == "RAY_PORT_NOT_LISTENING"]
    assert [f.subject for f in ports] == ["port 6379", "port 8265"] and ports[0].remedy != ports[1].remedy
    return result


def finding_item(html: str, text: str) -> str:
    """The page's <li> of the finding whose message holds ``text``."""
    [item] = [li for li in html.split("<li>")[1:] if text in li.split('<div class="remedy">')[0]]
    return item.split("</li>")[0]


def test_each_finding_shows_its_own_remedy_on_this_node_and_a_peer(tmp_path: Path) -> None:
    """Issue 33 row 5: the GCS port finding showed the dashboard port's remedy (looked up by check and code, the
    last one winning), and a peer's findings showed none. The page renders each finding's own, as `check` does."""
    head = ray_down_on_the_head(tmp_path / "a")
    peer = ray_down_on_the_head(tmp_path / "b")
    peer_doc = validated_document(response_json(json.dumps(ResultsDocument.of("dgx-b", [peer]).state()).encode()))
    view = assemble(node("dgx-a", None, head), [NodeRun("dgx-b", "http://dgx-b:9835", peer_doc.state())])
    html = render_page(view, REMEDIATION)
    for where in ("dgx-a", "dgx-b"):
        card = next(c for c in html.split('<div class="card">') if f"<b>{where}</b> · ray" in c)
        gcs = finding_item(card, "Ray GCS port 6379 is not listening")
        dashboard = finding_item(card, "Ray dashboard port 8265 is not listening")
        assert "grep 6379" in gcs and "grep 8265" not in gcs, where
        assert "grep 8265" in dashboard and "grep 6379" not in dashboard, where
    # `check` prints the same remedy under the same finding.
    printed = " ".join(report_table("dgx-a", [head]).split())
    gcs_line = printed.split("Ray GCS port 6379 is not listening")[1].split("- [")[0]
    assert "remedy: the head's GCS is down: `ss -lntp | grep 6379`" in gcs_line


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


def peer_node(name: str, *results: CheckResult) -> NodeRun:
    """A peer as the daemon holds it: its /state document read and validated as a fetch reads it."""
    doc = validated_document(response_json(json.dumps(ResultsDocument.of(name, list(results)).state()).encode()))
    return NodeRun(name, f"http://{name}:9835", doc.state(), fetched_at=time.time() - 4)


def test_the_grid_comes_first() -> None:
    """Issue 33 row 10: the node-by-check grid was at the bottom, below every finding (at 1280x900 three findings
    fit). It is now the page's first section, each node's column with its status and the age of its results."""
    xid = Finding("XID_79", Status.CRITICAL, "GPU fell off the bus", "0000:18:00.0", remedy="drain and reboot")
    bad = CheckResult("xid", Status.CRITICAL, "XID 79", (xid,))
    view = assemble(node("dgx-a", None, CheckResult("xid", Status.OK, "-")), [peer_node("dgx-b", bad)])
    html = render_page(view, REMEDIATION)
    grid, wrong = html.index('<section id="grid">'), html.index('<section id="wrong">')
    assert html.index("<body>") < grid < wrong < html.index("GPU fell off the bus")
    assert grid < html.index("<h2>Nodes</h2>") and grid < html.index("<h2>Remediation</h2>")
    table = html[grid:wrong]
    assert '<th>dgx-b<br><span class="b critical">CRITICAL</span><br><span class="muted">4 s ago</span></th>' in table
    assert '<tr><td>xid</td><td><span class="b ok">OK</span></td><td><span class="b critical">CRITICAL' in table


async def test_the_page_refreshes_itself_every_page_refresh_s(tmp_path: Path) -> None:
    """A wall display reloads the page (before: never). A meta refresh, not a script: the page's CSP allows none,
    and it works with JavaScript off. ``[daemon] page_refresh_s``: 30 by default, 0 off."""
    shown = {}
    for value in (None, 5, 0):
        path = tmp_path / f"{value}.toml"
        key = "" if value is None else f"page_refresh_s = {value}\n"
        path.write_text(f'[daemon]\n{key}[paths]\nstate_dir = "{tmp_path}"\n')
        config = load_config(path)
        html = await StatusPage(ResultStore("dgx-a"), lambda config=config: config, PeerStates())()
        shown[value] = re.findall(r'<meta http-equiv="refresh" content="(\d+)">', html)
        assert "<script" not in html
    assert shown == {None: ["30"], 5: ["5"], 0: []}
    assert "refreshes every 30 s" in render_page(assemble(node("dgx-a", None), []), None, refresh_s=30)
    assert "no auto-refresh" in render_page(assemble(node("dgx-a", None), []), None, refresh_s=0)
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[daemon]\npage_refresh_s = -1\n[paths]\nstate_dir = "{tmp_path}"\n')
    with pytest.raises(ConfigError, match="page_refresh_s"):
        load_config(bad)


def card_of(html: str, node_name: str, check: str) -> str:
    card = next(c for c in html.split('<div class="card">') if f"<b>{node_name}</b> · {check}" in c)
    return card.split("</div>")[0] if "<ul>" not in card else card.split("</ul>")[0]


def test_each_sentence_once(tmp_path: Path) -> None:
    """Issue 33 row 10: a check's summary and its only finding said the same sentence twice. A summary whose words
    are all its one finding's is left out; a finding's message the summary already holds is not said again."""
    b = ResultBuilder("gpu")  # as the gpu check reports NVML listing no GPU: the summary is the finding's message
    b.add(Finding("GPU_NOT_VISIBLE", Status.CRITICAL, "NVML lists no GPU while 8 NVIDIA GPU(s) are on the PCI bus"))
    same = b.build("NVML lists no GPU while 8 NVIDIA GPU(s) are on the PCI bus")
    worker = run_check(tmp_path / "w", REFUSED, dashboard_url=LOCAL, role="worker", listening=False)
    assert worker.summary == "worker node: no raylet running"  # its words are all in the finding's
    error = run_check(tmp_path / "e", {p: (500, b"x") for p in REFUSED})
    assert error.findings[0].message in error.summary  # the summary holds the finding's message
    view = assemble(node("dgx-a", None, same, worker), [peer_node("dgx-b", error)])
    html = render_page(view, REMEDIATION)
    assert html.count("NVML lists no GPU while 8 NVIDIA GPU(s) are on the PCI bus") == 1
    assert "worker node: no raylet running" not in html
    assert html.count(worker.findings[0].message) == 1
    assert html.count(_esc(error.findings[0].message)) == 1
    # What the page leaves out is only a repeat: the code, the subject and the remedy stay.
    assert "<code>RAY_API_ERROR</code> http://10.77.0.1:8265<" in card_of(html, "dgx-b", "ray")
    assert f"ray: {_esc(error.summary)}" in html


def _esc(text: str) -> str:
    import html

    return html.escape(text, quote=True)


def test_commands_in_remedies_are_code(tmp_path: Path) -> None:
    """Issue 33 row 10: remedies showed their backticks. Each `command` is a <code>, the finding's own remedy
    and the check's."""
    head = run_check(tmp_path, REFUSED, dashboard_url=LOCAL, role="head", listening=False)
    html = render_page(assemble(node("dgx-a", None, head), []), REMEDIATION)
    gcs = finding_item(html, "Ray GCS port 6379 is not listening")
    assert "<code>ss -lntp | grep 6379</code>" in gcs and "<code>ray stop --force</code>" in gcs
    remedies = re.findall(r'<div class="remedy">(.*?)</div>', html)
    assert remedies and not any("`" in r for r in remedies)
    action = CheckResult("vllm", Status.CRITICAL, "down", action=Action("restart_vllm", "`systemctl restart vllm`"))
    html = render_page(assemble(node("dgx-a", None, action), []), REMEDIATION)
    assert "<b>remedy</b>: <code>systemctl restart vllm</code>" in html
    assert remedy_html("`x` is code, a lone ` stays") == "<code>x</code> is code, a lone ` stays"


def test_a_peers_remedy_with_markup_in_backticks_is_escaped() -> None:
    """A backtick span is escaped like the rest: a peer cannot open a tag through it."""
    evil = "run `<script>alert(1)</script>` then `</code><img src=x onerror=alert(1)>`"
    bad = CheckResult("gpu", Status.CRITICAL, "bad", (Finding("X", Status.CRITICAL, "m", remedy=evil),),
                      action=Action("investigate", evil + " `<iframe src=//evil>`"))  # fmt: skip
    html = render_page(assemble(node("dgx-a", None), [peer_node("dgx-b", bad)]), REMEDIATION)
    assert "<script" not in html and "<img" not in html and "<iframe" not in html
    assert "<code>&lt;script&gt;alert(1)&lt;/script&gt;</code>" in html
    assert "<code>&lt;/code&gt;&lt;img src=x onerror=alert(1)&gt;</code>" in html
    assert re.findall(r'(?:href|src)="([^"]*)"', html) == ["/metrics", "/state", "/healthz"]
