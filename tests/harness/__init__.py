"""One harness for every multi-node test (docs/testing.md): nodes in their own network and PID namespaces
(namespaces.py), each laid out as the README installs dgxdoctor and running the daemon as its unit does
(deployment.py), the shipped serving units run with stand-in programs (programs/), and a real Prometheus and
Alertmanager (monitoring.py).

    with Cluster({"dgx-a": "head", "dgx-b": "worker"}, monitor=True) as cluster:
        a, b = cluster["dgx-a"], cluster["dgx-b"]
        a.configure(extra={...}, only=("vllm", "ray")); b.configure(...)
        cluster.start_unit(a, "vllm.service")
        cluster.start_daemons()
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import pytest

from conftest import FIXTURES, REPO
from harness import monitoring, namespaces
from harness.deployment import PORT, SYSTEMD_PATH, Node, copy_program, new_token, wait_for
from harness.monitoring import Monitoring
from harness.namespaces import Network, Spawned
from journalwriter import journal_remote, write_journal

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

    def start_daemons(self, program: Sequence[str] | None = None, env: dict[str, str] | None = None) -> None:
        """Start every node's agent (Node.start_daemon: ``program`` and ``env`` for a seam filled), then (when
        monitored) Prometheus and Alertmanager, and wait until Prometheus has scraped every agent: nothing a test
        does after this is missed by the first scrape."""
        for node in self.nodes.values():
            node.start_daemon(program=program, env=env)
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

    def start_unit(self, node: Node, unit: str, **environment: str) -> Spawned:
        """Start a shipped serving unit (``systemd/UNIT``: vllm.service, vllm-head-mp.service, ray-head.service, ...)
        on ``node`` as systemd would, its program a stand-in: ExecStart with ``/opt/vllm/bin/vllm`` and ``ray`` the
        programs of programs/, its ``Environment=`` (``environment``: the site's values, as an operator edits
        them), then its ``EnvironmentFile=`` (the node's ROOT/etc/nccl.env, Node.install_nccl_env), ``${VAR}``
        expanded."""
        journal_remote()  # the unit's output goes to its journal: skips naming the package when it is missing
        text = (REPO / "systemd" / unit).read_text()
        env = {"PATH": f"{node.bin}:{SYSTEMD_PATH}", "LANG": "C.UTF-8", "RAY_STANDIN_FIXTURES": str(FIXTURES / "ray"),
               "RAY_STANDIN_SCENARIO": str(node.root / "ray-scenario"), "VLLM_STANDIN_ENGINE": "idle"}  # fmt: skip
        for assignment in re.findall(r"^Environment=(.*)$", text, re.MULTILINE):
            key, _, value = assignment.strip().partition("=")
            env[key] = environment.pop(key, value)
        env.update(environment)
        for path in re.findall(r"^EnvironmentFile=(.*)$", text, re.MULTILINE):
            env.update(parse_env_file(node.root / path.strip().lstrip("-/")))
        env["STANDIN_SAY"] = str(node.root / f"{unit}.say")  # Cluster.say
        (exec_start,) = re.findall(r"^ExecStart=(.*)$", text, re.MULTILINE)
        argv = [re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], a) for a in exec_start.split()]
        name = Path(argv[0]).name
        assert argv[0] == f"/opt/vllm/bin/{name}" and name in ("vllm", "ray"), argv
        program = copy_program(PROGRAMS / f"{name}.py", node.bin / name)
        if name == "ray":
            copy_program(Path(shutil.which("sleep") or "/bin/sleep"), node.bin / "raylet")
            (node.root / "ray-scenario").write_text("healthy")
        started = node.ns.spawn([sys.executable, str(program), *argv[1:]], env=env, pipe=True)
        # The unit's output goes to the journal, as systemd's does (no StandardOutput= in the shipped units).
        threading.Thread(target=self._journal, args=(node, unit, name, started), daemon=True).start()
        return started

    @staticmethod
    def _journal(node: Node, unit: str, ident: str, started: Spawned) -> None:
        """Each line ``started`` prints, into ``node``'s journal as ``unit``'s, then into ROOT/UNIT.log."""
        assert started.outer.stdout is not None
        with (node.root / f"{unit}.log").open("ab") as log:
            for raw in started.outer.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                if line:
                    write_journal(node.journal, [(unit, line)], pid=started.pid, file=unit, ident=ident)
                log.write(raw)  # after the journal: a line in the log is in the journal
                log.flush()

    @staticmethod
    def say(node: Node, unit: str, started: Spawned, *lines: str) -> None:
        """Make the stand-in of ``unit`` print ``lines`` to its output, as vLLM's processes print torch's NCCL
        watchdog line; returns once they are in the unit's journal."""
        (node.root / f"{unit}.say").write_text("".join(f"{line}\n" for line in lines))
        started.signal(signal.SIGUSR1, group=False)
        log = node.root / f"{unit}.log"
        wait_for(f"{unit}'s lines in its journal", lambda: all(line in log.read_text() for line in lines), 30, node)

    @staticmethod
    def ray_scenario(node: Node, scenario: str) -> None:
        """What the head's Ray dashboard (ray-head.service's stand-in) answers from now on: ``dead``, ..."""
        (node.root / "ray-scenario").write_text(scenario)


def parse_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines of an EnvironmentFile (comments and blank lines skipped)."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and not line.startswith("#"))
    return {key.strip(): value.strip().strip('"') for key, value in pairs}
