"""Prometheus as the cluster view: six real agents in three serving groups (two nodes each, loopback ports), a real
Prometheus scraping them with the shipped rules, a real Alertmanager with the documented route (group by group).

One node's kernel log gets an XID 79; then ``dgxdoctor check --cluster --cached`` on another node, with ``[fleet]
prometheus_url``, answers from Prometheus: every node with its group, the bad node CRITICAL with the finding's code
and subject (and its message, read from that node's /state alone), the others OK. The XID alert reaches
Alertmanager's receiver in a notification of its own group (``groupLabels: {group: ...}``). The agents fetch no
peer's /state meanwhile (their peer_compare is SKIPPED, no ``dgxdoctor_peer_up`` series).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from harness.fleet import BUS, TOKEN, FleetRig, wait, why_not_runnable

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(why_not_runnable() is not None, reason=str(why_not_runnable())),
]

GROUPS = {"glm-a": ["a1", "a2"], "glm-b": ["b1", "b2"], "glm-c": ["c1", "c2"]}


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetRig]:
    with FleetRig(tmp_path_factory.mktemp("fleet"), GROUPS).running() as rig:
        yield rig


def test_the_cluster_view_names_the_bad_node_and_its_group_and_pages_the_group(rig: FleetRig) -> None:
    bad = next(a for a in rig.agents if a.name == "b2")
    asker = next(a for a in rig.agents if a.name == "a1")
    ok = rig.cli(asker, "check", "--cluster", "--cached", "--json")
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    doc = json.loads(ok.stdout)
    assert {(n["node"], n["results"]["group"], n["status"]) for n in doc["nodes"]} == {
        (n, g, "ok") for g, names in GROUPS.items() for n in names
    }
    assert {n["source"] for n in doc["nodes"]} == {"prometheus"}

    rig.inject_critical(bad)
    wait(lambda: rig.query('dgxdoctor_finding_info{node="b2",code="XID_79"}') != [], 60, "the XID in Prometheus")
    done = rig.cli(asker, "check", "--cluster", "--cached", "--json")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    doc = json.loads(done.stdout)
    nodes = {n["node"]: n for n in doc["nodes"]}
    assert doc["status"] == "critical"
    assert {n for n, v in nodes.items() if v["status"] != "ok"} == {"b2"}
    b2 = nodes["b2"]["results"]
    assert b2["group"] == "glm-b"
    xid = [f for c in b2["checks"] for f in c["findings"] if f["code"] == "XID_79"]
    assert [(f["subject"], f["group"]) for f in xid] == [(BUS, "glm-b")], b2
    assert xid[0]["message"], xid  # Prometheus has no message: read from b2's own /state
    assert nodes["b2"]["source"] == "agent" and nodes["a2"]["source"] == "prometheus"
    table = rig.cli(asker, "check", "--cluster", "--cached")
    assert "group glm-b" in table.stdout and "b2" in table.stdout, table.stdout

    assert rig.recorder is not None
    recorder = rig.recorder

    def paged() -> list[dict[str, object]]:
        return [b for b in recorder.bodies
                if any(a["labels"].get("alertname") == "DgxdoctorXidRebootRequired" for a in b["alerts"])]  # fmt: skip

    wait(lambda: paged() != [], 60, "the XID alert at Alertmanager's receiver")
    body = paged()[0]
    assert body["groupLabels"] == {"group": "glm-b"}
    assert {a["labels"]["group"] for a in body["alerts"]} == {"glm-b"}
    assert {a["labels"]["node"] for a in body["alerts"]} == {"b2"}


def test_the_agents_fetch_no_peer_state(rig: FleetRig) -> None:
    """Each agent has peers configured, yet with [fleet] prometheus_url its peer_compare fetches none of them."""
    agent = rig.agents[0]
    state = json.loads(rig.cli(agent, "check", "--cluster", "--cached", "--json").stdout)
    mine = next(n for n in state["nodes"] if n["node"] == agent.name)
    assert mine["results"] is not None
    compare = httpx.get(f"{agent.url}/state", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).json()
    peer = next(c for c in compare["checks"] if c["name"] == "peer_compare")
    assert peer["status"] == "skipped" and "Prometheus" in peer["summary"], peer
    assert rig.query("dgxdoctor_peer_up") == []
    done = rig.cli(agent, "check", "--cluster", "--json")  # fresh: every node Prometheus scrapes, asked now
    doc = json.loads(done.stdout)
    assert sorted(n["node"] for n in doc["nodes"]) == sorted(n for names in GROUPS.values() for n in names)
    assert all(n["results"] is not None for n in doc["nodes"]), doc


def test_the_peers_discovered_from_prometheus_targets(rig: FleetRig) -> None:
    """[fleet] peer_sources = ["prometheus"]: the other five agents, from the real Prometheus's targets."""
    from dgxdoctor.config import parse_config
    from dgxdoctor.fleet.discovery import Membership, discover

    asker = rig.agents[0]
    config = parse_config(
        {"node": {"name": asker.name}, "daemon": {"listen": f"127.0.0.1:{asker.port}"},
         "fleet": {"prometheus_url": rig.prometheus_url, "peer_sources": ["prometheus"]}}
    )  # fmt: skip
    peers, seen = discover(Membership(), config.peer_sources(), config.own_agent(), config.environment().http_client)
    assert sorted(peers) == sorted(a.url for a in rig.agents if a is not asker)
    assert seen.stale == ()
