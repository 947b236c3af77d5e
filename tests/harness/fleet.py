"""A fleet of dgxdoctor agents on loopback ports, in serving groups, scraped by a real Prometheus with the shipped
rules and routed by a real Alertmanager whose route groups by serving group (docs/remediation.md): the rig of
``tests/integration/test_fleet_prometheus.py`` and ``benchmarks/fleet64.py``.

Each agent is a real ``dgxdoctor run`` with its own config, state directory, kernel log file and an empty sysfs
tree (the hardware boundary: no InfiniBand, no GPU). Only the xid check runs (it follows the kernel log file, so
an XID line appended there is a critical finding within a second); the rest are off, so 64 of them fit on two
cores. Alertmanager's notifications go to a recorder in this process. Needs Debian's prometheus and
prometheus-alertmanager; everything stops by its PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
TOKEN = "fleet-rig-peer-token-0123456789abcdef"
JOB = "dgxdoctor"
BUS = "0000:3b:00"
XID_79 = f"NVRM: Xid (PCI:{BUS}): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus.\n"


def why_not_runnable() -> str | None:
    for tool in ("prometheus", "prometheus-alertmanager"):
        if shutil.which(tool) is None:
            return f"needs {tool} (Debian's prometheus and prometheus-alertmanager)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_names() -> list[str]:
    sys.path.insert(0, str(REPO / "src"))
    from dgxdoctor.checks.registry import ALL_CHECKS

    return [f.name for f in ALL_CHECKS]


@dataclass
class Agent:
    name: str
    group: str
    root: Path
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def kmsg(self) -> Path:
        return self.root / "kmsg"


class Recorder:
    """Alertmanager's webhook receiver: every notification's JSON body, in order."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        seen = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                seen.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class FleetRig:
    root: Path
    groups: Mapping[str, Sequence[str]]  # group -> node names
    scrape_s: float = 1.0
    compare_s: float = 15.0  # peer_compare's interval (the mesh's N x N fetching, when no Prometheus)
    extra_config: str = ""  # appended to every agent's config
    agent_extra: Mapping[str, str] = field(default_factory=dict)  # node name -> appended to that agent's config
    daemon_extra: Mapping[str, str] = field(default_factory=dict)  # node name -> lines of its [daemon] table
    agent_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # node name -> its environment's extra
    agents: list[Agent] = field(default_factory=list)
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    prometheus_url: str = ""
    alertmanager_url: str = ""
    recorder: Recorder | None = None

    def __post_init__(self) -> None:
        self.prometheus_port = free_port()
        self.prometheus_url = f"http://127.0.0.1:{self.prometheus_port}"
        self.agents = [Agent(n, g, self.root / n, free_port()) for g, names in self.groups.items() for n in names]

    # -- agents ----------------------------------------------------------------------------------------------

    def agent_config(self, agent: Agent, prometheus: bool = True) -> str:
        """Only xid and peer_compare on. ``prometheus``: ``[fleet] prometheus_url`` set (peer_compare then fetches
        nothing); else the mesh: every other agent is a peer, and peer_compare fetches each one's /state."""
        on = ("xid", "peer_compare")
        off = "".join(f"[checks.{name}]\nenabled = false\n" for name in check_names() if name not in on)
        fleet = f'[fleet]\nprometheus_url = "{self.prometheus_url}"\n' if prometheus else ""
        peers = json.dumps([a.url for a in self.agents if a is not agent])
        return (
            f'[node]\nname = "{agent.name}"\ngroup = "{agent.group}"\n'
            f'[paths]\nstate_dir = "{agent.root / "state"}"\nkmsg_path = "{agent.kmsg}"\n'
            f'sysfs_root = "{agent.root / "sys"}"\n'
            f'[daemon]\nlisten = "127.0.0.1:{agent.port}"\npeer_token_file = "{self.root / "peer.token"}"\n'
            f"check_run_min_interval_s = 0\npeers = {peers}\npeer_timeout_s = 5.0\n"
            f"{self.daemon_extra.get(agent.name, '')}"
            f"{fleet}[checks.xid]\ninterval_s = 30.0\n[checks.peer_compare]\ninterval_s = {self.compare_s:g}\n"
            f"timeout_s = 60.0\n{off}{self.extra_config}{self.agent_extra.get(agent.name, '')}"
        )

    def write_agents(self, prometheus: bool = True) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        token = self.root / "peer.token"
        token.write_text(TOKEN)
        token.chmod(0o600)
        for agent in self.agents:
            for sub in ("state", "sys"):
                (agent.root / sub).mkdir(parents=True, exist_ok=True)
            (agent.root / "state").chmod(0o750)
            agent.kmsg.write_text("")
            agent.config.write_text(self.agent_config(agent, prometheus))

    def start_agents(self, parallel: int = 4) -> None:
        """Start every agent, ``parallel`` starting at a time (an interpreter start is a core-second here)."""
        for i in range(0, len(self.agents), parallel):
            batch = self.agents[i : i + parallel]
            for agent in batch:
                self.spawn(agent)
            for agent in batch:
                self.wait_healthy(agent)

    def spawn(self, agent: Agent) -> None:
        """Start one agent (again: its port, config and state directory as before)."""
        env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **self.agent_env.get(agent.name, {})}
        with (agent.root / "daemon.log").open("ab") as log:
            agent.proc = subprocess.Popen(
                ["nice", "-n", "5", sys.executable, "-m", "dgxdoctor", "run", "--config", str(agent.config)],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip

    def wait_healthy(self, agent: Agent) -> None:
        wait(lambda: httpx.get(f"{agent.url}/healthz", timeout=2).status_code == 200, 120,
             f"{agent.name} healthy", lambda: self.log_tail(agent))  # fmt: skip

    def stop_agent(self, agent: Agent) -> None:
        """Stop one agent (SIGTERM to its process group, by its PID): its target goes down in Prometheus."""
        proc = agent.proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        agent.proc = None

    def log_tail(self, agent: Agent) -> str:
        path = agent.root / "daemon.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def inject_critical(self, agent: Agent) -> float:
        """An XID 79 (GPU fallen off the bus) in the agent's kernel log; the wall time it was written."""
        with agent.kmsg.open("a") as fh:
            fh.write(XID_79)
        return time.time()

    def cli(self, agent: Agent, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``dgxdoctor ARGS --config`` the agent's config, as an operator on that node runs it."""
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        argv = [sys.executable, "-m", "dgxdoctor", *args, "--config", str(agent.config)]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)

    # -- Prometheus and Alertmanager ---------------------------------------------------------------------------

    def start_monitoring(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.recorder = Recorder()
        am_port = free_port()
        self.alertmanager_url = f"http://127.0.0.1:{am_port}"
        # The route of docs/remediation.md: one serving group, one notification. Short waits: a test sees it in
        # seconds (the docs' defaults are Alertmanager's).
        am = {"route": {"receiver": "pager", "group_by": ["group"], "group_wait": "1s", "group_interval": "1s",
                        "repeat_interval": "1h"},
              "receivers": [{"name": "pager", "webhook_configs": [{"url": self.recorder.url,
                                                                    "send_resolved": False}]}]}  # fmt: skip
        (self.root / "alertmanager.yml").write_text(json.dumps(am))
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        rules = subprocess.run([sys.executable, "-m", "dgxdoctor", "rules"], capture_output=True, text=True, env=env,
                               check=True, timeout=120)  # fmt: skip
        (self.root / "dgxdoctor.rules.yml").write_text(rules.stdout)
        interval = f"{self.scrape_s:g}s"
        prom = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
            "rule_files": [str(self.root / "dgxdoctor.rules.yml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [{"job_name": JOB, "static_configs": [
                {"targets": [f"127.0.0.1:{a.port}" for a in self.agents]}]}],
        }  # fmt: skip
        (self.root / "prometheus.yml").write_text(json.dumps(prom))
        for name, argv in (
            ("alertmanager", ["prometheus-alertmanager", f"--config.file={self.root / 'alertmanager.yml'}",
                              f"--storage.path={self.root / 'am'}", f"--web.listen-address=127.0.0.1:{am_port}",
                              "--cluster.listen-address=", "--log.level=warn"]),
            ("prometheus", ["prometheus", f"--config.file={self.root / 'prometheus.yml'}",
                            f"--storage.tsdb.path={self.root / 'prom'}",
                            f"--web.listen-address=127.0.0.1:{self.prometheus_port}", "--log.level=warn"]),
        ):  # fmt: skip
            with (self.root / f"{name}.log").open("wb") as log:
                proc = subprocess.Popen(["nice", "-n", "5", *argv], stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
            self.procs.append((name, proc))

    def query(self, expr: str) -> list[dict[str, Any]]:
        doc = httpx.get(f"{self.prometheus_url}/api/v1/query", params={"query": expr}, timeout=10).json()
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result

    def wait_scraped(self, limit_s: float = 120) -> None:
        """Until Prometheus holds every agent's node_info and every agent's xid check ran."""
        n = len(self.agents)
        wait(lambda: len(self.query('dgxdoctor_check_status{check="xid"}')) == n and len(self.query(
            "dgxdoctor_node_info")) == n, limit_s, f"Prometheus to scrape all {n} agents")  # fmt: skip

    def firing(self, alertname: str) -> list[dict[str, Any]]:
        alerts = httpx.get(f"{self.prometheus_url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == alertname and a["state"] == "firing"]

    @contextlib.contextmanager
    def running(self) -> Iterator[FleetRig]:
        """The agents written and started, Prometheus and Alertmanager up and every agent scraped; all stopped
        after (a module's fixture)."""
        try:
            self.write_agents()
            self.start_monitoring()
            self.start_agents()
            self.wait_scraped()
            yield self
        finally:
            self.stop()

    # -- teardown ------------------------------------------------------------------------------------------

    def stop(self) -> None:
        procs = [p for _, p in self.procs] + [a.proc for a in self.agents if a.proc is not None]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        if self.recorder is not None:
            self.recorder.stop()


def fake_systemctl(root: Path) -> Path:
    """A directory to put first on an agent's PATH: its ``systemctl`` records every call in ``root/systemctl.calls``
    and does nothing (remediation's commands reach no real unit)."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "systemctl"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {root / "systemctl.calls"}\n')
    script.chmod(0o755)
    return bin_dir


def wait(predicate: Callable[[], bool], limit_s: float, what: str, tail: Callable[[], str] = str) -> float:
    """Poll until ``predicate()``; the seconds it took. AssertionError (with ``tail()``) when it never holds."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        with contextlib.suppress(httpx.HTTPError, OSError, KeyError, ValueError):
            if predicate():
                return time.monotonic() - t0
        time.sleep(0.2)
    raise AssertionError(f"timed out after {limit_s} s waiting for {what}\n{tail()}")
