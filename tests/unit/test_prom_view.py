"""Prometheus as the cluster view, the parts a real Prometheus is not needed for: Prometheus down falls back to the
peers (or is every node UNKNOWN, named), the agents' peer comparison fetches nothing, and the one query's answer read
into nodes (test_fleet_prometheus.py runs the real thing)."""

from __future__ import annotations

import socket

import httpx

from dgxdoctor.checks.peer_compare import PeerCompareCheck, PeerCompareSettings
from dgxdoctor.commands.cluster import run_cluster_check
from dgxdoctor.config import parse_config
from dgxdoctor.environment import Environment, Fleet, Peers
from dgxdoctor.fleet.prom_view import parse_view, query
from dgxdoctor.result import Status


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_prometheus_down_and_no_peers_is_unknown_and_named() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    config = parse_config({"node": {"name": "n1"}, "fleet": {"prometheus_url": url}})
    view = run_cluster_check(config, [], None, 3.0, cached=True)
    assert view.status is Status.UNKNOWN
    assert [(n.node, n.url) for n in view.nodes] == [("prometheus", url)]
    assert "ConnectError" in str(view.nodes[0].error)


def test_prometheus_down_falls_back_to_the_peers() -> None:
    url, peer = f"http://127.0.0.1:{closed_port()}", f"http://127.0.0.1:{closed_port()}"
    config = parse_config({"node": {"name": "n1"}, "fleet": {"prometheus_url": url}, "daemon": {"peers": [peer]}})
    view = run_cluster_check(config, [], None, 3.0, cached=True)
    assert [n.url for n in view.nodes] == [None, peer]  # this node and the configured peer, asked over the mesh


def test_peer_compare_fetches_nothing_with_prometheus() -> None:
    asked: list[str] = []
    env = Environment(
        node="n1",
        http_transport=httpx.MockTransport(lambda r: asked.append(str(r.url)) or httpx.Response(503)),
        fleet=Fleet(lambda check: {}, lambda: Peers(("http://n2:9835",), None, 1.0, "http://prom:9090")),
    )
    result = PeerCompareCheck(PeerCompareSettings(), env).run()
    assert result.status is Status.SKIPPED and "Prometheus" in result.summary
    assert asked == []


def test_the_answer_read_into_nodes() -> None:
    assert 'job="dgxdoctor"' in query("dgxdoctor")

    def series(name: str, value: str = "1", **labels: str) -> dict[str, object]:
        return {"metric": {"__name__": name, **labels}, "value": [0, value]}

    result = [
        series("dgxdoctor_node_info", node="n1", group="g", instance="h1:9835"),
        series("dgxdoctor_node_info", node="n2", group="g", instance="h2:9835"),
        series("dgxdoctor_check_status", "0", node="n1", check="xid"),
        series("dgxdoctor_check_status", "2", node="n2", check="xid"),
        series(
            "dgxdoctor_finding_info", node="n2", check="xid", code="XID_79", subject="0000:3b:00", status="critical"
        ),
        series("dgxdoctor_node_gone", node="n3", group="h", instance="h3:9835"),
        series("ALERTS", alertname="DgxdoctorNodeAsymmetricGpuUtilization", alertstate="firing", node="n1", group="g"),
        {"metric": "not labels"},
    ]
    view = parse_view(result)
    assert [(n.node, n.group, n.instance, n.doc and n.doc["status"]) for n in view.nodes] == [
        ("n1", "g", "h1:9835", "ok"), ("n2", "g", "h2:9835", "critical"), ("n3", "h", "h3:9835", None)
    ]  # fmt: skip
    n2 = view.nodes[1].doc
    assert n2 is not None
    assert n2["checks"][0]["findings"] == [
        {"code": "XID_79", "status": "critical", "subject": "0000:3b:00", "message": "", "group": "g"}
    ]
    assert [(f.code, f.subject) for f in view.comparison.findings] == [("PEER_GPU_UTILIZATION_IMBALANCE", "n1")]
