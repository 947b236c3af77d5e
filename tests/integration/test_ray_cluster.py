"""A real two-node Ray cluster on one machine: each node in its own network namespace and PID namespace.

Topology (no default route in the namespaces, so Ray's probes of cloud metadata and usage-stats hosts fail at
once and nothing leaves the machine; the host reaches 10.77.0.1 only through the bridge's connected route)::

    host: bridge dgxd-ray-br 10.77.0.254/24
      |-- veth -- netns dgxd-ray-head   eth0 10.77.0.1  `ray start --head --num-gpus=8` (GCS 6379, dashboard 8265)
      `-- veth -- netns dgxd-ray-worker eth0 10.77.0.2  `ray start --address=10.77.0.1:6379 --num-gpus=8`

The cluster runs with Ray's token authentication (RAY_AUTH_MODE=token, the token in a file of the test's own),
so the dashboard API answers only with ``Authorization: Bearer <token>``. Each node runs under
`unshare --pid --fork --kill-child`: killing that unshare process kills the namespace's first process, and the
kernel then kills every process of the node, as a crashed machine would.
Needs root, iproute2 with `ip netns`, and Ray in .cache/venv-ray (scripts/install-ray).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import REPO, run_cli
from dgxdoctor.checks.peer_compare import discovery_findings
from dgxdoctor.config import parse_config
from dgxdoctor.fleet.discovery import Membership, discover
from dgxdoctor.result import Finding

pytestmark = pytest.mark.integration

RAY_BIN = REPO / ".cache" / "venv-ray" / "bin" / "ray"
PREFIX = "dgxd-ray-"
BRIDGE = f"{PREFIX}br"
HEAD_NS, WORKER_NS = f"{PREFIX}head", f"{PREFIX}worker"
VETHS = (f"{PREFIX}v1", f"{PREFIX}v2")  # host ends of the head's and the worker's veth pairs
HEAD_IP, WORKER_IP, HOST_IP = "10.77.0.1", "10.77.0.2", "10.77.0.254"
DASHBOARD = f"http://{HEAD_IP}:8265"
# Death of a node is detected in ~2 s instead of ~15 s (GCS health checks of each raylet).
HEALTH_CHECK_ENV = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
LOCK_PATH = Path("/tmp") / f"{PREFIX}test.lock"
START_TIMEOUT_S = 90.0
_TOKEN: dict[str, str] = {}  # the module's cluster token, once the fixture made it
DEATH_TIMEOUT_S = 30.0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=15)


def _why_not_runnable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "needs iproute2 (ip) and util-linux (unshare)"
    if subprocess.run(["ip", "netns", "list"], capture_output=True, check=False).returncode != 0:
        return "`ip netns` does not work here"
    if not RAY_BIN.exists():
        return f"no Ray at {RAY_BIN}: run scripts/install-ray"
    return None


def _remove_network() -> None:
    """Remove this module's namespaces and bridge (also stale ones a killed earlier run left behind)."""
    for ns in (HEAD_NS, WORKER_NS):
        pids = _ip("netns", "pids", ns, check=False).stdout.split()
        for pid in pids:  # processes left in our own namespaces are ours
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", ns, check=False)
    # A deleted namespace is torn down asynchronously (it can take minutes on a busy machine) and its veth peer
    # lives until then: delete the host ends by name so the next run can create them again.
    for host_end in VETHS:
        _ip("link", "del", host_end, check=False)
    _ip("link", "del", BRIDGE, check=False)


def _create_network() -> None:
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{HOST_IP}/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for host_end, ns, addr in zip(VETHS, (HEAD_NS, WORKER_NS), (HEAD_IP, WORKER_IP), strict=True):
        _ip("netns", "add", ns)
        _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", host_end, "master", BRIDGE, "up")
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        routes = _ip("-n", ns, "route", "show", "default").stdout.strip()
        assert not routes, f"{ns} must have no default route, has {routes!r}"


@dataclass
class RayNodeProcess:
    ns: str
    popen: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)  # --kill-child takes the whole PID namespace with it
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""


def _start_node(ns: str, args: list[str], temp_dir: Path, extra_env: dict[str, str]) -> RayNodeProcess:
    log = temp_dir.with_suffix(".log")
    argv = [
        "ip", "netns", "exec", ns,
        "unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL",
        str(RAY_BIN), "start", "--block", "--num-gpus=8", "--num-cpus=1", "--disable-usage-stats",
        f"--temp-dir={temp_dir}", *args,
    ]  # fmt: skip
    env = {**os.environ, **extra_env}
    with log.open("wb") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    return RayNodeProcess(ns, popen, log)


def _api(path: str) -> Any:
    headers = {"Authorization": f"Bearer {_TOKEN['token']}"}
    with httpx.Client(timeout=3.0, trust_env=False, headers=headers) as client:
        return client.get(f"{DASHBOARD}{path}").json()


def _nodes() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = _api("/api/v0/nodes?detail=1")["data"]["result"]["result"]
    return rows


def _autoscaler_settled() -> bool:
    """The autoscaler report (what `ray status` prints) lags the node list by seconds and, after a node rejoins,
    passes through stale states (the dead node's resources still counted, 24 GPUs). Settled: it covers exactly the
    ALIVE nodes and 16 GPUs."""
    alive = {n["node_id"] for n in _nodes() if n["state"] == "ALIVE"}
    report = _api("/api/cluster_status")["data"]["clusterStatus"]["loadMetricsReport"]
    return set(report["usageByNode"]) == alive and report["usage"]["GPU"][1] == 16.0


def _poll(what: str, predicate: Any, timeout_s: float, *procs: RayNodeProcess) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.popen.poll() is not None:
                pytest.fail(
                    f"Ray node in {proc.ns} exited ({proc.popen.returncode}) while waiting for {what}:\n{proc.tail()}"
                )
        try:
            last = predicate()
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.25)
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}; last: {last!r}")


@dataclass
class Cluster:
    head: RayNodeProcess
    worker: RayNodeProcess
    worker_node_id: str
    tmp: Path
    procs: list[RayNodeProcess]  # every node started, killed by the fixture's teardown

    @property
    def token_file(self) -> Path:
        return self.tmp / "auth_token"

    @property
    def ray_env(self) -> dict[str, str]:
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_file)}

    def config(self, dashboard_url: str = DASHBOARD, token: bool = True) -> Path:
        path = self.tmp / f"dgxdoctor-{secrets.token_hex(4)}.toml"
        lines = ["[checks.ray]", f'dashboard_url = "{dashboard_url}"']
        if token:
            lines.append(f'auth_token_file = "{self.token_file}"')
        path.write_text("\n".join(lines) + "\n")
        return path


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    reason = _why_not_runnable()
    if reason:
        pytest.skip(reason)
    # One run at a time on a machine: the names and the subnet are fixed, and the stale-leftover cleanup below
    # must never reach a cluster that another run of this module is using.
    lock = open(LOCK_PATH, "w")  # noqa: SIM115 - held until teardown
    fcntl.flock(lock, fcntl.LOCK_EX)
    _remove_network()
    tmp = Path(tempfile.mkdtemp(prefix=PREFIX, dir="/tmp"))  # short: Ray's unix socket paths must fit 107 bytes
    procs: list[RayNodeProcess] = []
    _TOKEN["token"] = secrets.token_hex(32)
    (tmp / "auth_token").write_text(_TOKEN["token"])
    auth_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(tmp / "auth_token")}
    try:
        _create_network()
        head = _start_node(
            HEAD_NS,
            ["--head", f"--node-ip-address={HEAD_IP}", "--port=6379", "--dashboard-host=0.0.0.0"],
            tmp / "head",
            {**HEALTH_CHECK_ENV, **auth_env},
        )
        procs.append(head)
        _poll("the head's dashboard", lambda: len(_nodes()) >= 1, START_TIMEOUT_S, head)
        worker = _start_node(
            WORKER_NS, [f"--address={HEAD_IP}:6379", f"--node-ip-address={WORKER_IP}"], tmp / "worker", auth_env
        )
        procs.append(worker)

        def two_alive() -> list[dict[str, Any]] | None:
            alive = [n for n in _nodes() if n["state"] == "ALIVE"]
            return alive if len(alive) == 2 else None

        alive = _poll("2 nodes ALIVE", two_alive, START_TIMEOUT_S, head, worker)
        worker_id = next(n["node_id"] for n in alive if n["node_ip"] == WORKER_IP)
        _poll("the autoscaler report to count both nodes", _autoscaler_settled, 30, head, worker)
        yield Cluster(head, worker, worker_id, tmp, procs)
    finally:
        for proc in reversed(procs):
            proc.kill()
        _remove_network()
        shutil.rmtree(tmp, ignore_errors=True)
        lock.close()


def _cli_in_ns(ns: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    argv = ["ip", "netns", "exec", ns, sys.executable, "-m", "dgxdoctor", *args]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, timeout=60, check=False)


def _ray_check(report: dict[str, Any]) -> dict[str, Any]:
    (check,) = [c for c in report["checks"] if c["name"] == "ray"]
    return check


# The peers discovered from Ray's node table, remembered across this module's tests as the daemon remembers them.
MEMBERS = Membership()


def discovered(cluster: Cluster) -> tuple[tuple[str, ...], tuple[Finding, ...]]:
    """One round of discovery as a node's daemon runs it, with [fleet] peer_sources = ["ray"] and the cluster's
    token; this host's agent left out."""
    config = parse_config({"checks": {"ray": {"dashboard_url": DASHBOARD, "auth_token_file": str(cluster.token_file)}},
                           "fleet": {"peer_sources": ["ray"]}, "daemon": {"listen": f"{HOST_IP}:9835"}})  # fmt: skip
    peers, seen = discover(MEMBERS, config.peer_sources(), config.own_agent(), config.environment().http_client)
    return peers, discovery_findings(seen)


def test_the_peers_from_rays_node_table(cluster: Cluster) -> None:
    assert discovered(cluster) == ((f"http://{HEAD_IP}:9835", f"http://{WORKER_IP}:9835"), ())


def test_healthy_cluster_is_ok(cluster: Cluster) -> None:
    run = run_cli("check", "--only", "ray", "--json", "--config", str(cluster.config()))
    assert run.returncode == 0, run.stdout + run.stderr
    check = _ray_check(run.json())
    assert check["status"] == "ok", check
    assert "2/2 nodes ALIVE" in check["summary"]
    assert "16/16 GPUs" in check["summary"]


def test_missing_token_is_unknown_not_ok(cluster: Cluster) -> None:
    run = run_cli("check", "--only", "ray", "--json", "--config", str(cluster.config(token=False)))
    assert run.returncode == 3, run.stdout + run.stderr
    check = _ray_check(run.json())
    assert check["status"] == "unknown"
    (finding,) = check["findings"]
    assert finding["code"] == "RAY_API_UNAUTHORIZED"
    assert "401" in finding["message"]


def test_head_role_checks_its_ports(cluster: Cluster) -> None:
    """Inside the head's namespace the default loopback URL answers: head role, GCS and dashboard ports listen."""
    config = cluster.config(dashboard_url="http://127.0.0.1:8265")
    done = _cli_in_ns(HEAD_NS, "check", "--only", "ray", "--json", "--config", str(config))
    assert done.returncode == 0, done.stdout + done.stderr
    check = _ray_check(json.loads(done.stdout))
    assert check["status"] == "ok", check
    assert "(head at" not in check["summary"]  # ports were checked here, not deferred to another machine
    assert not [f for f in check["findings"] if f["code"] == "RAY_PORT_NOT_LISTENING"]


def test_worker_role_sees_its_raylet(cluster: Cluster) -> None:
    done = _cli_in_ns(WORKER_NS, "check", "--only", "ray", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    check = _ray_check(json.loads(done.stdout))
    assert check["status"] == "ok", check
    assert "worker node: raylet running" in check["summary"]


def test_diagnose_reads_live_ray_status(cluster: Cluster) -> None:
    status = subprocess.run(
        ["ip", "netns", "exec", HEAD_NS, str(RAY_BIN), "status", f"--address={HEAD_IP}:6379"],
        capture_output=True, text=True, timeout=60, check=True, env={**os.environ, **cluster.ray_env},
    )  # fmt: skip
    run = run_cli("diagnose", "--json", "-", stdin=status.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    (diagnosis,) = run.json()["inputs"]
    assert diagnosis["kind"] == "ray-status"
    assert diagnosis["data"]["nodes_alive"] == 2
    assert diagnosis["data"]["gpus_total"] == 16.0
    assert diagnosis["findings"] == []


def test_killed_worker_is_critical(cluster: Cluster) -> None:
    """Kills the worker node; the next test brings it back."""
    cluster.worker.kill()
    _poll(
        "the worker to be DEAD",
        lambda: any(n["node_id"] == cluster.worker_node_id and n["state"] == "DEAD" for n in _nodes()),
        DEATH_TIMEOUT_S,
        cluster.head,
    )
    run = run_cli("check", "--only", "ray", "--json", "--config", str(cluster.config()))
    assert run.returncode == 2, run.stdout + run.stderr
    check = _ray_check(run.json())
    assert check["status"] == "critical"
    by_code = {f["code"]: f for f in check["findings"]}
    dead = by_code["RAY_NODE_DEAD"]
    assert dead["subject"] == cluster.worker_node_id
    assert WORKER_IP in dead["message"]
    assert "8 of 16 GPUs" in by_code["RAY_GPUS_MISSING"]["message"]
    assert check["action"] and "ray start --address=" in check["action"]["remedy"]

    # Discovery keeps the worker as a peer and says it left Ray: not a silently shorter list.
    peers, found = discovered(cluster)
    assert f"http://{WORKER_IP}:9835" in peers
    assert [(f.code, f.subject) for f in found] == [("PEER_LEFT_RAY", WORKER_IP)]
    assert "DEAD" in found[0].message

    # The worker machine itself: no dashboard, no raylet left -> Ray is not here.
    done = _cli_in_ns(WORKER_NS, "check", "--only", "ray", "--json")
    assert _ray_check(json.loads(done.stdout))["status"] == "skipped", done.stdout


def test_rejoined_worker_is_ok_again(cluster: Cluster) -> None:
    """The tutorial's fix for a missing worker (`ray start --address=<head>:6379` again) brings the verdict back."""
    rejoined = _start_node(
        WORKER_NS,
        [f"--address={HEAD_IP}:6379", f"--node-ip-address={WORKER_IP}"],
        cluster.tmp / "worker2",
        cluster.ray_env,
    )
    cluster.procs.append(rejoined)
    _poll(
        "the worker to rejoin",
        lambda: sum(n["state"] == "ALIVE" for n in _nodes()) == 2,
        START_TIMEOUT_S,
        cluster.head,
        rejoined,
    )
    run = run_cli("check", "--only", "ray", "--json", "--config", str(cluster.config()))
    assert run.returncode == 0, run.stdout + run.stderr
    check = _ray_check(run.json())
    assert check["status"] == "ok", check
    assert "16/16 GPUs" in check["summary"]
    (old,) = [f for f in check["findings"] if f["code"] == "RAY_NODE_REJOINED"]
    assert old["subject"] == cluster.worker_node_id
    assert discovered(cluster) == ((f"http://{HEAD_IP}:9835", f"http://{WORKER_IP}:9835"), ())


def test_dashboard_down_on_the_head_falls_back_to_ray_status(cluster: Cluster) -> None:
    """Last: stops the head's dashboard. SIGTERM, because `ray start --block` kills the whole node when one of its
    processes dies of anything else."""
    _poll("the autoscaler report to settle after the rejoin", _autoscaler_settled, 30, cluster.head)
    pids = _ip("netns", "pids", HEAD_NS).stdout.split()
    dashboards = [p for p in pids if b"ray/dashboard/dashboard.py" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(dashboards) == 1, dashboards
    os.kill(int(dashboards[0]), signal.SIGTERM)

    def refused() -> bool:
        try:
            _nodes()
        except httpx.TransportError:
            return True
        return False

    _poll("the dashboard to stop answering", refused, 30, cluster.head)
    config = cluster.config(dashboard_url="http://127.0.0.1:8265")
    with config.open("a") as fh:
        fh.write(f'ray_command = "{RAY_BIN}"\n')
    done = _cli_in_ns(HEAD_NS, "check", "--only", "ray", "--json", "--config", str(config))
    assert done.returncode == 2, done.stdout + done.stderr
    check = _ray_check(json.loads(done.stdout))
    codes = {f["code"] for f in check["findings"]}
    if codes != {"RAY_DASHBOARD_DOWN", "RAY_PORT_NOT_LISTENING"}:
        status = subprocess.run(
            ["ip", "netns", "exec", HEAD_NS, str(RAY_BIN), "status", "--address=127.0.0.1:6379"],
            capture_output=True, text=True, timeout=60, check=False, env={**os.environ, **cluster.ray_env},
        )  # fmt: skip
        pytest.fail(f"{json.dumps(check, indent=1)}\nray status now:\n{status.stdout}{status.stderr}")
    assert "ray status: 2/2 nodes ALIVE, 16/16 GPUs" in check["summary"]

    # Seen from outside (the host, through the bridge), the head's dashboard no longer answers.
    run = run_cli("check", "--only", "ray", "--json", "--config", str(cluster.config()))
    assert run.returncode == 1, run.stdout + run.stderr
    assert [f["code"] for f in _ray_check(run.json())["findings"]] == ["RAY_DASHBOARD_UNREACHABLE"]
