"""The ray check's decisions over captured dashboard payloads, and `dgxdoctor diagnose` of `ray status` text.

The dashboard is served from the real captures in tests/fixtures/ray through an httpx MockTransport; procfs is a
small tree under tmp_path. The real cluster runs in tests/integration/test_ray_cluster.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx
import pytest

from conftest import run_cli
from dgxdoctor.checks.ray import RayCheck, RaySettings
from dgxdoctor.config import ConfigError, parse_config
from dgxdoctor.diagnose.base import diagnose_text
from dgxdoctor.diagnose.ray_status import RayStatusAnalyzer
from dgxdoctor.diagnose.registry import ANALYZERS
from dgxdoctor.environment import Environment
from dgxdoctor.judge.ray import cluster_findings
from dgxdoctor.result import CheckResult, Status
from dgxdoctor.sources.commands import CommandNotFound, CommandResult, CommandRunner
from dgxdoctor.sources.ray_api import ClusterView, Demand
from dgxdoctor.validation import validate
from proctree import stat_line

RAY = Path(__file__).resolve().parents[1] / "fixtures" / "ray"
WORKER_ID = "7cf0e4d13538d46a83b175ecc2c9162830812885b35ce9a2a1d7170c"
REMOTE = "http://10.77.0.1:8265"
LOCAL = "http://127.0.0.1:8265"

Reply = tuple[int, bytes] | Exception


def fixture(name: str) -> bytes:
    return (RAY / name).read_bytes()


def scenario(prefix: str) -> dict[str, Reply]:
    return {
        "/api/v0/nodes?detail=1": (200, fixture(f"{prefix}-nodes-detail.json")),
        "/api/cluster_status": (200, fixture(f"{prefix}-cluster-status.json")),
        "/api/version": (200, fixture("version.json")),
    }


def dashboard(routes: Mapping[str, Reply], seen: list[httpx.Request] | None = None) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        path = request.url.raw_path.decode()
        reply = routes.get(path, (404, b"404: Not Found"))
        if isinstance(reply, Exception):
            raise reply
        return httpx.Response(reply[0], content=reply[1])

    return httpx.MockTransport(handle)


REFUSED: Mapping[str, Reply] = {
    path: httpx.ConnectError("[Errno 111] Connection refused")
    for path in ("/api/v0/nodes?detail=1", "/api/cluster_status", "/api/version")
}


def proc_tree(root: Path, listening: bool = True, procs: Mapping[int, tuple[str, str]] | None = None) -> Path:
    (root / "net").mkdir(parents=True)
    tcp = fixture("head-proc-net-tcp.txt") if listening else fixture("head-proc-net-tcp.txt").splitlines()[0]
    tcp6 = fixture("head-proc-net-tcp6.txt") if listening else fixture("head-proc-net-tcp6.txt").splitlines()[0]
    (root / "net" / "tcp").write_bytes(tcp)
    (root / "net" / "tcp6").write_bytes(tcp6)
    for pid, (comm, state) in (procs or {}).items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "comm").write_text(comm + "\n")
        (root / str(pid) / "stat").write_text(stat_line(pid, comm, state))
        uid = os.geteuid()  # the test's own: a trusted raylet (procfs.trusted_uids)
        (root / str(pid) / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    return root


def no_commands(argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
    raise CommandNotFound(f"{argv[0]} not found in PATH")


def ray_status_prints(name: str, calls: list[list[str]] | None = None, returncode: int = 0) -> CommandRunner:
    def run(argv: Sequence[str], timeout_s: float = 10.0) -> CommandResult:
        if calls is not None:
            calls.append(list(argv))
        out = fixture(name).decode() if returncode == 0 else ""
        err = "" if returncode == 0 else "ConnectionError: Could not find any running Ray instance."
        return CommandResult(tuple(argv), returncode, out, err)

    return run


def run_check(
    tmp_path: Path,
    routes: Mapping[str, Reply],
    *,
    listening: bool = True,
    procs: Mapping[int, tuple[str, str]] | None = None,
    seen: list[httpx.Request] | None = None,
    runner: CommandRunner = no_commands,
    **settings: object,
) -> CheckResult:
    env = Environment(
        node="test",
        proc_root=proc_tree(tmp_path / "proc", listening, procs),
        state_dir=tmp_path / "state",
        http_transport=dashboard(routes, seen),
        run_command=runner,
    )
    settings.setdefault("dashboard_url", REMOTE)
    return RayCheck(validate(RaySettings, settings), env).run()


def codes(result: CheckResult) -> dict[str, Status]:
    return {f.code: f.status for f in result.findings}


def samples(result: CheckResult) -> dict[str, float]:
    return {s.metric.name + "".join(f"{{{v}}}" for v in s.labels.values()): s.value for s in result.samples}


# --- the head's verdict


def test_healthy_remote_head(tmp_path: Path) -> None:
    result = run_check(tmp_path, scenario("healthy"))
    assert result.status is Status.OK, result.findings
    assert result.summary.startswith("2/2 nodes ALIVE, 16/16 GPUs, 0 used")
    assert "ports are checked there" in result.summary
    assert samples(result) == {
        "dgxdoctor_ray_nodes_alive": 2,
        "dgxdoctor_ray_nodes_dead": 0,
        "dgxdoctor_ray_gpus_total": 16,
        "dgxdoctor_ray_gpus_used": 0,
        "dgxdoctor_ray_pending_demands": 0,
        "dgxdoctor_ray_placement_groups_pending": 0,
    }
    assert result.facts == {"ray_cluster_version": "2.60.0"}


def test_healthy_head_on_loopback_checks_its_ports(tmp_path: Path) -> None:
    result = run_check(tmp_path, scenario("healthy"), dashboard_url=LOCAL)
    assert result.status is Status.OK
    assert samples(result)["dgxdoctor_ray_port_listening{6379}"] == 1
    assert samples(result)["dgxdoctor_ray_port_listening{8265}"] == 1


def test_head_ports_not_listening(tmp_path: Path) -> None:
    result = run_check(tmp_path, scenario("healthy"), dashboard_url=LOCAL, listening=False, gcs_port=6380)
    assert result.status is Status.CRITICAL
    assert {f.subject for f in result.findings if f.code == "RAY_PORT_NOT_LISTENING"} == {"port 6380", "port 8265"}


def test_dead_worker_is_critical_and_names_the_node(tmp_path: Path) -> None:
    result = run_check(tmp_path, scenario("dead"))
    assert result.status is Status.CRITICAL
    dead = next(f for f in result.findings if f.code == "RAY_NODE_DEAD")
    assert dead.subject == WORKER_ID
    assert "10.77.0.2" in dead.message and "missing too many heartbeats" in dead.message
    gpus = next(f for f in result.findings if f.code == "RAY_GPUS_MISSING")
    assert "8 of 16 GPUs" in gpus.message
    assert "RAY_NODES_MISSING" not in codes(result)  # the dead node explains the missing one
    # The tutorial's error 5 fix is the suggested action.
    assert result.action is not None
    assert "ufw allow 6379/tcp" in result.action.remedy
    assert "ray start --address=<head IP>:6379 --num-gpus=8" in result.action.remedy
    assert samples(result)["dgxdoctor_ray_nodes_dead"] == 1
    assert samples(result)["dgxdoctor_ray_gpus_total"] == 8


def test_worker_that_never_joined(tmp_path: Path) -> None:
    """Only the head, no dead node: the worker never reached the head (firewall, wrong address)."""
    nodes = json.loads(fixture("healthy-nodes-detail.json"))
    nodes["data"]["result"]["result"] = nodes["data"]["result"]["result"][:1]
    routes = {**scenario("healthy"), "/api/v0/nodes?detail=1": (200, json.dumps(nodes).encode())}
    result = run_check(tmp_path, routes)
    assert codes(result) == {"RAY_NODES_MISSING": Status.CRITICAL, "RAY_GPUS_MISSING": Status.CRITICAL}


def test_rejoined_worker_is_ok(tmp_path: Path) -> None:
    result = run_check(tmp_path, scenario("rejoined"))
    assert result.status is Status.OK
    assert codes(result) == {"RAY_NODE_REJOINED": Status.OK}
    assert "16/16 GPUs" in result.summary


def test_clean_stop_and_crash_are_both_reported(tmp_path: Path) -> None:
    routes = {**scenario("dead"), "/api/v0/nodes?detail=1": (200, fixture("stopped-nodes-detail.json"))}
    result = run_check(tmp_path, routes)
    messages = [f.message for f in result.findings if f.code == "RAY_NODE_DEAD"]
    assert len(messages) == 2
    assert any("Expected termination: received SIGTERM" in m for m in messages)


def test_dead_node_of_the_past_is_not_critical_when_the_cluster_is_complete(tmp_path: Path) -> None:
    result = run_check(tmp_path, scenario("dead"), expected_nodes=1, expected_gpus=8)
    assert result.status is Status.OK
    assert codes(result) == {"RAY_NODE_DEAD_EARLIER": Status.OK}


def test_pending_demands_and_placement_groups(tmp_path: Path) -> None:
    result = run_check(tmp_path, scenario("pending"))
    assert result.status is Status.WARNING
    assert codes(result) == {"RAY_PENDING_DEMAND": Status.WARNING, "RAY_PLACEMENT_GROUP_PENDING": Status.WARNING}
    demand = next(f for f in result.findings if f.code == "RAY_PENDING_DEMAND")
    assert "{'GPU': 32.0}" in demand.message and "can never fit" in demand.message
    s = samples(result)
    assert (s["dgxdoctor_ray_gpus_used"], s["dgxdoctor_ray_pending_demands"]) == (12, 1)
    assert s["dgxdoctor_ray_placement_groups_pending"] == 1


def test_more_nodes_and_gpus_than_expected_warn(tmp_path: Path) -> None:
    result = run_check(tmp_path, scenario("healthy"), expected_nodes=1, expected_gpus=8)
    assert codes(result) == {"RAY_NODES_UNEXPECTED": Status.WARNING, "RAY_GPUS_UNEXPECTED": Status.WARNING}


def test_cluster_status_failure_keeps_the_node_verdict(tmp_path: Path) -> None:
    routes = {**scenario("dead"), "/api/cluster_status": (500, b"500 Internal Server Error")}
    result = run_check(tmp_path, routes)
    assert result.status is Status.CRITICAL
    assert codes(result)["RAY_CLUSTER_STATUS_UNAVAILABLE"] is Status.UNKNOWN
    assert "dgxdoctor_ray_pending_demands" not in samples(result)  # unknown, not zero


def test_old_ray_without_state_api_uses_the_node_summary(tmp_path: Path) -> None:
    routes = {
        "/nodes?view=summary": (200, fixture("dead-nodes-summary.json")),
        "/api/cluster_status": (200, fixture("dead-cluster-status.json")),
    }
    result = run_check(tmp_path, routes)
    assert result.status is Status.CRITICAL
    assert next(f for f in result.findings if f.code == "RAY_NODE_DEAD").subject == WORKER_ID
    assert "ray_cluster_version" not in result.facts


@pytest.mark.parametrize(
    "reply", [(200, b"<html>gateway</html>"), (500, b"boom"), (200, fixture("healthy-nodes-detail.json")[:100])]
)
def test_unusable_node_list_is_unknown(tmp_path: Path, reply: Reply) -> None:
    result = run_check(tmp_path, {"/api/v0/nodes?detail=1": reply})
    assert result.status is Status.UNKNOWN
    assert codes(result) == {"RAY_API_ERROR": Status.UNKNOWN}
    assert "/api/v0/nodes" in result.findings[0].message


# --- token authentication


def test_token_is_sent_as_bearer(tmp_path: Path) -> None:
    token = tmp_path / "auth_token"
    token.write_text("abc123\n")
    seen: list[httpx.Request] = []
    result = run_check(tmp_path, scenario("healthy"), seen=seen, auth_token_file=str(token))
    assert result.status is Status.OK
    assert {r.headers.get("authorization") for r in seen} == {"Bearer abc123"}


def test_unauthorized_is_unknown_with_the_remedy(tmp_path: Path) -> None:
    routes = {"/api/v0/nodes?detail=1": (401, b"Unauthorized: Missing authentication token")}
    result = run_check(tmp_path, routes)
    assert result.status is Status.UNKNOWN
    finding = result.findings[0]
    assert finding.code == "RAY_API_UNAUTHORIZED"
    assert "no token sent" in finding.message
    assert finding.remedy is not None and "auth_token_file" in finding.remedy


def test_unreadable_token_file_is_unknown(tmp_path: Path) -> None:
    result = run_check(tmp_path, scenario("healthy"), auth_token_file=str(tmp_path / "missing"))
    assert codes(result) == {"RAY_AUTH_TOKEN_UNREADABLE": Status.UNKNOWN}


# --- roles when the dashboard does not answer


def test_no_ray_here_is_skipped(tmp_path: Path) -> None:
    result = run_check(tmp_path, REFUSED, dashboard_url=LOCAL)
    assert result.status is Status.SKIPPED
    assert "no Ray here" in result.summary and "Connection refused" in result.summary


def test_configured_remote_head_that_does_not_answer_warns(tmp_path: Path) -> None:
    result = run_check(tmp_path, REFUSED, dashboard_url=REMOTE)
    assert codes(result) == {"RAY_DASHBOARD_UNREACHABLE": Status.WARNING}
    assert "8265/tcp" in (result.findings[0].remedy or "")
    with_raylet = run_check(tmp_path / "w", REFUSED, dashboard_url=REMOTE, procs={9: ("raylet", "S")})
    assert with_raylet.status is Status.WARNING
    assert "raylet running (pid 9)" in with_raylet.summary


def test_refused_with_a_raylet_is_a_worker(tmp_path: Path) -> None:
    result = run_check(tmp_path, REFUSED, dashboard_url=LOCAL, procs={4242: ("raylet", "S")})
    assert result.status is Status.OK
    assert "worker node: raylet running (pid 4242)" in result.summary
    assert "cluster checks run on the head" in result.summary


def test_worker_role_with_a_zombie_raylet_is_critical(tmp_path: Path) -> None:
    result = run_check(tmp_path, {}, role="worker", procs={4242: ("raylet", "Z")})
    assert codes(result) == {"RAY_RAYLET_DOWN": Status.CRITICAL}


def test_worker_role_never_asks_the_dashboard(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []
    result = run_check(tmp_path, scenario("healthy"), seen=seen, role="worker", procs={7: ("raylet", "S")})
    assert result.status is Status.OK
    assert seen == []


def test_gcs_running_but_dashboard_refused_is_critical(tmp_path: Path) -> None:
    procs = {100: ("gcs_server", "S"), 101: ("raylet", "S")}
    result = run_check(tmp_path, REFUSED, dashboard_url=LOCAL, procs=procs)
    assert result.status is Status.CRITICAL
    assert "RAY_DASHBOARD_DOWN" in codes(result)
    assert "gcs_server pid 100" in result.summary


def test_dashboard_down_falls_back_to_ray_status(tmp_path: Path) -> None:
    """The GCS still answers `ray status`: the cluster verdict survives the dashboard."""
    calls: list[list[str]] = []
    token = tmp_path / "auth_token"
    token.write_text("abc")
    result = run_check(
        tmp_path,
        REFUSED,
        dashboard_url=LOCAL,
        procs={100: ("gcs_server", "S")},
        runner=ray_status_prints("dead-ray-status.txt", calls),
        ray_command="/opt/ray/bin/ray",
        auth_token_file=str(token),
    )
    assert calls == [
        ["env", "RAY_AUTH_MODE=token", f"RAY_AUTH_TOKEN_PATH={token}", "/opt/ray/bin/ray", "status",
         "--address=127.0.0.1:6379"]
    ]  # fmt: skip
    found = codes(result)
    assert found["RAY_DASHBOARD_DOWN"] is Status.CRITICAL
    assert found["RAY_GPUS_MISSING"] is Status.CRITICAL
    assert "ray status: 1/2 nodes ALIVE, 8/16 GPUs" in result.summary
    assert "dgxdoctor_ray_nodes_dead" not in samples(result)  # the text does not list dead nodes
    assert samples(result)["dgxdoctor_ray_gpus_total"] == 8


@pytest.mark.parametrize(
    ("runner", "expected"),
    [(no_commands, "not found"), (ray_status_prints("healthy-ray-status.txt", returncode=1), "exit 1")],
)
def test_dashboard_down_and_no_ray_status(tmp_path: Path, runner: CommandRunner, expected: str) -> None:
    result = run_check(tmp_path, REFUSED, dashboard_url=LOCAL, procs={100: ("gcs_server", "S")}, runner=runner)
    assert result.status is Status.CRITICAL
    unavailable = next(f for f in result.findings if f.code == "RAY_STATUS_UNAVAILABLE")
    assert expected in unavailable.message


def test_declared_head_without_ray_is_critical(tmp_path: Path) -> None:
    result = run_check(tmp_path, REFUSED, dashboard_url=LOCAL, role="head", listening=False)
    assert result.status is Status.CRITICAL
    assert {"RAY_DASHBOARD_DOWN", "RAY_PORT_NOT_LISTENING"} <= set(codes(result))


# --- settings


def test_bad_settings_name_their_keys() -> None:
    for key, value, says in (
        ("dashboard_url", "10.0.0.1:8265", "is not an http(s)://HOST:PORT[/PATH] URL"),
        ("role", "boss", "Invalid enum value 'boss'"),
        ("gcs_port", 0, "Expected `int` >= 1"),
    ):
        with pytest.raises(ConfigError) as err:
            parse_config({"checks": {"ray": {key: value}}})
        [(table, reason)] = err.value.problems
        assert table == "checks.ray" and reason.endswith(f" - at `$.checks.ray.{key}`") and says in reason, reason


# --- diagnose `ray status`


def diagnose(name: str) -> tuple[dict[str, Status], dict[str, object], list[str | None]]:
    d = diagnose_text(fixture(name).decode(), ANALYZERS)
    assert d.kind == "ray-status"
    return {f.code: f.status for f in d.findings}, d.data, [f.evidence for f in d.findings]


def test_diagnose_healthy() -> None:
    found, data, _ = diagnose("healthy-ray-status.txt")
    assert found == {}
    assert (data["nodes_alive"], data["gpus_total"], data["gpus_used"]) == (2, 16.0, 0.0)


def test_diagnose_only_8_gpus_is_the_tutorials_error_5() -> None:
    d = RayStatusAnalyzer().analyze(fixture("dead-ray-status.txt").decode())
    by_code = {f.code: f for f in d.findings}
    missing = by_code["RAY_GPUS_MISSING"]
    assert missing.status is Status.CRITICAL
    assert "8 of 16 GPUs" in missing.message
    assert missing.evidence == "0.0/8.0 GPU"
    assert missing.remedy is not None and "ufw allow 6379/tcp" in missing.remedy
    assert by_code["RAY_NODES_MISSING"].status is Status.CRITICAL
    assert d.data["gpus_total"] == 8.0


def test_diagnose_pending_demands_are_findings_with_their_lines() -> None:
    found, data, evidence = diagnose("pending-ray-status.txt")
    assert found == {"RAY_PENDING_DEMAND": Status.WARNING, "RAY_PLACEMENT_GROUP_PENDING": Status.WARNING}
    assert "{'GPU': 32.0}: 1+ pending tasks/actors" in evidence
    assert data["gpus_used"] == 12.0
    assert [d["kind"] for d in data["pending_demands"]] == ["tasks", "placement_group"]  # type: ignore[attr-defined,index]


def test_diagnose_rejoin_moment_explains_the_double_count() -> None:
    d = RayStatusAnalyzer().analyze(fixture("rejoined-ray-status.txt").decode())
    (finding,) = d.findings
    assert finding.code == "RAY_GPUS_UNEXPECTED" and "rejoined" in finding.message


def test_diagnose_older_format_recent_failure() -> None:
    found, data, _ = diagnose("older-2021-ray-status.txt")
    assert found["RAY_NODE_FAILED"] is Status.WARNING  # 2 nodes healthy: a failure of the past
    assert data["recent_failures"] == ["10.0.0.157: custom1"]


def test_diagnose_forced_kind_on_other_text_is_unknown() -> None:
    d = diagnose_text("not ray at all\n", ANALYZERS, kind="ray-status")
    assert [f.code for f in d.findings] == ["RAY_STATUS_UNPARSED"]
    assert d.status is Status.UNKNOWN


def test_diagnose_cli_on_a_captured_file() -> None:
    done = run_cli("diagnose", "--json", str(RAY / "dead-ray-status.txt"))
    assert done.returncode == 2, done.stderr
    (entry,) = done.json()["inputs"]
    assert entry["kind"] == "ray-status"
    assert entry["data"]["nodes_alive"] == 1
    assert "RAY_GPUS_MISSING" in {f["code"] for f in entry["findings"]}


def test_never_fits_is_judged_per_task_not_per_count() -> None:
    view = ClusterView(
        nodes_alive=2,
        gpus_total=16.0,
        demands=(Demand("tasks", "{'GPU': 8.0}", 3, 8.0), Demand("tasks", "{'GPU': 32.0}", 1, 32.0)),
    )
    messages = [f.message for f in cluster_findings(view, 2, 16)]
    assert messages == [
        "3+ tasks/actors wait for {'GPU': 8.0}",
        "1+ tasks/actors wait for {'GPU': 32.0}; it can never fit: the cluster has 16 GPUs",
    ]
