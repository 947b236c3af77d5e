"""The fleet breaker: its verdict over (node, group, healthy) members (fleet.breaker), the members the daemon takes
from its own results and the peers' last /state, and the real remediation loop (Remediator.evaluate with its
guard, audit, pager and commands) refusing restarts and paging while it is tripped, never on two nodes."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_remediation_engine import DEAD, events, remediator, settle, vllm_app

from dgxdoctor.config import load_config
from dgxdoctor.daemon.sdnotify import Notifier
from dgxdoctor.daemon.service import Daemon
from dgxdoctor.documents import ResultsDocument
from dgxdoctor.fleet.breaker import Member, fleet_health, members_from_states
from dgxdoctor.fleet.peer_states import PeerState
from dgxdoctor.fleet.peers import PeerFetch
from dgxdoctor.result import CheckResult, Finding, Status

FRACTION, MIN_NODES, MIN_GROUPS = 0.2, 5, 3


def fleet(bad: set[str], groups: int = 3, per_group: int = 2) -> list[Member]:
    """``groups`` groups g0.. of ``per_group`` nodes each (dgx-a is g0's first); ``bad`` nodes unhealthy."""
    names = ["dgx-a", *[f"dgx-{i}" for i in range(1, groups * per_group)]]
    return [Member(n, f"g{i // per_group}", n not in bad) for i, n in enumerate(names)]


def verdict(members: list[Member]) -> bool:
    return fleet_health(members, FRACTION, MIN_NODES, MIN_GROUPS).tripped


@pytest.mark.parametrize(
    ("members", "tripped"),
    [
        # the base deployment: two nodes, one or both bad: never
        ([Member("dgx-a", None, False), Member("dgx-b", None, True)], False),
        ([Member("dgx-a", None, False), Member("dgx-b", None, False)], False),
        # four nodes without groups, all bad: below five nodes the fraction is not counted
        ([Member(f"n{i}", None, False) for i in range(4)], False),
        # five nodes: one bad is 20 %, not more; two are 40 %
        ([Member(f"n{i}", None, i >= 1) for i in range(5)], False),
        ([Member(f"n{i}", None, i >= 2) for i in range(5)], True),
        # three groups: one stuck group is restarted (one is never the fleet's fault), two of three trip it
        (fleet({"dgx-a"}), False),
        (fleet({"dgx-a", "dgx-2"}), True),
        # 64 nodes: 12 bad is 18.75 %, 13 is 20.3 %
        ([Member(f"n{i}", None, i >= 12) for i in range(64)], False),
        ([Member(f"n{i}", None, i >= 13) for i in range(64)], True),
    ],
)
def test_the_rule(members: list[Member], tripped: bool) -> None:
    assert verdict(members) is tripped


def test_groups_trip_it_below_the_node_count() -> None:
    """Four nodes in four groups (one each): nodes are not counted below five, groups are from three."""
    members = [Member(f"n{i}", f"g{i}", i >= 2) for i in range(4)]
    health = fleet_health(members, FRACTION, MIN_NODES, MIN_GROUPS)
    assert health.tripped and "2 of 4 (50 %) groups unhealthy: g0, g1" in health.reason and "nodes" not in health.reason


def _doc(node: str, status: Status, group: str) -> ResultsDocument:
    finding = (Finding("IB_PORT_DOWN", Status.CRITICAL, "Down", "mlx5_0/1"),) if status is Status.CRITICAL else ()
    result = CheckResult("infiniband", status, "x", finding)
    return ResultsDocument.of(node, [result], 0.0, group=group)


def test_members_from_the_peers_last_state() -> None:
    peers = [
        PeerState("http://b:9835", "b:9835", _doc("dgx-b", Status.CRITICAL, "g1"), None, 0.0),
        PeerState("http://c:9835", "c:9835", _doc("dgx-c", Status.WARNING, "g1"), None, 0.0),
        PeerState("http://d:9835", "d:9835", None, "ConnectError: refused", 0.0),  # no answer: not healthy
    ]
    members = members_from_states("dgx-a", "g0", "unknown", peers)
    assert members == [
        Member("dgx-a", "g0", True),  # unknown is no fault
        Member("dgx-b", "g1", False),
        Member("dgx-c", "g1", True),
        Member("d:9835", None, False),
    ]


def test_the_daemon_feeds_remediation_its_peers(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(f'[node]\nname = "dgx-a"\ngroup = "g0"\n[paths]\nstate_dir = "{tmp_path / "state"}"\n')
    daemon = Daemon(load_config(path), path, notifier=Notifier({}))
    daemon.store.put(CheckResult("infiniband", Status.OK, "8 rails"))
    assert daemon.remediator.fleet is not None and daemon.remediator.fleet() == [Member("dgx-a", "g0", True)]
    doc = _doc("dgx-b", Status.CRITICAL, "g1")
    fetched = PeerFetch("http://b:9835", "b:9835", doc.compared(), None, 0.1, document=doc, fetched_at=1.0)
    daemon.peer_states.record([fetched, PeerFetch("http://c:9835", "c:9835", None, "refused", 0.1)])
    assert daemon.remediator.fleet() == [Member("dgx-a", "g0", True), Member("dgx-b", "g1", False),
                                         Member("c:9835", None, False)]  # fmt: skip
    health = daemon.remediator.fleet_health()
    assert health is not None and health.bad_nodes == ("c:9835", "dgx-b") and not health.tripped  # three nodes


async def test_remediation_refuses_pages_and_resumes_when_the_fleet_recovers(tmp_path: Path) -> None:
    """Two of three groups bad at once (this node among them): the restart vLLM's death asks for is refused,
    audited with the fleet's figures, paged once; the metrics say so. The fleet back but this node: it restarts."""
    seen: list[str] = []
    view = fleet({"dgx-a", "dgx-2"})
    r = remediator(tmp_path, vllm_app(seen), {"vllm": DEAD})
    r.fleet = lambda: view
    await settle(r)
    refused = [e for e in events(tmp_path) if e["event"] == "decision"]
    assert [(e["verdict"], e["action"]) for e in refused] == [("refuse", "restart_vllm")]
    assert "fleet breaker: 2 of 6 (33 %) nodes unhealthy" in refused[0]["reason"]
    assert "2 of 3 (67 %) groups unhealthy: g0, g1" in refused[0]["reason"]
    assert [e["outcome"] for e in events(tmp_path) if e["event"] == "page"] == ["sent"]
    assert not [e for e in events(tmp_path) if e["event"] == "action_started"]
    assert sum("/api/v2/alerts" in s for s in seen) == 1 and "restart_vllm for" in seen[-1]
    metrics = r.metrics()
    assert metrics["fleet_breaker_open"] and metrics["fleet_refused"] == 1 and not metrics["breaker_open"]

    await settle(r)  # still tripped: refused again, no second page
    assert [e["outcome"] for e in events(tmp_path) if e["event"] == "page"] == ["sent"]

    view = fleet({"dgx-a"})
    await settle(r)
    (action,) = [e for e in events(tmp_path) if e["event"] == "action"]
    assert action["action"] == "restart_vllm" and action["outcome"] == "success"
    assert not r.metrics()["fleet_breaker_open"]


async def test_on_two_nodes_both_down_it_still_acts(tmp_path: Path) -> None:
    r = remediator(tmp_path, vllm_app([]), {"vllm": DEAD})
    r.fleet = lambda: [Member("dgx-a", None, False), Member("dgx-b", None, False)]
    await settle(r)
    (action,) = [e for e in events(tmp_path) if e["event"] == "action"]
    assert action["outcome"] == "success" and not r.metrics()["fleet_breaker_open"]


def test_the_settings_are_bounded() -> None:
    import msgspec

    from dgxdoctor.config import RemediationSettings
    from dgxdoctor.validation import validate

    assert validate(RemediationSettings, {}).fleet_breaker_fraction == 0.2
    for bad in ({"fleet_breaker_fraction": 0}, {"fleet_breaker_fraction": 1.5}, {"fleet_breaker_min_nodes": 1},
                {"fleet_breaker_min_groups": 10**9}):  # fmt: skip
        with pytest.raises(msgspec.ValidationError):
            validate(RemediationSettings, bad)
