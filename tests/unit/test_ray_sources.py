"""Parsers of the Ray dashboard API and of `ray status` text, over real captures (tests/fixtures/ray); the procfs
parts are in test_procfs.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dgxdoctor.sources.ray_api import (
    RayApiError,
    cluster_view,
    parse_cluster_status,
    parse_nodes_detail,
    parse_nodes_summary,
    parse_version,
)
from dgxdoctor.sources.ray_status import RayStatusError, looks_like_ray_status, parse_ray_status

RAY = Path(__file__).resolve().parents[1] / "fixtures" / "ray"
HEAD_ID = "2d41a9eb0ee60496732d0ea5772d910a1e2389743983eb007c2e28dd"
WORKER_ID = "7cf0e4d13538d46a83b175ecc2c9162830812885b35ce9a2a1d7170c"


def read(name: str) -> bytes:
    return (RAY / name).read_bytes()


# --- /api/v0/nodes?detail=1 and /nodes?view=summary


def test_nodes_detail_healthy() -> None:
    nodes = parse_nodes_detail(read("healthy-nodes-detail.json"))
    assert [(n.node_id, n.node_ip, n.state, n.is_head, n.gpus) for n in nodes] == [
        (HEAD_ID, "10.77.0.1", "ALIVE", True, 8.0),
        (WORKER_ID, "10.77.0.2", "ALIVE", False, 8.0),
    ]
    assert all(n.state_message is None for n in nodes)


def test_nodes_detail_crashed_worker_has_its_state_message() -> None:
    nodes = {n.node_id: n for n in parse_nodes_detail(read("dead-nodes-detail.json"))}
    worker = nodes[WORKER_ID]
    assert worker.state == "DEAD" and not worker.alive
    assert worker.state_message == "Unexpected termination: health check failed due to missing too many heartbeats"
    assert worker.gpus == 8.0


def test_nodes_detail_clean_stop_differs_from_crash() -> None:
    messages = {n.state_message for n in parse_nodes_detail(read("stopped-nodes-detail.json")) if not n.alive}
    assert messages == {
        "Unexpected termination: health check failed due to missing too many heartbeats",
        "Expected termination: received SIGTERM",
    }


def test_nodes_summary_matches_detail_once_settled() -> None:
    summary = parse_nodes_summary(read("dead-nodes-summary.json"))
    # The summary drops a dead node's resources (the state API keeps them): GPUs count only for ALIVE nodes.
    assert {(n.node_id, n.state, n.gpus, n.is_head) for n in summary} == {
        (HEAD_ID, "ALIVE", 8.0, True),
        (WORKER_ID, "DEAD", 0.0, False),
    }
    healthy = parse_nodes_summary(read("healthy-nodes-summary.json"))
    assert [n.node_ip for n in healthy] == ["10.77.0.1", "10.77.0.2"]


# --- /api/cluster_status


def test_cluster_status_healthy_has_no_demands() -> None:
    status = parse_cluster_status(read("healthy-cluster-status.json"))
    assert (status.gpus_used, status.gpus_total, status.demands) == (0.0, 16.0, ())


def test_cluster_status_pending_demands_and_placement_groups() -> None:
    status = parse_cluster_status(read("pending-cluster-status.json"))
    assert (status.gpus_used, status.gpus_total) == (12.0, 16.0)
    tasks = [d for d in status.demands if d.kind == "tasks"]
    groups = [d for d in status.demands if d.kind == "placement_group"]
    assert [(d.shape, d.count, d.gpus) for d in tasks] == [("{'GPU': 32.0}", 1, 32.0)]
    assert [(d.shape, d.count, d.gpus) for d in groups] == [
        ("{'CPU': 0.001, 'GPU': 8.0} * 2, {'GPU': 8.0} * 1 (STRICT_SPREAD)", 1, 24.0)
    ]


def test_api_demand_shapes_read_like_ray_status_lines() -> None:
    """The same moment through the API and through `ray status`: the shapes print the same."""
    api = {(d.kind, d.shape) for d in parse_cluster_status(read("pending-cluster-status.json")).demands}
    text = {(d.kind, d.shape) for d in parse_ray_status(read("pending-ray-status.txt").decode()).demands}
    assert api == text


def test_cluster_status_before_first_autoscaler_report() -> None:
    payload = json.dumps({"result": True, "msg": "", "data": {"clusterStatus": None}})
    status = parse_cluster_status(payload)
    assert (status.gpus_total, status.gpus_used, status.demands) == (None, None, ())


def test_cluster_view_counts_gpus_of_alive_nodes_only() -> None:
    """After a rejoin the autoscaler report still counts the dead node (24 GPUs); the ALIVE nodes do not."""
    status = parse_cluster_status(read("rejoined-cluster-status.json"))
    nodes = parse_nodes_detail(read("rejoined-nodes-detail.json"))
    view = cluster_view(nodes, status)
    assert view.nodes_alive == 2
    assert view.gpus_total == 16.0
    assert len(view.dead_nodes) == 1


def test_version() -> None:
    assert parse_version(read("version.json")) == "2.60.0"
    assert parse_version(b'{"version": "4"}') is None


# --- bad payloads: a clear error naming what is wrong


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b"<html>502 Bad Gateway</html>", "not JSON"),
        (read("healthy-nodes-detail.json")[:300], "not JSON"),  # truncated body
        (b"[1, 2]", "expected a JSON object"),
        (b'{"result": false, "msg": "Failed to get nodes: timeout", "data": {}}', "Failed to get nodes: timeout"),
        (b'{"result": true, "msg": ""}', "no 'data' object"),
        (b'{"result": true, "data": {"result": {"total": 0}}}', "missing key 'result'"),
        (b'{"result": true, "data": {"result": {"result": [{"node_id": "x"}]}}}', "missing key 'state'"),
        (
            b'{"result": true, "data": {"result": {"result": [{"node_id": "x", "state": "ALIVE",'
            b' "resources_total": {"GPU": "eight"}}]}}}',
            "GPU resource is 'eight'",
        ),
    ],
)
def test_nodes_detail_bad_payloads(payload: bytes, expected: str) -> None:
    with pytest.raises(RayApiError, match=expected) as err:
        parse_nodes_detail(payload)
    assert "/api/v0/nodes" in str(err.value)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"clusterStatus": []}, "clusterStatus is list"),
        ({"clusterStatus": {}}, "missing key 'loadMetricsReport'"),
        ({"clusterStatus": {"loadMetricsReport": {"usage": {"GPU": [1]}}}}, "usage of GPU"),
        (
            {"clusterStatus": {"loadMetricsReport": {"resourceDemand": [[{"GPU": 1}]]}}},
            "expected \\[resources, count\\]",
        ),
        ({"clusterStatus": {"loadMetricsReport": {"pgDemand": [[{"strategy": "PACK"}, 1]]}}}, "missing key 'bundles'"),
    ],
)
def test_cluster_status_bad_payloads(data: dict[str, object], expected: str) -> None:
    with pytest.raises(RayApiError, match=expected):
        parse_cluster_status(json.dumps({"result": True, "data": data}))


def test_nodes_summary_bad_payload() -> None:
    with pytest.raises(RayApiError, match="missing key 'raylet'"):
        parse_nodes_summary(b'{"result": true, "data": {"summary": [{"ip": "10.0.0.1"}]}}')


# --- `ray status` text


@pytest.mark.parametrize(
    ("name", "alive", "gpus_used", "gpus_total", "demands", "failures"),
    [
        ("healthy-ray-status.txt", 2, 0.0, 16.0, [], 0),
        ("pending-ray-status.txt", 2, 12.0, 16.0, [("tasks", 1, 32.0), ("placement_group", 1, 24.0)], 0),
        ("pending-ray-status-verbose.txt", 2, 12.0, 16.0, [("tasks", 1, 32.0), ("placement_group", 1, 24.0)], 0),
        ("dead-ray-status.txt", 1, 0.0, 8.0, [], 0),
        ("dead-pending-ray-status.txt", 1, 8.0, 8.0, [("tasks", 1, 32.0), ("placement_group", 1, 24.0)], 0),
        ("rejoined-ray-status.txt", 2, 0.0, 24.0, [], 0),
        (
            "older-2020-autoscaler-ray-status.txt",
            22,
            2.0,
            2.0,
            [("tasks", 150, 0.0), ("placement_group", 420, 0.0), ("request_resources", 100, 0.0)],
            1,
        ),
        ("older-2021-ray-status.txt", 2, 0.0, 0.0, [("tasks", 1, 0.0)], 1),
        ("older-2023-healthy-verbose-ray-status.txt", 3, 0.0, 0.0, [], 0),
        ("older-2023-idle-ray-status.txt", 1, 0.0, 0.0, [], 0),
    ],
)
def test_ray_status_formats(
    name: str,
    alive: int,
    gpus_used: float,
    gpus_total: float,
    demands: list[tuple[str, int, float]],
    failures: int,
) -> None:
    text = read(name).decode()
    assert looks_like_ray_status(text)
    report = parse_ray_status(text)
    view = report.view()
    assert view.nodes_alive == alive
    assert (view.gpus_used, view.gpus_total) == (gpus_used, gpus_total)
    assert [(d.kind, d.count, d.gpus) for d in report.demands] == demands
    assert all(d.line for d in report.demands)
    assert len(report.failures) == failures


def test_ray_status_keeps_failure_and_pending_lines() -> None:
    report = parse_ray_status(read("older-2020-autoscaler-ray-status.txt").decode())
    assert report.failures == ("p3.2xlarge: RayletUnexpectedlyDied (ip: 1.2.3.6)",)
    assert report.pending_nodes[0] == "m4.4xlarge, 2 launching"
    assert report.timestamp == "2020-12-28 01:02:03"
    assert report.usage["CPU"].total == 544.0


def test_ray_status_rejects_other_text() -> None:
    assert not looks_like_ray_status("NCCL INFO Bootstrap : Using eth0\n")
    with pytest.raises(RayStatusError, match="no Node status, Resources, Usage or Demands section"):
        parse_ray_status("hello\nworld\n")


def test_ray_status_names_a_line_it_does_not_understand() -> None:
    text = read("pending-ray-status.txt").decode().replace("1+ pending tasks/actors", "many waiting")
    with pytest.raises(RayStatusError, match="demand line not understood"):
        parse_ray_status(text)


@pytest.mark.parametrize(
    ("name", "alive", "gpus_total", "demands"),
    [
        # Ray 1.6: "Cluster status", nodes as "N node(s) with resources", placement-group bookkeeping resources
        ("versions/ray_17892_cluster_status_pg.txt", 1, 0.0, 7),
        # 2022: Healthy:/Usage:/Demands: with "(no resource demands)" and a shell prompt after the output
        ("versions/ray_26066_healthy_tpu_2022.txt", 5, 0.0, 0),
        # 2026: the indentation lost in the paste
        ("versions/gpustack_5509_unindented_tpu.txt", 2, 1.0, 1),
    ],
)
def test_ray_status_layouts_of_every_era(name: str, alive: int, gpus_total: float, demands: int) -> None:
    text = read(name).decode()
    assert looks_like_ray_status(text)
    report = parse_ray_status(text)
    view = report.view()
    assert (view.nodes_alive, view.gpus_total, len(report.demands)) == (alive, gpus_total, demands)


def test_ray_status_bookkeeping_resources_are_not_the_gpu_count() -> None:
    report = parse_ray_status(read("versions/ray_17892_cluster_status_pg.txt").decode())
    assert report.usage["CPU"].total == 16.0
    assert "CPU_group_0_625ace126f848864c46f50dced5e0ef7" in report.usage
    assert report.view().gpus_total == 0.0


@pytest.mark.parametrize(
    "text",
    [
        "Usage:\n 0.0/8.0 GPU\n",
        "Total Usage:\n0.0/16.0 GPU\n",
        "Pending Demands:\n {'GPU': 8.0} * 2 (STRICT_SPREAD): 1+ pending placement groups\n",
        "Demands:\n (no resource demands)\n",
        "Active:\n 1 node_7cf0e4d13538d46a83b175ecc2c9162830812885b35ce9a2a1d7170c\n",
        "Node status\n---------------------------------------------------------------\n",
    ],
)
def test_fragments_of_ray_status_are_recognised(text: str) -> None:
    assert looks_like_ray_status(text)
    parse_ray_status(text)


def test_a_fragment_leaves_unknown_what_it_lacks() -> None:
    report = parse_ray_status("Total Usage:\n 0.0/8.0 GPU\n")
    assert report.nodes_alive is None and report.view().gpus_total == 8.0
    report = parse_ray_status("Active:\n 1 node_7cf0e4d13538d46a83b175ecc2c9162830812885b35ce9a2a1d7170c\n")
    assert report.nodes_alive == 1 and report.view().gpus_total is None


def test_diagnose_of_ray_monitor_log_reads_the_latest_status_report() -> None:
    """Ray's monitor.log prints the autoscaler status every 5 s: a day of it is one cluster of one node, not 17,280
    (a healthy run's monitor.log read 120 nodes ALIVE before, benchmarks/healthy_days.py)."""
    from dgxdoctor.diagnose.registry import Thresholds, diagnose

    text = (RAY / "monitor-log-repeated-status.txt").read_text()
    assert text.count("Autoscaler status:") == 2
    report = parse_ray_status(text)
    assert report.timestamp == "2026-12-05 15:17:13.941486"
    assert report.view().nodes_alive == 1
    (status,) = [d for d in diagnose(text, thresholds=Thresholds(ray_expected_nodes=1, ray_expected_gpus=0))
                 if d.kind == "ray-status"]  # fmt: skip
    assert status.data["nodes_alive"] == 1
    assert all(f.status.value == "ok" for f in status.findings), status.findings
