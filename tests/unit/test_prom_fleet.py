"""The fleet from Prometheus for remediation (fleet.prom_fleet), on answers a real Prometheus gave.

The answers under tests/data/prometheus were recorded from the rig of test_fleet_prometheus_gates.py (six agents,
groups glm-a/b/c of two, Prometheus 2.42 scraping them) with ``fleet.prom_fleet.query("dgxdoctor")``:
``fleet_healthy.json`` all six up and OK; ``fleet_b1_down_c1_xid79.json`` b1's agent stopped (its target down) and
an XID 79 in c1's kernel log; ``fleet_query_error.json`` the query with a syntax error (Prometheus's error answer).
test_fleet_prometheus_gates.py runs the whole path against the real thing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from dgxdoctor.config import load_config
from dgxdoctor.daemon.sdnotify import Notifier
from dgxdoctor.daemon.service import Daemon
from dgxdoctor.fleet.breaker import FleetReading, Member, fleet_health
from dgxdoctor.fleet.prom_fleet import KEEP_S, FleetAnswer, PromFleet, fetch_fleet, parse_fleet, query
from dgxdoctor.fleet.prom_view import PrometheusUnavailable
from dgxdoctor.judge.hardware_cause import PEER_CAUSE_CODE, peer_cause_findings
from dgxdoctor.remediation.hardware_gate import causes
from dgxdoctor.result import CheckResult, Cure, Status

DATA = Path(__file__).resolve().parents[1] / "data" / "prometheus"
BUS = "0000:3b:00"


def recorded(name: str) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads((DATA / name).read_text())
    return answer


def answer(name: str) -> FleetAnswer:
    return parse_fleet(recorded(name)["data"]["result"])


def test_the_query_names_the_job() -> None:
    q = query("gpu-agents")
    assert 'job="gpu-agents"' in q and 'job="dgxdoctor"' not in q
    assert 'up{job="gpu-agents"} == 0' in q and 'status="critical"' in q


def test_a_healthy_fleet() -> None:
    got = answer("fleet_healthy.json")
    assert [n.member for n in got.nodes] == [
        Member(n, g, True) for g, names in (("glm-a", "a1 a2"), ("glm-b", "b1 b2"), ("glm-c", "c1 c2"))
        for n in names.split()
    ]  # fmt: skip
    assert all(n.findings == () for n in got.nodes)


def test_a_target_down_and_a_critical_node_are_unhealthy() -> None:
    got = {n.node: n for n in answer("fleet_b1_down_c1_xid79.json").nodes}
    assert set(got) == {"a1", "a2", "b1", "b2", "c1", "c2"}
    assert got["b1"].member == Member("b1", "glm-b", False) and not got["b1"].up  # named by what it last exported
    assert got["c1"].member == Member("c1", "glm-c", False) and got["c1"].critical
    assert [code for _, code, _ in got["c1"].findings] == ["XID_79"]
    assert all(got[n].member.healthy for n in ("a1", "a2", "b2", "c2"))


def test_a_target_down_that_never_exported_is_named_by_its_instance() -> None:
    down = {"metric": {"__name__": "dgxdoctor_fleet_down_target", "instance": "10.0.0.9:9835", "job": "dgxdoctor"},
            "value": [0, "0"]}  # fmt: skip
    (node,) = parse_fleet([down, {"metric": "not a dict"}, "junk"]).nodes
    assert node.member == Member("10.0.0.9:9835", None, False)


async def test_prometheus_answers_over_http_and_its_error_is_unavailable() -> None:
    answers = {"ok": recorded("fleet_b1_down_c1_xid79.json"), "error": recorded("fleet_query_error.json")}
    which = ["ok"]

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/query" and "dgxdoctor_fleet_down" in request.url.params["query"]
        body = answers[which[0]]
        return httpx.Response(200 if body["status"] == "success" else 400, json=body)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        got = await fetch_fleet(client, "http://prom:9090", "dgxdoctor", 2.0)
        assert len(got.nodes) == 6
        which[0] = "error"
        with pytest.raises(PrometheusUnavailable, match="prom:9090"):
            await fetch_fleet(client, "http://prom:9090", "dgxdoctor", 2.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_prometheus_silent_keeps_its_last_answer_then_counts_only_this_node() -> None:
    clock = Clock()
    view = PromFleet(clock)
    me = Member("a1", "glm-a", True)
    first = view.reading(me)
    assert first.members == (me,) and "fleet unknown" in first.unknown  # no answer yet: said, never "all healthy"

    view.record(answer("fleet_b1_down_c1_xid79.json"), "a1", "glm-a")
    fresh = view.reading(me)
    assert fresh.unknown == "" and len(fresh.members) == 6
    health = fleet_health(fresh.members, 0.2, 5, 3)
    assert health.tripped and health.bad_groups == ("glm-b", "glm-c")

    clock.now += 30
    view.failed("http://prom:9090: no answer within 2 s")
    kept = view.reading(me)
    assert kept.members == fresh.members and "its answer of 30 s ago counted" in kept.unknown
    health = fleet_health(kept.members, 0.2, 5, 3, kept.unknown)
    assert health.tripped and "its answer of 30 s ago counted" in health.reason  # a blip does not close it

    clock.now += KEEP_S
    alone = view.reading(me)
    assert alone.members == (me,) and "only this node counted" in alone.unknown and "no answer within" in alone.unknown
    assert not fleet_health(alone.members, 0.2, 5, 3, alone.unknown).tripped


def test_the_groups_hardware_cause_judged_by_code() -> None:
    view = PromFleet(Clock())
    view.record(answer("fleet_b1_down_c1_xid79.json"), "c2", "glm-c")
    (peer, doc, kept) = view.group_peers()[0]
    assert (peer, kept) == ("c1", None) and len(view.group_peers()) == 1  # c2's group only, itself left out
    (finding,) = peer_cause_findings(doc, peer)
    assert finding.code == PEER_CAUSE_CODE and finding.cure is Cure.HARDWARE and finding.subject == "c1"
    assert finding.message == f"XID 79 on {BUS} of c1"
    (cause,) = causes({}, "c2", [finding])
    assert cause.text == f"XID 79 on {BUS} of c1"

    other = PromFleet(Clock())
    other.record(answer("fleet_b1_down_c1_xid79.json"), "a1", "glm-a")  # another group: c1 is not a1's cause
    assert [peer_cause_findings(d, p) for p, d, _ in other.group_peers()] == [[]]


def test_a_critical_code_that_a_restart_cures_is_no_cause() -> None:
    view = PromFleet(Clock())
    series = [{"metric": {"__name__": "dgxdoctor_node_info", "node": n, "group": "g"}, "value": [0, "1"]}
              for n in ("n1", "n2")]  # fmt: skip
    dead = {"__name__": "dgxdoctor_finding_info", "node": "n2", "check": "vllm", "code": "VLLM_DEAD", "subject": ""}
    series.append({"metric": {**dead, "status": "critical"}, "value": [0, "1"]})
    view.record(parse_fleet(series), "n1", "g")
    assert [peer_cause_findings(d, p) for p, d, _ in view.group_peers()] == [[]]


def test_a_silent_peer_or_prometheus_keeps_the_last_cause() -> None:
    """As the mesh keeps a silent peer's last cause: a GPU off the bus does not come back because its node stopped
    answering."""
    view = PromFleet(Clock())
    view.record(answer("fleet_b1_down_c1_xid79.json"), "c2", "glm-c")
    view.failed("http://prom:9090: ConnectError: refused")
    ((peer, doc, kept),) = view.group_peers()
    assert peer == "c1" and kept is not None and "Prometheus gave no answer now" in kept
    assert [f.message for f in peer_cause_findings(doc, peer)] == [f"XID 79 on {BUS} of c1"]

    # c1's agent stops: its target is down, its findings gone from Prometheus; its cause is kept
    down = parse_fleet([
        {"metric": {"__name__": "dgxdoctor_node_info", "node": "c2", "group": "glm-c"}, "value": [0, "1"]},
        {"metric": {"__name__": "dgxdoctor_fleet_down", "node": "c1", "group": "glm-c"}, "value": [0, "1"]},
    ])  # fmt: skip
    view.record(down, "c2", "glm-c")
    ((peer, doc, kept),) = view.group_peers()
    assert kept is not None and "not scraped by Prometheus now" in kept and peer_cause_findings(doc, peer)

    view.record(answer("fleet_healthy.json"), "c2", "glm-c")  # back, and OK: the cause clears
    assert [peer_cause_findings(d, p) for p, d, _ in view.group_peers()] == [[]]


def test_the_daemon_wires_both_with_prometheus(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(f'[node]\nname = "c2"\ngroup = "glm-c"\n[paths]\nstate_dir = "{tmp_path / "state"}"\n'
                    '[fleet]\nprometheus_url = "http://prom:9090"\n')  # fmt: skip
    daemon = Daemon(load_config(path), path, notifier=Notifier({}))
    daemon.store.put(CheckResult("xid", Status.OK, "no XID"))
    assert daemon.remediator.fleet is not None
    before = daemon.remediator.fleet()
    assert isinstance(before, FleetReading) and before.members == (Member("c2", "glm-c", True),) and before.unknown
    daemon.prom_fleet.record(answer("fleet_b1_down_c1_xid79.json"), "c2", "glm-c")
    health = daemon.remediator.fleet_health()
    assert health is not None and health.tripped and health.bad_nodes == ("b1", "c1")
    (cause,) = daemon.remediator.causes(daemon.store.latest())
    assert cause.text == f"XID 79 on {BUS} of c1" and cause.finding.code == PEER_CAUSE_CODE


def test_the_daemon_without_prometheus_relays_nothing_itself(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(f'[node]\nname = "c2"\n[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    daemon = Daemon(load_config(path), path, notifier=Notifier({}))
    daemon.prom_fleet.record(answer("fleet_b1_down_c1_xid79.json"), "c2", "default")
    assert daemon.relayed_causes() == []  # the mesh's peer_compare relays


async def test_the_loop_says_what_it_could_not_count_and_refuses_for_the_groups_cause(tmp_path: Path) -> None:
    """Through Remediator.evaluate: Prometheus silent, vLLM's restart runs (this node alone is no fleet fault) and
    its audited reason says the fleet was not read; with the group peer's XID 79 in the answer it is refused and
    paged."""
    from test_remediation_engine import DEAD, events, remediator, settle, vllm_app

    for run, recorded_answer in (("silent", None), ("xid", "fleet_b1_down_c1_xid79.json")):
        home = tmp_path / run
        home.mkdir()
        view = PromFleet(Clock())
        if recorded_answer is not None:
            view.record(answer(recorded_answer), "c2", "glm-c")
        r = remediator(home, vllm_app([]), {"vllm": DEAD})
        r.fleet = lambda view=view: view.reading(Member("c2", "glm-c", False))
        r.relayed = lambda view=view: [f for p, d, _ in view.group_peers() for f in peer_cause_findings(d, p)]
        await settle(r)
        decisions = [e for e in events(home) if e["event"] == "decision"]
        if recorded_answer is None:
            (acted,) = decisions
            assert acted["verdict"] == "act" and "only this node counted" in acted["reason"], acted
            assert "fleet breaker not tripped on what it could read: fleet unknown" in acted["reason"], acted
            assert [e["outcome"] for e in events(home) if e["event"] == "action"] == ["success"]
        else:
            (refused,) = decisions
            assert refused["verdict"] == "refuse", refused
            assert f"cause: XID 79 on {BUS} of c1 (PEER_HARDWARE_FAULT)" in refused["reason"], refused
            assert [e for e in events(home) if e["event"] == "page"]
            assert not [e for e in events(home) if e["event"] == "action"]


def test_the_age_of_a_kept_answer_ticking_is_no_new_moment() -> None:
    """Prometheus silent, its kept answer's age changes every second: remediation's settled evaluation still holds
    (the moment is the same); a change of the verdict is a new one."""
    from dgxdoctor.remediation.engine import _fleet_moment

    clock = Clock()
    view = PromFleet(clock)
    view.record(answer("fleet_b1_down_c1_xid79.json"), "a1", "glm-a")
    me = Member("a1", "glm-a", True)
    moments = []
    for _ in range(2):
        clock.now += 17
        view.failed("http://prom:9090: ConnectError: refused")
        reading = view.reading(me)
        moments.append(_fleet_moment(fleet_health(reading.members, 0.2, 5, 3, reading.unknown)))
    assert moments[0] == moments[1] and "2 of 3 (67 %) groups" in moments[0]
    healthy = view.reading(Member("a1", "glm-a", True))
    assert _fleet_moment(fleet_health(healthy.members[:1], 0.2, 5, 3, healthy.unknown)) != moments[0]
