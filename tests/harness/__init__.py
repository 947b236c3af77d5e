"""One harness for every multi-node test (docs/testing.md): nodes in their own network and PID namespaces
(namespaces.py), each laid out as the README installs dgxdoctor and running the daemon as its unit does
(deployment.py), with stand-ins for what the nodes serve (programs/), and a real Prometheus and Alertmanager
(monitoring.py).

    with Cluster(tmp_path, {"dgx-a": "head", "dgx-b": "worker"}) as cluster:
        a, b = cluster["dgx-a"], cluster["dgx-b"]
        a.configure(extra={...}, only=("vllm", "ray")); b.configure(...)
        cluster.start_daemons()
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import pytest

from conftest import FIXTURES
from harness import monitoring, namespaces
from harness.deployment import PORT, Node, copy_program, new_token, wait_for
from harness.monitoring import Monitoring
from harness.namespaces import Network, Spawned

__all__ = ["PORT", "PROGRAMS", "Cluster", "Monitoring", "Node", "skip_unless_runnable", "wait_for"]

PROGRAMS = Path(__file__).with_name("programs")


def skip_unless_runnable(with_monitoring: bool = False) -> None:
    reason = namespaces.why_not_runnable() or (monitoring.why_not_runnable() if with_monitoring else None)
    if reason:
        pytest.skip(reason)


class Cluster:
    """Nodes by name and role (None: no role declared), their network, and (``monitor=True``) Prometheus and
    Alertmanager on the host."""

    def __init__(self, roles: Mapping[str, str | None], monitor: bool = False) -> None:
        skip_unless_runnable(monitor)
        # Short: unix socket paths (the notify socket) must fit 107 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="dgxh-", dir="/tmp"))
        self.network = Network(list(roles))
        token = new_token()
        self.nodes: dict[str, Node] = {}
        for name, role in roles.items():
            peers = [f"http://{other}:{PORT}" for other in roles if other != name]
            self.nodes[name] = Node(name, role, self.network.nodes[name], self.root / name, token, peers)
        self.monitoring = Monitoring(self.root / "monitoring", self.network.host_ip, list(self.nodes.values())) \
            if monitor else None  # fmt: skip

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def __enter__(self) -> Cluster:
        try:
            self.network.create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        for node in self.nodes.values():
            with contextlib.suppress(Exception):
                node.stop_daemon()
        if self.monitoring is not None:
            self.monitoring.stop()
        self.network.destroy()
        if not os.environ.get("DGXD_HARNESS_KEEP"):
            shutil.rmtree(self.root, ignore_errors=True)

    def start_daemons(self, names: Sequence[str] | None = None) -> None:
        """Start the agents, then (when monitored) Prometheus and Alertmanager, and wait until Prometheus has
        scraped every agent: nothing a test does after this is missed by the first scrape."""
        for name in names or list(self.nodes):
            self.nodes[name].start_daemon()
        if self.monitoring is not None:
            self.monitoring.start()
            prometheus, expected = self.monitoring, float(len(self.nodes))
            wait_for("every agent scraped by Prometheus", lambda: prometheus.value('sum(up{job="dgxdoctor"})') ==
                     expected, 60, *self.nodes.values())  # fmt: skip

    # -- stand-ins for what the nodes serve ---------------------------------------------------------------------

    def start_vllm(self, node: Node, *args: str, model: str = "/models/tiny", stalled: bool = False) -> Spawned:
        """``vllm serve MODEL ARGS`` on ``node`` (the stand-in of programs/vllm.py, named ``vllm``). ``stalled``:
        its engine has requests in flight and makes no progress (what a stopped rank does to every rank)."""
        program = copy_program(PROGRAMS / "vllm.py", node.bin / "vllm")
        argv = [sys.executable, str(program), "serve", model, "--served-model-name", "tiny", *args]
        env = {**os.environ, "VLLM_STANDIN_ENGINE": "stalled" if stalled else "idle"}
        return node.ns.spawn(argv, env=env, log=node.root / "vllm.log", cwd=node.root)

    def systemctl_calls(self) -> list[str]:
        """Every node's fake systemctl calls in call order, each ``NODE: VERB UNIT``."""
        path = self.root / "systemctl.calls"
        return path.read_text().splitlines() if path.exists() else []

    def start_ray_head(self, node: Node, scenario: str = "healthy") -> Path:
        """The Ray head's listeners on ``node`` answering the captures of ``scenario``; the file to write to
        change the scenario."""
        program = copy_program(PROGRAMS / "ray_head.py", node.bin / "ray-head-standin")
        control = node.root / "ray-scenario"
        control.write_text(scenario)
        node.ns.spawn([sys.executable, str(program), str(FIXTURES / "ray"), str(control)], log=node.root / "ray.log")
        return control

    def start_raylet(self, node: Node) -> Spawned:
        """A process named ``raylet`` (what a worker's ray check looks for), idle."""
        program = copy_program(Path(shutil.which("sleep") or "/bin/sleep"), node.bin / "raylet")
        return node.ns.spawn([str(program), "infinity"])


@contextlib.contextmanager
def cluster(roles: Mapping[str, str | None], monitor: bool = False) -> Iterator[Cluster]:
    with Cluster(roles, monitor) as made:
        yield made
