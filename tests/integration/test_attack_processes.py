"""Forged serving processes, for real: on an mp worker node whose headless vLLM (root's, as the shipped unit runs
it) is healthy, an unprivileged user (``setpriv`` to nobody) titles processes like vLLM's ranks with ``exec -a``.

- ``exec -a VLLM::Worker_TP9 sleep 600``, stopped: once CRITICAL ``VLLM_MP_HEADLESS_STOPPED`` on a healthy node
  (and, through the head's peer comparison, a cluster restart); now not judged, counted, OK.
- a real rank dies (CRITICAL ``VLLM_MP_WORKERS_MISSING``), then ``exec -a VLLM::Worker_TP3 sleep 600``: once back
  to OK with the dead rank hidden; now still CRITICAL.

The stand-in is a root process with the console script's argv (``python .../bin/vllm serve ... --headless``) whose
children are the ranks, titled by ``exec -a`` as vLLM's ``setproctitle`` titles them. The machine is shared with
other tests that start root processes with the same argv, so the agent's ``proc_root`` holds the kernel's own
``/proc/<pid>`` of this test's processes only (links) and ``/proc/stat``: the uid, the state letter and the parent
are what the kernel writes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import run_cli
from daemonproc import DaemonProc
from dgxdoctor.checks.registry import ALL_CHECKS

NOBODY = ("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv: the forger is nobody"
    ),
]

# The headless stand-in: its ranks VLLM::Worker_TP2 and TP3 (TP 4 over 2 nodes: two ranks on node rank 1) as its
# children; prints their pids, exits (killing them) when its stdin closes.
STAND_IN = """
import subprocess, sys
ranks = [subprocess.Popen(["bash", "-c", f"exec -a VLLM::Worker_TP{r} sleep 600"]) for r in (2, 3)]
print(*(p.pid for p in ranks), flush=True)
sys.stdin.read()
for p in ranks:
    p.kill()
"""


def titled(pid: int, title: str) -> None:
    """Wait until ``pid`` has exec'd into the titled process (setpriv and bash exec first)."""
    for _ in range(500):
        if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(title.encode()):
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never titled {title}")


def stopped(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    for _ in range(500):  # the stop is asynchronous: wait for the kernel to write T
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} never stopped")


@dataclass
class Node:
    root: Path  # the agent's proc_root
    config: Path
    server: subprocess.Popen[str]
    ranks: list[int]
    forged: list[subprocess.Popen[bytes]]

    def link(self, pid: int) -> None:
        (self.root / str(pid)).symlink_to(f"/proc/{pid}")

    def forge(self, title: str, stop: bool) -> int:
        """nobody runs ``exec -a TITLE sleep 600`` (and stops it): its pid, linked into the proc root."""
        proc = subprocess.Popen([*NOBODY, "bash", "-c", f"exec -a {title} sleep 600"])
        self.forged.append(proc)
        titled(proc.pid, title)
        if stop:
            stopped(proc.pid)
        self.link(proc.pid)
        return proc.pid

    def check(self) -> tuple[int, dict[str, object]]:
        done = run_cli("check", "--config", str(self.config), "--only", "vllm_executor", "--json")
        doc = json.loads(done.stdout)
        return done.returncode, next(c for c in doc["checks"] if c["name"] == "vllm_executor")


def config_body(tmp: Path, root: Path) -> str:
    quiet = "".join(f"[checks.{f.name}]\nenabled = false\n" for f in ALL_CHECKS if f.name != "vllm_executor")
    return (f'[node]\nname = "dgx-b"\nrole = "worker"\nexecutor = "mp"\n[paths]\nproc_root = "{root}"\n'
            f'state_dir = "{tmp / "state"}"\n[daemon]\nlisten = "@LISTEN@"\n'
            f"[checks.vllm_executor]\ninterval_s = 1\nconnect_timeout_s = 1\n{quiet}")  # fmt: skip


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    master = socket.create_server(("127.0.0.1", 0))  # the head's torch.distributed store, reachable
    port = master.getsockname()[1]
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text(STAND_IN)
    argv = [sys.executable, str(script), "serve", "/models/glm", "--tensor-parallel-size", "4",
            "--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank", "1", "--master-addr",
            "127.0.0.1", "--master-port", str(port), "--headless"]  # fmt: skip
    server = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdin is not None
    ranks = [int(x) for x in server.stdout.readline().split()]
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").symlink_to("/proc/stat")
    config = tmp_path / "config.toml"
    config.write_text(config_body(tmp_path, root).replace("@LISTEN@", "127.0.0.1:9"))
    n = Node(root, config, server, ranks, [])
    for pid in (server.pid, *ranks):
        n.link(pid)
    for pid, title in zip(ranks, ("VLLM::Worker_TP2", "VLLM::Worker_TP3"), strict=True):
        titled(pid, title)
    try:
        yield n
    finally:
        for proc in n.forged:
            proc.kill()
            proc.wait(timeout=10)
        server.stdin.close()
        server.wait(timeout=10)
        master.close()


def codes(check: dict[str, object]) -> dict[str, str]:
    return {f["code"]: f["status"] for f in check["findings"]}  # type: ignore[attr-defined]


def test_a_stopped_lookalike_of_nobody_on_a_healthy_worker_is_not_critical(node: Node) -> None:
    rc, check = node.check()
    assert (rc, check["status"], codes(check)) == (0, "ok", {}), check
    fake = node.forge("VLLM::Worker_TP9", stop=True)
    rc, check = node.check()
    assert check["status"] == "ok" and rc == 0, check
    assert codes(check) == {"VLLM_LOOKALIKES_IGNORED": "ok"}
    finding = check["findings"][0]  # type: ignore[index]
    assert f"pid {fake} VLLM::Worker_TP9 (uid 65534" in finding["message"]


def test_a_dead_rank_stays_critical_beside_a_forged_one(node: Node) -> None:
    os.kill(node.ranks[1], signal.SIGKILL)  # VLLM::Worker_TP3 dies (a zombie until its parent reaps it)
    rc, check = node.check()
    assert rc == 2 and codes(check) == {"VLLM_MP_WORKERS_MISSING": "critical"}, check
    node.forge("VLLM::Worker_TP3", stop=False)
    rc, check = node.check()
    assert rc == 2 and codes(check) == {"VLLM_MP_WORKERS_MISSING": "critical", "VLLM_LOOKALIKES_IGNORED": "ok"}
    missing = next(f for f in check["findings"] if f["code"] == "VLLM_MP_WORKERS_MISSING")  # type: ignore[attr-defined]
    assert "1 of 2 VLLM::Worker processes" in missing["message"]


def test_the_daemon_counts_the_lookalikes_and_stays_ok(node: Node, tmp_path: Path) -> None:
    """The daemon's own path: /metrics says how many were ignored, the check's status stays OK (0)."""
    node.forge("VLLM::Worker_TP9", stop=True)
    daemon = DaemonProc(tmp_path / "daemon", config_body(tmp_path, node.root)).start()
    try:
        daemon.wait_healthy()
        daemon.wait_for(
            lambda: daemon.metric("dgxdoctor_vllm_lookalikes_ignored", reason="owner") == 1.0, 20, "a look-alike"
        )
        assert daemon.metric("dgxdoctor_check_status", check="vllm_executor") == 0.0
        assert daemon.metric("dgxdoctor_vllm_lookalikes_ignored", reason="tree") == 0.0
    finally:
        daemon.stop()
